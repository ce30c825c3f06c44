"""The queue's state machine: which message goes to which subscription, and when it comes back.

Rules (pure state, no sockets, no files):
- A message is rdy, wip on exactly one subscription, or done. The source hands out
  never-delivered rdy messages in FIFO order; messages put back with `requeue` wait in a
  heap, oldest id first, ahead of the source.
- Taking a message out of wip without finishing it (NACK, `close`, `expire`) does not
  place it: those calls return it, and the caller's one policy point decides where it
  goes: `requeue` (rdy again at the front of the line), or out of this queue (delayed
  or a dead letter: the log keeps those).
- A subscription holds at most `prefetch` wip messages, as many as it asked for (up to
  `max_prefetch`; more is refused, never cut). ACK and NACK free credit; in
  "client" mode they are cumulative over the subscription's wip in delivery order.
- "auto" subscriptions hold wip and credit like the others: the caller ACKs a message for
  them once it has handed it to the connection, so that a consumer that stops reading
  holds at most `prefetch` messages, and a message it never got is rdy again when it goes.
- UNSUBSCRIBE pauses a subscription: it gets nothing more, its wip stays and can still be
  ACKed or NACKed on its connection. Closing the connection returns all of its wip.
- ACK up to an id (`ack_upto`) finishes every message with an id up to it, wherever it
  is: wip on any connection or waiting for redelivery. A later ACK or NACK of such a
  message by its holder gets the answer of any unknown id (QueueError).
- Ack deadlines: a delivery to a subscription with an ack timeout must be ACKed or
  NACKed by `now` plus it (`next_delivery(now)` stamps it; `touch` moves it), in whole
  milliseconds. `expire(now)` takes every delivery past its deadline out of wip, and only
  those: the subscription's other wip stays and its credit is freed. A later ACK or NACK
  of such a message by the connection that held it raises `Late` (the last LATE_KEPT of
  them per connection, or its subscription's prefetch if larger, are remembered), not the
  error of an unknown id, and changes nothing. The queue keeps no clock: callers pass
  `now` (seconds).
- Deadlines are kept per millisecond: a heap of the distinct deadlines, and for each
  the ids given it, in delivery order. An entry goes stale when its delivery is settled
  or touched (a dict says which deadline is current), so a delivery costs two dict
  look-ups and a list append (most deliveries of a pass share one millisecond, and so one
  heap entry), settling costs a dict removal, and `expire` looks only at the milliseconds
  that are due, never at the rest of the wip. Stale entries are not removed one by one:
  the buckets are rebuilt from the current deadlines when they outnumber them, so they
  hold at most about twice the timed wip. A caller keeping one timer compares `soonest`
  with the time it is armed for.
- Expiry, in wall-clock milliseconds since the epoch (`wall_ms`, given by the caller like
  `now`): a message is never handed out at or after its `expires_ms` (0: never). One met
  on the way to a delivery goes to `expired` instead, for the caller to take
  (`take_expired`) and dead-letter or drop. A queue made with `timed=False` (the dead
  letters') never looks. A message that never expires costs one attribute test per
  delivery. Likewise a message that was delivered `max_deliveries` times already (it
  came back at shutdown, which the caller exempts from the limit, or a restart
  recovered its count) is never handed out again: it goes to `spent`. Due times are not
  the queue's: its source (the log) hands out a message only once it is due, and keeps
  the ones put back with a delay until then.
- Competing subscriptions take turns, one message each, in a ring that persists across
  calls. The ring holds exactly the subscriptions that could take a message now (active,
  writable, with credit), so `next_delivery` is O(1) when nothing can be delivered.
"""

import heapq
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from curb.queue_errors import Late, QueueError

