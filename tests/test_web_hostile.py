"""Hostile clients of the web front: a WebSocket that never reads, one that sends a 100 MiB
message, 1,000 idle WebSockets, slowloris, malformed and oversized requests, a wrong
Origin and too many connections. Each gets a clear refusal (or is simply bounded), and
the broker keeps serving the others (docs/http-websocket.md)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import time

import pytest
from conftest import wait_until
from webrig import http, running

from curb.client import Client
from curb.session import OUTPUT_LIMIT
from curb.web import api, front
from curb.web.stomp_ws import OUTPUT_HELD

pytestmark = pytest.mark.slow


def upgrade(port: int, path: str = "/ws", protocol: str = "v12.stomp", origin: str | None = None) -> socket.socket:
    """A WebSocket opened by hand (so that it reads only when the test says); fails unless 101."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"Sec-WebSocket-Protocol: {protocol}",
        *([f"Origin: {origin}"] if origin else []),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, f"closed during the upgrade: {head!r}"
        head += chunk
    status = head.split(b"\r\n", 1)[0]
    if b" 101 " not in status:
        sock.close()
        raise AssertionError(status.decode())
    return sock


def frame(payload: bytes, opcode: int = 1, length: int | None = None) -> bytes:
    """A client's (masked) WebSocket frame; `length` may claim more than the payload holds."""
    size = len(payload) if length is None else length
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_code(sock: socket.socket) -> int | None:
    """The code of the close frame the server sends next (frames before it are skipped)."""
    data = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
        while len(data) >= 2:
            opcode, size = data[0] & 0x0F, data[1] & 0x7F
            start = 2 + {126: 2, 127: 8}.get(size, 0)
            if size == 126:
                size = struct.unpack("!H", data[2:4])[0]
            elif size == 127:
                size = struct.unpack("!Q", data[2:10])[0]
            if len(data) < start + size:
                break
            if opcode == 8:
                return struct.unpack("!H", data[start : start + 2])[0]
            data = data[start + size :]
    return None


def test_an_error_on_ws_reaches_a_client_that_is_still_sending(tmp_path):
    """The broker answers a bad frame with ERROR and closes; a client still sending frames
    then must get the ERROR and the close frame, not a reset that drops them (stompjs
    would see close 1006 and never the reason)."""
    with running(tmp_path) as web:
        sock = upgrade(web.http_port)
        sock.sendall(frame(b"CONNECT\naccept-version:1.2\n\n\x00"))
        sock.sendall(frame(b"BOGUS\n\n\x00"))  # an ERROR, and the broker closes
        for _ in range(200):  # the client goes on sending, not yet reading
            with contextlib.suppress(OSError):
                sock.sendall(frame(b"SEND\ndestination:/queue/a\n\n" + b"x" * 2000 + b"\x00"))
        # Read until the close frame comes: the broker then waits for the client's close
        # frame, which this client does not send.
        received = b""
        sock.settimeout(30)
        with contextlib.suppress(OSError):
            while 8 not in server_opcodes(received) and (chunk := sock.recv(65536)):
                received += chunk
        sock.close()
        assert b"ERROR" in received, received[:300]
        assert 8 in server_opcodes(received), "no close frame"


def server_opcodes(data: bytes) -> list[int]:
    """The opcodes of the whole (unmasked) frames a server sent in `data`."""
    opcodes, at = [], 0
    while at + 2 <= len(data):
        size, at_payload = data[at + 1] & 0x7F, at + 2
        if size == 126:
            size, at_payload = int.from_bytes(data[at + 2 : at + 4], "big"), at + 4
        elif size == 127:
            size, at_payload = int.from_bytes(data[at + 2 : at + 10], "big"), at + 10
        if at_payload + size > len(data):
            break
        opcodes.append(data[at] & 0x0F)
        at = at_payload + size
    return opcodes


def queue(web, body: bytes, count: int) -> None:
    """`count` messages of `body`, stored (the last one receipted) before it returns."""
    with Client("127.0.0.1", web.stomp_port) as producer:
        for i in range(count):
            producer.send(body, receipt="last" if i == count - 1 else None)
        producer.wait_receipt("last", timeout=30)


