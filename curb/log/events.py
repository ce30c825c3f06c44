"""What the log tells its owner, given to `LogCore` when it is made.

The log has no event loop and calls nobody but its pacer (curb.log.pacing) on its own:
whatever its owner must hear of (messages to hand out, answers to send, a fatal error)
it says through one object implementing `LogEvents`, fixed at construction, so that no
report is lost to a listener attached too late (recovery reports damage while it runs).
`NoEvents` hears nothing: tests and offline readers that drive the log themselves.
"""

from __future__ import annotations

from typing import Protocol


class LogEvents(Protocol):
    """The log's reports to its owner, each made from inside one of the log's calls (a
    flush, the end of a sync, an ACK up to an id, recovery)."""

    def written(self) -> None:
        """Appends were placed, or a walk of the ring went on: messages may wait to be
        handed out, and the counts changed."""

    def walked(self) -> None:
        """An ACK up to an id's walk of the parked index is done: the counts are exact again."""

    def answered(self) -> None:
        """Callers waiting for durability were answered: their replies may go out."""

    def disk_full(self, refused: int, why: str) -> None:
        """The file system had no room to grow the file: `refused` pending SENDs were refused."""

    def fatal(self, reason: str) -> None:
        """A write or sync failed: the log stopped for good (`LogCore.broken`)."""

    def damage(self, text: str) -> None:
        """Damaged bytes were found and skipped (`text` names the file); nothing in them is
        delivered."""


class NoEvents:
    """A LogEvents that ignores every report."""

    def written(self) -> None:
        pass

    def walked(self) -> None:
        pass

    def answered(self) -> None:
        pass

    def disk_full(self, refused: int, why: str) -> None:
        pass

    def fatal(self, reason: str) -> None:
        pass

    def damage(self, text: str) -> None:
        pass