ACK_MODES = ("auto", "client", "client-individual")
# The most unacked messages one subscription may ask to hold (prefetch-count).
MAX_PREFETCH = 1_000_000
# Late ACKs recognised per connection: the ids of its last deliveries whose deadline
# passed (at least this many, or its subscription's prefetch if larger, so that a whole
# window that expired at once is recognised).
LATE_KEPT = 1024
# Stale heap entries tolerated before the deadline heap is rebuilt, beyond one per live one.
DEADLINE_SLACK = 1024


class Message(Protocol):
    """What the queue needs of a message (the log's record objects, which only the log
    changes: the queue reads their ids and nothing else)."""

    @property
    def id(self) -> int:
        """Unique, increasing in send order."""

    @property
    def expires_ms(self) -> int:
        """Wall-clock ms from which it is never delivered; 0: never expires."""

    @property
    def deliveries(self) -> int:
        """How often it was delivered before."""


# The queue is generic in what it tracks, so that its caller gets its own types back:
# M is the message type (the log's Record), C the connection a subscription belongs to
# (the server's Session). The queue only ever uses a connection as a dict key.
M = TypeVar("M", bound=Message)
M_co = TypeVar("M_co", bound=Message, covariant=True)
C = TypeVar("C", bound=Hashable)


class Source(Protocol[M_co]):
    def next_ready(self) -> M_co | None:
        """The next never-delivered message in FIFO order, or None.

        Taking a message means it is now delivered.
        """


class Subscription(Generic[C, M]):
    """One SUBSCRIBE of a connection, and the messages it holds (its wip, in delivery order).
    Compared by identity: two subscriptions are never the same one."""

    def __init__(self, conn: C, sub_id: str, ack_mode: str, prefetch: int, ack_timeout_ms: int = 0):
        self.conn = conn
        self.id = sub_id
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.ack_timeout_ms = ack_timeout_ms  # how long a delivery may stay unsettled; 0: no deadline
        self.active = True
        self.unacked: OrderedDict[int, M] = OrderedDict()

    def has_room(self) -> bool:
        return len(self.unacked) < self.prefetch


def settings(
    ack_mode: str,
    prefetch: int | None,
    ack_timeout: float | None,
    default_prefetch: int,
    max_prefetch: int,
    default_timeout_ms: int,
) -> tuple[int, int]:
    """A SUBSCRIBE's prefetch and ack deadline (ms, 0: none), checked: QueueError for an
    unknown ack mode or a value out of bounds. An "auto" subscription has no deadline."""
    if ack_mode not in ACK_MODES:
        raise QueueError(
            f"unknown ack mode {ack_mode!r}; use one of {', '.join(ACK_MODES)}",
            f"Send SUBSCRIBE with an ack header of {', '.join(ACK_MODES)}, or none for auto.",
        )
    if prefetch is None:
        prefetch = default_prefetch
    elif not 1 <= prefetch <= max_prefetch:
        raise QueueError(
            f"prefetch must be from 1 to {max_prefetch}, got {prefetch}",
            f"Ask for a prefetch-count from 1 to {max_prefetch}, or leave it out for the broker's -prefetch.",
        )
    if ack_timeout is not None and ack_timeout < 0:
        raise QueueError(
            f"ack timeout must be at least 0, got {ack_timeout}",
            "Ask for an ack timeout of 0 (no deadline) or more, or leave it out for the broker's -ack-timeout.",
        )
    timeout_ms = default_timeout_ms if ack_timeout is None else _ms(ack_timeout)
    return prefetch, 0 if ack_mode == "auto" else timeout_ms


def not_awaiting(message_id: int) -> QueueError:
    """The error for an ACK, NACK or touch of a message the connection does not hold."""
    return QueueError(
        f"message {message_id} is not awaiting ACK or NACK on this connection",
        "ACK or NACK only the ack header of a MESSAGE this connection received and has not yet "
        "acknowledged; one acknowledged already (also by ACK curb-upto or a cumulative client "
        "ACK) or held by another connection is unknown here.",
    )


