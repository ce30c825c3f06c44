"""The one coordinator of the queue's steps, shared by every session.

Sessions say what a client did (send, subscribe, ack, nack, went away, was handed a
message); only this module turns that into calls on the queue state machine, the log and
the metrics, so each step is written once: an ACK is `queue.ack` then `log.ack`, and every
message that comes back unfinished goes through the return policy (curb.returns). Dead
letters are served by a second queue (curb.dead).

Accepting a message is one rule for every front (`accept`, curb.intake's, compiled;
`publish` is the same as a future): the limits a MESSAGE must meet
(curb.message_limits), the headers kept (curb.payload), and what a RECEIPT or an HTTP
201 waits for (the fsync). A front only maps `Refused.reason` (curb.refused) and its
`done` answer to its own words.

Delivery is `pump`, and settling what was delivered (ACK, NACK, a bounce, a touch)
the steps of curb.handout, which run for every message. Once the log failed
(`log_failed`), nothing is handed out or browsed: after a failed write the log's memory
may name records that never reached the disk, so a delivery or a browse read then could
be wrong; the owner stops the broker.

The rest is in units of their own, each with its invariants: refusals and their lines
(curb.refusals), the return policy and its two timers (curb.returns), a loop pass's
batching (curb.loop_pass), `./count` coalescing (curb.counts) and browse stepping
(curb.browse_steps). They take a scheduler and a loop as parameters, so tests drive the
broker without an event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from curb.backend import Backend, Browsing
from curb.broker_config import BrokerConfig
from curb.browse_steps import BrowseSteps
from curb.counts import CountWatch
from curb.dead import DeadBrowse, DeadSource
from curb.handout import Handout
from curb.intake import Intake
from curb.log.browse import Browse
from curb.log.cursor import Record
from curb.log.events import NoEvents
from curb.logins import Answer, LoginChecks, Offload, UsersFile, run_now
from curb.loop_pass import LoopPass
from curb.metrics import Metrics
from curb.peer import Peer
from curb.queue import Queue, Subscription
from curb.queue_errors import QueueError
from curb.refusals import Refusals
from curb.refused import NotStored
from curb.returns import Kept, Loop, Returns, Schedule
from curb.single_queue import SingleQueue
from curb.users import User

Done = Callable[[str | None], None]


class Store(Kept, Protocol):
    """What the broker needs of the log (curb.log.Log, or a fake in tests), beyond what
    the return policy needs (curb.returns.Kept) and a loop pass (curb.loop_pass.Flushed)."""

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
    @property
    def delayed(self) -> int: ...

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> Record: ...
    def delivered(self, rec: Record) -> None: ...
    def next_dead(self) -> Record | None: ...
    def dead_letters(self) -> tuple[int, list[Record]]: ...
    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]: ...
    def read_dead(self, mid: int) -> Record | None: ...
    def ack_upto(self, upto: int, done: Done | None = None) -> None: ...
    def browse(self, from_id: int, to_id: int) -> Browse: ...
    def end_browse(self, browse: Browse) -> None: ...
    def on_durable(self, done: Done) -> None: ...
    def payload(self, rec: Record) -> bytes | memoryview: ...
    def next_ready(self) -> Record | None: ...
    def flush(self) -> None: ...


def publish(
    broker: Backend, headers: Mapping[str, str], body: bytes, session: Peer | None = None
) -> asyncio.Future[None]:
    """`accept` for a front that awaits (HTTP publish) on behalf of `session`: raises
    Refused at once, else a future that is done once the message is fsynced, or fails
    with NotStored."""
    stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(err: str | None) -> None:
        if not stored.done():
            if err is None:
                stored.set_result(None)
            else:
                stored.set_exception(NotStored(err))

    broker.accept(headers, body, done, session=session)
    return stored


def loop_schedule(loop: asyncio.AbstractEventLoop) -> Schedule:
    """A Schedule on an event loop: call_soon for no delay, else call_later."""
    call_soon, call_later = loop.call_soon, loop.call_later

    def schedule(delay: float, callback: Callable[[], None]) -> object:
        return call_soon(callback) if delay <= 0 else call_later(delay, callback)

    return schedule


class BrokerEvents(NoEvents):
    """The log's events (curb.log.events) for the broker made over that log. The log is
    made first (the broker reads its counts when made), so its owner gives the log this
    and sets `broker` once the broker exists, before the log's first flush. A fatal error
    halts the broker (`Broker.log_failed`); stopping it, and damage, are the owner's
    (curb.instance)."""

    broker: Broker

    def written(self) -> None:
        self.broker.pump()

    def walked(self) -> None:
        self.broker.count_watch.changed()

    def answered(self) -> None:
        self.broker.passes.flush_out()

    def disk_full(self, refused: int, why: str) -> None:
        self.broker.refusals.disk_full(refused, why)

    def fatal(self, reason: str) -> None:
        self.broker.log_failed(reason)


class Broker(SingleQueue, UsersFile):
    """The one queue, its log and its metrics, and the sessions that use them."""

    def __init__(
        self,
        log: Store,
        config: BrokerConfig | None = None,
        *,
        users: Mapping[str, User] | None = None,
        metrics: Metrics | None = None,
        events: Callable[..., None] = lambda *a, **k: None,
        schedule: Schedule | None = None,
        offload: Offload | None = None,
        clock: Callable[[], float] = time.monotonic,
        loop: Loop | None = None,
    ):
        self.log = log
        self.config = config = config or BrokerConfig()
        self.queue: Queue[Peer, Record] = Queue(
            log,
            default_prefetch=config.prefetch,
            ack_timeout=config.ack_timeout,
            max_deliveries=config.redelivery.max_deliveries,
        )
        # The dead letters (curb.dead): ack deadlines as the queue's, no due times, no expiry.
        self.dead: Queue[Peer, Record] = Queue(
            DeadSource(log), default_prefetch=config.prefetch, ack_timeout=config.ack_timeout, timed=False
        )
        self.wall_ms = log.wall_ms  # the log's wall clock: due and expiry times are kept by it
        # The largest stored payload the log takes (a sixth of its ring), known at a SEND's head.
        self.max_message: int = min(config.max_frame, getattr(log, "max_message", config.max_frame))
        # Default: the event loop running now (a broker is made inside it).
        self.schedule = schedule or loop_schedule(asyncio.get_running_loop())
        self.logins = LoginChecks(offload or run_now, lambda callback: self.schedule(0, callback))
        self.users = users  # None: no users file, every client may do everything
        self.handshaking = 0  # TLS connections admitted whose handshake is under way
        self.metrics = metrics = metrics or Metrics()
        self.refusals = Refusals(metrics, events, clock)
        # The ack deadlines' time and timers. Default: the event loop running now.
        self.loop: Loop = loop or asyncio.get_running_loop()
        self.sessions: dict[Peer, None] = {}  # in the order they came
        self.count_watch = CountWatch(self.counts, self.schedule)
        self.browses = BrowseSteps(self.schedule)
        self.returns = Returns(
            self.queue,
            self.dead,
            log,
            redelivery=config.redelivery,
            drop_expired=config.drop_expired,
            metrics=metrics,
            refusals=self.refusals,
            loop=self.loop,
            schedule=self.schedule,
            pump=lambda: self.pump(),  # the handout's, made next: timers only
        )
        self.handout = handout = Handout(
            self.queue,
            self.dead,
            log,
            metrics,
            self.refusals,
            self.count_watch,
            self.browses,
            self.returns,
            self.loop,
            # Read once per pump pass: an asyncio loop's time() is a Python call around
            # time.monotonic, so take that C function directly when it is the loop's clock.
            time.monotonic if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time,
            self.wall_ms,
        )
        # The per-message steps are the handout's own (compiled), with no hop through here
        # (but `touch`, a method: the simulator's self-check replaces it on the class).
        self.pump = handout.pump
        self.ack, self.nack, self.bounce = handout.ack, handout.nack, handout.bounce
        # The one SEND rule (curb.intake), compiled, for every front.
        self.accept = Intake(log, config.max_frame, self.wall_ms, metrics, self.returns, self.count_watch).accept
        self.passes = LoopPass(log, handout.pump, self.schedule)

    # ---------------------------------------------------------------- a session's steps

    def admit(self, now: float, peer: str) -> bool:
        """May one more connection open? At the limit (open sessions and TLS handshakes
        under way), no: it is counted and logged as a refusal."""
        limit = self.config.max_connections
        if limit is None or len(self.sessions) + self.handshaking < limit:
            return True
        self.refusals.connection_limit(peer, limit, now)
        return False

    def join(self, session: Peer) -> None:
        self.sessions[session] = None
        self.metrics.connections_total += 1

    def subscribe(
        self,
        session: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int | None,
        ack_timeout: float | None = None,
        dead: bool = False,
        name: str = "",
    ) -> Subscription[Peer, Record]:
        """A subscription to the queue, or with `dead` to the dead letters; `ack_timeout`
        None: the broker's -ack-timeout."""
        return (self.dead if dead else self.queue).subscribe(session, sub_id, ack_mode, prefetch, ack_timeout)

    def unsubscribe(self, session: Peer, sub_id: str, dead: bool = False) -> None:
        (self.dead if dead else self.queue).unsubscribe(session, sub_id)

    def ack_upto(self, upto: int, done: Done | None = None, destination: str | None = None) -> None:
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
        self.count_watch.changed()

    def browse_dead(self, session: Peer, name: str = "") -> DeadBrowse:
        """A browse of the dead letters as they are now, oldest first: those the log holds
        (read one by one as the browse steps) and those of the dead letters' queue."""
        last, kept = self.log.dead_letters()
        browse = DeadBrowse(self.log, last, kept + self.dead.messages(), self.log.payload)
        self.browses.add(session)
        return browse

    def browse(self, session: Peer, from_id: int, to_id: int | None, name: str = "") -> Browse:
        """A browse of ids [from_id, to_id] for the session, stepped from the next loop
        pass on. to_id None: the highest id on disk, so that a range a reader plans from
        the end marker's `curb-last-id` holds nothing a power loss could take back."""
        browse = self.log.browse(from_id, self.log.durable_id if to_id is None else to_id)
        self.browses.add(session)
        return browse

    def end_browse(self, browse: Browsing) -> None:
        if isinstance(browse, Browse):
            self.log.end_browse(browse)

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        self.handout.touch(session, msg_id, seconds)

    def handed_off(self, session: Peer, records: Sequence[Record]) -> None:
        """Messages of an auto subscription went to the connection's transport: only now
        are they done, and their credit is free for more."""
        self.handout.handed_off(session, records)
        self.passes.want_pump()

    def set_writable(self, session: Peer, writable: bool) -> None:
        """Back-pressure: a session whose transport is full gets no more messages."""
        self.queue.set_writable(session, writable)

    def check_login(self, session: Peer, login: str, passcode: str, then: Callable[[Answer], None]) -> None:
        """Check a password against the users file off the loop, queued fairly by the
        session's source address; `then(user, None, or SHED)`, possibly at once."""

        def shed(_: Answer) -> None:
            self.refusals.login_shed(session, self.logins.queued)

        self.logins.check_peer(session.peer, session, login, passcode, then, shed)

    def when_durable(self, done: Done) -> None:
        """Run done(None) once every step asked of the log so far is on disk."""
        self.log.on_durable(done)

    def durability(self, session: Peer) -> Callable[[Done], None]:
        return self.when_durable

    def gone(self, session: Peer) -> None:
        """The connection is gone: its subscriptions vanish and its wip is rdy again."""
        self.sessions.pop(session, None)
        self.count_watch.watch(session, False)
        self.browses.sessions.pop(session, None)
        self.logins.forget(session)
        self.returns.closed(session)
        self.pump()

    # ---------------------------------------------------------------- shutdown

    def stop_delivering(self) -> None:
        """Shutdown, first step: no session reads or gets messages any more; all wip is rdy
        again at once, its delivery not counted against the limit (a restart is no
        consumer's failure)."""
        for session in list(self.sessions):
            session.stop_reading()
            self.returns.closed(session, limit=False)

    def close_sessions(self) -> None:
        """Shutdown, last step: every connection closes once its output is written."""
        for session in list(self.sessions):
            session.close()

    def log_failed(self, reason: str) -> None:
        """A write or sync failed and the log stopped for good: from now on no message is
        handed out and no browse stepped (curb.browse_steps), so no answer rests on
        records a failed write may not have put on disk."""
        self.handout.halted = reason
        self.browses.halted = True

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
