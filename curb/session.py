"""One STOMP 1.2 connection's rules, sans I/O: bytes in, bytes out, events for the transport.

The transport (curb.driver, for every front) feeds received bytes to
`receive_data(data, now)`, is told through `on_output` that output waits, takes it piece
by piece with `next_output(now)` while it can write (or all at once with
`data_to_send(now)`), or, for a session made with framed=True, frame by frame with
`next_frame(now)` (all at once: `frames_to_send(now)`, websockets' shape), and then
reads the events: `close_wanted` (close once the output is
written, or abort), `reading` (False: stop reading this peer) and `next_deadline` (when
to call `tick(now)`). Bytes in and out only ever move a deadline later; it can come
sooner only when `deadlines` changes (heart-beats agreed, a refusal due), so a
transport re-reads it then, and after each `tick`. The session keeps no clock, no
socket and no event loop.

Rules:
- Which frame is allowed when is the table `RULES`, (state, command) -> handler. A frame
  the table does not name gets one ERROR naming the state and the command, and the
  connection closes after it (STOMP 1.2 ERROR). Frames after DISCONNECT or an ERROR are
  dropped unread.
- A frame's RECEIPT leaves once its effect is durable when it changed the log (SEND, ACK,
  NACK, DISCONNECT) and at once otherwise, but never before the receipts owed for earlier
  frames: receipts leave in frame order.
- The line of owed receipts (`_owed`) is the only way out for what ends a connection: an
  ERROR, a DISCONNECT's RECEIPT, a shutdown's close. It takes the line's last place (or,
  when a frame's effect failed to become durable, that frame's place), the session
  handles no further frame and gets no more messages at once, and the connection closes
  only once it is written, after the receipts of every earlier frame that became durable.
  Nothing is written after it. Every place in the line is filled, with a RECEIPT or with
  an ERROR when the log reports a failure, so the line never blocks for good. Only a
  lost peer or a heart-beat timeout (an abort) drops the line. Bytes that are no frame,
  read while frames wait for a login check, wait behind them (UNPARSABLE).
- Every ERROR has a body that says what happened and what to do: `error` refuses an
  empty one, QueueError and Refused carry theirs.
- Heart-beats are negotiated once at CONNECT (curb.heartbeat); their deadlines are data
  derived from when bytes last came and went.
- An `ack:auto` message is done only once its frame is handed to the transport; one the
  transport never took is rdy again when the connection goes.
- Output is bounded by bytes: while OUTPUT_LIMIT bytes or more wait unsent, or the
  transport can take nothing now (`set_writable(False)`), the broker makes no more
  messages for the peer; while OUTPUT_LIMIT bytes or more wait, none of the peer's frames
  are read. So what waits for a connection is at most OUTPUT_LIMIT plus one frame,
  whatever the message size or the prefetch. Output is a list of pieces that are never
  joined past PIECE_BYTES: a large body goes out as a view of the bytes read from the
  log, and the transport takes it piece by piece (`next_output`), so the work per piece
  does not grow with what waits behind it.
- A browse (SUBSCRIBE with browser:true) sends the live messages of an id range and
  then one end marker (message-id BROWSE_END, browser:end); it changes no state. Its
  messages are made only while the transport takes output (`browse_more`).
- ACK with curb-upto:<n> acknowledges every message up to n on every connection; its
  RECEIPT waits until that is durable, like an ACK's.
- Ack deadlines: SUBSCRIBE may set its own (`curb-ack-timeout`, ms, 0 for none), and a
  NACK with `curb-touch:<ms>` does not NACK but moves that delivery's deadline to ms from
  now (a NACK is the safe carrier: a broker that ignores the header redelivers, an ACK
  would lose the message). An ACK, NACK or touch that came after its message's deadline
  passed on this connection changes nothing and is not an error: its RECEIPT, if it
  asked for one, carries `curb-late:true`.
- The queue, the log and the metrics are reached only through the Broker.
- Access: with a users file (Broker.users), CONNECT must name a user and its password, or
  come over a connection whose client certificate's CN names a user (`identity`). A login
  verified before is known at once (Broker.remembered_login); another password check
  (scrypt) runs off the event loop (Broker.check_login); until it answers the session
  reads nothing and holds the frames that came after CONNECT, then handles them in order.
  A failed CONNECT is answered "access refused" only at a deadline a fixed delay after it
  came, the same for every failure; a login the broker shed unchecked gets "server busy"
  at once, never "access refused". Each frame needs at most one permission, named by
  `PERMISSION` (and `./count` frames need `count`); without a users file everything is
  allowed.
- A connection that has not sent CONNECT by `broker.connect_timeout` seconds after it
  opened is answered with an ERROR and closed (a deadline too).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from curb import __version__, heartbeat, message_limits, payload, users
from curb.broker import Peer, Refused
from curb.counts import COUNT_DESTINATION, count_prefix
from curb.frame import FRAME_END, Frame, FrameParser, ProtocolError, decimal, encode, escape
from curb.logins import Answer, Shed
from curb.queue import Late, QueueError, Subscription

if TYPE_CHECKING:
    from curb.broker import Broker
    from curb.log.browse import Browse
    from curb.log.cursor import Record

BROWSE_END = "browse-end"  # the message-id of a browse's end marker
SERVER = f"curb/{__version__}"
MAX_PREFETCH = 1_000_000  # unacked messages one subscription may hold
PREFETCH_ADVICE = (
    f"Give prefetch-count (or activemq.prefetchSize) a whole number from 1 to {MAX_PREFETCH}, "
    "or leave it out for the broker's -prefetch."
)
MAX_MESSAGE_ID = (1 << 48) - 1  # a record holds its id in 12 hex digits
MAX_ID_HEADER = (1 << 64) - 1  # an id range's bound may lie beyond every id (Client.last_id)
MAX_DEADLINE_MS = heartbeat.MAX_MS  # curb-ack-timeout and curb-touch, at most a day
BEAT_EARLY = 0.9  # send our heart-beat a little before it is due, so it is never late
# Unsent output per connection past which the broker makes no more for it and reads none
# of its frames (README: Limits).
OUTPUT_LIMIT = 256 * 1024
# A body at least this long goes out as a view of the payload read from the log, never
# copied into its frame; shorter ones are cheaper to copy than to send apart.
VIEW_BODY = 64 * 1024
# The most output handed to the transport at once: small frames are joined up to it,
# larger pieces are cut to it, so that what a socket does not take at once is small.
PIECE_BYTES = 256 * 1024

Piece = bytes | memoryview

NEW, OPEN, CLOSING = "before CONNECT", "after CONNECT", "closing"
# The command of a stand-in, among the frames held during a login check, for bytes that
# were no valid frame (its headers: the reason and the receipt); no parsed frame has it,
# since a NUL ends a frame.
UNPARSABLE = "\0unparsable"
Handler = Callable[["Session", Frame], None]


@dataclass(slots=True, eq=False)
class Owed:
    """A place in the line: its bytes once known (a RECEIPT, an ERROR, or b"" for a plain
    close), and what to do once they are sent. Places compare by identity, so that a
    refused frame takes its own place out of the line (`remove`), not an equal one."""

    data: bytes | None = None
    then: Callable[[], None] | None = None


class Session:
    """One STOMP connection from CONNECT to close, with no I/O of its own."""

    def __init__(self, broker: Broker, now: float, peer: str = "?", identity: str | None = None, framed: bool = False):
        self.broker = broker
        self.peer = peer
        self.identity = identity  # the CN of a verified client certificate
        self.user: str | None = None
        self.permissions: frozenset[str] | None = None  # None: everything is allowed
        self.state = NEW
        self.opened_at = now
        self._refuse_at: float | None = None
        self._held: list[Frame] | None = None  # frames after a CONNECT whose check is under way
        self.parser = FrameParser(
            max_frame_bytes=broker.max_frame,
            max_body_bytes=max(0, min(broker.max_message, broker.max_frame - message_limits.RESERVE)),
        )
        # Events for the transport.
        self.close_wanted: str | None = None  # "close" once the output is written, or "abort"
        self.reading = True
        self.on_output: Callable[[], None] = lambda: None  # the transport's hook: output waits
        self.writable = True
        self._stopped = False  # shutdown: read nothing more
        self._gone = False
        self._out: collections.deque[Piece] = collections.deque()
        # framed: where each whole frame of the output ends (values of _made), for next_frame
        self._ends: collections.deque[int] | None = collections.deque() if framed else None
        self._made = 0  # bytes of output ever queued
        self._taken = 0  # bytes of output ever handed to the transport
        self._transport_ok = True  # the transport can take output now
        self._woken = False
        # auto messages in _out, done once handed over: (value of _made after its frame, record)
        self._handoff: collections.deque[tuple[int, Record]] = collections.deque()
        self._owed: collections.deque[Owed] = collections.deque()
        self._last: Owed | None = None  # the place that ends the line, once there is one
        self._erring = False  # an ERROR is in the line
        self._count_sub: str | None = None
        self._count_prefix = b""
        self._last_counts: dict[str, int] | None = None
        self._counts_owed = False
        self._prefixes: dict[Subscription[Peer, Record], bytes] = {}
        self._browses: dict[str, tuple[Browse, bytes]] = {}  # sub id -> browse, MESSAGE prefix
        self.last_recv = self.last_send = now
        self.send_every = self.expect_every = 0.0
        self.deadlines = 0  # changes whenever next_deadline may have come sooner
        broker.join(self)

    # ---------------------------------------------------------------- the transport's calls

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the peer: handle every frame they complete."""
        if self.state is CLOSING or self._gone:
            return
        self.last_recv = now
        bad: ProtocolError | None = None
        try:
            frames = self.parser.feed(data)
        except ProtocolError as err:
            bad, frames = err, err.frames
        broker = self.broker
        broker.before_frames()
        try:
            for frame in frames:
                if self.state is CLOSING:
                    break
                self.handle(frame)
            if bad is not None and self.state is not CLOSING:
                if self._held is not None:  # its ERROR waits behind the frames held for the login
                    receipt = {} if bad.receipt is None else {"receipt": bad.receipt}
                    self._held.append(Frame(UNPARSABLE, {"message": str(bad), **receipt}))
                else:
                    self.unparsable(str(bad), bad.receipt)
        finally:
            broker.after_frames()

    def output_due(self) -> None:
        """The broker tells the transport that output or an event waits (`on_output`)."""
        self._woken = False
        self.on_output()

    def next_output(self, now: float) -> Piece | None:
        """The next piece of output to write, or None when there is none: a run of small
        frames joined, or at most PIECE_BYTES of a larger one (a view, not a copy).
        Auto-acked messages are done once their frame is handed over."""
        out = self._out
        if not out:
            return None
        piece = out.popleft()
        size = len(piece)
        if size > PIECE_BYTES:
            view = memoryview(piece)
            out.appendleft(view[PIECE_BYTES:])
            piece, size = view[:PIECE_BYTES], PIECE_BYTES
        elif out and size + len(out[0]) <= PIECE_BYTES:
            run = [piece]
            while out and size + len(out[0]) <= PIECE_BYTES:
                nxt = out.popleft()
                run.append(nxt)
                size += len(nxt)
            piece = b"".join(run)
        return self._took(piece, size, now)

    def next_frame(self, now: float) -> Piece | None:
        """The next whole frame of output (a session made with framed=True), for a
        transport whose messages are frames: WebSocket, one STOMP frame each."""
        out, ends = self._out, self._ends
        if not out or not ends:
            return None
        end = ends.popleft()
        piece = out.popleft()
        size = len(piece)
        if self._taken + size < end:
            run = [piece]
            while self._taken + size < end:
                nxt = out.popleft()
                run.append(nxt)
                size += len(nxt)
            piece = b"".join(run)
        return self._took(piece, size, now)

    def _took(self, piece: Piece, size: int, now: float) -> Piece:
        """`size` bytes of output went to the transport: auto messages among them are done,
        and the flow may open again."""
        self._taken += size
        self.last_send = now
        handoff = self._handoff
        if handoff and handoff[0][0] <= self._taken:
            done = []
            while handoff and handoff[0][0] <= self._taken:
                done.append(handoff.popleft()[1])
            self.broker.handed_off(self, done)
        if not self.writable and self._made - self._taken < OUTPUT_LIMIT:
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
        return self._made - self._taken

    def discard_output(self) -> None:
        """The transport can take nothing more (it is closing)."""
        self._woken = False
        self._out.clear()
        if self._ends is not None:
            self._ends.clear()
        self._taken = self._made
        self._handoff.clear()

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
        room = self._made - self._taken < OUTPUT_LIMIT
        going_on = self.state is not CLOSING
        self.reading = room and going_on and not self._stopped and self._held is None
        writable = room and going_on and self._transport_ok
        if writable != self.writable:
            self.writable = writable
            self.broker.set_writable(self, writable)
            if writable:
                if self._counts_owed:
                    self.send_counts(self.broker.counts())
                self.broker.pump()

    def tick(self, now: float) -> None:
        """A deadline came: refuse a failed CONNECT, drop a peer that never sent CONNECT or
        fell silent, or send a beat."""
        if self._gone or self.close_wanted:
            return
        if self._refuse_at is not None:
            if now >= self._refuse_at:
                self._refuse()
            return
        if self.state is NEW:
            if (
                self._held is None
                and self.broker.connect_timeout
                and now >= self.opened_at + self.broker.connect_timeout
            ):
                self.broker.connect_timed_out(self, now)
                self._settle(
                    self._finish(),
                    encode(
                        "ERROR",
                        {"message": "CONNECT timeout", "content-type": "text/plain"},
                        f"Send CONNECT within {self.broker.connect_timeout:g} s of connecting.\n".encode(),
                    ),
                    self._hang_up,
                )
            return
        if self.expect_every and now - self.last_recv > heartbeat.tolerance(self.expect_every):
            self.broker.events("heartbeat_timeout", f"no heart-beat from {self.peer}; closing", peer=self.peer)
            self._close("abort")
            return
        if self.send_every and now - self.last_send >= self.send_every * BEAT_EARLY:
            self.last_send = now
            self.write(b"\n")

    @property
    def next_deadline(self) -> float | None:
        """When `tick` has something to check, or None while there is nothing to time."""
        if self._refuse_at is not None:
            return self._refuse_at
        if self.state is NEW:
            timeout = self.broker.connect_timeout
            return self.opened_at + timeout if timeout else None
        deadline = None
        if self.send_every:
            deadline = self.last_send + self.send_every * BEAT_EARLY
        if self.expect_every:
            silent = self.last_recv + heartbeat.tolerance(self.expect_every)
            deadline = silent if deadline is None else min(deadline, silent)
        return deadline

    def connection_lost(self) -> None:
        if self._gone:
            return
        self._gone = True
        self.state = CLOSING
        self.discard_output()
        self._end_browses()
        self.broker.gone(self)

    def _end_browses(self) -> None:
        for browse, _ in self._browses.values():
            self.broker.end_browse(browse)
        self._browses.clear()

    # ---------------------------------------------------------------- the broker's calls

    def deliver(self, sub: Subscription[Peer, Record], rec: Record, data: Piece) -> None:
        """Write one MESSAGE of the stored payload `data`: the cached prefix of its
        subscription, then the message."""
        stored, body = payload.split(memoryview(data))
        extra = b"redelivered:true\ncurb-deliveries:%d\n" % rec.deliveries if rec.deliveries > 1 else b""
        ack = b"" if sub.ack_mode == "auto" else b"ack:%d\n" % rec.id
        self._write_message(b"%smessage-id:%d\n%s%s%s" % (self._prefixes[sub], rec.id, ack, extra, stored), body)
        if sub.ack_mode == "auto":
            self._handoff.append((self._made, rec))

    def _write_message(self, head: bytes, body: Piece) -> None:
        """A MESSAGE whose head (up to its own headers) is `head`: a large body is written
        as its own piece, uncopied."""
        if len(body) < VIEW_BODY:
            self.write(b"%scontent-length:%d\n\n%s%s" % (head, len(body), body, FRAME_END))
        else:
            self.write(b"%scontent-length:%d\n\n" % (head, len(body)), False)
            self.write(body, False)
            self.write(FRAME_END)

    @property
    def browsing(self) -> bool:
        return bool(self._browses)

    def browse_more(self, budget: int) -> bool:
        """One step of each browse: its messages, and its end marker once it is over.
        Returns whether some browse could go on at once. A closing session ends them:
        nothing may follow an ERROR or a DISCONNECT's RECEIPT."""
        if self.state is CLOSING:
            self._end_browses()
            return False
        more = False
        for sub_id, (browse, prefix) in list(self._browses.items()):
            step = browse.step(budget)
            for msg_id, data in step.messages:
                stored, body = payload.split(memoryview(data))
                self._write_message(b"%smessage-id:%d\n%s" % (prefix, msg_id, stored), body)
            if step.done:
                self.write(
                    b"%smessage-id:%s\nbrowser:end\ncurb-last-id:%d\ncontent-length:0\n\n%s"
                    % (prefix, BROWSE_END.encode(), browse.to_id, FRAME_END)
                )
                del self._browses[sub_id]
                self.broker.end_browse(browse)
            elif not step.waiting:
                more = True
        return more

    def send_counts(self, counts: dict[str, int]) -> None:
        """One `./count` MESSAGE if the counts changed since the last; while the peer
        does not read, only the latest counts are kept for later. The frame is shared
        by every subscriber but for its first two lines (curb.counts)."""
        if self._count_sub is None or counts == self._last_counts:
            return
        if not self.writable:
            self._counts_owed = True
            return
        self._counts_owed = False
        self._last_counts = counts
        self.write(self._count_prefix + self.broker.count_messages.tail(counts))

    def stop_reading(self) -> None:
        """Shutdown: read nothing more from this peer."""
        self._stopped = True
        self.reading = False
        self._wake()

    def close(self) -> None:
        """Shutdown: close once the receipts owed are written (unless something else
        already ends the line)."""
        if self._last is None and not self._gone:
            self._settle(self._finish(), b"", self._hang_up)

    # ---------------------------------------------------------------- frames

    def handle(self, frame: Frame) -> None:
        if self._held is not None:
            self._held.append(frame)
            return
        handler = RULES.get((self.state, frame.command))
        if handler is None:
            unexpected(self, frame)
            return
        if self.permissions is not None:
            needed = permission_needed(frame)
            if needed is not None and needed not in self.permissions:
                self.broker.permission_refused()
                self.error(
                    f"{needed} permission needed",
                    f"User {self.user!r} may not {frame.command} here without the {needed!r} permission; "
                    f"the operator grants it with `curb passwd USERS-FILE {self.user} --perm {needed} ...`.",
                    frame,
                )
                return
        try:
            handler(self, frame)
        except QueueError as err:
            self.error(str(err), err.advice, frame)
        except Refused as err:
            self.error(err.message, str(err), frame)

    def unparsable(self, reason: str, receipt: str | None) -> None:
        """The ERROR for bytes that are no valid frame."""
        self.error(
            reason,
            "The frame is not valid STOMP 1.2 or breaks one of the broker's limits "
            "(README: Limits): fix the frame and reconnect.",
            receipt=receipt,
        )

    def on_connect(self, frame: Frame) -> None:
        versions = frame.headers.get("accept-version", "1.0").split(",")
        if "1.2" not in versions:
            self.error(
                "unsupported protocol version",
                "Curb speaks STOMP 1.2 only; send accept-version:1.2.",
                frame,
                version="1.2",
            )
            return
        try:
            theirs = heartbeat.parse(frame.headers.get("heart-beat", "0,0"))
        except ValueError as err:
            self.error("bad heart-beat header", f"{err}.", frame)
            return
        if self.broker.users is not None:
            self._log_in(frame.headers, theirs)
        else:
            self._connected(theirs)

    def _connected(self, theirs: tuple[int, int]) -> None:
        ours = self.broker.heartbeat_ms
        self.send_every, self.expect_every = heartbeat.negotiate((ours, ours), theirs)
        self.deadlines += 1
        self.state = OPEN
        self.write(
            encode(
                "CONNECTED",
                {"version": "1.2", "server": SERVER, "heart-beat": f"{ours},{ours}", "session": str(id(self))},
            )
        )

    def _log_in(self, headers: dict[str, str], theirs: tuple[int, int]) -> None:
        """Check CONNECT's credentials against the users file: a certificate's CN or a login
        verified before at once, another password off the loop, holding the frames that
        follow until it is known."""
        users_by_name = self.broker.users
        assert users_by_name is not None
        login = headers.get("login")
        came = self.last_recv
        if login is None:
            self._logged_in(users_by_name.get(self.identity) if self.identity is not None else None, None, came, theirs)
            return
        passcode = headers.get("passcode", "")
        known = self.broker.remembered_login(login, passcode)
        if known is not None:
            self._logged_in(known, login, came, theirs)
            return
        self._held = []
        self.reading = False
        self._wake()
        self.broker.check_login(self, login, passcode, lambda answer: self._checked(answer, login, came, theirs))

    def _checked(self, answer: Answer, login: str, came: float, theirs: tuple[int, int]) -> None:
        """The password check's answer: handle the held frames once connected."""
        held, self._held = self._held or [], None
        if self._gone:
            return
        if isinstance(answer, Shed):
            self._shed()
            return
        self._logged_in(answer, login, came, theirs)
        if answer is None:
            return
        self.reading = self.writable and not self._stopped
        for frame in held:
            if self.state is CLOSING:
                break
            self.handle(frame)
        self.broker.after_frames()

    def _logged_in(self, user: users.User | None, login: str | None, came: float, theirs: tuple[int, int]) -> None:
        """Connect as `user`, or refuse at the deadline a fixed delay after CONNECT came."""
        if user is None:
            self.broker.access_refused(self, login)
            self.state = CLOSING
            self._refuse_at = came + self.broker.refuse_delay
            self.deadlines += 1
            self._wake()  # the glue re-arms its timer for the refusal
            return
        self.user, self.permissions = user.name, user.permissions
        self._connected(theirs)

    def _shed(self) -> None:
        """The login was not checked (too many wait): say so at once, not as a wrong password."""
        self.write(
            encode(
                "ERROR",
                {"version": "1.2", "content-type": "text/plain", "message": "server busy"},
                b"Too many logins are waiting for a password check, so this one was not checked. "
                b"Connect again in a few seconds.\n",
            )
        )
        self.state = CLOSING
        self._close("close")

    def _refuse(self) -> None:
        self._refuse_at = None
        self.write(
            encode(
                "ERROR",
                {"version": "1.2", "content-type": "text/plain", "message": "access refused"},
                b"Send the login and passcode of a user in the broker's users file.\n",
            )
        )
        self._close("close")

    def on_send(self, frame: Frame) -> None:
        """The broker's one SEND rule (Broker.accept); the RECEIPT waits for the fsync."""
        headers = frame.headers
        receipt = headers.get("receipt")
        entry = self._owe() if receipt is not None else None

        def stored(err: str | None) -> None:
            if err is not None:
                self.error(
                    "message not stored",
                    f"{err}. The message was not stored and will not be delivered: send it again "
                    "once the broker can store it (its log says why not).",
                    receipt=receipt,
                    entry=entry,
                )
            elif entry is not None and receipt is not None:
                self._settle(entry, _receipt(receipt))

        try:
            self.broker.accept(headers, frame.body, stored, urgent=receipt is not None)
        except Refused:
            if entry is not None:
                self._owed.remove(entry)
            raise

    def on_subscribe(self, frame: Frame) -> None:
        headers = frame.headers
        sub_id = headers.get("id")
        if sub_id is None:
            raise QueueError(
                "SUBSCRIBE needs an id header",
                "Give SUBSCRIBE an id header (any name); MESSAGEs carry it as subscription and UNSUBSCRIBE names it.",
            )
        lines = [
            b"subscription:" + escape(sub_id).encode(),
            b"destination:" + escape(headers.get("destination", "/queue/curb")).encode(),
        ]
        for line in lines:
            problem = message_limits.line_problem(line, message_limits.MAX_SUBSCRIPTION_LINE)
            if problem is not None:
                raise QueueError(f"SUBSCRIBE {problem}", "Use a shorter subscription id and destination.")
        prefix = b"MESSAGE\n%s\n%s\n" % tuple(lines)
        if headers.get("browser") == "true":
            if sub_id in self._browses:
                raise QueueError(
                    f"browse {sub_id!r} is still running; UNSUBSCRIBE it or wait for its end",
                    "Wait for the browse's end marker (message-id browse-end), UNSUBSCRIBE it, or "
                    "give the new browse another id.",
                )
            first = _message_id(headers, "curb-from-id")
            last = _message_id(headers, "curb-to-id")
            browse = self.broker.browse(self, 1 if first is None else first, last)
            self._browses[sub_id] = (browse, prefix)
        elif headers.get("destination") == COUNT_DESTINATION:
            self._count_sub = sub_id
            self._count_prefix = count_prefix(escape(sub_id).encode())
            self._last_counts = None
            self.broker.watch_counts(self, True)
            self.send_counts(self.broker.counts())
        else:
            raw_timeout = headers.get("curb-ack-timeout")
            try:
                timeout = None if raw_timeout is None else _milliseconds(raw_timeout, "curb-ack-timeout", 0)
            except ValueError as err:
                self.error(
                    "bad curb-ack-timeout header",
                    f"{err}: give the milliseconds a delivered message may wait for its ACK or NACK before it "
                    f"goes back to the queue, from 0 (no deadline) to {MAX_DEADLINE_MS} (a day).",
                    frame,
                )
                return
            sub = self.broker.subscribe(self, sub_id, headers.get("ack", "auto"), _prefetch(headers), timeout)
            self._prefixes[sub] = prefix
        self._receipt_now(frame)

    def on_unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.headers.get("id")
        if sub_id is None:
            raise QueueError("UNSUBSCRIBE needs an id header", "Give UNSUBSCRIBE the id header its SUBSCRIBE had.")
        browse = self._browses.pop(sub_id, None)
        if browse is not None:
            self.broker.end_browse(browse[0])
        elif self._count_sub is not None and self._count_sub == sub_id:
            self._count_sub = None
            self.broker.watch_counts(self, False)
        else:
            self.broker.unsubscribe(self, sub_id)
        self._receipt_now(frame)

    def on_ack(self, frame: Frame) -> None:
        raw_upto = frame.headers.get("curb-upto")
        if raw_upto is not None:
            self._ack_upto(frame, _id_value(raw_upto, "curb-upto"))
            return
        msg_id = self._ack_id(frame)
        if msg_id is not None:
            try:
                self.broker.ack(self, msg_id)
            except Late:
                self._answer_late(frame)
                return
        if "receipt" in frame.headers:
            self._receipt_durable(frame)

    def _ack_upto(self, frame: Frame, upto: int) -> None:
        """ACK curb-upto: its RECEIPT waits until the acknowledgement is durable."""
        receipt = frame.headers.get("receipt")
        entry = self._owe() if receipt is not None else None

        def answer(err: str | None) -> None:
            if entry is not None and receipt is not None:
                self._settle_durable(entry, receipt, err, "ACK")

        try:
            self.broker.ack_upto(upto, answer)
        except QueueError:
            if entry is not None:
                self._owed.remove(entry)
            raise

    def on_nack(self, frame: Frame) -> None:
        msg_id = self._ack_id(frame)
        raw_touch = frame.headers.get("curb-touch")
        if raw_touch is not None:
            self._touch(frame, msg_id, raw_touch)
            return
        if msg_id is not None:
            try:
                self.broker.nack(self, msg_id)
            except Late:
                self._answer_late(frame)
                return
        if "receipt" in frame.headers:
            self._receipt_durable(frame)

    def _touch(self, frame: Frame, msg_id: int | None, raw: str) -> None:
        """NACK with curb-touch: the delivery stays, due `raw` ms from now; nothing to sync."""
        try:
            seconds = _milliseconds(raw, "curb-touch", 1)
        except ValueError as err:
            self.error(
                "bad curb-touch header",
                f"{err}: give the milliseconds from now by which the message must be ACKed or NACKed, "
                f"from 1 to {MAX_DEADLINE_MS} (a day).",
                frame,
            )
            return
        if msg_id is not None:
            try:
                self.broker.touch(self, msg_id, seconds)
            except Late:
                self._answer_late(frame)
                return
        self._receipt_durable(frame)

    def _answer_late(self, frame: Frame) -> None:
        """An ACK, NACK or touch after the message's deadline: a RECEIPT saying so, which,
        like every RECEIPT for these frames, says that the frames before it are on disk."""
        self._receipt_durable(frame, late=True)

    def on_disconnect(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        entry = self._finish()
        if receipt is None:
            self._settle(entry, b"", self._hang_up)
            return
        self.broker.when_durable(lambda err: self._settle_durable(entry, receipt, err, "DISCONNECT", self._hang_up))

    def on_transaction(self, frame: Frame) -> None:
        self.error(
            "transactions are not supported",
            "Curb does not buffer transactions; send frames without 'transaction'.",
            frame,
        )

    def _ack_id(self, frame: Frame) -> int | None:
        """The message an ACK or NACK names; None for a ./count update, which needs none."""
        raw = frame.headers.get("id")
        if raw is None:
            raise QueueError(
                f"{frame.command} needs an id header",
                f"Give {frame.command} the id header: the ack header of the MESSAGE it answers.",
            )
        if raw.startswith("count-") and self._count_sub is not None:
            return None
        try:
            return decimal(raw, "ack id", MAX_MESSAGE_ID)
        except ValueError:
            raise QueueError(
                f"unknown ack id {raw[:40]!r}",
                f"Give {frame.command} the ack header of a MESSAGE this connection received (a "
                "message id, a decimal number); to ACK up to an id, send ACK with a curb-upto header.",
            ) from None

    # ---------------------------------------------------------------- receipts, in order

    def _receipt_now(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._settle(self._owe(), _receipt(receipt))

    def _receipt_durable(self, frame: Frame, late: bool = False) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is None:
            return
        entry = self._owe()
        command = frame.command
        self.broker.when_durable(lambda err: self._settle_durable(entry, receipt, err, command, late=late))

    def _settle_durable(
        self,
        entry: Owed,
        receipt: str,
        err: str | None,
        command: str,
        then: Callable[[], None] | None = None,
        late: bool = False,
    ) -> None:
        """The log's answer for a frame whose RECEIPT waits for durability: the RECEIPT
        (`curb-late:true` for a `late` one), or an ERROR in its place when the log could not
        make the connection's earlier frames durable."""
        if err is None:
            self._settle(entry, (_late_receipt if late else _receipt)(receipt), then)
        else:
            self.error(
                f"{command} not stored",
                f"{err}. The broker could not make this {command} durable and stops serving: "
                "reconnect once it is back (its log says why), and expect messages this connection "
                "had acknowledged to come again.",
                receipt=receipt,
                entry=entry,
            )

    def _owe(self) -> Owed:
        """A place in this connection's line of receipts, filled in by _settle()."""
        entry = Owed()
        self._owed.append(entry)
        return entry

    def _finish(self) -> Owed:
        """The line's last place, for what ends the connection."""
        self._stop()
        entry = self._last = self._owe()
        return entry

    def _stop(self) -> None:
        """The connection is ending: from now on no frame is read or handled, and no
        message is delivered to it (its wip is returned when it is gone)."""
        self.state = CLOSING
        self._flow()  # reads nothing more, and gets no message
        self._end_browses()  # nothing may follow an ERROR or a DISCONNECT's RECEIPT
        self._wake()

    def _settle(self, entry: Owed, data: bytes, then: Callable[[], None] | None = None) -> None:
        """Fill in an owed place and send everything now at the front of the line."""
        entry.data, entry.then = data, then
        owed = self._owed
        while owed and (ready := owed[0].data) is not None:
            after = owed.popleft().then
            if ready:
                self.write(ready)
            if after is not None:
                after()

    # ---------------------------------------------------------------- output and errors

    def write(self, data: Piece, end: bool = True) -> None:
        """Queue output; the transport takes it piece by piece. `end`: a frame ends with
        it. Nothing is written once the connection is to close (after an ERROR or a
        DISCONNECT's RECEIPT)."""
        if self._gone or self.close_wanted:
            return
        self._out.append(data)
        self._made += len(data)
        if end and self._ends is not None:
            self._ends.append(self._made)
        if self._made - self._taken >= OUTPUT_LIMIT and (self.writable or self.reading):
            self._flow()
        if not self._woken:  # _wake(), inline: this runs for every message
            self._woken = True
            self.broker.want_flush(self)

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            self.broker.want_flush(self)

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
        if self._gone or self.close_wanted or (entry is None and self._erring):
            return
        headers = {"message": message, "content-type": "text/plain"}
        if version is not None:
            headers["version"] = version
        receipt = receipt if receipt is not None else (frame.headers.get("receipt") if frame else None)
        if receipt is not None:
            headers["receipt-id"] = receipt
        if entry is None:
            # The last place, or the one a DISCONNECT or shutdown took: an earlier frame failed,
            # so the ERROR goes out instead of that RECEIPT.
            entry = self._last if self._last is not None else self._finish()
        else:
            self._stop()
        self._erring = True
        self._settle(
            entry, encode("ERROR", headers, (detail + "\n").encode()), lambda: self._close_after_error(message)
        )

    def _close_after_error(self, reason: str) -> None:
        self.broker.protocol_error(self, reason)
        self._hang_up()

    def _hang_up(self) -> None:
        """What ends the line is written: close once the output is."""
        self._close("close")

    def _close(self, how: str) -> None:
        if self.close_wanted != "abort":
            self.close_wanted = how
        self._stop()
        self._owed.clear()


def unexpected(session: Session, frame: Frame) -> None:
    """The ERROR for any frame the table does not allow in the session's state (or for
    bytes held as UNPARSABLE behind a login check)."""
    command = frame.command
    if command == UNPARSABLE:
        session.unparsable(frame.headers["message"], frame.headers.get("receipt"))
    elif command in KNOWN_COMMANDS:
        session.error(
            f"{command} not allowed {session.state}",
            "Send CONNECT (or STOMP) once, first; then any other frame."
            if session.state is NEW
            else "CONNECT may only be sent once per connection: open a new connection to connect again.",
            frame,
        )
    else:
        session.error(
            f"unknown command {command[:40]!r} {session.state}",
            "Curb speaks STOMP 1.2: send CONNECT (or STOMP), SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK or DISCONNECT.",
            frame,
        )


# The permission each command needs when Curb has a users file; `./count` frames need
# `count` instead (permission_needed).
PERMISSION = {"SEND": "send", "SUBSCRIBE": "consume", "ACK": "consume", "NACK": "consume"}


def permission_needed(frame: Frame) -> str | None:
    """The permission a frame needs, or None for a frame anyone logged in may send."""
    command, headers = frame.command, frame.headers
    if command == "SUBSCRIBE" and headers.get("destination") == COUNT_DESTINATION:
        return "count"
    if command in ("ACK", "NACK") and headers.get("id", "").startswith("count-"):
        return "count"
    return PERMISSION.get(command)


RULES: dict[tuple[str, str], Handler] = {
    (NEW, "CONNECT"): Session.on_connect,
    (NEW, "STOMP"): Session.on_connect,
    (OPEN, "SEND"): Session.on_send,
    (OPEN, "SUBSCRIBE"): Session.on_subscribe,
    (OPEN, "UNSUBSCRIBE"): Session.on_unsubscribe,
    (OPEN, "ACK"): Session.on_ack,
    (OPEN, "NACK"): Session.on_nack,
    (OPEN, "DISCONNECT"): Session.on_disconnect,
    (OPEN, "BEGIN"): Session.on_transaction,
    (OPEN, "COMMIT"): Session.on_transaction,
    (OPEN, "ABORT"): Session.on_transaction,
}
KNOWN_COMMANDS = frozenset(command for _, command in RULES)


def _receipt(receipt_id: str) -> bytes:
    return b"RECEIPT\nreceipt-id:%s\n\n%s" % (escape(receipt_id).encode(), FRAME_END)


def _late_receipt(receipt_id: str) -> bytes:
    return b"RECEIPT\nreceipt-id:%s\ncurb-late:true\n\n%s" % (escape(receipt_id).encode(), FRAME_END)


def _milliseconds(raw: str, name: str, least: int) -> float:
    """Seconds in a header of milliseconds from `least` to MAX_DEADLINE_MS; ValueError
    naming the header otherwise."""
    value = decimal(raw, name, MAX_DEADLINE_MS)
    if value < least:
        raise ValueError(f"{name} must be at least {least}, not {value}")
    return value / 1000


def _message_id(headers: dict[str, str], name: str) -> int | None:
    """A header holding a message id (a non-negative integer), or None when absent."""
    raw = headers.get(name)
    return None if raw is None else _id_value(raw, name)


def _id_value(raw: str, name: str) -> int:
    """A message id header's value (a non-negative integer)."""
    try:
        return decimal(raw, name, MAX_ID_HEADER)
    except ValueError:
        raise QueueError(
            f"bad {name} {raw[:40]!r}: use a message id, a non-negative integer",
            f"Give {name} a message id: a decimal integer from 0 to {MAX_ID_HEADER}, such as a MESSAGE's message-id.",
        ) from None


def _prefetch(headers: dict[str, str]) -> int | None:
    raw = headers.get("prefetch-count", headers.get("activemq.prefetchSize"))
    if raw is None:
        return None
    try:
        value = decimal(raw, "prefetch", MAX_PREFETCH)
    except ValueError as err:
        raise QueueError(f"bad prefetch: {err}", PREFETCH_ADVICE) from None
    if value < 1:
        raise QueueError(f"bad prefetch {value}: use a positive integer up to {MAX_PREFETCH}", PREFETCH_ADVICE)
    return value
