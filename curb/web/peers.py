"""An HTTP client as the broker sees it: a Peer (curb.broker) with no STOMP output.

Each HTTP request that logs in or waits for a message, and each Narconi consume
WebSocket, is one `HttpPeer`. The broker delivers to it through `on_deliver`, names
it in its log lines (`peer`, `user`) and keeps its queue state (subscription, wip,
ack deadlines) under it as under a STOMP session; the rest of the Peer protocol (counts,
browses, output) is for STOMP sessions and does nothing here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from curb.log import Record
from curb.queue import Subscription

Delivery = Callable[[Subscription[Any, Record], Record, bytes | memoryview], None]


def refuse(sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
    raise AssertionError("a message was delivered to an HTTP client that takes none")


class HttpPeer:
    """One HTTP client's standing with the broker; compares by identity."""

    browsing = False

    def __init__(self, peer: str, user: str | None = None, identity: str | None = None):
        self.peer = peer
        self.user = user
        self.identity = identity
        self.writable = True
        self.last_recv = 0.0  # the broker's log line for a shed login reads it
        self.on_deliver: Delivery = refuse

    def deliver(self, sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
        self.on_deliver(sub, rec, data)

    def send_counts(self, counts: dict[str, int]) -> None:
        pass

    def browse_more(self, budget: int) -> bool:
        return False

    def output_due(self) -> None:
        pass

    def stop_reading(self) -> None:
        pass

    def close(self) -> None:
        pass
