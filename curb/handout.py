"""Handing the queue's messages out and taking them back: the broker's per-message steps.

`pump` hands out messages one at a time while a subscription has credit and its session
can take output; ACK, NACK, a bounce, a touch and an auto subscription's hand-off settle
what was handed out, on the queue that holds it (the dead letters' when the session's
`./dead` subscription holds it). Each step is the queue's call, then the log's, then the
metrics'. Kept apart from curb.broker, a class of mixins that stays pure Python, so that
these steps, which run for every message, are compiled (mypyc) with the queue and the log.

Rules:
- Once the log failed (`halted`), nothing is handed out: after a failed write the log's
  memory may name records that never reached the disk.
- A pump called from within a pump is skipped, so each session gets its messages in the
  queue's order.
- Every message that comes back unfinished goes through the return policy
  (curb.returns); an ACK, NACK or touch after the message's ack deadline passed is Late,
  counted and logged (curb.refusals), and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from curb.browse_steps import BrowseSteps
from curb.counts import CountWatch
from curb.log.cursor import Record
from curb.metrics import Metrics
from curb.peer import Peer
from curb.queue import Queue
from curb.queue_errors import Late
from curb.redelivery import REASON_MAX_DELIVERIES
from curb.refusals import Refusals
from curb.returns import Loop, Returns


class Handed(Protocol):
    """What handing out and settling need of the log."""

    def delivered(self, rec: Record) -> None: ...
    def payload(self, rec: Record) -> bytes | memoryview: ...
    def ack(self, rec: Record) -> None: ...


class Handout:
    """The queue's and the dead letters' deliveries, and the steps that settle them."""

    def __init__(
        self,
        queue: Queue[Peer, Record],
        dead: Queue[Peer, Record],
        log: Handed,
        metrics: Metrics,
        refusals: Refusals,
        count_watch: CountWatch,
        browses: BrowseSteps,
        returns: Returns,
        loop: Loop,
        time: Callable[[], float],
        wall_ms: Callable[[], int],
    ):
        self.queue = queue
        self.dead = dead
        self.log = log
        self.metrics = metrics
        self.refusals = refusals
        self.count_watch = count_watch
        self.browses = browses
        self.returns = returns
        self.loop = loop
        self.time = time  # read once per pump pass
        self.wall_ms = wall_ms
        self.halted: str | None = None  # why the log failed: nothing is handed out since
        self._pumping = False

    # ---------------------------------------------------------------- handing out

    def pump(self) -> None:
        """Hand out messages, one at a time, while some subscription has credit and its
        session can take output: a session stops taking once its unsent output passes
        its bound (curb.session), so a pass makes at most about that much per
        connection, whatever the prefetch or the message size."""
        if self.halted is not None:
            return
        queue = self.queue
        if queue.has_credit() and not self._pumping:
            self._pumping = True
            delivered = redelivered = 0
            try:
                log = self.log
                now = self.time()
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
            self._after_pass(queue)
        if self.dead.has_credit() and not self._pumping:
            self._pump_dead()
        if self.count_watch.watchers:
            self.count_watch.changed()
        if self.browses.sessions:
            self.browses.want()

    def _after_pass(self, queue: Queue[Peer, Record]) -> None:
        """After a pass of the queue's deliveries: its soonest ack deadline armed, what it
        met expired or past the delivery limit given to the return policy."""
        returns = self.returns
        soonest = queue.soonest
        deadlines = returns.deadlines
        if soonest is not None and (deadlines.at is None or soonest < deadlines.at):
            deadlines.arm(soonest)
        if queue.expired:
            returns.expired(queue.take_expired())
        if queue.spent:
            for rec in queue.take_spent():
                returns.bury(rec, REASON_MAX_DELIVERIES)

    def _pump_dead(self) -> None:
        """Hand out dead letters to `./dead` subscribers while they have credit."""
        dead = self.dead
        self._pumping = True
        try:
            now = self.time()
            while (got := dead.next_delivery(now)) is not None:
                sub, rec = got
                sub.conn.deliver(sub, rec, self.log.payload(rec))
        finally:
            self._pumping = False
        self.returns.deadlines.arm(dead.soonest)

    # ---------------------------------------------------------------- settling

    def ack(self, session: Peer, msg_id: int) -> None:
        """The client is done with the message (and, in client mode, the earlier ones).
        A dead letter's ACK deletes it for good."""
        queue, records = self._taken(session, msg_id, "ACK")
        log = self.log
        for rec in records:
            log.ack(rec)
        if queue is self.dead:
            self.metrics.dead_acked += len(records)
            self.count_watch.changed()
        else:
            self.metrics.acked += len(records)

    def nack(self, session: Peer, msg_id: int, delay_ms: int | None = None) -> None:
        """The client gives the message back: rdy again after `delay_ms` (None: the
        policy's delay), or dead past the delivery limit."""
        records = self._given_back(session, msg_id)
        self.metrics.nacked += len(records)
        self.returns.requeue(records, delay_ms)

    def bounce(self, session: Peer, msg_id: int) -> None:
        """NACK curb-undelivered:true: the message reached nobody (a router had no client
        with credit for it), so it is rdy at once and its delivery is not counted."""
        records = self._given_back(session, msg_id)
        for rec in records:
            rec.deliveries = max(0, rec.deliveries - 1)
        self.metrics.bounced += len(records)
        self.returns.requeue(records, 0)

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        """The message's ack deadline is `seconds` from now; a dead letter's too."""
        queue = self._holder(session, msg_id)
        try:
            queue.touch(session, msg_id, self.loop.time() + seconds)
        except Late:
            self.refusals.late(session, msg_id, "touch", self.loop.time())
            raise
        self.returns.deadlines.arm(queue.soonest)

    def handed_off(self, session: Peer, records: Sequence[Record]) -> None:
        """Messages of an auto subscription went to the connection's transport: only now
        are they done (the caller frees their credit for more)."""
        for rec in records:
            (self.dead if rec.dead else self.queue).ack(session, rec.id)
            self.log.ack(rec)
        self.metrics.delivered += len(records)

    def _given_back(self, session: Peer, msg_id: int) -> list[Record]:
        """A NACK's messages; none when they are dead letters, which go back among the dead."""
        queue, records = self._taken(session, msg_id, "NACK")
        if queue is self.dead:
            queue.requeue(records)
            return []
        return records

    def _taken(self, session: Peer, msg_id: int, command: str) -> tuple[Queue[Peer, Record], list[Record]]:
        """The queue holding the message, and what an ACK or NACK (`command`) of it takes
        out of that queue's wip; Late, counted and logged, past its ack deadline."""
        queue = self._holder(session, msg_id)
        try:  # each a direct call, compiled (a bound method picked first would be a generic one)
            return queue, queue.ack(session, msg_id) if command == "ACK" else queue.nack(session, msg_id)
        except Late:
            self.refusals.late(session, msg_id, command, self.loop.time())
            raise

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