class Queue(Generic[C, M]):
    """Subscriptions, their wip and credit, and the redelivery list, over a source of new ones."""

    def __init__(
        self,
        source: Source[M],
        default_prefetch: int = 100,
        max_prefetch: int = MAX_PREFETCH,
        ack_timeout: float = 0.0,
        timed: bool = True,
        max_deliveries: int = 0,
    ):
        if not 1 <= default_prefetch <= max_prefetch:
            raise ValueError(f"need 1 <= default_prefetch ({default_prefetch}) <= max_prefetch ({max_prefetch})")
        if ack_timeout < 0:
            raise ValueError(f"ack_timeout must be at least 0, got {ack_timeout}")
        self._source = source
        self._default_prefetch = default_prefetch
        self._max_prefetch = max_prefetch
        self._default_ack_timeout_ms = _ms(ack_timeout)
        self._active: dict[C, Subscription[C, M]] = {}  # each connection's active subscription
        self._paused: dict[C, dict[Subscription[C, M], None]] = {}  # unsubscribed, holding wip (in order)
        self._blocked: set[C] = set()  # connections whose send buffer is full
        self._wip: dict[int, Subscription[C, M]] = {}  # message id -> the subscription holding it
        self._redeliver: list[tuple[int, M]] = []  # heap of (id, message), rdy again
        self._timed = timed  # whether expiry counts (False: the dead letters)
        self._limit = max_deliveries if timed else 0  # deliveries a message may have had; 0: any
        self.spent: list[M] = []  # met with the limit's deliveries on the way to a delivery
        self.expired: list[M] = []  # met expired on the way to a delivery, for the caller
        self._due: dict[int, int] = {}  # wip message id -> its delivery's ack deadline, ms
        self._buckets: dict[int, list[int]] = {}  # deadline ms -> ids given it, some stale
        self._deadlines: list[int] = []  # heap of the buckets' deadlines, each once
        self._entries = 0  # ids in the buckets, stale ones included
        # The soonest deadline (seconds) deliver or touch set since next_deadline was asked.
        self.soonest: float | None = None
        self._late: dict[C, dict[int, None]] = {}  # per connection: ids whose deadline passed there
        # subscriptions that could take a message now, the next turn first
        self._ring: OrderedDict[Subscription[C, M], None] = OrderedDict()

    @property
    def redeliver_count(self) -> int:
        """Messages waiting in the redelivery list."""
        return len(self._redeliver)

    @property
    def wip_count(self) -> int:
        """Messages delivered and not yet ACKed or NACKed."""
        return len(self._wip)

    @property
    def subscription_count(self) -> int:
        """Active (not unsubscribed) subscriptions."""
        return len(self._active)

    def subscription(self, conn: C) -> Subscription[C, M] | None:
        """The connection's active subscription, if it has one."""
        return self._active.get(conn)

    def has_credit(self) -> bool:
        """Some active, writable subscription could take a message now."""
        return bool(self._ring)

    def subscribe(
        self,
        conn: C,
        sub_id: str,
        ack_mode: str = "auto",
        prefetch: int | None = None,
        ack_timeout: float | None = None,
    ) -> Subscription[C, M]:
        """A subscription; `ack_timeout` None takes the queue's default, and an "auto"
        subscription has no deadline (its messages are done once handed over)."""
        if conn in self._active:
            raise QueueError(
                f"already subscribed as {self._active[conn].id!r}; UNSUBSCRIBE first",
                "A connection holds one queue subscription at a time: UNSUBSCRIBE it before "
                "subscribing again, or open another connection for a second consumer.",
            )
        prefetch, timeout_ms = settings(
            ack_mode, prefetch, ack_timeout, self._default_prefetch, self._max_prefetch, self._default_ack_timeout_ms
        )
        sub: Subscription[C, M] = Subscription(conn, sub_id, ack_mode, prefetch, timeout_ms)
        self._active[conn] = sub
        self._refresh(sub)
        return sub

    def unsubscribe(self, conn: C, sub_id: str) -> None:
        """Pause: no more deliveries; its wip stays and can still be ACKed or NACKed."""
        sub = self._active.get(conn)
        if sub is None or sub.id != sub_id:
            raise QueueError(
                f"no active subscription {sub_id!r} on this connection",
                "UNSUBSCRIBE with the id of this connection's SUBSCRIBE, once; it needs no UNSUBSCRIBE after that.",
            )
        del self._active[conn]
        sub.active = False
        self._ring.pop(sub, None)
        if sub.unacked:
            self._paused.setdefault(conn, {})[sub] = None

    def set_writable(self, conn: C, writable: bool) -> None:
        """Back-pressure: a connection whose send buffer is full gets nothing."""
        if writable:
            self._blocked.discard(conn)
        else:
            self._blocked.add(conn)
        sub = self._active.get(conn)
        if sub is not None:
            self._refresh(sub)

    def deliver(self, now: float, wall_ms: int = 0) -> list[tuple[Subscription[C, M], M]]:
        """Hand out as many messages as credit allows (see `next_delivery`)."""
        return list(iter(lambda: self.next_delivery(now, wall_ms), None))

    def next_delivery(self, now: float, wall_ms: int = 0) -> tuple[Subscription[C, M], M] | None:
        """Hand out one message, or None when no subscription could take one or none is
        rdy: redeliveries (oldest first), then new ones. Subscriptions take turns, one
        message each, up to their credit; between calls a connection may become blocked
        (`set_writable`), and then gets nothing more. A message delivered to a
        subscription with an ack timeout is due back by `now` plus it. One expired by
        `wall_ms` goes to `expired` instead."""
        ring = self._ring
        if not ring:
            return None
        redeliver = self._redeliver
        message: M | None
        while True:
            if redeliver:
                message = heapq.heappop(redeliver)[1]
            else:
                message = self._source.next_ready()
                if message is None:
                    return None
            expires = message.expires_ms
            if expires and expires <= wall_ms and self._timed:
                self.expired.append(message)
            elif self._limit and message.deliveries >= self._limit:
                self.spent.append(message)
            else:
                break
        sub = ring.popitem(last=False)[0]
        message_id = message.id
        sub.unacked[message_id] = message
        self._wip[message_id] = sub
        timeout = sub.ack_timeout_ms
        if timeout:
            self._set_deadline(message_id, round(now * 1000) + timeout)  # _ms(now), inline
        if len(sub.unacked) < sub.prefetch:
            ring[sub] = None
        return sub, message

    def ack(self, conn: C, message_id: int) -> list[M]:
        """Finish the message (in "client" mode also the earlier wip of its subscription).

        Returns the finished messages.
        """
        return self._settle(conn, message_id)

    def nack(self, conn: C, message_id: int) -> list[M]:
        """Like ack, but the messages are not done: the caller places them (`requeue`)."""
        return self._settle(conn, message_id)

    def requeue(self, messages: list[M]) -> None:
        """The messages are rdy again, ahead of never-delivered ones, oldest first."""
        redeliver = self._redeliver
        for message in messages:
            heapq.heappush(redeliver, (message.id, message))

    def take_spent(self) -> list[M]:
        """The messages met with `max_deliveries` deliveries already (one that came back
        at shutdown, or whose count a restart recovered); the caller dead-letters them."""
        spent, self.spent = self.spent, []
        return spent

    def take_expired(self) -> list[M]:
        """The expired messages met since the last call; the caller dead-letters or drops them."""
        expired, self.expired = self.expired, []
        return expired

    def holds(self, conn: C, message_id: int) -> bool:
        """Whether the message is wip here on this connection."""
        sub = self._wip.get(message_id)
        return sub is not None and sub.conn == conn

    def messages(self) -> list[M]:
        """The messages put back here (rdy again) and wip, by id: a snapshot, for a
        browse of the dead letters. The source's are not among them."""
        held = [message for _, message in self._redeliver]
        held += [sub.unacked[message_id] for message_id, sub in self._wip.items()]
        return sorted(held, key=lambda message: message.id)

    def take_ready(self, count: int | None) -> list[M]:
        """Take up to `count` (None: all) of the messages put back here out of the queue,
        oldest id first, for the caller to place elsewhere (a redrive of dead letters).
        The source's stay."""
        redeliver = self._redeliver
        taken = len(redeliver) if count is None else min(count, len(redeliver))
        return [heapq.heappop(redeliver)[1] for _ in range(taken)]

    def touch(self, conn: C, message_id: int, deadline: float) -> None:
        """Move one wip message's ack deadline to `deadline` (later or sooner), whether or
        not its subscription has a timeout; in "client" mode too, only that message."""
        sub = self._wip.get(message_id)
        if sub is None or sub.conn != conn:
            raise self._not_wip(conn, message_id)
        self._set_deadline(message_id, _ms(deadline))

    def next_deadline(self) -> float | None:
        """The earliest ack deadline of a wip message, or None when none has one. Resets
        `soonest`: deadlines set from now on are compared with this one."""
        self.soonest = None
        deadlines, due = self._deadlines, self._due
        while deadlines:
            deadline = deadlines[0]
            if any(due.get(message_id) == deadline for message_id in self._buckets[deadline]):
                return deadline / 1000
            heapq.heappop(deadlines)
            self._entries -= len(self._buckets.pop(deadline))
        return None

    def expire(self, now: float) -> list[tuple[Subscription[C, M], M]]:
        """Take every delivery whose ack deadline is at or before `now` out of wip, freeing
        its subscription's credit, and return it with the subscription that held it (the
        caller places the message, as for a NACK). Nothing else changes."""
        expired: list[tuple[Subscription[C, M], M]] = []
        deadlines, due, now_ms = self._deadlines, self._due, _ms(now)
        while deadlines and deadlines[0] <= now_ms:
            deadline = heapq.heappop(deadlines)
            bucket = self._buckets.pop(deadline)
            self._entries -= len(bucket)
            for message_id in bucket:
                if due.get(message_id) != deadline:
                    continue  # settled or touched since
                del due[message_id]
                sub = self._wip.pop(message_id)
                expired.append((sub, sub.unacked.pop(message_id)))
                late = self._late.setdefault(sub.conn, {})
                late[message_id] = None
                if len(late) > max(LATE_KEPT, sub.prefetch):
                    del late[next(iter(late))]
                self._after_settle(sub)
        return expired

    def ack_upto(self, upto: int) -> list[M]:
        """Finish every wip or rdy-again message with an id up to `upto`, on every
        connection. Returns them (never-delivered ones are the source's to skip)."""
        finished: list[M] = []
        # In the order first met (not a set's): the order they rejoin the delivery ring
        # is every later delivery's, which must not depend on where objects live.
        touched: dict[Subscription[C, M], None] = {}
        for message_id in [i for i in self._wip if i <= upto]:
            sub = self._wip.pop(message_id)
            finished.append(sub.unacked.pop(message_id))
            self._due.pop(message_id, None)
            touched[sub] = None
        for sub in touched:
            self._after_settle(sub)
        if self._redeliver and self._redeliver[0][0] <= upto:
            finished.extend(message for i, message in self._redeliver if i <= upto)
            self._redeliver = [entry for entry in self._redeliver if entry[0] > upto]
            heapq.heapify(self._redeliver)
        return finished

    def close(self, conn: C) -> list[M]:
        """The connection is gone: its subscriptions vanish. Returns all its wip, for the
        caller to place (`requeue`)."""
        self._blocked.discard(conn)
        self._late.pop(conn, None)
        subs = self._paused.pop(conn, {})
        active = self._active.pop(conn, None)
        if active is not None:
            active.active = False
            self._ring.pop(active, None)
            subs[active] = None
        returned: list[M] = []
        due = self._due
        for sub in subs:
            for message in sub.unacked.values():
                del self._wip[message.id]
                due.pop(message.id, None)
                returned.append(message)
        return returned

    def _settle(self, conn: C, message_id: int) -> list[M]:
        """Take the message (cumulatively in "client" mode) out of wip; the caller places it."""
        sub = self._wip.get(message_id)
        if sub is None or sub.conn != conn:
            raise self._not_wip(conn, message_id)
        unacked, due = sub.unacked, self._due
        if sub.ack_mode == "client":
            settled = []
            while True:
                settled_id, message = unacked.popitem(last=False)
                del self._wip[settled_id]
                due.pop(settled_id, None)
                settled.append(message)
                if settled_id == message_id:
                    break
        else:
            settled = [unacked.pop(message_id)]
            del self._wip[message_id]
            due.pop(message_id, None)
        if sub.active:  # _after_settle(sub), inline: this runs for every ACK
            self._refresh(sub)
        elif not unacked:
            self._forget_paused(sub)
        return settled

    def passed(self, conn: C, message_id: int) -> bool:
        """Whether the message's ack deadline passed while this connection held it (one
        of those remembered): its ACK, NACK or touch here is late."""
        late = self._late.get(conn)
        return late is not None and message_id in late

    def _not_wip(self, conn: C, message_id: int) -> QueueError:
        """The error for a message that is not wip on `conn`: Late if its deadline passed there."""
        if self.passed(conn, message_id):
            return Late(
                f"message {message_id} passed its ack deadline on this connection and went back to the queue",
                "Nothing to do: the message will be, or was, delivered again. ACK or NACK in time, or extend "
                "the deadline with NACK curb-touch:<ms> while working on it.",
            )
        return not_awaiting(message_id)

    def _after_settle(self, sub: Subscription[C, M]) -> None:
        """A message left the subscription's wip: its credit is free (or a paused one with
        nothing left is forgotten)."""
        if sub.active:
            self._refresh(sub)
        elif not sub.unacked:
            self._forget_paused(sub)

    def _set_deadline(self, message_id: int, deadline_ms: int) -> None:
        """The wip message is due back at `deadline_ms`; an entry it had before goes stale."""
        self._due[message_id] = deadline_ms
        self._bucket(deadline_ms).append(message_id)
        self._entries += 1
        if self.soonest is None or deadline_ms / 1000 < self.soonest:
            self.soonest = deadline_ms / 1000
        if self._entries > 2 * len(self._due) + DEADLINE_SLACK:
            self._rebuild_deadlines()

    def _bucket(self, deadline_ms: int) -> list[int]:
        """The ids given this deadline, a new bucket (and heap entry) if it has none."""
        bucket = self._buckets.get(deadline_ms)
        if bucket is None:
            bucket = self._buckets[deadline_ms] = []
            heapq.heappush(self._deadlines, deadline_ms)
        return bucket

    def _rebuild_deadlines(self) -> None:
        """Drop the stale entries of the deadline buckets."""
        self._buckets, self._deadlines, self._entries = {}, [], 0
        for message_id, deadline in self._due.items():
            self._bucket(deadline).append(message_id)
        self._entries = len(self._due)

    def _forget_paused(self, sub: Subscription[C, M]) -> None:
        paused = self._paused[sub.conn]
        paused.pop(sub, None)
        if not paused:
            del self._paused[sub.conn]

    def _refresh(self, sub: Subscription[C, M]) -> None:
        """Put an active subscription in the ring if it could take a message now, else out."""
        if sub.conn not in self._blocked and sub.has_room():
            self._ring[sub] = None
        else:
            self._ring.pop(sub, None)


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, the deadlines' unit."""
    return round(seconds * 1000)
