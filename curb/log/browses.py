"""The browses open on the log, where each starts, and what the log tells them.

A browse (curb.log.browse) reads the ring beside the cursor while the log writes,
compacts and reuses space under it. Invariants, each kept here:
- Every browse open hears of each copy compaction makes (`moved`) and of space a
  durable checkpoint lets the log reuse (`freed`), so it returns each message once and
  never reads an older lap's bytes.
- A browse starts at the logical tail, or at a *mark* (curb.log.marks: a sparse index
  from id to record, rebuilt by recovery's walk and kept as records are written) with an
  id at most its from-id, when that mark still lies in the live region and its record is
  still there (`mark_before`).
- The marks of space a durable checkpoint frees are dropped with it, so no mark names an
  older lap's bytes (such as the end of a lap past its pad, which is intact and within
  the live region's span, but read by no one).
"""

from __future__ import annotations

from collections.abc import Callable

from curb.log import record as fmt
from curb.log.browse import Browse
from curb.log.cursor import Cursor
from curb.log.disk import Disk
from curb.log.marks import Marks
from curb.log.reader import RecordReader
from curb.log.record import RECORD_HEADER, RING_START, FormatError
from curb.log.ring import Ring


class Browses:
    """The browses open (`active`) over one log's ring, and the marks they start at."""

    def __init__(
        self,
        disk: Disk,
        end: int,
        cursor: Cursor,
        ring: Ring,
        marks: Marks,
        waits_for: Callable[[int], bool],
        slice_work: int,
    ):
        self.disk = disk
        self.end = end
        self.cursor = cursor
        self.ring = ring
        self.marks = marks
        self.waits_for = waits_for  # whether a message with an id up to n is yet to be written
        self.slice_work = slice_work
        self.active: set[Browse] = set()

    def start(self, from_id: int, to_id: int) -> Browse:
        """A browse of the live messages with ids in [from_id, to_id], open until `end`."""
        reader = RecordReader(self.disk, self.end - RING_START)
        browse = Browse(self.cursor, reader, self.end, from_id, to_id, self.waits_for, self.slice_work)
        mark = self.mark_before(from_id)
        if mark is not None:
            browse.start_at(mark[1], mark[2])
        self.active.add(browse)
        return browse

    def end_browse(self, browse: Browse) -> None:
        self.active.discard(browse)

    def mark_before(self, msg_id: int) -> tuple[int, int, int] | None:
        """The last mark with an id at most `msg_id` that lies in the live region (from the
        logical tail to the head) with its record still there, if it is worth starting at."""
        mark = self.marks.before(msg_id)
        if mark is None:
            return None
        cur, ring = self.cursor, self.ring
        tail = cur.tail()
        if not 0 < ring.distance(tail, mark[1]) < ring.distance(tail, cur.whead):
            return None
        raw = self.disk.pread(RECORD_HEADER, mark[1])
        try:
            hdr = fmt.parse_header(raw, 0)
        except FormatError:
            return None
        return mark if (hdr.id, hdr.wseq) == (mark[0], mark[2]) else None

    def moved(self, msg_id: int, old_wseq: int, new_wseq: int) -> None:
        """Compaction copied message `msg_id` (its copy of `old_wseq`) to a new record."""
        for browse in self.active:
            browse.moved(msg_id, old_wseq, new_wseq)

    def freed(self, old_tail: int, new_tail: int) -> None:
        """A durable checkpoint lets the log reuse [old_tail, new_tail): its marks go, and
        a browse there moves on."""
        distance = self.ring.distance
        self.marks.drop_freed(distance, old_tail, new_tail)
        for browse in self.active:
            browse.freed(distance, old_tail, new_tail)
