"""curb.spawn.BrokerProcess, the one way tests, the benchmark and Spark's local mode start a
broker: it returns the port from the start-up line, and a broker that cannot start fails
with what it said."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

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
