"""A browse: a read of the queue's live messages by id range that changes no state.

A browse is a second reader over the ring, beside the read cursor (curb.cursor). It walks
the records from the logical tail towards the head, a bounded number of bytes per step,
through its own RecordReader window, and keeps no per-message state beyond the copies
compaction makes while it runs. Which record is a live message is the cursor's answer
(`Cursor.is_live`), so the browse and the deliveries judge copies, acks and the
watermark the same way.

Invariants:
- Each live message in [from_id, to_id] is returned exactly once, in log order (ascending
  ids, except that a message compaction copied forward comes where its copy is).
  Records are read in strictly rising write sequence, like the cursor; a message copied
  while the browse runs is returned at its old place if the browse had passed that
  place (then its new copy is skipped, `skip`), else at its new one (`moved`).
- The position never lies in space the log may reuse: when the durable tail passes it,
  the log calls `freed` and the browse moves to the new tail (everything in between
  was dead when that checkpoint was taken). Its window is dropped then and at every pad.
- Originals (records that are not copies) are written in id order, so once the browse
  reads an original above to_id, the only live messages left in range are held ones
  (in memory: the cursor's `behind` and `ahead`) and copies recovery found (`last`):
  those are returned from memory, in write order, and the browse ends.
- The browse ends at the head once no message with an id up to to_id waits to be
  written; until then it waits for the log to write them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from curb.cursor import Cursor
from curb.reader import RecordReader
from curb.record import RECORD_HEADER, RING_START, STATE_PAD


@dataclass(slots=True)
class Step:
    """What one step of a browse found: (id, stored payload) pairs, and whether the
    browse is over (`done`) or waits for the log to write more (`waiting`)."""

    messages: list[tuple[int, bytes]]
    done: bool = False
    waiting: bool = False


class Browse:
    """One browse of the ring, stepped by its owner as its output drains."""

    def __init__(
        self,
        cursor: Cursor,
        reader: RecordReader,
        end: int,
        from_id: int,
        to_id: int,
        waits_for: Callable[[int], bool],
    ):
        self.cursor = cursor
        self.reader = reader
        self.end = end
        self.from_id = from_id
        self.to_id = to_id
        self.waits_for = waits_for  # whether a message with an id up to n is yet to be written
        self.pos = cursor.tail()
        self.last_wseq = -1
        self.skip: dict[int, int] = {}  # id -> write sequence of a copy already returned
        self.done = from_id > to_id

    # ---------------------------------------------------------------- the log's notices

    def moved(self, msg_id: int, old_wseq: int, new_wseq: int) -> None:
        """Compaction copied message `msg_id` (its copy of `old_wseq`) to a new record."""
        if msg_id in self.skip or old_wseq <= self.last_wseq:
            self.skip[msg_id] = new_wseq

    def freed(self, distance: Callable[[int, int], int], old_tail: int, new_tail: int) -> None:
        """Space in [old_tail, new_tail) may be reused: leave it if the browse is there."""
        if distance(old_tail, self.pos) < distance(old_tail, new_tail):
            self.pos = new_tail
            self.reader.drop()

    # ---------------------------------------------------------------- stepping

    def step(self, budget: int) -> Step:
        """Read on until `budget` bytes of messages are found, the head, or the end."""
        out: list[tuple[int, bytes]] = []
        if self.done:
            return Step(out, done=True)
        cur, reader = self.cursor, self.reader
        low, high = self.from_id, self.to_id
        used = 0
        while used < budget:
            pos = self.pos
            if pos == cur.whead:
                self.done = not self.waits_for(high)
                return Step(out, done=self.done, waiting=not self.done)
            limit = cur.whead if cur.whead > pos else self.end
            found = reader.intact(pos, limit)
            if found is None or not self.last_wseq < found[0].wseq < cur.next_wseq:
                self._skip_damage(pos, limit)
                continue
            hdr, buf, off = found
            self.last_wseq = hdr.wseq
            if hdr.state == STATE_PAD:
                self.pos = RING_START
                reader.drop()
                continue
            self.pos = pos + hdr.size
            mid = hdr.id
            if self.skip.get(mid) == hdr.wseq:
                del self.skip[mid]
                continue
            if not hdr.copy and mid > high:
                out.extend(self._held_ahead())
                self.done = True
                return Step(out, done=True)
            if low <= mid <= high and cur.is_live(pos, hdr):
                out.append((mid, bytes(buf[off + RECORD_HEADER : off + hdr.size - 1])))
                used += hdr.size
        return Step(out)

    def _held_ahead(self) -> list[tuple[int, bytes]]:
        """The live messages in range whose live occurrence is still ahead, once no
        original in range is: held messages, and copies recovery found, in write order."""
        cur, low, high = self.cursor, self.from_id, self.to_id
        found: list[tuple[int, int, int]] = []  # (wseq, id, offset)
        for held in (cur.behind, cur.ahead):
            for rec in held.values():
                if (
                    low <= rec.id <= high
                    and not rec.acked
                    and rec.id > cur.upto
                    and rec.wseq > self.last_wseq
                    and rec.id not in self.skip
                ):
                    found.append((rec.wseq, rec.id, rec.offset))
        out: list[tuple[int, int, bytes]] = []
        for wseq, mid, offset in found:
            got = self._read(offset, mid)
            if got is not None:
                out.append((wseq, mid, got[1]))
        for mid, offset in cur.last.items():
            if low <= mid <= high and mid > cur.upto:
                got = self._read(offset, mid)
                if got is not None and got[0] > self.last_wseq:
                    out.append((got[0], mid, got[1]))
        out.sort()
        return [(mid, payload) for _, mid, payload in out]

    def _read(self, offset: int, msg_id: int) -> tuple[int, bytes] | None:
        """(write sequence, payload) of the intact record of `msg_id` at `offset`."""
        self.reader.drop()
        found = self.reader.intact(offset, self.end)
        if found is None or found[0].id != msg_id:
            return None
        hdr, buf, off = found
        return hdr.wseq, bytes(buf[off + RECORD_HEADER : off + hdr.size - 1])

    def _skip_damage(self, pos: int, limit: int) -> None:
        """Past damaged bytes, as the cursor does (it reports them; a browse does not)."""
        low, high = self.last_wseq, self.cursor.next_wseq
        nxt = self.reader.resync(pos, limit, lambda h: low < h.wseq < high)
        if nxt is None:
            nxt = RING_START if pos > self.cursor.whead else self.cursor.whead
            self.reader.drop()
        self.pos = nxt
