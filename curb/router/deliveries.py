"""What each client of the router holds, sans I/O: its subscriptions, the MESSAGEs it was
handed and their ACKs and NACKs, forwarded to the instance that delivered them.

Rules (invariants the tests check):
- Each MESSAGE of an instance goes to one client subscription with credit (curb.router.
  credit), rendered by the client's own session; its message-id and ack id are the
  instance's id shifted left by INDEX_BITS plus the instance's index, the same on every
  delivery of the message and across reconnects. One no client can take (it crossed a
  smaller SUBSCRIBE) is handed back at once with `curb-undelivered:true`, which the
  instance does not count as a delivery.
- ACK, NACK and touch go to that instance without a receipt; the links they used are
  remembered (`unsynced`) until a RECEIPT waits for them (curb.router.core.durability).
  With ack:client an ACK settles every earlier delivery of its subscription too.
- An auto subscription's message is ACKed upstream once its session handed it to the
  transport (`handed_off`), as an instance does.
- An ack deadline (SUBSCRIBE's curb-ack-timeout, moved by a NACK curb-touch) is kept by
  the router as an instance keeps it: once passed, the message goes back to its instance
  and the client's ACK or NACK of it is late. `soonest` is never later than the earliest
  deadline held, so a tick before it has nothing to look at.
- A link lost: what it delivered is dropped from its clients (the instance requeued it);
  their ACK or NACK of it is late (`Late`: a RECEIPT with `curb-late:true`), changing
  nothing. A session gone has everything it holds NACKed, so it is redelivered.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence

from curb import payload
from curb.frame import Frame
from curb.log.cursor import Record
from curb.peer import Peer
from curb.queue import not_awaiting
from curb.queue_errors import Late, QueueError
from curb.router.credit import ClientSub, Credit, Delivery
from curb.router.links import Link, Links
from curb.router.placement import INDEX_BITS

LATE_KEPT = 4096  # ids a session held when their link was lost: their ACKs are late
# What the client's session writes itself (curb.render), not kept from the instance's MESSAGE.
_MESSAGE_OWN = frozenset(
    (
        "subscription",
        "destination",
        "message-id",
        "ack",
        "content-length",
        "redelivered",
        "curb-deliveries",
        "curb-dead-reason",
    )
)


class Routed(Record):
    """A message as a client's front renders it (curb.render, curb.web): the router's id,
    the instance's delivery count, a dead letter's reason, no timestamp (the router does
    not know when it was stored); the log's own fields stay unset."""

    __slots__ = ()

    def __init__(self, msg_id: int, deliveries: int):
        self.id, self.deliveries, self.dead, self.timestamp_ms = msg_id, deliveries, "", 0


