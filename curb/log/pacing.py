"""When the log's writes and syncs happen: the core's one question to whoever runs it.

The core (curb.log.core) decides *what* to write and *what* a sync answers, and never
when: it tells its pacer that something waits to be flushed or synced, and asks it
whether a flush its owner asks for is due. The asyncio driver (curb.log.driver) arranges
loop callbacks and a sync thread; a caller that steps the core by hand (the crash
simulator, in-memory tests) flushes and syncs when it chooses, so for it every wish is
already met and every flush asked for is due (`ByHand`).
"""

from __future__ import annotations

from typing import Protocol


class Pacer(Protocol):
    def flush_wanted(self) -> None:
        """Something waits to be flushed (appends, patches, a checkpoint, a walk's next slice)."""

    def take_flush(self) -> bool:
        """The core's owner asks for a flush now (`LogCore.flush`): whether one is due.
        When it is, a flush the pacer arranged for later is no longer needed."""

    def sync_soon(self, small: bool) -> None:
        """Something waits for a sync (a receipt, an append waiting for room): sync soon.
        `small`: few writes since the last sync, cheaper to sync at once than to hand
        to a thread."""

    def sync_later(self) -> None:
        """Written bytes wait for a sync nobody waits for: it may wait for company."""


class ByHand:
    """The pacing of a caller that flushes and syncs the core itself."""

    def flush_wanted(self) -> None:
        pass

    def take_flush(self) -> bool:
        return True

    def sync_soon(self, small: bool) -> None:
        pass

    def sync_later(self) -> None:
        pass
