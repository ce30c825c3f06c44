"""What the broker asks of one client connection, and how its log lines name one.

A front (curb.session.Session for STOMP, the web front's sockets and requests) is a Peer:
the broker delivers to it and stops it through these callbacks and imports no front, so
a front depends on the broker, never the reverse.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

from curb.log.cursor import Record
from curb.queue import Subscription


class Peer(Hashable, Protocol):
    """One client connection: the callbacks through which the broker delivers and stops
    it, and the names its log lines give."""

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


def who(session: Peer) -> str:
    """The peer, and the user once it logged in: '10.0.0.5:51234 (user 'alice')'."""
    return session.peer if session.user is None else f"{session.peer} (user {session.user!r})"
