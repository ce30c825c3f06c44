"""A small blocking STOMP 1.2 client over `curb.frame`, for the Spark connector, the benchmark and tests.

One thread per client. Writes are buffered and flushed before every blocking read (and
whenever 64 KiB pile up), so a caller can pipeline many SENDs; while flushing, the client
keeps reading, so a server that answers while we write cannot deadlock us. Heart-beats,
when negotiated, go out while we are blocked in a read; a server silent for twice its
heart-beat period is taken as lost.
"""

from __future__ import annotations

import math
import select
import socket
import time
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import NoReturn, overload

from curb import heartbeat
from curb.frame import HEARTBEAT, Frame, FrameParser, ProtocolError, encode

DEFAULT_DESTINATION = "/queue/curb"
BROWSE_END = "browse-end"  # the message-id of a browse's end marker
_FLUSH_AT = 64 * 1024
_READ_SIZE = 64 * 1024
_READABLE = select.POLLIN


class StompError(Exception):
    """The server sent an ERROR frame (kept in `frame`) or the connection was lost (`frame` is None)."""

    def __init__(self, reason: str, frame: Frame | None = None):
        super().__init__(reason)
        self.frame = frame


class Client:
    """Blocking STOMP 1.2 connection; `with Client(...) as c:` connects, and disconnects on exit."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        login: str | None = None,
        passcode: str | None = None,
        heartbeat: tuple[int, int] = (0, 0),
        timeout: float = 30.0,
        virtual_host: str | None = None,
        max_frame_bytes: int | None = None,
    ):
        self.host = host
        self.port = port
        self.login = login
        self.passcode = passcode
        self.heartbeat = heartbeat  # (ms we can send at, ms we want to hear at), as in CONNECT
        self.timeout = timeout  # seconds for connecting, for a stalled send and for receipts
        self.virtual_host = virtual_host  # CONNECT's `host` header (RabbitMQ's vhost); default: `host`
        self._sock: socket.socket | None = None
        self._poll: select.poll | None = None  # poll(2) rather than selectors: less work per wait
        self._parser = FrameParser()
        if max_frame_bytes is not None:  # the largest frame we accept from the server
            self._parser.max_frame_bytes = max_frame_bytes
        self._out = bytearray()
        self._inbox: deque[Frame] = deque()
        self._send_every = 0.0  # negotiated heart-beat periods in seconds, 0 for none
        self._expect_every = 0.0
        self._last_sent = 0.0
        self._last_received = 0.0
        self.last_browsed = 0  # the curb-last-id of the last browse's end marker

    def __enter__(self) -> Client:
        if self._sock is None:
            self.connect()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None and self._sock is not None:
            self.disconnect()
        else:
            self.close()

    def connect(self) -> Frame:
        """Open the connection and log in (a STOMP frame asking for 1.2); return the CONNECTED frame."""
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, _READABLE)
        self._last_sent = self._last_received = time.monotonic()
        sends, wants = self.heartbeat
        host = self.host if self.virtual_host is None else self.virtual_host
        headers = {"accept-version": "1.2", "host": host, "heart-beat": f"{sends},{wants}"}
        if self.login is not None:
            headers["login"] = self.login
        if self.passcode is not None:
            headers["passcode"] = self.passcode
        self._write(encode("STOMP", headers))
        frame = self._next_frame(time.monotonic() + self.timeout)
        if frame is None:
            self.close()
            raise StompError(f"no CONNECTED within {self.timeout}s")
        if frame.command != "CONNECTED":
            self.close()
            raise StompError(f"expected CONNECTED, got {frame.command}", frame)
        self._negotiate_heartbeat(frame.headers.get("heart-beat", "0,0"))
        return frame

    def send(
        self,
        body: bytes,
        headers: dict[str, str] | None = None,
        receipt: str | None = None,
        destination: str = DEFAULT_DESTINATION,
    ) -> None:
        """Queue a SEND (flushed before the next blocking read)."""
        frame_headers = {"destination": destination, **(headers or {})}
        if receipt is not None:
            frame_headers["receipt"] = receipt
        self._write(encode("SEND", frame_headers, body))

    def write(self, frame: bytes) -> None:
        """Queue a frame encoded by the caller (`curb.frame.encode`): a load generator encodes
        its SENDs before the clock starts and pipelines them at no further cost."""
        self._write(frame)

    def subscribe(
        self,
        sub_id: str = "0",
        destination: str = DEFAULT_DESTINATION,
        ack: str = "client-individual",
        prefetch: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Queue a SUBSCRIBE; `prefetch` becomes the `prefetch-count` header."""
        frame_headers = {"id": sub_id, "destination": destination, "ack": ack}
        if prefetch is not None:
            frame_headers["prefetch-count"] = str(prefetch)
        self._write(encode("SUBSCRIBE", {**frame_headers, **(headers or {})}))

    def unsubscribe(self, sub_id: str = "0") -> None:
        self._write(encode("UNSUBSCRIBE", {"id": sub_id}))

    def ack(self, ack_id: str, receipt: str | None = None) -> None:
        self._write(encode("ACK", _with_receipt({"id": ack_id}, receipt)))

    def nack(self, ack_id: str, receipt: str | None = None) -> None:
        self._write(encode("NACK", _with_receipt({"id": ack_id}, receipt)))

    def ack_upto(self, upto: int, receipt: str | None = None, destination: str | None = None) -> None:
        """ACK every message with an id up to `upto`, on every connection (curb-upto);
        through `curb router`, of the routed `destination`."""
        headers = (
            {"curb-upto": str(upto)} if destination is None else {"curb-upto": str(upto), "destination": destination}
        )
        self._write(encode("ACK", _with_receipt(headers, receipt)))

    def browse(
        self,
        from_id: int | None = None,
        to_id: int | None = None,
        sub_id: str = "browse",
        destination: str = DEFAULT_DESTINATION,
    ) -> Iterator[Frame]:
        """Read the live messages with ids in [from_id, to_id] without changing them
        (SUBSCRIBE browser:true): yield each MESSAGE, in the log's order, until the end
        marker, whose `curb-last-id` is then in `last_browsed`. Frames of other
        subscriptions that arrive meanwhile are kept for `receive`. StompError if no
        frame comes for the client's timeout."""
        headers = {"id": sub_id, "destination": destination, "browser": "true"}
        if from_id is not None:
            headers["curb-from-id"] = str(from_id)
        if to_id is not None:
            headers["curb-to-id"] = str(to_id)
        self._write(encode("SUBSCRIBE", headers))
        aside: list[Frame] = []
        try:
            while True:
                frame = self._next_frame(time.monotonic() + self.timeout)
                if frame is None:
                    raise StompError(f"browse {sub_id!r}: nothing for {self.timeout}s")
                if frame.command != "MESSAGE" or frame.headers.get("subscription") != sub_id:
                    aside.append(frame)
                elif frame.headers.get("browser") == "end":
                    self.last_browsed = int(frame.headers["curb-last-id"])
                    return
                else:
                    yield frame
        finally:
            self._inbox.extendleft(reversed(aside))

    def last_id(self, destination: str = DEFAULT_DESTINATION) -> int:
        """The highest message id on disk (fsynced): a browse of an empty range."""
        for _ in self.browse(from_id=1 << 62, destination=destination, sub_id="last-id"):
            pass
        return self.last_browsed

    @overload
    def receive(self, timeout: None = None) -> Frame: ...
    @overload
    def receive(self, timeout: float) -> Frame | None: ...

    def receive(self, timeout: float | None = None) -> Frame | None:
        """The next frame from the server (MESSAGE, RECEIPT, ...), or None after `timeout`
        seconds (None: wait as long as it takes). Raises StompError on ERROR or a lost connection."""
        return self._next_frame(None if timeout is None else time.monotonic() + timeout)

    def receive_bytes(self, timeout: float) -> bytes:
        """The next bytes from the server, unparsed (b"" if none come within `timeout` seconds),
        for a caller that parses a fast stream itself at less cost per frame (the benchmark's
        load). Buffered writes go out first. Only between frames, and without heart-beat duties:
        bytes the caller leaves unparsed go back through `unread` before `receive` is used again."""
        if self.holds_input:
            raise StompError("parsed frames are pending: receive() them first")
        _, poll = self._connection()
        self.flush()
        deadline = time.monotonic() + timeout
        while True:
            wait = deadline - time.monotonic()
            if wait < 0 or not poll.poll(_millis(wait)):
                return b""
            data = self._recv()
            if data:
                return data

    @property
    def holds_input(self) -> bool:
        """Whether frames (or the start of one) read from the server wait for `receive`:
        a send that waits for the socket reads meanwhile, so that neither side stalls."""
        return bool(self._inbox or self._parser.buffered)

    def unread(self, data: bytes) -> None:
        """Hand back bytes from `receive_bytes` that the caller did not parse (the start of a
        frame cut by the read): `receive` parses them first."""
        self._take(data)

    def wait_receipt(self, receipt_id: str, timeout: float | None = None) -> list[Frame]:
        """Block until the RECEIPT for `receipt_id` arrives (at most `timeout` seconds, default
        the client's timeout, else StompError); return the frames that arrived before it, in order."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        before: list[Frame] = []
        while True:
            frame = self._next_frame(deadline)
            if frame is None:
                raise StompError(f"no RECEIPT for {receipt_id!r} within {wait}s")
            if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt_id:
                return before
            before.append(frame)

    def disconnect(self, timeout: float = 5.0) -> None:
        """DISCONNECT with a receipt, wait for it (frames arriving meanwhile are dropped), close."""
        try:
            self._write(encode("DISCONNECT", {"receipt": "disconnect"}))
            self.wait_receipt("disconnect", timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Drop the connection without DISCONNECT (the server redelivers unacked messages)."""
        self._poll = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._out.clear()

    def flush(self) -> None:
        """Send everything buffered, reading (and queueing) incoming frames meanwhile."""
        sock, poll = self._connection()
        if not self._out:
            return
        # Usually the socket takes it all at once: one system call, no poll round trip.
        try:
            sent = sock.send(self._out)
        except OSError:  # full, or gone: the loop below reads first, to report an ERROR frame
            sent = 0
        if sent:
            del self._out[:sent]
            self._last_sent = time.monotonic()
        if self._out:
            self._send_as_writable(sock, poll)

    def _send_as_writable(self, sock: socket.socket, poll: select.poll) -> None:
        """Send the rest as the socket becomes writable, reading what comes meanwhile;
        StompError once nothing could be sent for `timeout` seconds."""
        poll.modify(sock, _READABLE | select.POLLOUT)
        try:
            stalled_at = time.monotonic() + self.timeout
            while self._out:
                events = poll.poll(_millis(stalled_at - time.monotonic()))
                if not events:
                    self._lost(f"send stalled for {self.timeout}s")
                for _, mask in events:
                    if mask & ~select.POLLOUT:  # readable, closed or failed: reading tells which
                        self._read()
                    if mask & ~select.POLLIN:
                        stalled_at = self._send_some(sock, stalled_at)
        finally:
            if self._poll is not None:
                poll.modify(sock, _READABLE)

    def _send_some(self, sock: socket.socket, stalled_at: float) -> float:
        """Send what the writable socket takes; return the time past which sending has stalled:
        `timeout` seconds after it took some, still `stalled_at` if it took none."""
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return stalled_at
        except OSError as err:
            self._lost(f"connection lost: {err}")
        del self._out[:sent]
        self._last_sent = time.monotonic()
        return self._last_sent + self.timeout

    def _write(self, data: bytes) -> None:
        if self._sock is None:
            raise StompError("not connected")
        self._out += data
        if len(self._out) >= _FLUSH_AT:
            self.flush()

    def _next_frame(self, deadline: float | None) -> Frame | None:
        """The next frame (ERROR raises), or None once the monotonic deadline passes. Buffered
        writes go out before the client waits, not before it hands over a frame it already has:
        a consumer's ACKs for a burst of MESSAGEs then leave in one system call."""
        _, poll = self._connection()
        while not self._inbox:
            self.flush()
            now = time.monotonic()
            if self._expect_every and now - self._last_received > 2 * self._expect_every:
                self._lost(f"server silent for {now - self._last_received:.1f}s")
            if self._send_every and now - self._last_sent >= self._send_every:
                self._out += HEARTBEAT
                self.flush()
            if deadline is not None and now >= deadline:
                return None
            if self._send_every or self._expect_every:
                wait = self._until_next_duty(now, deadline)
            else:
                wait = None if deadline is None else deadline - now
            if poll.poll(None if wait is None else _millis(wait)):
                self._read()
        frame = self._inbox.popleft()
        if frame.command == "ERROR":
            self.close()
            raise StompError(error_reason(frame), frame)
        return frame

    def _until_next_duty(self, now: float, deadline: float | None) -> float | None:
        """Seconds until the deadline or the next heart-beat to send or check (None: no limit)."""
        times = [] if deadline is None else [deadline]
        if self._send_every:
            times.append(self._last_sent + self._send_every)
        if self._expect_every:
            times.append(self._last_received + 2 * self._expect_every)
        return max(0.0, min(times) - now) if times else None

    def _read(self) -> None:
        """Read what the socket has and queue the complete frames."""
        self._take(self._recv())

    def _recv(self) -> bytes:
        """What the socket has (b"" if nothing after all); a closed or failed connection raises."""
        sock, _ = self._connection()
        try:
            data = sock.recv(_READ_SIZE)
        except BlockingIOError:
            return b""
        except OSError as err:
            self._lost(f"connection lost: {err}")
        if not data:
            self._lost("connection closed by the server")
        self._last_received = time.monotonic()
        return data

    def _take(self, data: bytes) -> None:
        """Parse received bytes and queue the complete frames."""
        try:
            self._inbox.extend(self._parser.feed(data))
        except ProtocolError as err:
            self._lost(f"bad frame from the server: {err}")

    def _lost(self, reason: str) -> NoReturn:
        """Close and raise: with the server's ERROR frame if one is queued, else with `reason`."""
        self.close()
        error = next((frame for frame in self._inbox if frame.command == "ERROR"), None)
        if error is not None:
            raise StompError(error_reason(error), error)
        raise StompError(reason)

    def _connection(self) -> tuple[socket.socket, select.poll]:
        if self._sock is None or self._poll is None:
            raise StompError("not connected")
        return self._sock, self._poll

    def _negotiate_heartbeat(self, server_heartbeat: str) -> None:
        """Heart-beat periods as STOMP 1.2 negotiates them from CONNECT's and CONNECTED's headers."""
        try:
            theirs = heartbeat.parse(server_heartbeat)
        except ValueError:
            self._lost(f"bad heart-beat header from the server: {server_heartbeat!r}")
        self._send_every, self._expect_every = heartbeat.negotiate(self.heartbeat, theirs)


def _millis(seconds: float) -> int:
    """A poll(2) timeout: whole milliseconds, rounded up so a wait never ends early."""
    return max(0, math.ceil(seconds * 1000))


def _with_receipt(headers: dict[str, str], receipt: str | None) -> dict[str, str]:
    if receipt is not None:
        headers["receipt"] = receipt
    return headers


def error_reason(frame: Frame) -> str:
    """An ERROR frame as one line: its message header and, if any, its body."""
    detail = frame.body.decode(errors="replace").strip()
    message = frame.headers.get("message", "ERROR")
    return f"{message}: {detail}" if detail else message
