"""The calls of curb.backend that name a destination, as an instance answers them: it
has one queue, so every ordinary destination is that queue, and its own names are
`./redrive`, `./dead` and `./count` (curb.destinations). The names these calls are given
are empty, and ignored.

A mixin of curb.broker.Broker, kept apart so that the coordinator holds only the queue's
steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from curb.backend import COUNT, DEAD, QUEUE, REDRIVE, Done
from curb.counts import COUNT_DESTINATION, CountWatch
from curb.dead import DEAD_DESTINATION, REDRIVE_DESTINATION
from curb.destinations import send_refusal, subscribe_refusal
from curb.frame import Frame
from curb.peer import Peer

if TYPE_CHECKING:
    from curb.returns import Returns
    from curb.transactions import Budget


class SingleQueue:
    """Destinations, redrive and counts of an instance's one queue."""

    returns: Returns
    count_watch: CountWatch
    counts: Callable[[], dict[str, int]]
    transactions: Budget | None = None  # an instance refuses transactions

    @staticmethod
    def send_kind(destination: str | None) -> tuple[str, str]:
        if destination == REDRIVE_DESTINATION:
            return REDRIVE, ""
        refusal = send_refusal(destination)
        if refusal is not None:
            raise refusal
        return QUEUE, ""

    @staticmethod
    def subscribe_kind(destination: str | None) -> tuple[str, str]:
        refusal = subscribe_refusal(destination)
        if refusal is not None:
            raise refusal
        if destination == DEAD_DESTINATION:
            return DEAD, ""
        return (COUNT if destination == COUNT_DESTINATION else QUEUE), ""

    @staticmethod
    def scope(session: Peer, frame: Frame) -> str | None:
        """None: an instance's permissions are plain (a router's may name destinations)."""
        return None

    @staticmethod
    def check_send(headers: Mapping[str, str], body: bytes) -> None:
        """Nothing to check ahead: an instance holds no transaction (Broker.accept checks)."""

    def redrive(self, name: str, count: int | None, moved: Callable[[int], None], failed: Done) -> None:
        """`failed` is never called: an instance's redrive fails only with its log, which
        the RECEIPT's wait for durability reports."""
        self.returns.redrive(count, moved)

    def counts_of(self, name: str) -> dict[str, int]:
        return self.counts()

    def count_tail(self, name: str, counts: dict[str, int]) -> tuple[bytes, bytes]:
        return self.count_watch.messages.tail(counts)

    def watch_counts(self, session: Peer, name: str, watching: bool) -> None:
        self.count_watch.watch(session, watching)
