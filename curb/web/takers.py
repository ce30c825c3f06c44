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

Invariants: a peer without wip is handed to `gone`, so no subscription outlives
its request or claim; a request cancelled while it holds a message (the client left, or
shutdown) gives it back through `gone`, which puts it back in the queue. An ACK's answer
waits for the peer's `durability` before the peer is gone, so that a router, which knows
what each client's ACKs reached, can vouch for it.

Everything goes through the `curb.backend.Backend` protocol, with what differs between
a broker and a router in a `curb.web.queues.Queues`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curb.backend import Backend
from curb.log import Record
from curb.queue import Subscription
from curb.refused import NotStored
from curb.web.peers import HttpPeer
from curb.web.queues import Queues

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

    def __init__(self, backend: Backend, queues: Queues):
        self.backend = backend
        self.queues = queues
        self.claims: dict[int, _Claim] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    async def take(self, peer: HttpPeer, wait: float, ack_timeout: float | None = None, name: str = "") -> Taken | None:
        """The next message of destination `name`, waiting up to `wait` seconds; None if
        none came. It is wip on `peer` (deadline: `ack_timeout`, None for the backend's
        -ack-timeout, 0 for none)."""
        broker, own = self.backend, self.queues.own_deadlines
        got: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()

        def delivered(sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
            got.set_result(Taken(rec.id, bytes(data), rec.deliveries, rec.timestamp_ms, sub))

        peer.on_deliver = delivered
        self.queues.enter(peer)
        broker.subscribe(peer, SUB_ID, "client-individual", 1, ack_timeout if own else None, False, name)
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
        taken = got.result()
        if ack_timeout and not own:  # the claim's ttl, where SUBSCRIBE cannot set it
            broker.touch(peer, taken.id, ack_timeout)
        return taken

    async def ack_now(self, peer: HttpPeer, taken: Taken) -> None:
        """Consume-one: ACK the message taken, and return once that is on disk."""
        self.backend.ack(peer, taken.id)
        await self._settled(peer)

    def claim(self, peer: HttpPeer, taken: Taken) -> None:
        """Keep the message wip on `peer` until it is ACKed, NACKed or its deadline passes."""
        old = self.claims.get(taken.id)
        if old is not None:  # its deadline passed and the message came round again
            self.backend.gone(old.peer)
        self.claims[taken.id] = _Claim(peer, taken.sub)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    async def ack(self, msg_id: int) -> None:
        """The claimed message is done; returns once that is on disk. KeyError: not claimed
        here; curb.queue_errors.Late: its deadline passed."""
        peer = self._holder(msg_id)
        self.backend.ack(peer, msg_id)
        del self.claims[msg_id]
        await self._settled(peer)

    async def release(self, msg_id: int) -> None:
        """NACK: the claimed message goes back to the queue (as a STOMP NACK's, at the front)."""
        peer = self._holder(msg_id)
        self.backend.nack(peer, msg_id)
        del self.claims[msg_id]
        await self._settled(peer)

    def touch(self, msg_id: int, seconds: float) -> None:
        """The claimed message's deadline is `seconds` from now."""
        self.backend.touch(self._holder(msg_id), msg_id, seconds)

    def _holder(self, msg_id: int) -> HttpPeer:
        return self.claims[msg_id].peer

    async def _settled(self, peer: HttpPeer) -> None:
        """Once what `peer` did is on disk, it is gone; NotStored if that failed."""
        try:
            await durable(self.backend, peer)
        finally:
            self.backend.gone(peer)

    def _done(self, msg_id: int) -> None:
        claim = self.claims.pop(msg_id)
        self.backend.gone(claim.peer)

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
            self.queues.give_back(self.claims[msg_id].peer)
            self._done(msg_id)


def answer() -> tuple[asyncio.Future[str | None], Callable[[str | None], None]]:
    """A future and the broker's `done` callback that settles it (with None or the failure)."""
    future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def done(err: str | None) -> None:
        if not future.done():
            future.set_result(err)

    return future, done


async def durable(backend: Backend, peer: HttpPeer) -> None:
    """Until every step `peer` asked for so far is on disk; NotStored if that failed."""
    future, done = answer()
    backend.durability(peer)(done)
    err = await future
    if err is not None:
        raise NotStored(err)
