"""The blocking client against a scripted in-test STOMP server (one connection, one thread)."""

import socket
import threading
import time
from collections import deque
from contextlib import contextmanager

import pytest

from curb.client import Client, StompError
from curb.frame import Frame, FrameParser, encode


class Peer:
    """The server side of one connection, driven by a test script."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.parser = FrameParser()
        self.frames: deque[Frame] = deque()

    def read_frame(self) -> Frame:
        while not self.frames:
            data = self.conn.recv(65536)
            if not data:
                raise EOFError("client closed the connection")
            self.frames.extend(self.parser.feed(data))
        return self.frames.popleft()

    def read_until_closed(self) -> list[Frame]:
        frames = []
        try:
            while True:
                frames.append(self.read_frame())
        except EOFError:
            return frames

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.conn.sendall(encode(command, headers or {}, body))

    def handshake(self, heart_beat: str = "0,0") -> Frame:
        connect = self.read_frame()
        self.send("CONNECTED", {"version": "1.2", "heart-beat": heart_beat})
        return connect

    def receipt_for(self, frame: Frame) -> None:
        self.send("RECEIPT", {"receipt-id": frame.headers["receipt"]})


@contextmanager
def scripted_server(script):
    """Run `script(peer)` for the first connection in a thread; yield (host, port); re-raise its failure."""
    listener = socket.create_server(("127.0.0.1", 0))
    failures = []

    def serve():
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn:
            try:
                script(Peer(conn))
            except BaseException as err:  # handed to the test thread
                failures.append(err)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
        thread.join(10)
        assert not thread.is_alive(), "server script did not finish"
    finally:
        listener.close()
    if failures:
        raise failures[0]


def test_connect_asks_for_stomp_1_2_and_returns_connected():
    seen = []

    def script(peer):
        seen.append(peer.handshake())
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        client = Client(host, port, login="ann", passcode="p\\w:d", heartbeat=(0, 0))
        connected = client.connect()
        client.close()
    assert connected.command == "CONNECTED" and connected.headers["version"] == "1.2"
    assert seen[0] == Frame(
        "STOMP", {"accept-version": "1.2", "host": host, "heart-beat": "0,0", "login": "ann", "passcode": "p\\w:d"}, b""
    )


def test_connect_without_credentials_sends_none():
    seen = []

    def script(peer):
        seen.append(peer.handshake())
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        client = Client(host, port)
        client.connect()
        client.close()
    assert "login" not in seen[0].headers and "passcode" not in seen[0].headers


def test_connect_refused_by_error_frame():
    def script(peer):
        peer.read_frame()
        peer.send("ERROR", {"message": "unsupported version"}, b"only 1.2")

    with scripted_server(script) as (host, port):
        with pytest.raises(StompError, match=r"unsupported version: only 1\.2") as raised:
            Client(host, port).connect()
    assert raised.value.frame is not None and raised.value.frame.command == "ERROR"


def test_connect_to_server_that_hangs_up():
    def script(peer):
        peer.read_frame()

    with scripted_server(script) as (host, port):
        with pytest.raises(StompError, match="closed") as raised:
            Client(host, port).connect()
    assert raised.value.frame is None


def test_frames_written_by_each_command():
    seen = []

    def script(peer):
        peer.handshake()
        seen.extend(peer.read_until_closed())

    with scripted_server(script) as (host, port):
        client = Client(host, port)
        client.connect()
        client.send(b"a\0b")
        client.send(b"x", headers={"content-type": "text/plain", "k": "v:1"}, receipt="r1", destination="/queue/other")
        client.subscribe()
        client.subscribe("s2", prefetch=10, ack="auto", headers={"x-extra": "1"})
        client.ack("7", receipt="r2")
        client.nack("8")
        client.unsubscribe("s2")
        client.flush()
        client.close()
    assert seen == [
        Frame("SEND", {"destination": "/queue/curb", "content-length": "3"}, b"a\0b"),
        Frame(
            "SEND",
            {
                "destination": "/queue/other",
                "content-type": "text/plain",
                "k": "v:1",
                "receipt": "r1",
                "content-length": "1",
            },
            b"x",
        ),
        Frame("SUBSCRIBE", {"id": "0", "destination": "/queue/curb", "ack": "client-individual"}, b""),
        Frame(
            "SUBSCRIBE",
            {"id": "s2", "destination": "/queue/curb", "ack": "auto", "prefetch-count": "10", "x-extra": "1"},
            b"",
        ),
        Frame("ACK", {"id": "7", "receipt": "r2"}, b""),
        Frame("NACK", {"id": "8"}, b""),
        Frame("UNSUBSCRIBE", {"id": "s2"}, b""),
    ]


def test_pipelined_sends_arrive_in_order_and_receipt_returns_earlier_frames():
    count = 2000
    seen = []

    def script(peer):
        peer.handshake()
        peer.send("MESSAGE", {"message-id": "1", "subscription": "0"}, b"early")
        for _ in range(count):
            frame = peer.read_frame()
            seen.append(frame.body)
        peer.send("RECEIPT", {"receipt-id": "other"})
        peer.receipt_for(frame)
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            for n in range(count - 1):
                client.send(b"%d" % n)
            client.send(b"%d" % (count - 1), receipt="last")
            before = client.wait_receipt("last")
            client.close()
    assert seen == [b"%d" % n for n in range(count)]
    assert [(f.command, f.body) for f in before] == [("MESSAGE", b"early"), ("RECEIPT", b"")]


def test_receive_returns_frames_in_order_then_none_on_timeout():
    def script(peer):
        peer.handshake()
        for n in range(3):
            peer.send("MESSAGE", {"message-id": str(n)}, b"m%d" % n)
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            frames = [client.receive(timeout=5) for _ in range(3)]
            assert client.receive(timeout=0.05) is None
            client.close()
    assert [frame.body for frame in frames if frame is not None] == [b"m0", b"m1", b"m2"]


def test_receive_flushes_buffered_writes_first():
    def script(peer):
        peer.handshake()
        subscribe = peer.read_frame()
        peer.send("MESSAGE", {"subscription": subscribe.headers["id"]}, b"hello")
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            client.subscribe("sub-1")
            frame = client.receive(timeout=5)
            client.close()
    assert frame is not None and frame.headers["subscription"] == "sub-1"


def test_error_frame_raises_with_the_frame():
    def script(peer):
        peer.handshake()
        peer.read_frame()
        peer.send("ERROR", {"message": "unknown ack id"}, b"id 9 is not in flight")

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            client.ack("9")
            with pytest.raises(StompError, match="unknown ack id: id 9 is not in flight") as raised:
                client.receive(timeout=5)
    assert raised.value.frame is not None and raised.value.frame.headers["message"] == "unknown ack id"


def test_error_then_close_during_pipelined_sends_reports_the_error():
    def script(peer):
        peer.handshake()
        peer.read_frame()
        peer.send("ERROR", {"message": "queue full"})
        peer.conn.shutdown(socket.SHUT_RDWR)

    with scripted_server(script) as (host, port):
        client = Client(host, port)
        client.connect()
        with pytest.raises(StompError, match="queue full") as raised:
            for _ in range(100_000):
                client.send(b"x" * 1000)
            client.wait_receipt("never", timeout=5)
    assert raised.value.frame is not None and raised.value.frame.command == "ERROR"


def test_lost_connection_raises():
    def script(peer):
        peer.handshake()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            with pytest.raises(StompError, match="closed") as raised:
                client.receive(timeout=5)
    assert raised.value.frame is None


def test_wait_receipt_times_out():
    def script(peer):
        peer.handshake()
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            with pytest.raises(StompError, match="no RECEIPT for 'r9'"):
                client.wait_receipt("r9", timeout=0.05)
            client.close()


def test_disconnect_waits_for_its_receipt_then_closes():
    seen = []

    def script(peer):
        peer.handshake()
        frame = peer.read_frame()
        seen.append(frame)
        peer.send("MESSAGE", {"message-id": "1"}, b"late")
        peer.receipt_for(frame)
        seen.append(peer.read_until_closed())

    with scripted_server(script) as (host, port):
        client = Client(host, port)
        client.connect()
        client.disconnect()
        with pytest.raises(StompError, match="not connected"):
            client.send(b"after")
    assert seen[0].command == "DISCONNECT" and "receipt" in seen[0].headers
    assert seen[1] == []


def test_context_manager_connects_and_disconnects():
    seen = []

    def script(peer):
        seen.append(peer.handshake().command)
        frame = peer.read_frame()
        seen.append(frame.command)
        peer.receipt_for(frame)

    with scripted_server(script) as (host, port):
        with Client(host, port):
            pass
    assert seen == ["STOMP", "DISCONNECT"]


def test_context_manager_drops_connection_on_exception():
    seen: list[str] = []

    def script(peer):
        peer.handshake()
        seen.extend(frame.command for frame in peer.read_until_closed())

    with scripted_server(script) as (host, port):
        with pytest.raises(KeyError):
            with Client(host, port) as client:
                client.send(b"x")
                raise KeyError("boom")
    assert seen == []  # no DISCONNECT; unflushed writes dropped too


def test_heartbeats_sent_while_blocked_when_negotiated():
    received = []

    def script(peer):
        connect = peer.handshake(heart_beat="0,50")
        received.append(connect.headers["heart-beat"])
        peer.conn.settimeout(2)
        data = b""
        while data.count(b"\n") < 3:
            data += peer.conn.recv(100)
        received.append(data)
        peer.send("RECEIPT", {"receipt-id": "done"})
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        client = Client(host, port, heartbeat=(50, 0))
        client.connect()
        client.wait_receipt("done", timeout=5)
        client.close()
    assert received[0] == "50,0"
    assert set(received[1]) == {ord("\n")}


def test_no_heartbeats_when_server_declines():
    received = []

    def script(peer):
        peer.handshake(heart_beat="0,0")
        peer.conn.settimeout(0.3)
        try:
            received.append(peer.conn.recv(100))
        except TimeoutError:
            received.append(b"")
        peer.send("RECEIPT", {"receipt-id": "done"})
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        client = Client(host, port, heartbeat=(50, 0))
        client.connect()
        client.wait_receipt("done", timeout=5)
        client.close()
    assert received == [b""]


def test_silent_server_is_taken_as_lost():
    done = threading.Event()

    def script(peer):
        peer.handshake(heart_beat="50,0")
        done.wait(10)

    with scripted_server(script) as (host, port):
        client = Client(host, port, heartbeat=(0, 50))
        client.connect()
        try:
            with pytest.raises(StompError, match="silent"):
                client.receive(timeout=5)
        finally:
            done.set()


def test_server_heartbeats_keep_the_connection_alive():
    def script(peer):
        peer.handshake(heart_beat="100,0")
        for _ in range(15):
            peer.conn.sendall(b"\n")
            time.sleep(0.02)
        peer.send("MESSAGE", {"message-id": "1"}, b"after beats")
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        client = Client(host, port, heartbeat=(0, 100))
        client.connect()
        frame = client.receive(timeout=5)
        assert frame is not None and frame.body == b"after beats"
        client.close()


def test_no_deadlock_when_both_sides_write_a_lot():
    size, count = 1024, 16 * 1024  # 16 MiB each way, more than the socket buffers hold

    def script(peer):
        peer.handshake()
        for n in range(count):
            peer.send("MESSAGE", {"message-id": str(n)}, b"m" * size)
        for _ in range(count):
            frame = peer.read_frame()
        peer.receipt_for(frame)
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            for _ in range(count - 1):
                client.send(b"s" * size)
            client.send(b"s" * size, receipt="all")
            before = client.wait_receipt("all", timeout=30)
            client.close()
    assert [int(frame.headers["message-id"]) for frame in before] == list(range(count))


def test_receive_bytes_returns_the_raw_stream_and_unread_hands_the_rest_back():
    message = encode("MESSAGE", {"message-id": "1"}, b"one")

    def script(peer):
        peer.handshake()
        subscribe = peer.read_frame()
        peer.conn.sendall(message + message[:5])
        peer.read_until_closed()
        assert subscribe.command == "SUBSCRIBE"

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            client.subscribe("sub-1")  # flushed by receive_bytes
            data = client.receive_bytes(timeout=5)
            client.close()
    assert data == message + message[:5]


def test_unread_bytes_are_parsed_before_the_socket():
    message = encode("MESSAGE", {"message-id": "2"}, b"two")

    def script(peer):
        peer.handshake()
        peer.read_frame()  # sent after the client's unread
        peer.conn.sendall(message[4:])
        peer.read_until_closed()

    with scripted_server(script) as (host, port):
        with Client(host, port) as client:
            client.unread(message[:4])
            client.subscribe("sub-2")
            frame = client.receive(timeout=5)
            with pytest.raises(StompError, match="pending"):
                client.unread(message[:4])
                client.receive_bytes(timeout=0.01)
            client.close()
    assert frame is not None and (frame.command, frame.body) == ("MESSAGE", b"two")
