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
- A browse may start at a later record than the logical tail (`start_at`, the log's
  choice: a mark, curb.marks, an original whose id is at most from_id, written in this
  run or found by recovery). Nothing in range lies before it: every original before it
  has a lower id, and so has every copy before it (a copy is written after its
  original, so it is of a message with a lower id than any original written after it).
- Originals (records that are not copies) are written in id order, so once the browse
  reads an original above to_id, the only live messages left in range are held ones
  (in memory: the cursor's `behind` and `ahead`) and copies recovery found (`last`):
  those are returned from memory, in write order, and the browse ends.
- A step's work is bounded like the cursor's: it reads at most `slice_work` (bytes
  read, plus RECORD_WORK a record) before it returns, whatever it found, so a browse
  whose range lies far from where it starts crosses the records in between over many
  steps, each a short one for the event loop.
- The browse ends at the head once no message with an id up to to_id waits to be
  written; until then it waits for the log to write them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from curb.log.cursor import RECORD_WORK, SLICE_WORK, Cursor
from curb.log.reader import RecordReader
from curb.log.record import (
    COPY_FLAG,
    CRC_FROM,
    CRC_TO,
    RECORD_HEADER,
    RING_START,
    STATE_ACK,
    STATE_PAD,
    STATE_RDY,
    RecordHeader,
    payload_crc,
    record_size,
)


@dataclass(slots=True)
class Step:
    """What one step of a browse found: (id, stored payload) pairs, the due times of
    those delayed (`due`: id -> ms since the epoch, as the record on disk has it), and
    whether the browse is over (`done`) or waits for the log to write more (`waiting`)."""

    messages: list[tuple[int, bytes]]
    done: bool = False
    waiting: bool = False
    due: dict[int, int] = field(default_factory=dict)


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
        slice_work: int = SLICE_WORK,
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
        self.slice_work = slice_work

    def start_at(self, pos: int, wseq: int) -> None:
        """Start at the record at `pos` (write sequence `wseq`) instead of the tail: no
        original before it has an id in range."""
        self.pos, self.last_wseq = pos, wseq - 1

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
        """Read on until `budget` bytes of messages are found, this step's work is done
        (`slice_work`), the head, or the end."""
        out: list[tuple[int, bytes]] = []
        due: dict[int, int] = {}
        if self.done:
            return Step(out, done=True)
        cur, reader, skip = self.cursor, self.reader, self.skip
        low, high = self.from_id, self.to_id
        used = 0
        work = self.slice_work
        while used < budget and work > 0:
            pos = self.pos
            whead = cur.whead
            if pos == whead:
                self.done = not self.waits_for(high)
                return Step(out, done=self.done, waiting=not self.done, due=due)
            limit = whead if whead > pos else self.end
            found = self._plain(pos, limit) or reader.intact(pos, limit)
            if found is None or not self.last_wseq < found[0].wseq < cur.next_wseq:
                self._skip_damage(pos, limit)
                work -= RECORD_WORK
                continue
            hdr, buf, off = found
            mid, wseq, state, size = hdr.id, hdr.wseq, hdr.state, hdr.size
            work -= RECORD_WORK + size
            self.last_wseq = wseq
            if state == STATE_PAD:
                self.pos = RING_START
                reader.drop()
                continue
            self.pos = pos + size
            if skip and skip.get(mid) == wseq:
                del skip[mid]
                continue
            if not hdr.copy and mid > high:
                out.extend(self._held_ahead(due))
                self.done = True
                return Step(out, done=True, due=due)
            if low <= mid <= high and cur.is_live(pos, mid, wseq, state):
                out.append((mid, hdr.payload(buf, off)))
                if hdr.due_ms:
                    due[mid] = hdr.due_ms
                used += size
        return Step(out, due=due)

    def _plain(self, pos: int, limit: int) -> tuple[RecordHeader, bytes, int] | None:
        """The record at pos when it is a plain intact `rdy` or `ack` record inside the
        current window (the common case, parsed here without the general checks);
        None sends the caller to RecordReader.intact, which decides every other case."""
        reader = self.reader
        buf = reader.buf
        off = pos - reader.base
        if off < 0 or off + RECORD_HEADER > len(buf) or buf[off + RECORD_HEADER - 1] != 10:
            return None
        state = buf[off : off + 3]
        if state != STATE_RDY and state != STATE_ACK:
            return None
        if buf[off + 26 : off + 32] != buf[off + 52 : off + 58]:
            return None  # the tag is not the write sequence's (curb.log.record)
        try:
            length = int(buf[off + 85 : off + 93], 16)
            mid = int(buf[off + 33 : off + 45], 16)
            stamp = int(buf[off + 59 : off + 71], 16)
            due_ms = int(buf[off + 13 : off + 25], 16)
            size = record_size(length)
            hdr = RecordHeader(
                state,
                0,
                mid,
                int(buf[off + 46 : off + 58], 16),
                stamp & ~COPY_FLAG,
                length,
                int(buf[off + 94 : off + 102], 16),
                bool(stamp & COPY_FLAG),
                due_ms=due_ms,
                size=size,
            )
        except ValueError:
            return None
        end = off + size
        if mid == 0 or pos + size > limit or end > len(buf) or buf[end - 1] != 10:
            return None
        body = off + RECORD_HEADER
        if payload_crc(buf[body : body + length], zlib.crc32(buf[off + CRC_FROM : off + CRC_TO])) != hdr.crc:
            return None
        return hdr, buf, off

    def _held_ahead(self, due: dict[int, int]) -> list[tuple[int, bytes]]:
        """The live messages in range whose live occurrence is still ahead, once no
        original in range is: held messages, parked ones, and copies recovery found, in
        write order (the due times of those delayed into `due`).
        Each is read back and judged by `Cursor.is_live` like any other record."""
        cur, low, high = self.cursor, self.from_id, self.to_id
        places = [rec.offset for held in (cur.behind, cur.ahead) for rec in held.values() if low <= rec.id <= high]
        places += [at for mid, at in cur.last.items() if low <= mid <= high and at >= 0]
        # Parked records (compaction copies them after newer ones).
        parked = cur.parked
        places += [at for mid, at in zip(parked.ids, parked.offsets, strict=True) if low <= mid <= high]
        places = sorted(set(places))  # one read window serves neighbours; each place once
        found: list[tuple[int, int, bytes]] = []  # (wseq, id, payload)
        reader = self.reader
        reader.drop()
        for at in places:
            got = reader.intact(at, self.end)
            if got is None:
                continue
            hdr, buf, off = got
            if (
                low <= hdr.id <= high  # a place may hold another record now (a parked one's was reused)
                and hdr.wseq > self.last_wseq
                and hdr.id not in self.skip
                and cur.is_live(at, hdr.id, hdr.wseq, hdr.state)
            ):
                found.append((hdr.wseq, hdr.id, bytes(hdr.payload(buf, off))))
                if hdr.due_ms:
                    due[hdr.id] = hdr.due_ms
        reader.drop()
        found.sort()
        return [(mid, payload) for _, mid, payload in found]

    def _skip_damage(self, pos: int, limit: int) -> None:
        """Past damaged bytes, as the cursor does (it reports them; a browse does not)."""
        cur = self.cursor
        self.pos = self.reader.past_damage(pos, limit, self.last_wseq, cur.next_wseq, cur.whead)
