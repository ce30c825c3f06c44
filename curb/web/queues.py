"""Where the HTTP API's `{queue}` leads: the broker's one queue, or a router's destination.

The API (curb.web.api, curb.web.takers, curb.web.narconi) stores and takes messages
through the `curb.backend.Backend` protocol, as a STOMP session does; a `Queues` says
what differs between the backends that serve it:

- `name`: the destination a path's `{queue}` names. A broker has one queue, so any name
  is it (""); a router has one per routed NAME, and refuses the others.
- `enter`: an HTTP client becomes one of the backend's clients before it publishes or
  subscribes (a router keeps what a client sent until an instance answers it); every
  client that entered leaves with `Backend.gone`.
- `own_deadlines`: whether a subscription may set its own ack deadline (a claim's
  `ttl`, a consume-one's none). A router's instances keep their own -ack-timeout, so
  there a claim's ttl is set by a touch once the message came.
- `purge` and `give_back` (shutdown: a claim's message back, its delivery uncounted)
  reach the broker's queue itself; a router refuses a purge with a 4xx that says where
  to send it.

`OneQueue` is the broker's.
"""

from __future__ import annotations

from typing import Protocol

from curb.backend import Done
from curb.broker import Broker
from curb.web.peers import HttpPeer


class Queues(Protocol):
    own_deadlines: bool

    def name(self, queue: str) -> str:
        """The destination `queue` names ("" for the broker's one queue); a
        curb.web.replies.Refusal when there is none."""

    def enter(self, peer: HttpPeer) -> None: ...
    def purge(self, done: Done) -> None:
        """ACK every message (`done` once that is on disk), or a Refusal."""

    def give_back(self, peer: HttpPeer) -> None:
        """Shutdown: what `peer` holds goes back at once, its delivery not counted."""


class OneQueue:
    """The broker's queue: every `{queue}` names it."""

    own_deadlines = True

    def __init__(self, broker: Broker):
        self.broker = broker

    def name(self, queue: str) -> str:
        return ""

    def enter(self, peer: HttpPeer) -> None:
        """The broker keeps HTTP clients apart from its STOMP sessions: nothing to do."""

    def purge(self, done: Done) -> None:
        self.broker.ack_upto(self.broker.log.last_id, done)

    def give_back(self, peer: HttpPeer) -> None:
        self.broker.returns.closed(peer, limit=False)
