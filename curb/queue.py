"""The queue's state machine: which message goes to which subscription, and when it comes back.

Rules (pure state, no sockets, no files):
- A message is rdy, wip on exactly one subscription, or done. The source hands out
  never-delivered rdy messages in FIFO order; NACKed messages and the wip of a closed
  connection are rdy again and wait in a heap, oldest id first, ahead of the source.
- A subscription holds at most `prefetch` wip messages. ACK and NACK free credit; in
  "client" mode they are cumulative over the subscription's wip in delivery order.
- "auto" subscriptions hold wip and credit like the others: the caller ACKs a message for
  them once it has handed it to the connection, so that a consumer that stops reading
  holds at most `prefetch` messages, and a message it never got is rdy again when it goes.
- UNSUBSCRIBE pauses a subscription: it gets nothing more, its wip stays and can still be
  ACKed or NACKed on its connection. Closing the connection returns all of its wip.
- ACK up to an id (`ack_upto`) finishes every message with an id up to it, wherever it
  is: wip on any connection or waiting for redelivery. A later ACK or NACK of such a
  message by its holder gets the answer of any unknown id (QueueError).
- Competing subscriptions take turns, one message each, in a ring that persists across
  calls. The ring holds exactly the subscriptions that could take a message now (active,
  writable, with credit), so `deliver()` is O(1) when nothing can be delivered.
"""

import heapq
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

ACK_MODES = ("auto", "client", "client-individual")


class QueueError(Exception):
    """A client asked for something the queue state does not allow.

    str() is a short reason, fit for the `message` header of an ERROR frame; `advice`,
    for its body, says what the client should do instead (every raise must give one).
    """

    def __init__(self, reason: str, advice: str):
        super().__init__(reason)
        self.advice = advice


class Message(Protocol):
    """What the queue needs of a message (the log's record objects, which only the log
    changes: the queue reads their ids and nothing else)."""

    @property
    def id(self) -> int:
        """Unique, increasing in send order."""


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


@dataclass(eq=False)
class Subscription(Generic[C, M]):
    """One SUBSCRIBE of a connection, and the messages it holds (its wip, in delivery order)."""

    conn: C
    id: str
    ack_mode: str
    prefetch: int
    active: bool = True
    unacked: OrderedDict[int, M] = field(default_factory=OrderedDict, repr=False)

    def has_room(self) -> bool:
        return len(self.unacked) < self.prefetch