def test_a_websocket_that_never_reads_holds_a_bounded_output_and_others_are_served(tmp_path):
    body = b"x" * (64 << 10)
    with running(tmp_path, cap=64 << 20) as web:
        queue(web, body, 300)
        stalled = upgrade(web.http_port)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(frame(b"CONNECT\naccept-version:1.2\n\n\x00"))
        stalled.sendall(frame(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:client\nprefetch-count:1000\n\n\x00"))
        time.sleep(2)  # it reads nothing from here on

        def unsent() -> list[int]:
            return [s.unsent for s in web.instance.broker.sessions]  # type: ignore[attr-defined]

        [held] = web.call(unsent)
        assert held <= OUTPUT_LIMIT + len(body) + 1024, held  # the session's bound
        wip = web.gauges()["wip"]
        # what the broker made for it: its session's bound, the link's, and what the
        # kernel's socket buffers took; far below the 300 messages it may hold
        assert wip * len(body) < OUTPUT_LIMIT + OUTPUT_HELD + (8 << 20), wip
        started = time.monotonic()
        assert http("POST", web.base + "/v2/p/queues/q/messages", b"other").status == 201
        with Client("127.0.0.1", web.stomp_port) as other:
            other.send(b"still served", receipt="ok")
            other.wait_receipt("ok", timeout=10)
        assert time.monotonic() - started < 5
        stalled.close()
        assert wait_until(lambda: web.gauges()["wip"] == 0)  # its messages are rdy again


def test_a_narconi_consumer_that_never_reads_holds_what_a_stomp_one_does(tmp_path):
    """?ack&limit=10000 over 300 messages of 60 KiB: the broker makes messages for the
    socket only while what it holds for it is under the session's bound."""
    body = b"x" * (60 << 10)
    with running(tmp_path, cap=64 << 20) as web:
        queue(web, body, 300)
        stalled = upgrade(web.http_port, "/v2/p/queues/q/messages?ack&limit=10000", "consume")
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        time.sleep(2)  # it reads nothing
        wip = web.gauges()["wip"]
        assert wip * len(body) < OUTPUT_LIMIT + OUTPUT_HELD + (8 << 20), wip
        assert http("POST", web.base + "/v2/p/queues/q/messages", b"other").status == 201
        stalled.close()
        assert wait_until(lambda: web.gauges()["wip"] == 0)  # its messages are rdy again


@pytest.mark.parametrize("path, protocol", [("/ws", "v12.stomp"), ("/v2/p/queues/q/messages", "publish")])
def test_a_100_mib_websocket_message_is_refused_before_it_is_read(tmp_path, path, protocol):
    with running(tmp_path) as web:
        sock = upgrade(web.http_port, path, protocol)
        sock.sendall(frame(b"y" * 65536, opcode=2, length=100 << 20)[: 14 + 65536])
        assert close_code(sock) == 1009  # message too big
        sock.close()
        assert http("POST", web.base + "/v2/p/queues/q/messages", b"fine").status == 201


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_1000_idle_websockets_cost_a_bounded_rss_and_do_not_slow_others(curb_broker, free_port):
    http_port = free_port()
    broker = curb_broker(extra_args=("-http", f"127.0.0.1:{http_port}", "-connect-timeout", "120", "-heartbeat", "0"))
    pid = broker.proc.pid

    def round_trip() -> float:
        started = time.monotonic()
        with Client("127.0.0.1", broker.port) as client:
            client.send(b"ping", receipt="r")
            client.wait_receipt("r", timeout=10)
        return time.monotonic() - started

    quiet = min(round_trip() for _ in range(5))
    before = rss_kib(pid)
    idle = [upgrade(http_port) for _ in range(1000)]
    try:
        after = rss_kib(pid)
        per_socket = (after - before) / len(idle)
        assert per_socket < 100, f"{per_socket:.1f} KiB per idle WebSocket"  # docs/http-websocket.md
        busy = min(round_trip() for _ in range(5))
        assert busy < max(10 * quiet, 0.25), (quiet, busy)
    finally:
        for sock in idle:
            sock.close()


def test_slowloris_is_closed_at_the_keepalive_deadline_and_others_are_served(tmp_path, monkeypatch):
    monkeypatch.setattr(front, "KEEPALIVE_SECONDS", 1.0)
    with running(tmp_path) as web:
        slow = [socket.create_connection(("127.0.0.1", web.http_port), timeout=10) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for _ in range(4):  # a header line every half second: never a whole request
            time.sleep(0.5)
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Slow: 1\r\n")
            assert http("GET", web.base + "/stats", timeout=5).status == 200
        for sock in slow:
            sock.settimeout(5)
            assert sock.recv(100) == b""  # closed by the broker
            sock.close()
        assert time.monotonic() - started < 8


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GET /stats HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", b" 400 "),
        (b"POST /v2/p/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\nabc", b" 413 "),
        (b"POST /v2/p/queues/q/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b" 400 "),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100, b" 400 "),
    ],
)
def test_malformed_and_oversized_requests_get_a_clear_status(tmp_path, request_bytes, status):
    with running(tmp_path) as web:
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=10) as sock:
            sock.sendall(request_bytes)
            answer = sock.recv(4096)
        assert status in answer.split(b"\r\n", 1)[0], answer[:200]
        assert web.gauges()["rdy"] == 0
        assert http("GET", web.base + "/stats").status == 200


def test_a_websocket_from_another_origin_is_refused(tmp_path):
    with running(tmp_path) as web:
        with pytest.raises(AssertionError, match="403"):
            upgrade(web.http_port, origin="https://evil.example")
        upgrade(web.http_port, origin=f"http://127.0.0.1:{web.http_port}").close()


def test_web_connections_past_max_connections_are_closed_at_once_but_monitoring_sees_the_broker(tmp_path):
    """At -max-connections a new web connection may ask only for /metrics, /stats or
    /ping (a few more are let in for that); past those it is closed at once. Each refusal
    is counted, and logged."""
    lines: list[str] = []
    with running(tmp_path, max_connections=5, events=lambda event, text, **fields: lines.append(text)) as web:
        held = [upgrade(web.http_port) for _ in range(5)]
        assert http("GET", web.base + "/metrics").status == 200
        busy = http("POST", web.base + "/v2/p/queues/q/messages", b"job")
        assert busy.status == 503 and "-max-connections" in busy.json["error"], busy
        held += [socket.create_connection(("127.0.0.1", web.http_port)) for _ in range(front.MONITOR_HEADROOM)]
        time.sleep(0.3)  # accepted
        extra = socket.create_connection(("127.0.0.1", web.http_port), timeout=10)
        extra.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert extra.recv(100) == b""
        assert web.instance.metrics.connections_refused >= 2
        for sock in held:
            sock.close()

        def served() -> bool:
            try:
                return http("POST", web.base + "/v2/p/queues/q/messages", b"job").status == 201
            except OSError:  # refused while the closed ones are still counted
                return False

        assert wait_until(served)
    assert any("a web connection was closed at once: 5 web connections are open" in line for line in lines), lines


@pytest.mark.parametrize(
    "request_line",
    [b"DELETE /v2/p/queues/q/messages?wait=10", b"POST /v2/p/queues/q/claims?wait=10&ttl=600"],
    ids=["consume", "claim"],
)
def test_a_request_abandoned_while_it_waits_takes_nothing(tmp_path, request_line):
    """A client that gives up on a long-poll (curl --max-time) is gone: the next message
    published is not taken for it (ACKed, or held by a claim nobody knows)."""
    with running(tmp_path) as web:
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=10) as sock:
            sock.sendall(request_line + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            time.sleep(0.3)  # it waits for a message
        time.sleep(0.3)  # and is gone
        assert http("POST", web.base + "/v2/p/queues/q/messages", b"job").status == 201
        time.sleep(0.3)
        assert web.gauges()["rdy"] == 1 and web.gauges()["wip"] == 0
        got = http("DELETE", web.base + "/v2/p/queues/q/messages?wait=2")
        assert got.status == 200 and got.body == b"job"


def test_a_stored_header_no_http_header_can_carry_breaks_no_response(tmp_path):
    """A content-type with a line break, header names with a colon or a space (stored over
    STOMP or a JSON batch line, where they are legal): the HTTP consume answers whole, with
    the message, and each such header is left out (the JSON forms carry them)."""
    line = {
        "message": "job",
        "headers": {"content-type": "text/plain\r\nX-Split: 1", "a:b": "1", "c d": "2", "ok": "3"},
    }
    with running(tmp_path) as web:
        body = json.dumps(line).encode() + b"\n"
        assert http("POST", web.base + "/v2/p/queues/q/messages/batch", body).status == 201
        got = http("DELETE", web.base + "/v2/p/queues/q/messages")
        assert got.status == 200 and got.body == b"job", got
        assert got.headers["Content-Type"] == "application/octet-stream" and got.headers["x-msg-ok"] == "3"
        names = [name.lower() for name in got.headers]
        assert not any(name.startswith("x-split") or name == "x-msg-a" or " " in name for name in names), names


def test_a_queue_name_with_a_line_break_cannot_split_a_claims_location(tmp_path):
    with running(tmp_path) as web:
        assert http("POST", web.base + "/v2/p/queues/q/messages", b"job").status == 201
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=10) as sock:
            sock.sendall(
                b"POST /v2/p/queues/a%0d%0aX-Split:%201/claims HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            )
            head = sock.recv(4096).split(b"\r\n\r\n", 1)[0]
        assert not any(line.lower().startswith(b"x-split") for line in head.split(b"\r\n")), head
        assert head.startswith(b"HTTP/1.1 201") and b"\r\nLocation: /v2/p/queues/a%0d%0aX-Split:%201/claims/1" in head


def test_a_body_that_trickles_in_is_closed_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "BODY_SECONDS", 1.0)
    with running(tmp_path) as web:
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=10) as sock:
            sock.sendall(b"POST /v2/p/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
            started = time.monotonic()
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert time.monotonic() - started < 5
        assert web.gauges()["rdy"] == 0


def test_a_chunked_body_is_refused_as_soon_as_it_grows_past_the_limit(tmp_path):
    with running(tmp_path, max_frame=64 << 10) as web:
        with socket.create_connection(("127.0.0.1", web.http_port), timeout=10) as sock:
            sock.sendall(b"POST /v2/p/queues/q/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"a" * 16384
            for _ in range(5):  # 80 KiB of a body that never ends
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert web.gauges()["rdy"] == 0


@pytest.mark.parametrize("depth", [100_000])
def test_json_nested_too_deep_is_a_400_not_a_500(tmp_path, depth, caplog):
    with running(tmp_path) as web:
        line = b'{"message": "x", "headers": ' + b"[" * depth + b"]" * depth + b"}\n"
        got = http("POST", web.base + "/v2/p/queues/q/messages/batch", line)
        assert got.status == 400 and "nested too deep" in got.json["error"], got
    assert "Traceback" not in caplog.text


def test_a_narconi_consumer_gone_holds_no_message(tmp_path):
    """A consumer that never read and then went left its socket, peer and consumer in a
    reference cycle that only the garbage collector's full pass frees, and with them the
    messages it had been handed: RSS crept with each such client. They are let go at once."""
    import gc

    with running(tmp_path, cap=64 << 20) as web:
        queue(web, b"x" * (50 << 10), 40)
        stalled = upgrade(web.http_port, "/v2/p/queues/q/messages?ack&limit=10000", "consume")
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert wait_until(lambda: web.gauges()["wip"] > 0)
        stalled.close()
        assert wait_until(lambda: web.gauges()["wip"] == 0)  # its messages are rdy again

        def holding() -> int:
            consumers = [o for o in gc.get_objects() if type(o).__name__ == "_Consumer"]
            return sum(len(consumer.out) for consumer in consumers)

        assert web.call(holding) == 0
