"""The asyncio side of the broker: one Session per connection, wiring frames to the
queue state machine and the log.

Each session turns frames into calls on the Broker, which owns the queue and the log.
Receipts wait for the log's fsync where the frame changed the log (SEND, ACK, NACK,
DISCONNECT) and keep their order within a connection. Anything a client sends that the
session rules do not allow ends in one ERROR frame and the close of that connection only.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import time
from collections.abc import Callable
from typing import cast

from curb import __version__, payload
from curb.frame import Frame, FrameParser, ProtocolError, encode, escape
from curb.log import Log, QueueFull, Record, TooLarge
from curb.metrics import Metrics
from curb.queue import Queue, QueueError, Subscription

COUNT_DESTINATION = "./count"
TRANSACTIONS = ("BEGIN", "COMMIT", "ABORT")
WRITE_HIGH_WATER = 256 * 1024
COUNT_COALESCE_SECONDS = 0.05
SERVER = f"curb/{__version__}"


class Broker:
    """The one queue and its log, shared by every session."""

    def __init__(self, log: Log, *, prefetch: int = 100, max_frame: int = 16 << 20,
                 heartbeat_ms: int = 10000, metrics: Metrics | None = None,
                 events: Callable[..., None] = lambda *a, **k: None):
        self.log = log
        self.queue: Queue[Session, Record] = Queue(log, default_prefetch=prefetch)
        self.max_frame = max_frame
        self.heartbeat_ms = heartbeat_ms
        self.metrics = metrics or Metrics()
        self.events = events
        self.sessions: set[Session] = set()
        self.counters: set[Session] = set()
        self._count_scheduled = False
        self._pumping = False
        self._dirty: list[Session] = []
        log.on_written = self.pump
        log.on_answered = self._flush_out

    def pump(self) -> None:
        """Hand out every message that some subscription has credit for."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while True:
                batch = self.queue.deliver()
                if not batch:
                    break
                for sub, rec in batch:
                    sub.conn.send_message(sub, rec)
                    if sub.ack_mode == "auto":
                        self.log.ack(rec)
                self.metrics.delivered += len(batch)
        finally:
            self._pumping = False
        if self.counters:
            self.counts_changed()

    def after_frames(self) -> None:
        """A connection's frames are handled: write them to the log, deliver what can
        be delivered, and send the answers, all in this loop pass."""
        self.log.flush()
        self.pump()
        self._flush_out()

    def want_flush(self, session: Session) -> None:
        """Gather every connection's output of this loop pass into one write each."""
        if not self._dirty:
            asyncio.get_running_loop().call_soon(self._flush_out)
        self._dirty.append(session)

    def _flush_out(self) -> None:
        dirty, self._dirty = self._dirty, []
        for session in dirty:
            session.flush_out()

    def counts(self) -> dict[str, int]:
        return {"rdy": self.log.unread + self.queue.redeliver_count,
                "wip": self.queue.wip_count,
                "subscriptions": self.queue.subscription_count}

    def counts_changed(self) -> None:
        """Coalesce count updates for ./count subscribers into one MESSAGE per change."""
        if not self._count_scheduled:
            self._count_scheduled = True
            asyncio.get_running_loop().call_later(COUNT_COALESCE_SECONDS, self._send_counts)

    def _send_counts(self) -> None:
        self._count_scheduled = False
        counts = self.counts()
        for session in list(self.counters):
            session.send_counts(counts)

    def gauges(self) -> dict[str, int]:
        counts = self.counts()
        return {"rdy": counts["rdy"], "wip": counts["wip"], "connections": len(self.sessions),
                "subscriptions": counts["subscriptions"], "log_bytes": self.log.file_bytes,
                "live_bytes": self.log.live_bytes, "cap": self.log.end}

    def requeue(self, records: list[Record]) -> None:
        for rec in records:
            self.log.requeue(rec)


