"""One STOMP 1.2 connection, sans I/O: bytes in, bytes out, events for the transport.

The transport (curb.driver) feeds received bytes to `receive_data(data, now)`, is told
through `on_output` that output waits, takes it with `next_output(now)` while it can
write, or whole frame by frame with `next_frame(now)` for a session made framed
(WebSocket; all at once: `frames_to_send(now)`, websockets' shape), and reads the events
`close_wanted` (close once the output is written, or abort), `reading` (False: stop
reading this peer) and `next_deadline` (when to call `tick(now)`, curb.deadlines). The
session keeps no clock, no socket and no event loop.

It holds a connection's state and ties its units together: what each frame does is
curb.commands, who may do it curb.access, the order of its answers curb.receipts, the
bytes of its MESSAGEs curb.render, its unsent output curb.output, its timers
curb.deadlines.

Rules kept here:
- What ends a connection (an ERROR, a DISCONNECT's RECEIPT, a shutdown's close) takes
  the receipt line's last place; from then on the session handles no frame, reads
  nothing and gets no message (`_stop`), and it closes only once that place is written.
  Frames after it are dropped unread. Only the first ERROR of a connection is sent, and
  every ERROR has a body that says what happened and what to do (`error` refuses an
  empty one; QueueError and Refused carry theirs).
- Output is bounded by bytes: while OUTPUT_LIMIT bytes or more wait unsent, or the
  transport can take nothing now (`set_writable(False)`), the broker makes no more
  messages for the peer; while OUTPUT_LIMIT bytes or more wait, none of the peer's frames
  are read. So what waits for a connection is at most OUTPUT_LIMIT plus one frame,
  whatever the message size or the prefetch.
- An `ack:auto` message is done only once its frame is handed to the transport; one the
  transport never took is rdy again when the connection goes.
- The queue is reached only through the backend (curb.backend): an instance's Broker, or
  a router's core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from curb import access, deadlines, message_limits, render
from curb.commands import RULES, UNPARSABLE, unexpected, unparsable
from curb.conn import CLOSING, NEW, Beats, Login
from curb.frame import Frame, FrameParser, ProtocolError
from curb.output import Output, Piece
from curb.queue_errors import QueueError
from curb.receipts import Owed, ReceiptLine
from curb.refused import Refused
from curb.transaction_rules import TRANSACTION_RULES
from curb.transactions import Transactions

if TYPE_CHECKING:
    from curb.backend import Backend
    from curb.log.cursor import Record


# Unsent output per connection past which the broker makes no more for it and reads none
# of its frames (docs/guide.md: Limits).
OUTPUT_LIMIT = 256 * 1024


class Session:
    """One STOMP connection from CONNECT to close, with no I/O of its own."""

    def __init__(self, broker: Backend, now: float, peer: str = "?", identity: str | None = None, framed: bool = False):
        self.broker = broker
        self.peer = peer
        self.identity = identity  # the CN of a verified client certificate
        self.user: str | None = None
        self.login = Login()
        self.state = NEW
        self.opened_at = now
        self.parser = FrameParser(
            max_frame_bytes=broker.config.max_frame,
            max_body_bytes=max(0, min(broker.max_message, broker.config.max_frame - message_limits.RESERVE)),
        )
        # Events for the transport.
        self.close_wanted: str | None = None  # "close" once the output is written, or "abort"
        self.reading = True
        self.on_output: Callable[[], None] = lambda: None  # the transport's hook: output waits
        self.writable = True
        self.stopped = False  # shutdown: read nothing more
        self.gone = False
        self._out: Output[Record] = Output(framed)
        self._transport_ok = True  # the transport can take output now
        self._woken = False
        self.line = ReceiptLine(self.write, broker.durability(self), self.error)
        budget = broker.transactions
        self.rules = RULES if budget is None else TRANSACTION_RULES
        self.transactions = None if budget is None else Transactions(budget)
        self._erring = False  # an ERROR is in the line
        self.messages = render.Messages(broker, self, self.write, self._out)
        self.deliver = self.messages.deliver  # the broker's hottest call, without a hop
        self.send_counts = self.messages.send_counts
        self.browse_more = self.messages.browse_more
        self.beats = Beats(now)
        self.deadlines = 0  # changes whenever next_deadline may have come sooner
        broker.join(self)

    # ---------------------------------------------------------------- the transport's calls

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the peer: handle every frame they complete."""
        if self.state is CLOSING or self.gone:
            return
        self.beats.last_recv = now
        bad: ProtocolError | None = None
        try:
            frames = self.parser.feed(data)
        except ProtocolError as err:
            bad, frames = err, err.frames
        broker = self.broker
        broker.passes.before_frames()
        try:
            for frame in frames:
                if self.state is CLOSING:
                    break
                self.handle(frame)
            if bad is not None and self.state is not CLOSING:
                if self.login.held is not None:  # its ERROR waits behind the frames held for the login
                    receipt = {} if bad.receipt is None else {"receipt": bad.receipt}
                    self.login.held.append(Frame(UNPARSABLE, {"message": str(bad), **receipt}))
                else:
                    unparsable(self, str(bad), bad.receipt)
        finally:
            broker.passes.after_frames()

    def output_due(self) -> None:
        """The broker tells the transport that output or an event waits (`on_output`)."""
        self._woken = False
        self.on_output()

    def next_output(self, now: float) -> Piece | None:
        """The next piece of output to write (curb.output), or None when there is none."""
        return self._took(self._out.next_piece(), now)

    def next_frame(self, now: float) -> Piece | None:
        """The next whole frame of output (framed=True), or None when there is none."""
        return self._took(self._out.next_frame(), now)

    def _took(self, piece: Piece | None, now: float) -> Piece | None:
        """`piece` went to the transport: auto-acked messages in it are done, and the flow
        may open again."""
        if piece is None:
            return None
        self.beats.last_send = now
        out = self._out
        done = out.handed()
        if done:
            self.broker.handed_off(self, done)
        if not self.writable and out.made - out.taken < OUTPUT_LIMIT:
            self._flow()
        return piece

    def data_to_send(self, now: float) -> bytes:
        """All of the output at once (a transport that is closing, and tests)."""
        self._woken = False
        return b"".join(iter(lambda: self.next_output(now), None))

    def frames_to_send(self, now: float) -> list[Piece]:
        """All of the output at once as whole frames (framed=True), the shape of the
        websockets library's data_to_send: one WebSocket message each."""
        self._woken = False
        return list(iter(lambda: self.next_frame(now), None))

    @property
    def unsent(self) -> int:
        """Bytes of output queued and not yet handed to the transport."""
        return self._out.unsent

    def discard_output(self) -> None:
        """The transport can take nothing more (it is closing)."""
        self._woken = False
        self._out.discard()

    def set_writable(self, writable: bool) -> None:
        """The transport can take more output now (True) or not (False). While it cannot,
        nothing new is made for this peer; its frames are read until OUTPUT_LIMIT bytes
        wait, since their answers wait here."""
        self._transport_ok = writable
        self._flow()

    def _flow(self) -> None:
        """Recompute `writable` (messages may be made for the peer) and `reading` from the
        transport's state, the bytes waiting and whether the connection is ending; a
        change is told to the broker."""
        room = self._out.unsent < OUTPUT_LIMIT
        going_on = self.state is not CLOSING
        self.reading = room and going_on and not self.stopped and self.login.held is None
        writable = room and going_on and self._transport_ok
        if writable != self.writable:
            self.writable = writable
            self.broker.set_writable(self, writable)
            if writable:
                if self.messages.counts_owed:
                    self.messages.resend_counts()
                self.broker.pump()

    def tick(self, now: float) -> None:
        """A deadline came (curb.deadlines)."""
        if not (self.gone or self.close_wanted):
            deadlines.tick(self, now)

    @property
    def next_deadline(self) -> float | None:
        """When `tick` has something to check, or None while there is nothing to time."""
        return deadlines.next_deadline(self)

    def connection_lost(self) -> None:
        if self.gone:
            return
        self.gone = True
        self.state = CLOSING
        if self.transactions is not None:
            self.transactions.clear()
        self.discard_output()
        self.messages.end_browses()
        self.broker.gone(self)

    # ---------------------------------------------------------------- the broker's calls (Peer)

    @property
    def browsing(self) -> bool:
        return bool(self.messages.browses)

    def stop_reading(self) -> None:
        """Shutdown: read nothing more from this peer."""
        self.stopped = True
        self.reading = False
        self.wake()

    def close(self) -> None:
        """Shutdown: close once the receipts owed are written (unless something else
        already ends the line)."""
        if self.line.last is None and not self.gone:
            self.end_with(b"")

    def end_with(self, data: bytes) -> None:
        """`data` (b"": nothing) in the line's last place, then the close."""
        self.line.settle(self.finish(), data, self.hang_up)

    def abort(self) -> None:
        """Close at once, dropping the owed receipts (a peer gone silent)."""
        self._close("abort")

    # ---------------------------------------------------------------- frames

    def handle(self, frame: Frame) -> None:
        if self.login.held is not None:
            self.login.held.append(frame)
            return
        handler = self.rules.get((self.state, frame.command))
        if handler is None:
            unexpected(self, frame)
        elif self.login.permissions is None or not access.refused(self, frame):
            try:
                handler(self, frame)
            except QueueError as err:
                self.error(str(err), err.advice, frame)
            except Refused as err:
                self.error(err.message, str(err), frame)

    def say_and_close(self, data: bytes) -> None:
        """A refusal before any frame is handled: `data`, then the close."""
        self.write(data)
        self.state = CLOSING
        self._close("close")

    def finish(self) -> Owed:
        """The line's last place, for what ends the connection."""
        self._stop()
        return self.line.end()

    def _stop(self) -> None:
        """The connection is ending: from now on no frame is read or handled, and no
        message is delivered to it (its wip is returned when it is gone)."""
        self.state = CLOSING
        if self.transactions is not None:
            self.transactions.clear()
        self._flow()  # reads nothing more, and gets no message
        self.messages.end_browses()  # nothing may follow an ERROR or a DISCONNECT's RECEIPT
        self.wake()

    # ---------------------------------------------------------------- output and errors

    def write(self, data: Piece, end: bool = True) -> None:
        """Queue output; `end`: a frame ends with it. Nothing is written once the
        connection is to close (after an ERROR or a DISCONNECT's RECEIPT)."""
        if self.gone or self.close_wanted:
            return
        out = self._out
        out.write(data, end)
        if out.made - out.taken >= OUTPUT_LIMIT and (self.writable or self.reading):
            self._flow()
        if not self._woken:  # wake(), inline: this runs for every message
            self._woken = True
            self.broker.passes.want_flush(self)

    def wake(self) -> None:
        if not self._woken:
            self._woken = True
            self.broker.passes.want_flush(self)

    def error(
        self,
        message: str,
        detail: str,
        frame: Frame | None = None,
        receipt: str | None = None,
        entry: Owed | None = None,
        version: str | None = None,
    ) -> None:
        """One ERROR frame, then the close (STOMP 1.2 section ERROR), in the line of owed
        receipts: in the place of `entry` (a frame whose effect the log lost), else in the
        line's last place, after the receipts of every frame before. `detail` is its body:
        what happened and what to do. Only the first ERROR of a connection is sent."""
        if not detail.strip():
            raise ValueError(f"ERROR {message!r} needs a body that says what to do")
        if self.gone or self.close_wanted or (entry is None and self._erring):
            return
        receipt = receipt if receipt is not None else (frame.headers.get("receipt") if frame else None)
        if entry is None:
            # The last place, or the one a DISCONNECT or shutdown took: an earlier frame failed,
            # so the ERROR goes out instead of that RECEIPT.
            entry = self.line.last if self.line.last is not None else self.finish()
        else:
            self._stop()
        self._erring = True
        error = render.error_frame(message, detail, receipt, version)
        self.line.settle(entry, error, lambda: self._close_after_error(message))

    def _close_after_error(self, reason: str) -> None:
        self.broker.refusals.protocol_error(self, reason)
        self.hang_up()

    def hang_up(self) -> None:
        """What ends the line is written: close once the output is."""
        self._close("close")

    def _close(self, how: str) -> None:
        if self.close_wanted != "abort":
            self.close_wanted = how
        self._stop()
        self.line.clear()
