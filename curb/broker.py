"""The one coordinator of the queue's steps, shared by every session.

Sessions say what a client did (send, subscribe, ack, nack, went away, was handed a
message); only this module turns that into calls on the queue state machine, the log and
the metrics, so each step is written once: an ACK is `queue.ack` then `log.ack`, and every
message that comes back unfinished (NACK, an ack deadline passed, a connection gone or
silent past its heart-beat, shutdown) goes through `_requeue`, the one place that decides
where it goes (curb.redelivery: rdy again at once or after a delay, or a dead letter past
the delivery limit), in the queue and in the log alike. An expired message the queue
meets on the way to a delivery is dead-lettered (or dropped, `drop_expired`) by
`_expired`. Dead letters are served by a second queue (curb.dead).

Accepting a message is one rule for every front (`accept`; `publish` is the same as a
future): the limits a MESSAGE must meet (curb.message_limits), the headers kept
(curb.payload), and what a RECEIPT or an HTTP 201 waits for (the fsync). A front only
maps `Refused.reason` and its `done` answer to its own words.

Ack deadlines are kept by the queue, and those of `./dead` subscribers by the dead
letters' queue; this module arms one timer (on `loop`, the event loop unless a test
gives its own) for the earliest of them all, re-arms it only when a sooner one appears,
and when it fires returns what is due through `_requeue` (a dead letter among the dead,
as its NACK would). Delayed
messages (a delayed SEND, a message put back with a delay) are the log's to keep until
due, by the log's wall clock (`log.wall_ms`, milliseconds since the epoch, so that a due
time means the same after a restart), and are never delivered early: a delay counts from
the clock's next millisecond (curb.timing.due_after), since its reading is rounded down,
and a message is released only once the clock reads its due time: a second timer is armed for the log's soonest due
time, by how far it lies from that clock now, and when it fires what is due goes to the
front of the line (`_release`).

Browses (SUBSCRIBE with browser:true) are stepped here, a bounded number of bytes per
loop pass for each session that can take output, so that a browse of any length holds
only its window in memory and respects the session's flow control like deliveries.

It also gathers each connection's output of one loop pass into one write (`want_flush`,
`flush_out`) and coalesces `./count` updates. It needs a scheduler for both and takes it
as a parameter, so tests drive it without an event loop.

Refusals (a TLS handshake that failed, the connection limit, a connection without CONNECT
in time, a failed login, a client error such as a missing permission, a SEND the full
disk refused), and deliveries past their ack deadline and the ACKs, NACKs and touches
that came after it, are each counted in the metrics and logged by `_refused`: one line naming
the peer and, once it logged in, the user, at most one per LIMIT_LOG_SECONDS for each
kind, however many there are; a line that stands for several says how many.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from curb import message_limits, payload
from curb.counts import CountMessages
from curb.dead import DeadBrowse, DeadSource
from curb.log import QueueFull, TooLarge
from curb.log.browse import Browse
from curb.log.cursor import Record
from curb.log.events import NoEvents
from curb.log.waiters import MaybeStored
from curb.logins import SHED, Answer, LoginChecks, Offload, run_now
from curb.metrics import Metrics
from curb.queue import Late, Queue, QueueError, Subscription
from curb.ratelimit import LineLimit
from curb.redelivery import DEAD, REASON_EXPIRED, REASON_MAX_DELIVERIES, Redelivery
from curb.timing import TIME_HEADERS, due_after, send_times
from curb.users import User

COUNT_COALESCE_SECONDS = 0.05
BROWSE_STEP_BYTES = 256 * 1024  # a browse's output per session per loop pass
# ./count MESSAGEs a second, all subscribers together, at most: each costs a send() call,
# and with a thousand subscribers at every 50 ms those calls took half the loop's time.
COUNT_FRAMES_PER_SECOND = 1000
CONNECT_TIMEOUT_SECONDS = 10.0
# How long a delivered message may wait for its ACK or NACK before it goes back to the
# queue, unless the SUBSCRIBE says otherwise (curb-ack-timeout).
ACK_TIMEOUT_SECONDS = 30 * 60.0
# How long after a failed CONNECT its "access refused" leaves, whatever the failure was.
REFUSE_DELAY_SECONDS = 1.0
# At most one line of each kind of refusal per this many seconds, however many there are.
LIMIT_LOG_SECONDS = 10.0
Done = Callable[[str | None], None]
Schedule = Callable[[float, Callable[[], None]], object]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What the broker needs to keep ack deadlines: an asyncio event loop has both."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], None]) -> Timer: ...


class Store(Protocol):
    """What the broker needs of the log (curb.log.Log, or a fake in tests)."""

    hold_flush: bool

    @property
    def unread(self) -> int: ...
    @property
    def live_bytes(self) -> int: ...
    @property
    def file_bytes(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def last_id(self) -> int: ...
    @property
    def durable_id(self) -> int: ...

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> Record: ...
    def delivered(self, rec: Record) -> None: ...
    def ack(self, rec: Record) -> None: ...
    def requeue(self, rec: Record, due_ms: int = 0) -> None: ...
    def bury(self, rec: Record, reason: str) -> None: ...
    def revive(self, rec: Record) -> None: ...
    def keep_dead(self, rec: Record) -> None: ...
    def next_dead(self) -> Record | None: ...
    def dead_letters(self) -> tuple[int, list[Record]]: ...
    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]: ...
    def read_dead(self, mid: int) -> Record | None: ...
    def redrive(self, count: int) -> list[int]: ...
    def wall_ms(self) -> int: ...
    def release(self, now_ms: int) -> bool: ...
    def next_due(self) -> int | None: ...
    @property
    def delayed(self) -> int: ...
    @property
    def dead(self) -> int: ...
    def ack_upto(self, upto: int, done: Done | None = None) -> None: ...
    def browse(self, from_id: int, to_id: int) -> Browse: ...
    def end_browse(self, browse: Browse) -> None: ...
    def on_durable(self, done: Done) -> None: ...
    def payload(self, rec: Record) -> bytes | memoryview: ...
    def next_ready(self) -> Record | None: ...
    def flush(self) -> None: ...


class Alarm:
    """One timer on the loop, armed for the soonest time asked of it: a time later than
    the one it is armed for costs a comparison. `fire(armed_for)` runs when it goes off;
    it may fire a clock tick early, so `fire` treats what it was armed for as due."""

    def __init__(self, loop: Loop, fire: Callable[[float], None]):
        self._loop = loop
        self._fire = fire
        self.at: float | None = None  # when it fires
        self._timer: Timer | None = None

    def arm(self, when: float | None) -> None:
        if when is None or (self.at is not None and self.at <= when):
            return
        if self._timer is not None:
            self._timer.cancel()
        self.at = when
        self._timer = self._loop.call_at(when, self._fired)

    def _fired(self) -> None:
        armed_for, self.at, self._timer = self.at, None, None
        self._fire(armed_for if armed_for is not None else self._loop.time())


class Peer(Hashable, Protocol):
    """What the broker asks of one client connection (curb.session.Session for STOMP, or
    another front's): the callbacks through which the broker delivers and stops it, and
    the names its log lines give. The broker imports no session: a front depends on the
    broker, never the reverse."""

    peer: str  # the peer's address, HOST:PORT, for log lines
    user: str | None  # the user it logged in as, once it did
    identity: str | None  # the CN of a verified client certificate
    writable: bool  # it can take output now: messages may be made for it

    @property
    def browsing(self) -> bool: ...

    def deliver(self, sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
        """Write one MESSAGE of the stored payload `data` for the subscription."""

    def send_counts(self, counts: dict[str, int]) -> None:
        """The queue's counts changed: one `./count` update if it watches them."""

    def browse_more(self, budget: int) -> bool:
        """One step of its browses, about `budget` bytes; whether one could go on at once."""

    def output_due(self) -> None:
        """Output waits (gathered once per loop pass): the transport should take it."""

    def stop_reading(self) -> None:
        """Shutdown: read nothing more from the client."""

    def close(self) -> None:
        """Shutdown: close once the receipts it owes are written."""


class Refused(Exception):
    """A message the broker would not take (`accept`); nothing was stored. `message` is
    for an ERROR frame's header, str() the detail (what happened and what to do), `reason`
    one of TOO_LARGE, BAD_HEADERS, FULL (an HTTP front's 413, 400, 503), and
    `retry_after` the seconds after which trying again may work (FULL only)."""

    def __init__(self, message: str, detail: str, reason: str = "", retry_after: float | None = None):
        super().__init__(detail)
        self.message = message
        self.reason = reason
        self.retry_after = retry_after


class NotStored(Exception):
    """A message `accept` took could not be made durable after all: it will not be
    delivered, or (`maybe`: the log failed after writing it) it may be on disk and then
    delivered. str() says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.maybe = isinstance(reason, MaybeStored)


# Dead letters a redrive moves per loop pass: each is read back and rewritten in place,
# about 9 us, so a pass holds other clients up about 5 ms.
REDRIVE_SLICE = 512
TOO_LARGE, BAD_HEADERS, FULL = "too_large", "bad_headers", "full"
# When a front may suggest trying a SEND the full queue refused again (HTTP's Retry-After).
RETRY_FULL_SECONDS = 1.0


def loop_schedule(loop: asyncio.AbstractEventLoop) -> Schedule:
    """A Schedule on an event loop: call_soon for no delay, else call_later."""
    call_soon, call_later = loop.call_soon, loop.call_later

    def schedule(delay: float, callback: Callable[[], None]) -> object:
        return call_soon(callback) if delay <= 0 else call_later(delay, callback)

    return schedule


class BrokerEvents(NoEvents):
    """The log's events (curb.log.events) for the broker made over that log. The log is
    made first (the broker reads its counts when made), so its owner gives the log this
    and sets `broker` once the broker exists, before the log's first flush. Damage and a
    fatal error are the owner's to hear (curb.instance)."""

    broker: Broker

    def written(self) -> None:
        self.broker.pump()

    def walked(self) -> None:
        self.broker._counts_dirty()

    def answered(self) -> None:
        self.broker.flush_out()

    def disk_full(self, refused: int, why: str) -> None:
        self.broker.disk_full(refused, why)


class Broker:
    """The one queue, its log and its metrics, and the sessions that use them."""

    def __init__(
        self,
        log: Store,
        *,
        prefetch: int = 100,
        max_frame: int = 16 << 20,
        heartbeat_ms: int = 10000,
        users: Mapping[str, User] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        refuse_delay: float = REFUSE_DELAY_SECONDS,
        max_connections: int | None = None,
        ack_timeout: float = ACK_TIMEOUT_SECONDS,
        redelivery: Redelivery | None = None,
        drop_expired: bool = False,
        metrics: Metrics | None = None,
        events: Callable[..., None] = lambda *a, **k: None,
        schedule: Schedule | None = None,
        offload: Offload | None = None,
        clock: Callable[[], float] = time.monotonic,
        loop: Loop | None = None,
    ):
        self.log = log
        self.redelivery = redelivery or Redelivery()
        self.queue: Queue[Peer, Record] = Queue(
            log,
            default_prefetch=prefetch,
            ack_timeout=ack_timeout,
            max_deliveries=self.redelivery.max_deliveries,
        )
        # The dead letters (curb.dead): ack deadlines as the queue's, no due times, no expiry.
        self.dead: Queue[Peer, Record] = Queue(
            DeadSource(log), default_prefetch=prefetch, ack_timeout=ack_timeout, timed=False
        )
        self.drop_expired = drop_expired  # -expired drop: an expired message is ACKed, not dead-lettered
        self.wall_ms = log.wall_ms  # the log's wall clock: due and expiry times are kept by it
        self.max_frame = max_frame
        # The largest stored payload the log takes (a sixth of its ring), known at a SEND's head.
        self.max_message: int = min(max_frame, getattr(log, "max_message", max_frame))
        self.heartbeat_ms = heartbeat_ms
        self.logins = LoginChecks(offload or run_now, lambda callback: self.schedule(0, callback))
        self.users = users  # None: no users file, every client may do everything
        self.connect_timeout = connect_timeout  # 0: no limit
        self.refuse_delay = refuse_delay
        self.max_connections = max_connections  # None: no limit
        self.handshaking = 0  # TLS connections admitted whose handshake is under way
        self.metrics = metrics or Metrics()
        self.events = events
        self.clock = clock  # for the refusal lines of steps that are not given the time
        self._lines: collections.defaultdict[str, LineLimit] = collections.defaultdict(
            lambda: LineLimit(LIMIT_LOG_SECONDS)
        )
        # Default: the event loop running now (a broker is made inside it).
        self.schedule = schedule or loop_schedule(asyncio.get_running_loop())
        # The ack deadlines' time and timer. Default: the event loop running now.
        self.loop: Loop = loop or asyncio.get_running_loop()
        # Read once per pump pass: an asyncio loop's time() is a Python call around
        # time.monotonic, so take that C function directly when it is the loop's clock.
        self._time = time.monotonic if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        self._deadlines = Alarm(self.loop, self._deadline_passed)
        self._due = Alarm(self.loop, self._came_due)
        self.sessions: dict[Peer, None] = {}  # in the order they came
        # Watchers of ./count and open browses, in the order they came (not a set's: the
        # order each pass serves them in must not depend on where objects live).
        self._counters: dict[Peer, None] = {}
        self.count_messages = CountMessages()
        self._count_scheduled = False
        self._pumping = False
        self._pump_wanted = False
        self._dirty: list[Peer] = []
        self._flushing = False  # in flush_out, which pumps after the sessions' output
        self._in_frames = False  # between before_frames and after_frames: flush_out follows
        self._browsing: dict[Peer, None] = {}
        self._browse_scheduled = False
        self._arm_due()  # messages recovered delayed

    # ---------------------------------------------------------------- a session's steps

    def admit(self, now: float, peer: str) -> bool:
        """May one more connection open? At the limit (open sessions and TLS handshakes
        under way), no: it is counted and logged as a refusal."""
        limit = self.max_connections
        if limit is None or len(self.sessions) + self.handshaking < limit:
            return True
        self.metrics.connections_refused += 1
        self._refused(
            "connection_limit",
            f"connection from {peer} closed at once: {limit} connections are open (-max-connections)",
            now,
            peer=peer,
            limit=limit,
        )
        return False

    def web_connection_refused(self, limit: int) -> None:
        """A web connection was closed at the limit (curb.web.front): counted and logged as
        a STOMP connection's is."""
        self.metrics.connections_refused += 1
        self._refused(
            "connection_limit",
            f"a web connection was closed at once: {limit} web connections are open (-max-connections)",
            kind="web",
            limit=limit,
        )

    def join(self, session: Peer) -> None:
        self.sessions[session] = None
        self.metrics.connections_total += 1

    def accept(self, headers: Mapping[str, str], body: bytes, done: Done | None = None, urgent: bool = True) -> None:
        """The one SEND rule, for every front (STOMP over TCP, TLS and WebSocket, HTTP):
        take a message of these headers (the one-hop ones, curb.payload.NOT_STORED, are
        dropped, the rest kept for its MESSAGE; its due and expiry times, curb.timing, are
        read from them) and body, or raise Refused with nothing stored. `done(None)` runs
        once it is fsynced, which is what a RECEIPT or an HTTP 201 waits for;
        `done(reason)` if it could not be stored after all. urgent=False: nobody waits for
        `done`, so the write may wait for company."""
        lines = payload.header_lines(headers)
        data = lines + b"\n" + body
        due_ms = expires_ms = 0
        if lines or len(data) - 1 + message_limits.RESERVE > self.max_frame:  # else nothing to check
            problem = message_limits.send_problem(lines, len(data), self.max_frame)
            if problem is not None:
                message, detail = problem
                raise Refused(message, detail, TOO_LARGE if message == "message too large" else BAD_HEADERS)
            if not headers.keys().isdisjoint(TIME_HEADERS):
                try:
                    due_ms, expires_ms = send_times(headers, self.wall_ms())
                except QueueError as err:
                    raise Refused(str(err), err.advice, BAD_HEADERS) from None
        try:
            self.log.append(data, done, urgent=urgent, due_ms=due_ms, expires_ms=expires_ms)
        except TooLarge as err:
            self.metrics.refused_too_large += 1
            raise Refused(
                "message too large",
                f"{err}: send a smaller message, or ask the operator for a larger -cap",
                TOO_LARGE,
            ) from None
        except QueueFull as err:
            self.metrics.refused_full += 1
            raise Refused("queue full", str(err), FULL, RETRY_FULL_SECONDS) from None
        self.metrics.sent += 1
        if due_ms:
            self._arm_due()
        if self._counters:
            self.counts_changed()

    def publish(self, headers: Mapping[str, str], body: bytes) -> asyncio.Future[None]:
        """`accept` for a front that awaits (HTTP publish): raises Refused at once, else a
        future that is done once the message is fsynced, or fails with NotStored."""
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: str | None) -> None:
            if not stored.done():
                if err is None:
                    stored.set_result(None)
                else:
                    stored.set_exception(NotStored(err))

        self.accept(headers, body, done)
        return stored

    def subscribe(
        self,
        session: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int | None,
        ack_timeout: float | None = None,
        dead: bool = False,
    ) -> Subscription[Peer, Record]:
        """A subscription to the queue, or with `dead` to the dead letters; `ack_timeout`
        None: the broker's -ack-timeout."""
        return (self.dead if dead else self.queue).subscribe(session, sub_id, ack_mode, prefetch, ack_timeout)

    def unsubscribe(self, session: Peer, sub_id: str, dead: bool = False) -> None:
        (self.dead if dead else self.queue).unsubscribe(session, sub_id)

    def ack(self, session: Peer, msg_id: int) -> None:
        """The client is done with the message (and, in client mode, the earlier ones).
        Late (counted and logged) when its ack deadline passed: nothing changes. A dead
        letter's ACK deletes it for good."""
        queue = self._holder(session, msg_id)
        try:
            records = queue.ack(session, msg_id)
        except Late:
            self._late(session, msg_id, "ACK")
            raise
        for rec in records:
            self.log.ack(rec)
        if queue is self.dead:
            self.metrics.dead_acked += len(records)
            self._counts_dirty()
        else:
            self.metrics.acked += len(records)

    def _holder(self, session: Peer, msg_id: int) -> Queue[Peer, Record]:
        """The queue an ACK, NACK or touch of the message is for: the dead letters' when
        the session's `./dead` subscription holds it, or held it until its deadline
        passed (and the queue does not hold it now); else the queue."""
        dead = self.dead
        if dead.wip_count and dead.holds(session, msg_id):
            return dead
        if dead.passed(session, msg_id) and not self.queue.holds(session, msg_id):
            return dead
        return self.queue

    def ack_upto(self, upto: int, done: Done | None) -> None:
        """Every message with an id up to `upto` is done for good, on every connection,
        delayed messages and dead letters too; `done(None)` runs once that is durable."""
        last = self.log.last_id
        if upto > last:
            raise QueueError(
                f"curb-upto {upto} is above the highest message id so far ({last}): "
                f"it would acknowledge messages not yet sent",
                "ACK up to an id the broker has assigned: a MESSAGE's message-id or a browse end "
                "marker's curb-last-id.",
            )
        records = self.queue.ack_upto(upto)
        self.dead.ack_upto(upto)
        self.log.ack_upto(upto, done)
        self.metrics.acked += len(records)
        if self._counters:
            self.counts_changed()

    def browse_dead(self, session: Peer) -> DeadBrowse:
        """A browse of the dead letters as they are now, oldest first: those the log holds
        (read one by one as the browse steps) and those of the dead letters' queue."""
        last, kept = self.log.dead_letters()
        log = self.log
        browse = DeadBrowse(log, last, kept + self.dead.messages(), log.payload)
        self._browsing[session] = None
        self._want_browse()
        return browse

    def redrive(self, count: int | None, moved: Callable[[int], None]) -> None:
        """Move up to `count` (None: all there are when it starts) dead letters back to
        the queue, oldest first, their delivery count reset: the log's, a slice per loop
        pass (a million take a few seconds, and no client waits more than a slice), then
        those back from `./dead` subscribers. `moved(n)` once the last slice is done; what
        it moved is durable once `on_durable` says so. Dead letters a `./dead`
        subscriber holds stay."""
        total = 0
        left = self.log.dead if count is None else count

        def step() -> None:
            nonlocal total, left
            n = len(self.log.redrive(min(left, REDRIVE_SLICE)))
            total += n
            left -= n
            self.pump()
            if n == REDRIVE_SLICE and left:
                self.schedule(0, step)
                return
            revived = self.dead.take_ready(None if count is None else left)
            for rec in revived:
                self.log.revive(rec)
            self.queue.requeue(revived)
            total += len(revived)
            self.metrics.redriven += total
            self.pump()
            moved(total)

        step()

    def browse(self, session: Peer, from_id: int, to_id: int | None) -> Browse:
        """A browse of ids [from_id, to_id] for the session, stepped from the next loop
        pass on. to_id None: the highest id on disk, so that a range a reader plans from
        the end marker's `curb-last-id` holds nothing a power loss could take back."""
        browse = self.log.browse(from_id, self.log.durable_id if to_id is None else to_id)
        self._browsing[session] = None
        self._want_browse()
        return browse

    def end_browse(self, browse: Browse | DeadBrowse) -> None:
        if isinstance(browse, Browse):
            self.log.end_browse(browse)

    def nack(self, session: Peer, msg_id: int, delay_ms: int | None = None) -> None:
        """The client gives the message back: rdy again after `delay_ms` (None: the
        policy's delay), or dead past the delivery limit. A dead letter's NACK puts it
        back among the dead."""
        queue = self._holder(session, msg_id)
        try:
            records = queue.nack(session, msg_id)
        except Late:
            self._late(session, msg_id, "NACK")
            raise
        if queue is self.dead:
            queue.requeue(records)
            return
        self.metrics.nacked += len(records)
        self._requeue(records, delay_ms)

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        """The message's ack deadline is `seconds` from now (Late as for a NACK); a dead
        letter's too."""
        queue = self._holder(session, msg_id)
        try:
            queue.touch(session, msg_id, self.loop.time() + seconds)
        except Late:
            self._late(session, msg_id, "touch")
            raise
        self._deadlines.arm(queue.soonest)

    def _late(self, session: Peer, msg_id: int, what: str) -> None:
        """Count and log (as a refusal line) a settlement that came after its message's
        ack deadline."""
        self.metrics.late_acks += 1
        self._refused(
            "late_ack",
            f"late {what} from {_who(session)}: message {msg_id} passed its ack deadline and went back to the "
            "queue before it; the frame changed nothing",
            self.loop.time(),
            peer=session.peer,
            user=session.user,
            message_id=msg_id,
        )

    def handed_off(self, session: Peer, records: list[Record]) -> None:
        """Messages of an auto subscription went to the connection's transport: only now
        are they done, and their credit is free for more."""
        for rec in records:
            (self.dead if rec.dead else self.queue).ack(session, rec.id)
            self.log.ack(rec)
        self.metrics.delivered += len(records)
        if not self._pump_wanted:
            self._pump_wanted = True
            if not self._flushing:  # a transport that drained took it: pump in this pass
                self.schedule(0, self.flush_out)

    def set_writable(self, session: Peer, writable: bool) -> None:
        """Back-pressure: a session whose transport is full gets no more messages."""
        self.queue.set_writable(session, writable)

    def protocol_error(self, session: Peer, reason: str) -> None:
        """A client's frame was answered with ERROR, and its connection closes."""
        self.metrics.protocol_errors += 1
        self._refused(
            "client_error",
            f"client error from {_who(session)}: {reason}",
            peer=session.peer,
            user=session.user,
            reason=reason,
        )

    def permission_refused(self) -> None:
        """A frame needed a permission its user lacks; its ERROR, a client error whose line
        names the user, follows."""
        self.metrics.permissions_refused += 1

    @property
    def users(self) -> Mapping[str, User] | None:
        return self._users

    @users.setter
    def users(self, table: Mapping[str, User] | None) -> None:
        """A new users table (a reload): logins cached under a changed line are forgotten."""
        self._users = table
        self.logins.users = table or {}

    def remembered_login(self, login: str, passcode: str) -> User | None:
        """The user if this login verified before against the current users file, else None."""
        return self.logins.remembered(login, passcode)

    def check_login(self, session: Peer, login: str, passcode: str, then: Callable[[Answer], None]) -> None:
        """Check a password against the users file off the loop, queued fairly by the
        session's source address; `then(user, None, or SHED)`, possibly at once."""
        source = session.peer.rpartition(":")[0] or session.peer

        def answer(result: Answer) -> None:
            if result is SHED:
                self._login_shed(session)
            then(result)

        self.logins.check(session, source, login, passcode, answer)

    def _login_shed(self, session: Peer) -> None:
        self.metrics.logins_shed += 1
        self._refused(
            "logins_shed",
            f"server busy: shed a login from {session.peer} unchecked, {self.logins.queued} password checks waiting",
            peer=session.peer,
        )

    def connect_timed_out(self, session: Peer, now: float) -> None:
        """A connection sent no CONNECT in time."""
        self.metrics.connect_timeouts += 1
        self._refused(
            "connect_timeout",
            f"closed {session.peer}: no CONNECT within {self.connect_timeout:g} s (-connect-timeout)",
            now,
            peer=session.peer,
        )

    def access_refused(self, session: Peer, login: str | None) -> None:
        """A CONNECT did not log in: `login` is its login header (None: it had none, and
        the client certificate's CN, if any, named no user)."""
        self.metrics.access_refused += 1
        cn = session.identity
        if login is not None:
            tried = f"login {login!r}"
        elif cn is not None:
            tried = f"no login, and certificate CN {cn!r} is not a user"
        else:
            tried = "no login and no client certificate"
        self._refused(
            "access_refused", f"access refused to {session.peer} ({tried})", peer=session.peer, login=login, cn=cn
        )

    def tls_failed(self, peer: str, reason: str, why: str, now: float) -> None:
        """A TLS handshake failed; `reason` is one of curb.metrics.TLS_FAILURES. A client
        that closed the connection itself is counted but not logged: load balancers'
        port checks do that all day, and nothing was refused."""
        self.metrics.tls_failures[reason] += 1
        if reason != "closed":
            self._refused(
                "tls_failed", f"TLS handshake with {peer} failed: {why}", now, kind=reason, peer=peer, reason=reason
            )

    def disk_full(self, refused: int, why: str) -> None:
        """The log could not grow, so it refused the SENDs waiting to be written."""
        self.metrics.refused_disk_full += refused
        self._refused(
            "disk_full",
            f"disk full: {why}; SENDs are refused (not stored) until space is freed on that file system",
            reason=why,
        )

    def _refused(
        self, event: str, text: str, now: float | None = None, kind: str = "", times: int = 1, **fields: object
    ) -> None:
        """The line for `times` refusals of this event (and kind), unless one was logged
        less than LIMIT_LOG_SECONDS ago; a line for several says how many since the last."""
        count = self._lines[f"{event}:{kind}"].hit(self.clock() if now is None else now, times)
        if not count:
            return
        if count > 1:
            text += f" ({count} such since the last line; at most one line per {LIMIT_LOG_SECONDS:g} s)"
        self.events(event, text, count=count, **fields)

    def when_durable(self, done: Done) -> None:
        """Run done(None) once every step asked of the log so far is on disk."""
        self.log.on_durable(done)

    def watch_counts(self, session: Peer, watching: bool) -> None:
        if watching:
            self._counters[session] = None
        else:
            self._counters.pop(session, None)

    def gone(self, session: Peer) -> None:
        """The connection is gone: its subscriptions vanish and its wip is rdy again."""
        self.sessions.pop(session, None)
        self._counters.pop(session, None)
        self._browsing.pop(session, None)
        self.logins.forget(session)
        self.dead.requeue(self.dead.close(session))
        self._requeue(self.queue.close(session))
        self.pump()

    def _requeue(self, records: list[Record], delay_ms: int | None = None, limit: bool = True) -> None:
        """The one place that decides where a message that came back unfinished goes
        (NACK, ack deadline, connection gone; `delay_ms` is what a NACK asked for):
        curb.redelivery's fate, in the queue and in the log (which keeps its delivery
        count and due time). At shutdown (`limit` False) every message is rdy again at
        once: a restart is no consumer's failure."""
        if not limit:
            self.queue.requeue(records)
            for rec in records:
                self.log.requeue(rec)
            return
        fate, queue, log = self.redelivery.fate, self.queue, self.log
        wall_ms = 0
        for rec in records:
            wait = fate(rec.deliveries, delay_ms)
            if wait == 0:
                queue.requeue([rec])
                log.requeue(rec)
            elif wait == DEAD:
                self._bury(rec, REASON_MAX_DELIVERIES)
            else:
                wall_ms = wall_ms or self.wall_ms()
                log.requeue(rec, due_after(wall_ms, wait))  # the log keeps it until due
                self.metrics.delayed_requeues += 1
        if wall_ms:
            self._arm_due()

    def _bury(self, rec: Record, reason: str) -> None:
        """The message is a dead letter, with its reason: marked so in the log, which
        keeps it from then on, as it keeps those found at start-up (no object each: the
        dead letters' queue reads them from the log when a `./dead` reader wants one)."""
        self.log.bury(rec, reason)
        self.log.keep_dead(rec)
        self.metrics.dead_lettered[reason] += 1

    def _expired(self, records: list[Record]) -> None:
        """Messages the queue met expired: dead letters, or (-expired drop) gone."""
        self.metrics.expired += len(records)
        for rec in records:
            if self.drop_expired:
                self.log.ack(rec)
            else:
                self._bury(rec, REASON_EXPIRED)

    # ---------------------------------------------------------------- due times

    def _arm_due(self) -> None:
        """Arm the due timer for the log's soonest delayed message (unless armed sooner)."""
        due = self.log.next_due()
        if due is not None:
            self._due.arm(self.loop.time() + max(0, due - self.wall_ms()) / 1000)

    def _came_due(self, armed_for: float) -> None:
        self._release()

    def _release(self) -> None:
        """What the log kept until now is due: it joins the log's ready line (the front of
        the queue's line), a slice per loop pass, and is delivered as consumers can take
        it; then the timer is armed for what is left."""
        if self.log.release(self.wall_ms()):
            self.schedule(0, self._release)
        else:
            self._arm_due()
        self.pump()

    # ---------------------------------------------------------------- ack deadlines

    def _deadline_passed(self, armed_for: float) -> None:
        """The timer (one for the queue's deadlines and the dead letters') fired: every
        delivery due by now goes back as a NACK's would, a dead letter among the dead;
        the connections that held them are untouched."""
        now = self.loop.time()
        # A loop may fire a timer a clock tick early: what it was armed for is due.
        expired = self.queue.expire(max(now, armed_for))
        dead = self.dead.expire(max(now, armed_for))
        # Armed before the pump, whose deliveries may come sooner.
        self._deadlines.arm(self.queue.next_deadline())
        self._deadlines.arm(self.dead.next_deadline())
        if expired:
            self._timed_out(expired, now, "the queue")
            self._requeue([rec for _, rec in expired])
        if dead:
            self._timed_out(dead, now, "the dead letters")
            self.dead.requeue([rec for _, rec in dead])
        if expired or dead:
            self.pump()

    def _timed_out(self, expired: list[tuple[Subscription[Peer, Record], Record]], now: float, where: str) -> None:
        """Count and log (as a refusal line, one per kind) deliveries whose deadline passed."""
        self.metrics.ack_timeouts += len(expired)
        sub, rec = expired[-1]
        self._refused(
            "ack_timeout",
            f"ack deadline passed: {len(expired)} delivered messages went back to {where} (the last: "
            f"message {rec.id}, held by {_who(sub.conn)})",
            now,
            kind=where,
            times=len(expired),
            peer=sub.conn.peer,
            user=sub.conn.user,
            message_id=rec.id,
        )

    # ---------------------------------------------------------------- shutdown

    def stop_delivering(self) -> None:
        """Shutdown, first step: no session reads or gets messages any more; all wip is rdy."""
        for session in list(self.sessions):
            session.stop_reading()
            self.give_back(session)

    def give_back(self, session: Peer) -> None:
        """Shutdown: the session's subscriptions end and its wip is rdy again at once, its
        delivery not counted against the limit (a restart is no consumer's failure)."""
        self.dead.requeue(self.dead.close(session))
        self._requeue(self.queue.close(session), limit=False)

    def close_sessions(self) -> None:
        """Shutdown, last step: every connection closes once its output is written."""
        for session in list(self.sessions):
            session.close()

    # ---------------------------------------------------------------- delivery and output

    def pump(self) -> None:
        """Hand out messages, one at a time, while some subscription has credit and its
        session can take output: a session stops taking once its unsent output passes
        its bound (curb.session), so a pass makes at most about that much per
        connection, whatever the prefetch or the message size. A pump called from within
        a pass is skipped, so that each session gets its messages in the queue's order."""
        queue = self.queue
        if queue.has_credit() and not self._pumping:
            self._pumping = True
            delivered = redelivered = 0
            try:
                log = self.log
                now = self._time()
                wall_ms = self.wall_ms()
                while (got := queue.next_delivery(now, wall_ms)) is not None:
                    sub, rec = got
                    log.delivered(rec)
                    sub.conn.deliver(sub, rec, log.payload(rec))
                    if sub.ack_mode != "auto":
                        delivered += 1
                    if rec.deliveries > 1:
                        redelivered += 1
            finally:
                self._pumping = False
                self.metrics.delivered += delivered
                self.metrics.redelivered += redelivered
            soonest = queue.soonest
            if soonest is not None and (self._deadlines.at is None or soonest < self._deadlines.at):
                self._deadlines.arm(soonest)
            if queue.expired:
                self._expired(queue.take_expired())
            if queue.spent:
                for rec in queue.take_spent():
                    self._bury(rec, REASON_MAX_DELIVERIES)
        if self.dead.has_credit() and not self._pumping:
            self._pump_dead()
        if self._counters:
            self.counts_changed()
        if self._browsing:
            self._want_browse()

    def _pump_dead(self) -> None:
        """Hand out dead letters to `./dead` subscribers while they have credit."""
        dead = self.dead
        self._pumping = True
        try:
            now = self._time()
            while (got := dead.next_delivery(now)) is not None:
                sub, rec = got
                sub.conn.deliver(sub, rec, self.log.payload(rec))
        finally:
            self._pumping = False
        self._deadlines.arm(dead.soonest)

    def _want_browse(self) -> None:
        if not self._browse_scheduled:
            self._browse_scheduled = True
            self.schedule(0, self._browse_pass)

    def _browse_pass(self) -> None:
        """One step of every browse whose session can take output; again next loop pass
        while some could go on (those waiting for writes go on from `pump`)."""
        self._browse_scheduled = False
        again = False
        for session in list(self._browsing):
            if not session.writable:
                continue
            more = session.browse_more(BROWSE_STEP_BYTES)
            if not session.browsing:
                self._browsing.pop(session, None)
            again = again or more
        if again:
            self._want_browse()

    def before_frames(self) -> None:
        """A connection's frames are about to be handled, and `after_frames` follows in
        the same call (the session makes sure): until then, what they ask of the log and
        the output they make wait for it, with no loop callback of their own."""
        self._in_frames = True
        self.log.hold_flush = True

    def after_frames(self) -> None:
        """A connection's frames are handled: write them to the log, deliver what can
        be delivered, and send the answers, all in this loop pass."""
        self.log.hold_flush = False
        try:
            self.log.flush()
            self.pump()
        finally:
            self._in_frames = False
        self.flush_out()

    def want_flush(self, session: Peer) -> None:
        """Gather every connection's output of this loop pass into one write each."""
        if not self._dirty and not self._in_frames:
            self.schedule(0, self.flush_out)
        self._dirty.append(session)

    def flush_out(self) -> None:
        dirty, self._dirty = self._dirty, []
        self._flushing = True
        try:
            for session in dirty:
                session.output_due()
        finally:
            self._flushing = False
        if self._pump_wanted:
            self._pump_wanted = False
            self.pump()

    # ---------------------------------------------------------------- counts

    def counts(self) -> dict[str, int]:
        """rdy (due and waiting), delayed (not yet due), wip, dead letters (rdy and held
        by `./dead` subscribers) and queue subscriptions."""
        return {
            "rdy": self.log.unread + self.queue.redeliver_count,
            "wip": self.queue.wip_count,
            "delayed": self.log.delayed,
            "dead": self.log.dead + self.dead.redeliver_count + self.dead.wip_count,
            "subscriptions": self.queue.subscription_count,
        }

    def _counts_dirty(self) -> None:
        if self._counters:
            self.counts_changed()

    def counts_changed(self) -> None:
        """Coalesce count updates for ./count subscribers into one MESSAGE per change, at
        most every COUNT_COALESCE_SECONDS, and less often the more subscribers there are
        (COUNT_FRAMES_PER_SECOND in all)."""
        if not self._count_scheduled:
            self._count_scheduled = True
            delay = max(COUNT_COALESCE_SECONDS, len(self._counters) / COUNT_FRAMES_PER_SECOND)
            self.schedule(delay, self._send_counts)

    def _send_counts(self) -> None:
        self._count_scheduled = False
        counts = self.counts()
        for session in list(self._counters):
            session.send_counts(counts)

    def gauges(self) -> dict[str, int]:
        counts = self.counts()
        return {
            "rdy": counts["rdy"],
            "wip": counts["wip"],
            "delayed": counts["delayed"],
            "dead": counts["dead"],
            "connections": len(self.sessions),
            "subscriptions": counts["subscriptions"],
            "log_bytes": self.log.file_bytes,
            "live_bytes": self.log.live_bytes,
            "cap": self.log.end,
        }


def _who(session: Peer) -> str:
    """The peer, and the user once it logged in: '10.0.0.5:51234 (user 'alice')'."""
    return session.peer if session.user is None else f"{session.peer} (user {session.user!r})"
