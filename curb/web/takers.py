"""Messages taken over HTTP: consume-one, and claims that are ACKed or NACKed by later requests.

A request that takes a message is an HttpPeer with one subscription of prefetch 1
(ack mode client-individual), so the queue hands it the next message as it would a STOMP
consumer: redeliveries first, competing fairly with the other consumers. Once it has its
message the subscription is paused (UNSUBSCRIBE), and the message stays wip on that peer:

- consume-one (`take` then `ack_now`): ACKed at once; the answer leaves once the ACK is
  on disk, so a crash after it never delivers the message again.
- a claim: the peer is kept under the message id until ACK (`ack`), NACK (`release`) or
  the ack deadline (-ack-timeout, or the claim's own ttl); `touch` moves the deadline.
  Once the deadline passed the broker has put the message back; an ACK or NACK that
  comes after is Late (410), as over STOMP, until the claim is swept, at most
  2 x SWEEP_SECONDS later (then 404, like any id not claimed over HTTP).

Invariants: a peer without wip is handed to `broker.gone`, so no subscription outlives
its request or claim; a request cancelled while it holds a message (the client left, or
shutdown) gives it back through `broker.gone`, which puts it back in the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curb.broker import Broker, NotStored
from curb.log import Record
from curb.queue import Subscription
from curb.web.peers import HttpPeer

SUB_ID = "http"
SWEEP_SECONDS = 60.0


@dataclass(slots=True)
class Taken:
    """A message handed to an HTTP request: its id, stored payload and deliveries so far,
    and the (paused) subscription it is wip on."""

    id: int
    payload: bytes
    deliveries: int
    timestamp_ms: int  # when it was published
    sub: Subscription[Any, Record]


@dataclass(slots=True, eq=False)
class _Claim:
    peer: HttpPeer
    sub: Subscription[Any, Record]
    stale: bool = False  # its message was not wip at the last sweep


class Takers:
    """The messages HTTP requests take and the claims they hold."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.claims: dict[int, _Claim] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    async def take(self, peer: HttpPeer, wait: float, ack_timeout: float | None = None) -> Taken | None:
        """The next message, waiting up to `wait` seconds; None if none came. It is wip on
        `peer` (deadline: `ack_timeout`, None for the broker's -ack-timeout, 0 for none)."""
        broker = self.broker
        got: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()

        def delivered(sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
            got.set_result(Taken(rec.id, bytes(data), rec.deliveries, rec.timestamp_ms, sub))

        peer.on_deliver = delivered
        broker.subscribe(peer, SUB_ID, "client-individual", 1, ack_timeout)
        try:
            broker.pump()
            if not got.done() and wait > 0:
                await asyncio.wait_for(asyncio.shield(got), wait)
        except TimeoutError:
            pass
        except BaseException:  # cancelled: whatever it holds goes back
            broker.gone(peer)
            raise
        if not got.done():
            broker.gone(peer)
            return None
        broker.unsubscribe(peer, SUB_ID)
        return got.result()

    async def ack_now(self, peer: HttpPeer, taken: Taken) -> None:
        """Consume-one: ACK the message taken, and return once that is on disk."""
        broker = self.broker
        broker.ack(peer, taken.id)
        broker.gone(peer)
        await _durable(broker)

    def claim(self, peer: HttpPeer, taken: Taken) -> None:
        """Keep the message wip on `peer` until it is ACKed, NACKed or its deadline passes."""
        old = self.claims.get(taken.id)
        if old is not None:  # its deadline passed and the message came round again
            self.broker.gone(old.peer)
        self.claims[taken.id] = _Claim(peer, taken.sub)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def ack(self, msg_id: int) -> None:
        """The claimed message is done; returns once that is on disk. KeyError: not claimed
        here; curb.queue.Late: its deadline passed."""
        peer = self._holder(msg_id)
        self.broker.ack(peer, msg_id)
        self._done(msg_id)
        await _durable(self.broker)

    async def release(self, msg_id: int) -> None:
        """NACK: the claimed message goes back to the queue (as a STOMP NACK's, at the front)."""
        peer = self._holder(msg_id)
        self.broker.nack(peer, msg_id)
        self._done(msg_id)
        await _durable(self.broker)

    def touch(self, msg_id: int, seconds: float) -> None:
        """The claimed message's deadline is `seconds` from now."""
        self.broker.touch(self._holder(msg_id), msg_id, seconds)

    def _holder(self, msg_id: int) -> HttpPeer:
        return self.claims[msg_id].peer

    def _done(self, msg_id: int) -> None:
        claim = self.claims.pop(msg_id)
        self.broker.gone(claim.peer)

    def _sweep(self) -> None:
        """Forget the claims whose message was not wip at this sweep and the one before."""
        self._sweeper = None
        for msg_id, claim in list(self.claims.items()):
            if msg_id in claim.sub.unacked:
                continue
            if claim.stale:
                self._done(msg_id)
            else:
                claim.stale = True
        if self.claims:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    def close(self) -> None:
        """Shutdown: every claim is given back, its message rdy again at once and its
        delivery not counted, as for a STOMP consumer's at shutdown."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for msg_id in list(self.claims):
            self.broker.returns.closed(self.claims[msg_id].peer, limit=False)
            self._done(msg_id)


def answer() -> tuple[asyncio.Future[str | None], Callable[[str | None], None]]:
    """A future and the broker's `done` callback that settles it (with None or the failure)."""
    future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def done(err: str | None) -> None:
        if not future.done():
            future.set_result(err)

    return future, done


async def _durable(broker: Broker) -> None:
    """Until every step asked of the log so far is on disk; NotStored if the log failed."""
    future, done = answer()
    broker.when_durable(done)
    err = await future
    if err is not None:
        raise NotStored(err)
