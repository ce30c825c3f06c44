"""The return policy: where a message that comes back unfinished goes, and the two timers
that bring messages back on time.

A NACK, an ack deadline passed, a connection gone or silent past its heart-beat, shutdown:
every such message goes through `Returns.requeue`, the one place that decides (by
curb.redelivery's fate) whether it is rdy again at once, after a delay, or a dead letter
past the delivery limit, in the queue and in the log alike. An expired message the queue
meets on the way to a delivery is dead-lettered, or with -expired drop ACKed (`expired`).

Ack deadlines are kept by the queue, and those of `./dead` subscribers by the dead
letters' queue; one timer (`deadlines`) is armed for the earliest of them all, re-armed
only when a sooner one appears, and when it fires what is due comes back as its NACK
would (a dead letter among the dead). Delayed messages are the log's to keep until due, by
the log's wall clock (milliseconds since the epoch, so that a due time means the same
after a restart); a second timer is armed for the log's soonest due time, by how far it
lies from that clock now, and a message is released only once the clock reads its due
time (a delay counts from the clock's next millisecond, curb.timing.due_after, since a
reading is rounded down): never early.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from curb.log.cursor import Record
from curb.metrics import Metrics
from curb.peer import Peer
from curb.queue import Queue, Subscription
from curb.redelivery import DEAD, REASON_EXPIRED, REASON_MAX_DELIVERIES, Redelivery
from curb.refusals import Refusals
from curb.timing import due_after

Schedule = Callable[[float, Callable[[], None]], object]
# Dead letters a redrive moves per loop pass: each is read back and rewritten in place,
# about 9 us, so a pass holds other clients up about 5 ms.
REDRIVE_SLICE = 512


class Timer(Protocol):
    def cancel(self) -> None: ...


class Loop(Protocol):
    """What the timers need: an asyncio event loop has both."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], None]) -> Timer: ...


class Kept(Protocol):
    """What the return policy needs of the log: it keeps delivery counts, due times and
    dead letters."""

    def ack(self, rec: Record) -> None: ...
    def requeue(self, rec: Record, due_ms: int = 0) -> None: ...
    def bury(self, rec: Record, reason: str) -> None: ...
    def keep_dead(self, rec: Record) -> None: ...
    def wall_ms(self) -> int: ...
    def release(self, now_ms: int) -> bool: ...
    def next_due(self) -> int | None: ...
    def redrive(self, count: int) -> list[int]: ...
    def revive(self, rec: Record) -> None: ...
    @property
    def dead(self) -> int: ...


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


