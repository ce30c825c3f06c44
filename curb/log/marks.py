"""Marks: a sparse index from message id to record, so that a browse starts near its range.

A mark is (id, offset, write sequence) of an *original* record (not a copy compaction
made) whose id is above every id before it in write order. Start-up recovery marks the
records it walks, and the log marks those it writes, at most one a `spacing` of bytes:
a browse starts at the last mark at or below its from-id and reads at most about two
spacings of records to reach its range, however deep the queue; and there are at most
about ring / spacing marks, however small the messages.

Invariants:
- Nothing with an id at or above a mark's id lies before the mark in write order: every
  original before it has a lower id (originals are written in id order), and so has
  every copy before it (a copy is of a message written before the copy was).
- The marks are in write order, so their ids rise, and they lie in the live region
  from the durable tail to the head: the log drops the marks of the space a durable
  checkpoint frees (`drop_freed`) before that space can be written again. A mark is
  still checked against the record at its offset before use (curb.log).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

MARK_BYTES = 256 * 1024  # the least spacing of marks
MAX_MARKS = 1 << 16  # for rings larger than MARK_BYTES * MAX_MARKS, marks spread out


def spacing_for(capacity: int) -> int:
    """Bytes between marks in a ring of `capacity` bytes."""
    return max(MARK_BYTES, capacity // MAX_MARKS)


class Marks:
    """The marks of one ring, in write order."""

    def __init__(self, spacing: int):
        self.spacing = spacing
        self.entries: list[tuple[int, int, int]] = []  # (id, offset, wseq), ids rising
        self.last_at = -1  # offset of the last mark
        self.next_at = 0  # the next original at or past this offset gets a mark

    def due(self, pos: int) -> bool:
        """Whether an original record at `pos`, the next written, gets a mark (also
        the first after the ring wrapped)."""
        return pos >= self.next_at or pos < self.last_at

    def add(self, msg_id: int, pos: int, wseq: int) -> None:
        entries = self.entries
        if entries and msg_id <= entries[-1][0]:
            return  # out of id order: never a mark (see the module's invariants)
        entries.append((msg_id, pos, wseq))
        self.last_at, self.next_at = pos, pos + self.spacing

    def before(self, msg_id: int) -> tuple[int, int, int] | None:
        """The last mark with an id at most `msg_id`."""
        i = bisect.bisect_right(self.entries, msg_id, key=lambda mark: mark[0])
        return self.entries[i - 1] if i else None

    def drop_freed(self, distance: Callable[[int, int], int], old_tail: int, new_tail: int) -> None:
        """The durable tail moved from old_tail to new_tail: forget the marks in between
        (the oldest ones), whose space may now be written again."""
        freed = distance(old_tail, new_tail)
        entries = self.entries
        n = 0
        while n < len(entries) and distance(old_tail, entries[n][1]) < freed:
            n += 1
        del entries[:n]
