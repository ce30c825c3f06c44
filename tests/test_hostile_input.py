"""Hostile and unusual input against a real broker over real sockets: frames end in NUL LF
(clients that read two bytes after a sized body keep their place), a too-large
content-length is refused at the head, bad numbers get an ERROR rather than a traceback,
and the largest SEND the broker takes reaches Curb's client and stomp.py intact."""

from __future__ import annotations

import socket

import pytest
from conftest import WAIT_S

from curb.client import Client, StompError
from curb.frame import MAX_FRAME, MAX_HEADER_LINE, MAX_HEADERS, FrameParser, encode
from curb.log import max_message_for, parse_size
from curb.message_limits import ADDED_HEADERS, RESERVE

QUEUE = "/queue/curb"


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"the broker closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def read_head(sock: socket.socket) -> bytes:
    """Bytes up to and including the blank line that ends a frame's head, one at a time,
    as a client that knows nothing of heart-beats does."""
    head = b""
    while not head.endswith(b"\n\n"):
        head += read_exactly(sock, 1)
    return head


def test_pipelined_sized_messages_read_two_bytes_after_each_body(broker):
    """PHP's pecl client: read the head, `content-length` body bytes, then exactly two
    bytes, which must be NUL LF, and the next head starts right after."""
    with Client("127.0.0.1", broker.port) as producer:
        for i in range(50):
            producer.send(b"body %d \0 with a NUL" % i, receipt=f"r{i}")
        producer.wait_receipt("r49")
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=WAIT_S)
    try:
        sock.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "localhost"}))
        assert read_head(sock).startswith(b"CONNECTED\n")
        assert read_exactly(sock, 2) == b"\0\n"
        sock.sendall(encode("SUBSCRIBE", {"id": "0", "destination": QUEUE}))
        for i in range(50):
            head = read_head(sock)
            assert head.startswith(b"MESSAGE\n"), head
            [length] = [line[15:] for line in head.split(b"\n") if line.startswith(b"content-length:")]
            assert read_exactly(sock, int(length)) == b"body %d \0 with a NUL" % i
            assert read_exactly(sock, 2) == b"\0\n"
    finally:
        sock.close()


def test_a_content_length_over_the_limit_is_refused_at_the_head(curb_broker, raw):
    broker = curb_broker(cap="10MiB")
    client = raw(broker.port)
    client.connect()
    client.send(b"SEND\ndestination:/queue/curb\ncontent-length:%d\n\n" % (15 << 20))  # and no body
    error = client.read_frame()
    assert error is not None and error.command == "ERROR"
    limit = max_message_for(parse_size("10MiB"))
    assert error.headers["message"] == f"body too large: content-length {15 << 20} exceeds the limit of {limit} bytes"
    assert client.closed()


def test_bad_numbers_get_an_error_naming_the_header_and_no_traceback(broker, raw):
    nines = raw(broker.port)
    nines.send(encode("CONNECT", {"accept-version": "1.2", "heart-beat": "1," + "9" * 400}))
    error = nines.read_frame()
    assert error is not None and error.command == "ERROR"
    assert error.headers["message"] == "bad heart-beat header"
    assert b"exceeds the limit of 86400000" in error.body
    zeros = raw(broker.port)
    zeros.connect()
    zeros.send(b"SEND\ndestination:/queue/curb\nreceipt:z\ncontent-length:000000000000000000005\n\nhello\0")
    receipt = zeros.read_frame()
    assert receipt is not None and receipt.command == "RECEIPT", receipt
    assert "Traceback" not in broker.stderr_text()


def test_the_largest_send_reaches_curb_client_and_stomp_py(curb_broker, stomp_conn):
    """Most headers, each line as long as allowed once escaped, and the biggest body the
    broker takes beside them; delivered once, then redelivered (the most added headers)."""
    cap = "16MiB"  # the largest payload is a sixth of it: 2.7 MiB, 2 of them headers
    broker = curb_broker(cap=cap)
    value = ":" * ((MAX_HEADER_LINE - 5) // 2) + "x" * ((MAX_HEADER_LINE - 5) % 2)
    headers = {f"h{i:03d}": value for i in range(MAX_HEADERS - ADDED_HEADERS)}
    kept = len(headers) * (MAX_HEADER_LINE + 1)
    largest_payload = min(max_message_for(parse_size(cap)), MAX_FRAME - RESERVE + 1)
    body = bytes(range(256)) * ((largest_payload - kept - 1) // 256) + b"t" * ((largest_payload - kept - 1) % 256)
    with Client("127.0.0.1", broker.port) as client:
        client.send(body, headers, receipt="big")
        client.wait_receipt("big")
        client.subscribe("s", ack="client-individual")
        message = client.receive(WAIT_S)
        assert message is not None and message.command == "MESSAGE"
        assert message.body == body
        assert all(message.headers[name] == value for name in headers)
        client.nack(message.headers["ack"], receipt="nacked")
        client.unsubscribe("s")
        client.wait_receipt("nacked")
    conn, inbox = stomp_conn(broker.port, auto_decode=False)
    conn.subscribe(QUEUE, id="t", ack="client-individual")
    [again] = inbox.wait_messages(1, timeout=60)
    assert again.body == body
    assert again.headers["redelivered"] == "true"
    assert all(again.headers[name] == value for name in headers)
    conn.ack(again.headers["ack"], "t", receipt="acked")
    inbox.wait_receipt("acked")
    assert not inbox.errors
    over = Client("127.0.0.1", broker.port)
    over.connect()
    try:
        over.send(body + b"!", headers, receipt="over")
        with pytest.raises(StompError, match="message too large"):
            over.wait_receipt("over")
    finally:
        over.close()


def test_every_frame_a_client_can_get_parses_with_the_frame_ends(broker, raw):
    client = raw(broker.port)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "0", "destination": QUEUE, "receipt": "sub"})
    client.send_frame("SEND", {"destination": QUEUE}, b"x")
    wire = b""
    while wire.count(b"\0") < 2 and (chunk := client.read_bytes()):
        wire += chunk
    client.send_frame("FROB")  # after the MESSAGE, so that the ERROR comes last
    while chunk := client.read_bytes():
        wire += chunk
    assert wire.count(b"\0\n") == 3, wire  # RECEIPT, MESSAGE, ERROR
    assert [f.command for f in FrameParser().feed(wire)] == ["RECEIPT", "MESSAGE", "ERROR"]
