"""Without -http the broker never imports the web front's libraries (aiohttp,
prometheus_client): they would cost an idle broker megabytes and its start a fifth of a
second. The real `curb` process is run, serves a client, and says at exit what it loaded."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from curb.client import Client
from curb.spawn import BrokerProcess

WEB_LIBRARIES = ("aiohttp", "prometheus_client")
# `python -c REPORT -m curb FLAGS...` runs curb as `python -m curb FLAGS...` would, and at
# exit prints which of WEB_LIBRARIES were ever imported.
REPORT = f"""
import atexit, runpy, sys
atexit.register(lambda: print("loaded:", *[n for n in {WEB_LIBRARIES!r} if n in sys.modules], file=sys.stderr))
sys.argv = ["curb", *sys.argv[3:]]
runpy.run_module("curb", run_name="__main__", alter_sys=True)
"""


def loaded_by_a_broker(tmp_path: Path, *flags: str) -> list[str]:
    """Which web libraries a broker started with FLAGS loaded by the time it exited."""
    child = BrokerProcess(cwd=tmp_path, timeout=15, interpreter=(sys.executable, "-c", REPORT))
    port = child.start(["-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", "curb.log", *flags])
    try:
        with Client("127.0.0.1", port, timeout=5) as client:
            client.send(b"x", receipt="stored")
            client.wait_receipt("stored")
    finally:
        assert child.stop(signal.SIGTERM) == 0
    lines = [line.split()[1:] for line in child.output().splitlines() if line.startswith("loaded:")]
    assert len(lines) == 1, child.output()
    return lines[0]


def test_a_broker_without_http_never_imports_the_web_libraries(tmp_path: Path):
    assert loaded_by_a_broker(tmp_path) == []


def test_with_http_it_imports_them_so_the_report_is_not_blind(tmp_path: Path):
    assert loaded_by_a_broker(tmp_path, "-http", "127.0.0.1:0") == list(WEB_LIBRARIES)
