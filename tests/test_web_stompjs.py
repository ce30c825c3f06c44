"""@stomp/stompjs, the STOMP client of web pages, against Curb's /ws (run by node).

The packages of tests/node/package.json are installed from the npm registry into a
temporary directory once per run; without node and npm, or without the registry, the
test is skipped and says why."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from webrig import running, users_file

from curb.client import Client

pytestmark = pytest.mark.slow
NODE = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_packages(tmp_path_factory) -> Path:
    """A directory holding tests/node with its packages installed."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (Debian: apt-get install nodejs npm)")
    where = tmp_path_factory.mktemp("node")
    for name in ("package.json", "stompjs_roundtrip.js"):
        shutil.copy(NODE / name, where / name)
    result = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        pytest.skip(f"npm install failed (is the npm registry reachable?): {result.stderr.strip()[-300:]}")
    return where


def stompjs(where: Path, url: str, *credentials: str) -> dict:
    result = subprocess.run(
        ["node", "stompjs_roundtrip.js", url, *credentials], cwd=where, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_stompjs_publishes_and_consumes_text_and_binary_over_ws(node_packages, tmp_path):
    with running(tmp_path, heartbeat_ms=10_000) as web:
        result = stompjs(node_packages, f"ws://127.0.0.1:{web.http_port}/ws")
        assert "error" not in result, result
        assert result["version"] == "1.2" and result["heartBeat"] == "10000,10000"
        assert sorted(result["receipts"]) == ["r1", "r2"]
        text, binary = result["got"]
        assert text["text"] == "hello from stompjs" and text["headers"]["x-from"] == "js"
        assert binary["bytes"] == [0, 255, 1, 128]
        assert web.gauges()["rdy"] == 0 and web.gauges()["wip"] == 0  # both ACKed


def test_stompjs_logs_in_with_the_users_file_and_a_stomp_py_consumer_sees_its_message(node_packages, tmp_path):
    path = users_file(tmp_path, alice="send,consume")
    with running(tmp_path, users_path=path) as web:
        refused = stompjs(node_packages, f"ws://127.0.0.1:{web.http_port}/ws", "alice", "wrong")
        assert refused["error"] == "access refused"
        result = stompjs(node_packages, f"ws://127.0.0.1:{web.http_port}/ws", "alice", "correct horse")
        assert "error" not in result, result
        with Client("127.0.0.1", web.stomp_port, login="alice", passcode="correct horse") as client:
            client.send(b"from tcp", receipt="r")
            client.wait_receipt("r", timeout=10)
        assert web.gauges()["rdy"] == 1


def test_stompjs_round_trips_through_the_routers_ws(node_packages, curb_broker, curb_router):
    """`curb router -http`: /ws is a session of the router's core, so stompjs reaches the
    instance of the routed destination `curb` through it, receipts and ACKs included."""
    instance = curb_broker()
    router = curb_router([f"curb=127.0.0.1:{instance.port}"], extra_args=("-http", "127.0.0.1:0"))
    found = re.search(r"web front on http://127\.0\.0\.1:(\d+)", router.stderr_text())
    assert found, router.stderr_text()
    result = stompjs(node_packages, f"ws://127.0.0.1:{found.group(1)}/ws")
    assert "error" not in result, result
    assert result["version"] == "1.2" and sorted(result["receipts"]) == ["r1", "r2"]
    text, binary = result["got"]
    assert text["text"] == "hello from stompjs" and text["headers"]["x-from"] == "js"
    assert binary["bytes"] == [0, 255, 1, 128]
    with Client("127.0.0.1", instance.port) as direct:  # both ACKed on the instance
        assert list(direct.browse()) == []