class Deliveries:
    """Every client's subscriptions and held messages."""

    def __init__(self, links: Links, credit: Credit, clock: Callable[[], float]):
        self.links = links
        self.credit = credit
        self.clock = clock
        self.subs: dict[Peer, dict[str, ClientSub]] = {}
        self.holding: dict[Peer, dict[int, Delivery]] = {}
        self.late: dict[Peer, collections.deque[int]] = {}
        self.unsynced: dict[Peer, dict[Link, int]] = {}  # links its ACKs used since, and their epoch
        self.soonest = math.inf  # at most the earliest ack deadline of a held delivery

    def subscribe(self, sub: ClientSub) -> None:
        subs = self.subs.setdefault(sub.conn, {})
        if sub.id in subs:
            raise QueueError(
                f"subscription {sub.id!r} exists already on this connection",
                "Give each SUBSCRIBE of a connection its own id, or UNSUBSCRIBE the old one first.",
            )
        subs[sub.id] = sub
        self.credit.add(sub)

    def unsubscribe(self, session: Peer, sub_id: str) -> ClientSub:
        sub = self.subs.get(session, {}).pop(sub_id, None)
        if sub is None:
            raise QueueError(
                f"no active subscription {sub_id!r} on this connection",
                "UNSUBSCRIBE with the id of this connection's SUBSCRIBE, once; it needs no UNSUBSCRIBE after that.",
            )
        self.credit.drop(sub)
        return sub

    def message(self, link: Link, frame: Frame, index: int | None) -> None:
        """An instance's MESSAGE: to a client with credit, or handed back at once."""
        headers = frame.headers
        upstream = headers.get("ack") or headers.get("message-id", "")
        sub_id = headers.get("subscription", "")
        dead = sub_id[:1] == "d"  # curb.router.credit names them so
        credit = self.credit
        sub = credit.taker(link, dead)
        if sub is None or index is None or not upstream.isdigit():
            self.links.send(link, "NACK", {"id": upstream, "curb-undelivered": "true"})
            credit.rebalance(link, dead)
            return
        count = headers.get("curb-deliveries", "1")
        msg_id = int(upstream) << INDEX_BITS | index
        rec = Routed(msg_id, int(count) if count.isdigit() and len(count) < 10 else 1)
        if dead:
            rec.dead = headers.get("curb-dead-reason", "dead")
        source = credit.of(link, dead)
        delivery = Delivery(link, upstream, sub_id, sub, rec, link.epoch, source)
        if sub.ack_timeout_ms:
            due = delivery.due = self.clock() + sub.ack_timeout_ms / 1000
            if due < self.soonest:
                self.soonest = due
        credit.hold(delivery, 1)
        if sub_id != source.sub_id:  # it crossed an UNSUBSCRIBE: its credit was counted free
            credit.rebalance(link, dead, source)
        source.deliveries[upstream] = delivery
        holding = self.holding.get(sub.conn)
        if holding is None:
            holding = self.holding[sub.conn] = {}
        holding[msg_id] = delivery
        sub.unacked[msg_id] = rec
        if headers.keys() <= _MESSAGE_OWN:  # the common case: nothing of the SEND's to keep
            data = b"\n" + frame.body
        else:
            data = payload.encode({k: v for k, v in headers.items() if k not in _MESSAGE_OWN}, frame.body)
        sub.conn.deliver(sub, rec, data)
        link.tally.delivered += 1

    def handed_off(self, session: Peer, records: Sequence[Record]) -> None:
        """Auto-acked messages went to the transport: done, on their instances too."""
        holding = self.holding.get(session, {})
        for rec in records:
            delivery = holding.get(rec.id)
            if delivery is not None:
                self.settle(delivery)
                self.links.answer(delivery.link, b"ACK", delivery.upstream)

    def settle(self, delivery: Delivery) -> None:
        """The delivery is over for the router (ACKed, NACKed, or its client gone)."""
        sub, source, msg_id = delivery.sub, delivery.source, delivery.rec.id
        source.deliveries.pop(delivery.upstream, None)
        holding = self.holding.get(sub.conn)
        if holding is not None:
            holding.pop(msg_id, None)
        sub.unacked.pop(msg_id, None)
        self.credit.hold(delivery, -1)
        self.credit.rebalance(delivery.link, sub.dead, source)

    def ack(self, session: Peer, msg_id: int) -> None:
        holding = self.holding.get(session)
        delivery = holding.get(msg_id) if holding is not None else None
        if delivery is None:
            delivery = self.held(session, msg_id)  # raises: late, or unknown
        sub = delivery.sub
        if sub.ack_mode != "client":
            self.answer(session, delivery, "ACK", {})
            return
        ids = list(sub.unacked)  # every delivery of the subscription up to it
        for each in [self.holding[session][each] for each in ids[: ids.index(msg_id) + 1]]:
            self.answer(session, each, "ACK", {})

    def answer(self, session: Peer, delivery: Delivery, command: str, extra: dict[str, str]) -> None:
        """An ACK or NACK of the delivery, to its instance."""
        self.settle(delivery)
        link = delivery.link
        if extra:
            self.links.send(link, command, {"id": delivery.upstream, **extra})
        else:
            self.links.answer(link, command.encode(), delivery.upstream)
        unsynced = self.unsynced.get(session)
        if unsynced is None:
            unsynced = self.unsynced[session] = {}
        unsynced[link] = link.epoch

    def held(self, session: Peer, msg_id: int) -> Delivery:
        """The delivery the session holds as `msg_id`; Late when its link was lost (the
        instance requeued it), QueueError when it holds none."""
        delivery = self.holding.get(session, {}).get(msg_id)
        if delivery is not None:
            return delivery
        if msg_id in self.late.get(session, ()):
            raise Late(
                f"message {msg_id}'s instance was lost while this connection held it",
                "Nothing to do: the instance queued it again, and it will be delivered again.",
            )
        raise not_awaiting(msg_id)

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        """The delivery's deadline, here and on its instance, moves to `seconds` from now."""
        delivery = self.held(session, msg_id)
        due = delivery.due = self.clock() + seconds  # nothing to sync: the RECEIPT need not wait for it
        self.soonest = min(self.soonest, due)
        self.links.send(delivery.link, "NACK", {"id": delivery.upstream, "curb-touch": str(round(seconds * 1000))})

    def expire(self, now: float) -> list[Delivery]:
        """The deliveries whose ack deadline (curb-ack-timeout, or a touch) passed: back to
        their instances (a plain NACK: the client had it, so it counts), and a later ACK or
        NACK of one is late. Returned, for the refusal line."""
        if now < self.soonest:
            return []
        held = [delivery for holding in self.holding.values() for delivery in holding.values() if delivery.due]
        passed = [delivery for delivery in held if delivery.due <= now]
        self.soonest = min((delivery.due for delivery in held if delivery.due > now), default=math.inf)
        for delivery in passed:
            self.settle(delivery)
            self.links.answer(delivery.link, b"NACK", delivery.upstream)
            self._late(delivery)
        return passed

    def _late(self, delivery: Delivery) -> None:
        late = self.late.setdefault(delivery.sub.conn, collections.deque(maxlen=LATE_KEPT))
        late.append(delivery.rec.id)

    def link_down(self, link: Link) -> None:
        for delivery in self.credit.link_down(link):
            session = delivery.sub.conn
            self.holding.get(session, {}).pop(delivery.rec.id, None)
            delivery.sub.unacked.pop(delivery.rec.id, None)
            self._late(delivery)

    def gone(self, session: Peer) -> None:
        """NACK what the session held, so the instances redeliver it; its credit leaves."""
        for delivery in list(self.holding.pop(session, {}).values()):
            self.settle(delivery)
            self.links.answer(delivery.link, b"NACK", delivery.upstream)
        for sub in self.subs.pop(session, {}).values():
            self.credit.drop(sub)
        self.unsynced.pop(session, None)
        self.late.pop(session, None)