class Returns:
    """The policy for the queue and the dead letters' queue over the log; `pump` hands
    out what came back."""

    def __init__(
        self,
        queue: Queue[Peer, Record],
        dead: Queue[Peer, Record],
        log: Kept,
        *,
        redelivery: Redelivery,
        drop_expired: bool,
        metrics: Metrics,
        refusals: Refusals,
        loop: Loop,
        schedule: Schedule,
        pump: Callable[[], None],
    ):
        self.queue, self.dead, self.log = queue, dead, log
        self.redelivery = redelivery
        self.drop_expired = drop_expired
        self.metrics = metrics
        self.refusals = refusals
        self.loop = loop
        self.schedule = schedule
        self.pump = pump
        self.deadlines = Alarm(loop, self._deadline_passed)
        self._due = Alarm(loop, lambda armed_for: self._release())
        self.arm_due()  # messages recovered delayed

    def requeue(self, records: list[Record], delay_ms: int | None = None, limit: bool = True) -> None:
        """Where each message that came back goes (`delay_ms` is what a NACK asked for):
        curb.redelivery's fate, in the queue and in the log (which keeps its delivery count
        and due time). At shutdown (`limit` False) every message is rdy again at once: a
        restart is no consumer's failure."""
        queue, log = self.queue, self.log
        if not limit:
            queue.requeue(records)
            for rec in records:
                log.requeue(rec)
            return
        fate = self.redelivery.fate
        wall_ms = 0
        for rec in records:
            wait = fate(rec.deliveries, delay_ms)
            if wait == 0:
                queue.requeue([rec])
                log.requeue(rec)
            elif wait == DEAD:
                self.bury(rec, REASON_MAX_DELIVERIES)
            else:
                wall_ms = wall_ms or log.wall_ms()
                log.requeue(rec, due_after(wall_ms, wait))  # the log keeps it until due
                self.metrics.delayed_requeues += 1
        if wall_ms:
            self.arm_due()

    def bury(self, rec: Record, reason: str) -> None:
        """The message is a dead letter, with its reason: marked so in the log, which
        keeps it from then on, as it keeps those found at start-up (no object each: the
        dead letters' queue reads them from the log when a `./dead` reader wants one)."""
        self.log.bury(rec, reason)
        self.log.keep_dead(rec)
        self.metrics.dead_lettered[reason] += 1

    def expired(self, records: list[Record]) -> None:
        """Messages the queue met expired: dead letters, or (-expired drop) gone."""
        self.metrics.expired += len(records)
        for rec in records:
            if self.drop_expired:
                self.log.ack(rec)
            else:
                self.bury(rec, REASON_EXPIRED)

    def closed(self, session: Peer, limit: bool = True) -> None:
        """The session's subscriptions end: its wip comes back (`limit` False at shutdown:
        rdy again at once), its dead letters among the dead."""
        self.dead.requeue(self.dead.close(session))
        self.requeue(self.queue.close(session), limit=limit)

    def redrive(self, count: int | None, moved: Callable[[int], None]) -> None:
        """Move up to `count` (None: all there are when it starts) dead letters back to
        the queue, oldest first, their delivery count reset: the log's, a slice per loop
        pass (a million take a few seconds, and no client waits more than a slice), then
        those back from `./dead` subscribers. `moved(n)` once the last slice is done; what
        it moved is durable once `on_durable` says so. Dead letters a `./dead`
        subscriber holds stay."""
        log = self.log
        total = 0
        left = log.dead if count is None else count

        def step() -> None:
            nonlocal total, left
            n = len(log.redrive(min(left, REDRIVE_SLICE)))
            total += n
            left -= n
            self.pump()
            if n == REDRIVE_SLICE and left:
                self.schedule(0, step)
                return
            revived = self.dead.take_ready(None if count is None else left)
            for rec in revived:
                log.revive(rec)
            self.queue.requeue(revived)
            total += len(revived)
            self.metrics.redriven += total
            self.pump()
            moved(total)

        step()

    def arm_due(self) -> None:
        """Arm the due timer for the log's soonest delayed message (unless armed sooner)."""
        due = self.log.next_due()
        if due is not None:
            self._due.arm(self.loop.time() + max(0, due - self.log.wall_ms()) / 1000)

    def _release(self) -> None:
        """What the log kept until now is due: it joins the log's ready line (the front of
        the queue's line), a slice per loop pass, and is delivered as consumers can take
        it; then the timer is armed for what is left."""
        if self.log.release(self.log.wall_ms()):
            self.schedule(0, self._release)
        else:
            self.arm_due()
        self.pump()

    def _deadline_passed(self, armed_for: float) -> None:
        """Every delivery due by now goes back as a NACK's would, a dead letter among the
        dead; the connections that held them are untouched."""
        now = self.loop.time()
        # A loop may fire a timer a clock tick early: what it was armed for is due.
        expired = self.queue.expire(max(now, armed_for))
        dead = self.dead.expire(max(now, armed_for))
        # Armed before the pump, whose deliveries may come sooner.
        self.deadlines.arm(self.queue.next_deadline())
        self.deadlines.arm(self.dead.next_deadline())
        if expired:
            self._timed_out(expired, now, "the queue")
            self.requeue([rec for _, rec in expired])
        if dead:
            self._timed_out(dead, now, "the dead letters")
            self.dead.requeue([rec for _, rec in dead])
        if expired or dead:
            self.pump()

    def _timed_out(self, expired: list[tuple[Subscription[Peer, Record], Record]], now: float, where: str) -> None:
        sub, rec = expired[-1]
        self.refusals.timed_out(len(expired), sub.conn, rec.id, now, where)
