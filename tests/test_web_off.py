"""Without -http the broker never imports the web front's libraries (aiohttp,
prometheus_client): they would cost an idle broker megabytes and its start a fifth of a
second. Nor, without -users, the password hashing's (hashlib, hmac), nor the subcommands'
modules and the flag suggestions' difflib, nor before a large record zlib-ng: each costs
an idle broker memory. The real
`curb` process is run, serves a client, and says at exit what it loaded."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from curb.client import Client
from curb.spawn import BrokerProcess
from curb.users import hash_password

WEB_LIBRARIES = ("aiohttp", "prometheus_client")
HASHING = ("hashlib", "hmac")
FAST_CRC = "zlib_ng"
OPTIONAL = (*WEB_LIBRARIES, *HASHING, "difflib", "curb.inspect", "curb.passwd", "curb.router", FAST_CRC)
# `python -c REPORT -m curb FLAGS...` runs curb as `python -m curb FLAGS...` would, and at
# exit prints which of OPTIONAL were ever imported.
REPORT = f"""
import atexit, runpy, sys
atexit.register(lambda: print("loaded:", *[n for n in {OPTIONAL!r} if n in sys.modules], file=sys.stderr))
sys.argv = ["curb", *sys.argv[3:]]
runpy.run_module("curb", run_name="__main__", alter_sys=True)
"""


def loaded_by_a_broker(tmp_path: Path, *flags: str, login: str | None = None, body: bytes = b"x") -> list[str]:
    """Which of OPTIONAL a broker started with FLAGS, sent `body`, loaded by the time it exited."""
    child = BrokerProcess(cwd=tmp_path, timeout=15, interpreter=(sys.executable, "-c", REPORT))
    port = child.start(["-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", "curb.log", *flags])
    try:
        with Client("127.0.0.1", port, timeout=5, login=login, passcode=login) as client:
            client.send(body, receipt="stored")
            client.wait_receipt("stored")
    finally:
        assert child.stop(signal.SIGTERM) == 0
    lines = [line.split()[1:] for line in child.output().splitlines() if line.startswith("loaded:")]
    assert len(lines) == 1, child.output()
    return lines[0]


def test_a_broker_without_http_or_users_imports_none_of_them(tmp_path: Path):
    assert loaded_by_a_broker(tmp_path) == []


def test_with_http_it_imports_the_web_libraries_so_the_report_is_not_blind(tmp_path: Path):
    loaded = loaded_by_a_broker(tmp_path, "-http", "127.0.0.1:0")
    assert set(WEB_LIBRARIES) <= set(loaded)  # aiohttp brings hashlib too


def test_with_users_a_login_imports_the_hashing(tmp_path: Path):
    (tmp_path / "users").write_text(f"alice:{hash_password('alice', n=2)}:send,consume,count\n")
    assert loaded_by_a_broker(tmp_path, "-users", "users", login="alice") == list(HASHING)


def test_a_large_record_imports_the_fast_crc_so_the_report_is_not_blind(tmp_path: Path):
    assert loaded_by_a_broker(tmp_path, body=b"y" * (64 << 10)) == [FAST_CRC]
