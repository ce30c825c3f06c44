"""A bare STOMP 1.2 connection for load generation, on Curb's own frame codec.

Frames to send are appended to a buffer and go out in one system call when the
connection next has to wait for the broker, so a load process can pipeline hundreds of
pre-encoded frames without a client library in the way.
"""

from __future__ import annotations

import socket
from collections import deque
from dataclasses import dataclass
from typing import overload

from curb.frame import Frame, FrameParser, encode

RECV_BYTES = 1 << 20


class BrokerError(Exception):
    """The broker answered with an ERROR frame, closed the connection or fell silent."""


@dataclass(frozen=True)
class Target:
    """Where a broker listens and what its STOMP dialect needs (headers, credentials)."""
    host: str
    port: int
    dest: str = "/queue/bench"
    send_headers: tuple[tuple[str, str], ...] = ()
    sub_headers: tuple[tuple[str, str], ...] = ()
    prefetch_header: str = "prefetch-count"
    login: str | None = None
    passcode: str | None = None

    def send_frame(self, body: bytes, receipt: str | None = None) -> bytes:
        headers = [("destination", self.dest), *self.send_headers]
        if receipt is not None:
            headers.append(("receipt", receipt))
        return encode("SEND", headers, body)


class Connection:
    """One blocking STOMP connection: write() buffers, next_frame() flushes and reads."""

    def __init__(self, target: Target, timeout: float, max_body: int = 0):
        self.target = target
        self.timeout = timeout
        self._sock = socket.create_connection((target.host, target.port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._parser = FrameParser()
        self._parser.max_frame_bytes = max(self._parser.max_frame_bytes, 2 * max_body)
        self._frames: deque[Frame] = deque()
        self._out = bytearray()
        self._wait = timeout
        headers = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}
        if target.login is not None:
            headers["login"] = target.login
        if target.passcode is not None:
            headers["passcode"] = target.passcode
        self.write(encode("CONNECT", headers))
        frame = self.next_frame()
        if frame is None or frame.command != "CONNECTED":
            raise BrokerError(f"CONNECT to {target.host}:{target.port} got {frame and frame.command} "
                              "instead of CONNECTED")
        self.server = frame.headers.get("server", "")

    def write(self, data: bytes) -> None:
        self._out += data

    def flush(self) -> None:
        if self._out:
            self._sock.sendall(self._out)
            self._out.clear()

    @overload
    def next_frame(self, wait: None = None) -> Frame: ...
    @overload
    def next_frame(self, wait: float) -> Frame | None: ...

    def next_frame(self, wait: float | None = None) -> Frame | None:
        """The next frame; None if `wait` seconds pass without one (default: the connection's
        timeout, which raises instead). Buffered writes are flushed before blocking."""
        frames = self._frames
        while not frames:
            self.flush()
            limit = self.timeout if wait is None else wait
            if limit != self._wait:
                self._sock.settimeout(limit)
                self._wait = limit
            try:
                data = self._sock.recv(RECV_BYTES)
            except TimeoutError:
                if wait is None:
                    raise BrokerError(f"no frame from the broker for {self.timeout:g} s") from None
                return None
            if not data:
                raise BrokerError("the broker closed the connection")
            frames.extend(self._parser.feed(data))
        frame = frames.popleft()
        if frame.command == "ERROR":
            detail = bytes(frame.body).decode(errors="replace").strip()
            raise BrokerError(f"ERROR from the broker: {frame.headers.get('message', '')} {detail}".strip())
        return frame

    def subscribe(self, prefetch: int | None, sub_id: str = "0", ack: str = "client-individual") -> None:
        headers = {"id": sub_id, "destination": self.target.dest, "ack": ack}
        if prefetch is not None:
            headers[self.target.prefetch_header] = str(prefetch)
        headers.update(self.target.sub_headers)
        self.write(encode("SUBSCRIBE", headers))

    def ack(self, message: Frame, receipt: str | None = None) -> None:
        """Queue the ACK of a MESSAGE (STOMP 1.2 `ack` header, else its message-id)."""
        headers = message.headers
        ack_id = headers.get("ack") or headers["message-id"]
        self.write(encode("ACK", {"id": ack_id, "receipt": receipt} if receipt else {"id": ack_id}))

    def wait_receipt(self, receipt: str, on_frame=None) -> None:
        """Block until RECEIPT `receipt`; other frames meanwhile go to on_frame (or are an error)."""
        while True:
            frame = self.next_frame()
            if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt:
                return
            if on_frame is None:
                raise BrokerError(f"unexpected {frame.command} while waiting for receipt {receipt}")
            on_frame(frame)

    def close(self, on_frame=None) -> None:
        """DISCONNECT with a receipt, so that every frame written before it has taken effect."""
        try:
            self.write(encode("DISCONNECT", {"receipt": "bye"}))
            self.wait_receipt("bye", on_frame)
        finally:
            self._sock.close()