class Queue(Generic[C, M]):
    """Subscriptions, their wip and credit, and the redelivery list, over a source of new ones."""

    def __init__(self, source: Source[M], default_prefetch: int = 100, max_prefetch: int = 10000):
        if not 1 <= default_prefetch <= max_prefetch:
            raise ValueError(f"need 1 <= default_prefetch ({default_prefetch}) <= max_prefetch ({max_prefetch})")
        self._source = source
        self._default_prefetch = default_prefetch
        self._max_prefetch = max_prefetch
        self._active: dict[C, Subscription[C, M]] = {}  # each connection's active subscription
        self._paused: dict[C, set[Subscription[C, M]]] = {}  # unsubscribed but still holding wip
        self._blocked: set[C] = set()  # connections whose send buffer is full
        self._wip: dict[int, Subscription[C, M]] = {}  # message id -> the subscription holding it
        self._redeliver: list[tuple[int, M]] = []  # heap of (id, message), rdy again
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

    def has_credit(self) -> bool:
        """Some active, writable subscription could take a message now."""
        return bool(self._ring)

    def subscribe(
        self, conn: C, sub_id: str, ack_mode: str = "auto", prefetch: int | None = None
    ) -> Subscription[C, M]:
        if conn in self._active:
            raise QueueError(
                f"already subscribed as {self._active[conn].id!r}; UNSUBSCRIBE first",
                "A connection holds one queue subscription at a time: UNSUBSCRIBE it before "
                "subscribing again, or open another connection for a second consumer.",
            )
        if ack_mode not in ACK_MODES:
            raise QueueError(
                f"unknown ack mode {ack_mode!r}; use one of {', '.join(ACK_MODES)}",
                f"Send SUBSCRIBE with an ack header of {', '.join(ACK_MODES)}, or none for auto.",
            )
        if prefetch is None:
            prefetch = self._default_prefetch
        elif prefetch < 1:
            raise QueueError(
                f"prefetch must be at least 1, got {prefetch}",
                "Ask for a prefetch-count of 1 or more, or leave it out for the broker's -prefetch.",
            )
        sub: Subscription[C, M] = Subscription(conn, sub_id, ack_mode, min(prefetch, self._max_prefetch))
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
            self._paused.setdefault(conn, set()).add(sub)

    def set_writable(self, conn: C, writable: bool) -> None:
        """Back-pressure: a connection whose send buffer is full gets nothing."""
        if writable:
            self._blocked.discard(conn)
        else:
            self._blocked.add(conn)
        sub = self._active.get(conn)
        if sub is not None:
            self._refresh(sub)

    def deliver(self) -> list[tuple[Subscription[C, M], M]]:
        """Hand out as many messages as credit allows (see `next_delivery`)."""
        return list(iter(self.next_delivery, None))

    def next_delivery(self) -> tuple[Subscription[C, M], M] | None:
        """Hand out one message, or None when no subscription could take one or none is
        rdy: redeliveries (oldest first), then new ones. Subscriptions take turns, one
        message each, up to their credit; between calls a connection may become blocked
        (`set_writable`), and then gets nothing more."""
        ring = self._ring
        if not ring:
            return None
        redeliver = self._redeliver
        message: M | None
        if redeliver:
            message = heapq.heappop(redeliver)[1]
        else:
            message = self._source.next_ready()
            if message is None:
                return None
        sub = ring.popitem(last=False)[0]
        sub.unacked[message.id] = message
        self._wip[message.id] = sub
        if len(sub.unacked) < sub.prefetch:
            ring[sub] = None
        return sub, message

    def ack(self, conn: C, message_id: int) -> list[M]:
        """Finish the message (in "client" mode also the earlier wip of its subscription).

        Returns the finished messages.
        """
        return self._settle(conn, message_id)

    def nack(self, conn: C, message_id: int) -> list[M]:
        """Like ack, but the messages become rdy again, ahead of never-delivered ones."""
        messages = self._settle(conn, message_id)
        for message in messages:
            heapq.heappush(self._redeliver, (message.id, message))
        return messages

    def ack_upto(self, upto: int) -> list[M]:
        """Finish every wip or rdy-again message with an id up to `upto`, on every
        connection. Returns them (never-delivered ones are the source's to skip)."""
        finished: list[M] = []
        touched: set[Subscription[C, M]] = set()
        for message_id in [i for i in self._wip if i <= upto]:
            sub = self._wip.pop(message_id)
            finished.append(sub.unacked.pop(message_id))
            touched.add(sub)
        for sub in touched:
            if sub.active:
                self._refresh(sub)
            elif not sub.unacked:
                self._forget_paused(sub)
        if self._redeliver and self._redeliver[0][0] <= upto:
            finished.extend(message for i, message in self._redeliver if i <= upto)
            self._redeliver = [entry for entry in self._redeliver if entry[0] > upto]
            heapq.heapify(self._redeliver)
        return finished

    def close(self, conn: C) -> list[M]:
        """The connection is gone: its subscriptions vanish and all its wip is rdy again.

        Returns that wip.
        """
        self._blocked.discard(conn)
        subs = self._paused.pop(conn, set())
        active = self._active.pop(conn, None)
        if active is not None:
            active.active = False
            self._ring.pop(active, None)
            subs.add(active)
        returned: list[M] = []
        for sub in subs:
            for message in sub.unacked.values():
                del self._wip[message.id]
                heapq.heappush(self._redeliver, (message.id, message))
                returned.append(message)
        return returned

    def _settle(self, conn: C, message_id: int) -> list[M]:
        """Take the message (cumulatively in "client" mode) out of wip; the caller places it."""
        sub = self._wip.get(message_id)
        if sub is None or sub.conn != conn:
            raise QueueError(
                f"message {message_id} is not awaiting ACK or NACK on this connection",
                "ACK or NACK only the ack header of a MESSAGE this connection received and has not yet "
                "acknowledged; one acknowledged already (also by ACK curb-upto or a cumulative client "
                "ACK) or held by another connection is unknown here.",
            )
        unacked = sub.unacked
        if sub.ack_mode == "client":
            settled = []
            while True:
                settled_id, message = unacked.popitem(last=False)
                del self._wip[settled_id]
                settled.append(message)
                if settled_id == message_id:
                    break
        else:
            settled = [unacked.pop(message_id)]
            del self._wip[message_id]
        if sub.active:
            self._refresh(sub)
        elif not unacked:
            self._forget_paused(sub)
        return settled

    def _forget_paused(self, sub: Subscription[C, M]) -> None:
        paused = self._paused[sub.conn]
        paused.discard(sub)
        if not paused:
            del self._paused[sub.conn]

    def _refresh(self, sub: Subscription[C, M]) -> None:
        """Put an active subscription in the ring if it could take a message now, else out."""
        if sub.conn not in self._blocked and sub.has_room():
            self._ring[sub] = None
        else:
            self._ring.pop(sub, None)