class Session(asyncio.Protocol):
    """One STOMP connection: the session rules from CONNECT to DISCONNECT."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.transport: asyncio.Transport  # set by connection_made, before any other call
        self.peer = "?"
        self.parser = FrameParser(max_frame_bytes=broker.max_frame)
        self.connected = False
        self.closing = False
        self.owed: collections.deque[list] = collections.deque()
        self.out: list[bytes] = []
        self.count_sub: tuple[str, int] | None = None
        self.last_counts: dict[str, int] | None = None
        self.prefixes: dict[Subscription[Session, Record], bytes] = {}
        self.last_recv = self.last_send = time.monotonic()
        self.send_every = self.expect_every = 0.0
        self._heartbeat: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server (create_server) hands its protocols a Transport.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "local")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.broker.sessions.add(self)
        self.broker.metrics.connections_total += 1

    def connection_lost(self, exc: Exception | None) -> None:
        broker = self.broker
        self.closing = True
        broker.sessions.discard(self)
        broker.counters.discard(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        broker.requeue(broker.queue.close(self))
        broker.pump()

    def pause_writing(self) -> None:
        self.broker.queue.set_writable(self, False)

    def resume_writing(self) -> None:
        self.broker.queue.set_writable(self, True)
        self.broker.pump()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_recv = time.monotonic()
        try:
            frames = self.parser.feed(data)
        except ProtocolError as err:
            self.error(str(err), "The bytes received are not a valid STOMP 1.2 frame.")
            return
        for frame in frames:
            if self.closing:
                break
            self.handle(frame)
        self.broker.after_frames()

    def write(self, data: bytes) -> None:
        """Queue output; it leaves in one send per connection per loop pass."""
        if not self.out:
            self.broker.want_flush(self)
        self.out.append(data)

    def flush_out(self) -> None:
        if self.out:
            if not self.transport.is_closing():
                self.transport.write(b"".join(self.out))
                self.last_send = time.monotonic()
            self.out.clear()

    def close_transport(self) -> None:
        self.flush_out()
        self.transport.close()

    # ---------------------------------------------------------------- frames

    def handle(self, frame: Frame) -> None:
        command = frame.command
        if not self.connected:
            if command in ("CONNECT", "STOMP"):
                self.on_connect(frame)
            else:
                self.error("not connected", f"Send CONNECT (or STOMP) first, not {command}.", frame)
            return
        handler = HANDLERS.get(command)
        if handler is None:
            if command in TRANSACTIONS:
                self.error("transactions are not supported",
                           "Curb does not buffer transactions; send frames without 'transaction'.", frame)
            elif command in ("CONNECT", "STOMP"):
                self.error("already connected", "CONNECT may only be sent once.", frame)
            else:
                self.error(f"unknown command {command[:40]!r}", "Curb speaks STOMP 1.2.", frame)
            return
        try:
            handler(self, frame)
        except QueueError as err:
            self.error(str(err), "", frame)

    def on_connect(self, frame: Frame) -> None:
        versions = frame.headers.get("accept-version", "1.0").split(",")
        if "1.2" not in versions:
            self.write(encode("ERROR", {"version": "1.2", "content-type": "text/plain",
                                        "message": "unsupported protocol version"},
                              b"Curb speaks STOMP 1.2 only; send accept-version:1.2.\n"))
            self.close_after_error("unsupported protocol version")
            return
        cx, cy = _heartbeat_header(frame.headers.get("heart-beat", "0,0"))
        if cx is None:
            self.error("bad heart-beat header", "heart-beat must be two comma-separated integers.", frame)
            return
        ours = self.broker.heartbeat_ms
        send_ms = max(ours, cy) if ours and cy else 0
        recv_ms = max(ours, cx) if ours and cx else 0
        self.connected = True
        self.write(encode("CONNECTED", {"version": "1.2", "server": SERVER,
                                        "heart-beat": f"{ours},{ours}", "session": str(id(self))}))
        self.send_every = send_ms / 1000
        self.expect_every = recv_ms / 1000
        if self.send_every or self.expect_every:
            self._schedule_heartbeat()

    def on_send(self, frame: Frame) -> None:
        headers = frame.headers
        broker = self.broker
        try:
            broker.log.append(payload.encode(headers, frame.body), self.stored(frame), urgent="receipt" in headers)
        except TooLarge as err:
            broker.metrics.refused_too_large += 1
            self.error("message too large", str(err), frame)
            return
        except QueueFull as err:
            broker.metrics.refused_full += 1
            self.error("queue full", str(err), frame)
            return
        broker.metrics.sent += 1
        if broker.counters:
            broker.counts_changed()

    def stored(self, frame: Frame) -> Callable[[str | None], None]:
        """The log's answer for one SEND: its RECEIPT once fsynced, or an ERROR if it
        was not stored after all."""
        receipt = frame.headers.get("receipt")
        entry = self.owe() if receipt is not None else None

        def done(err: str | None) -> None:
            if err is not None:
                self.error("message not stored", err, receipt=receipt)
            elif entry is not None and receipt is not None:  # both, or neither
                self.settle(entry, _receipt(receipt))

        return done

    def on_subscribe(self, frame: Frame) -> None:
        headers = frame.headers
        sub_id = headers.get("id")
        if sub_id is None:
            raise QueueError("SUBSCRIBE needs an id header")
        if headers.get("destination") == COUNT_DESTINATION:
            self.count_sub = (sub_id, 0)
            self.last_counts = None
            self.broker.counters.add(self)
            self.send_counts(self.broker.counts())
        else:
            prefetch = _prefetch(headers)
            sub = self.broker.queue.subscribe(self, sub_id, headers.get("ack", "auto"), prefetch)
            self.prefixes[sub] = b"MESSAGE\nsubscription:%s\ndestination:%s\n" % (
                escape(sub_id).encode(), escape(headers.get("destination", "/queue/curb")).encode())
        self.receipt(frame)

    def on_unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.headers.get("id")
        if sub_id is None:
            raise QueueError("UNSUBSCRIBE needs an id header")
        if self.count_sub is not None and self.count_sub[0] == sub_id:
            self.count_sub = None
            self.broker.counters.discard(self)
        else:
            self.broker.queue.unsubscribe(self, sub_id)
        self.receipt(frame)

    def on_ack(self, frame: Frame) -> None:
        broker = self.broker
        msg_id = self.ack_id(frame)
        if msg_id is not None:
            for rec in broker.queue.ack(self, msg_id):
                broker.log.ack(rec)
                broker.metrics.acked += 1
        self.receipt(frame, durable=True)

    def on_nack(self, frame: Frame) -> None:
        broker = self.broker
        msg_id = self.ack_id(frame)
        if msg_id is not None:
            records = broker.queue.nack(self, msg_id)
            broker.metrics.nacked += len(records)
            broker.requeue(records)
        self.receipt(frame, durable=True)

    def on_disconnect(self, frame: Frame) -> None:
        self.closing = True
        receipt = frame.headers.get("receipt")
        if receipt is None:
            self.close_transport()
            return
        entry = self.owe()
        def answer(err: str | None) -> None:
            if err is None:
                self.settle(entry, _receipt(receipt), self.close_transport)
            else:
                self.close_transport()

        self.broker.log.on_durable(answer)

    def ack_id(self, frame: Frame) -> int | None:
        """The message an ACK or NACK names; None for a ./count update, which needs none."""
        raw = frame.headers.get("id")
        if raw is None:
            raise QueueError(f"{frame.command} needs an id header")
        if raw.startswith("count-") and self.count_sub is not None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise QueueError(f"unknown ack id {raw[:40]!r}") from None

    def receipt(self, frame: Frame, durable: bool = False) -> None:
        """Answer a frame's receipt header: once the frame's effect is on disk when it
        changed the log, else at once; either way after the receipts owed before it."""
        receipt = frame.headers.get("receipt")
        if receipt is None:
            return
        entry = self.owe()
        if durable:
            def answer(err: str | None) -> None:
                if err is None:
                    self.settle(entry, _receipt(receipt))

            self.broker.log.on_durable(answer)
        else:
            self.settle(entry, _receipt(receipt))

    def owe(self) -> list:
        """A place in this connection's line of receipts, filled in by settle()."""
        entry = [None, None]
        self.owed.append(entry)
        return entry

    def settle(self, entry: list, data: bytes, then: Callable[[], None] | None = None) -> None:
        """Fill in an owed receipt and send every receipt that is now at the front of
        the line, so that receipts leave in the order their frames came."""
        entry[0], entry[1] = data, then
        owed = self.owed
        while owed and owed[0][0] is not None:
            data, then = owed.popleft()
            self.write(data)
            if then is not None:
                then()

    # ---------------------------------------------------------------- output

    def send_message(self, sub: Subscription[Session, Record], rec: Record) -> None:
        stored, body = payload.split(self.broker.log.payload(rec))
        extra = b"redelivered:true\ncurb-deliveries:%d\n" % rec.deliveries if rec.deliveries > 1 else b""
        if rec.deliveries > 1:
            self.broker.metrics.redelivered += 1
        ack = b"" if sub.ack_mode == "auto" else b"ack:%d\n" % rec.id
        self.write(b"%smessage-id:%d\n%s%s%scontent-length:%d\n\n%s\0" % (
            self.prefixes[sub], rec.id, ack, extra, stored, len(body), body))

    def send_counts(self, counts: dict[str, int]) -> None:
        if self.count_sub is None or counts == self.last_counts:
            return
        sub_id, n = self.count_sub
        self.count_sub = (sub_id, n + 1)
        self.last_counts = counts
        body = json.dumps(counts).encode()
        self.write(encode("MESSAGE", {"subscription": sub_id, "message-id": f"count-{n + 1}",
                                      "destination": COUNT_DESTINATION, "content-type": "application/json",
                                      "rdy": str(counts["rdy"]), "wip": str(counts["wip"])}, body))

    def error(self, message: str, detail: str, frame: Frame | None = None, receipt: str | None = None) -> None:
        """Send one ERROR frame and close this connection (STOMP 1.2 section ERROR)."""
        if self.closing and self.transport.is_closing():
            return
        headers = {"message": message, "content-type": "text/plain"}
        receipt = receipt if receipt is not None else (frame.headers.get("receipt") if frame else None)
        if receipt is not None:
            headers["receipt-id"] = receipt
        self.write(encode("ERROR", headers, (detail + "\n").encode() if detail else b""))
        self.close_after_error(message)

    def close_after_error(self, reason: str) -> None:
        self.broker.metrics.protocol_errors += 1
        self.broker.events("client_error", f"client error from {self.peer}: {reason}",
                           peer=self.peer, reason=reason)
        self.closing = True
        self.close_transport()

    # ---------------------------------------------------------------- heart-beats

    def _schedule_heartbeat(self) -> None:
        every = min(x for x in (self.send_every, self.expect_every) if x)
        self._heartbeat = asyncio.get_running_loop().call_later(every / 2, self._beat)

    def _beat(self) -> None:
        now = time.monotonic()
        if self.expect_every and now - self.last_recv > _tolerance(self.expect_every):
            self.broker.events("heartbeat_timeout", f"no heart-beat from {self.peer}; closing",
                               peer=self.peer)
            self.closing = True
            self.transport.abort()
            return
        if self.send_every and now - self.last_send >= self.send_every * 0.9:
            self.write(b"\n")
        self._schedule_heartbeat()


