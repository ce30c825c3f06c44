"""curb.spawn.BrokerProcess, the one way tests, the benchmark and Spark's local mode start a
broker: it returns the port from the start-up line, and a broker that cannot start fails
with what it said."""

from __future__ import annotations

import select
import signal
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

from curb import spawn
from curb.client import Client
from curb.spawn import BrokerProcess, StartError


def test_start_returns_the_port_the_broker_listens_on_and_stop_is_clean(tmp_path: Path):
    child = BrokerProcess(cwd=tmp_path, output=tmp_path / "stderr", timeout=15)
    port = child.start(["-cap", "1MiB", "-addr", "127.0.0.1:0", "-file", "curb.log"])
    try:
        assert port > 0
        with Client("127.0.0.1", port, timeout=5) as client:  # serving, signal handlers in place
            client.send(b"x", receipt="stored")
            client.wait_receipt("stored")
    finally:
        assert child.stop(signal.SIGTERM) == 0
    assert not child.running()
    assert f"127.0.0.1:{port}" in child.output()
    assert (tmp_path / "stderr").read_text() == child.output()


def test_a_broker_that_exits_at_start_raises_with_its_output(tmp_path: Path):
    child = BrokerProcess(cwd=tmp_path, timeout=15)
    with pytest.raises(StartError, match="exited with status 2") as raised:
        child.start(["-cap", "1", "-addr", "127.0.0.1:0"])
    assert "-cap" in str(raised.value)
    assert not child.running()


def test_the_interpreter_given_runs_curb_with_the_flags(tmp_path: Path):
    # a stand-in interpreter that says it listens and names what it was asked to run
    says = "import sys; print('curb: listening on 127.0.0.1:4321, argv', sys.argv[1:], file=sys.stderr)"
    child = BrokerProcess(cwd=tmp_path, timeout=15, interpreter=(sys.executable, "-c", says))
    assert child.start(["-cap", "1MiB"]) == 4321
    child.process.wait(15)  # it exits by itself; stop() then collects its status and all its output
    assert child.stop() == 0
    assert "argv ['-m', 'curb', '-cap', '1MiB']" in child.output()


# A stand-in for `python -m curb`: says it listens, then, once the test creates `go`,
# writes one line and only then creates `written`, the way a broker logs before it answers.
LATE_LINE = """
import pathlib, sys, time
print("curb: listening on 127.0.0.1:1", file=sys.stderr, flush=True)
while not pathlib.Path("go").exists():
    time.sleep(0.01)
print("curb: the line", file=sys.stderr, flush=True)
pathlib.Path("written").touch()
time.sleep(60)
"""


def test_output_holds_every_line_written_before_the_call_however_far_behind_its_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    hold, held, release = threading.Event(), threading.Event(), threading.Event()

    def lagging(rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any]) -> tuple[list[Any], ...]:
        ready = select.select(rlist, wlist, xlist)
        if hold.is_set():  # the pipe has something, and the reading thread lags behind it
            held.set()
            release.wait(30)
        return ready

    monkeypatch.setattr(spawn, "select", types.SimpleNamespace(select=lagging))
    child = BrokerProcess(cwd=tmp_path, timeout=15, interpreter=(sys.executable, "-c", LATE_LINE))
    try:
        child.start([])
        hold.set()
        (tmp_path / "go").touch()
        assert wait_until((tmp_path / "written").exists, 15)
        assert held.wait(15)  # the thread has not read the line
        assert child.output().endswith("curb: the line\n")
    finally:
        release.set()
        child.kill()
    assert child.output().count("curb: the line\n") == 1