HANDLERS: dict[str, Callable[[Session, Frame], None]] = {
    "SEND": Session.on_send,
    "SUBSCRIBE": Session.on_subscribe,
    "UNSUBSCRIBE": Session.on_unsubscribe,
    "ACK": Session.on_ack,
    "NACK": Session.on_nack,
    "DISCONNECT": Session.on_disconnect,
}


def _receipt(receipt_id: str) -> bytes:
    return b"RECEIPT\nreceipt-id:%s\n\n\0" % escape(receipt_id).encode()


def _tolerance(every: float) -> float:
    """How long a peer may stay silent: twice its interval, and at least a second more,
    since networks and busy clients are late."""
    return max(2 * every, every + 1.0)


def _heartbeat_header(value: str) -> tuple[int | None, int]:
    try:
        cx, cy = (int(x) for x in value.split(","))
    except ValueError:
        return None, 0
    if cx < 0 or cy < 0:
        return None, 0
    return cx, cy


def _prefetch(headers: dict[str, str]) -> int | None:
    raw = headers.get("prefetch-count", headers.get("activemq.prefetchSize"))
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise QueueError(f"bad prefetch {raw[:40]!r}: use a positive integer") from None
    if value < 1:
        raise QueueError(f"bad prefetch {value}: use a positive integer")
    return value
