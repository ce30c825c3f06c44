"""Placement and compaction: where each record goes in the ring, and the copies that
make room.

The ring's arithmetic is curb.log.ring's; this unit claims the spots it finds (growing
the file to cover them, ending a lap with a pad), hands out write sequences, and copies
the messages that pin the tail to the head when the ring runs short of room. It is a
unit of its own because every write of the log goes through it: appends (curb.log.appends),
copies of the records the log keeps (curb.log.kept) and compaction.

Invariants kept here:
- Every record, pad and copy written gets a new write sequence, above every earlier
  one (`next_wseq`): the cursor and recovery read records in strictly rising write
  sequence (curb.log.cursor, curb.log.scan).
- A copy made by compaction has the message's id and a new write sequence; the last copy
  in write order is the message (curb.log.cursor, curb.log.scan). ACK and requeue patch
  the record's current copy only, so older copies stay `rdy` and dead.
- Compaction copies parked records like held ones: one that pins the tail is copied to
  the head (same id, new write sequence, the mutable block as it is now) and its index
  entry moves to the copy, at once. Long-lived records therefore never pin the tail,
  whatever their due time.
- Compaction copies only while the durable tail (the ring's, the last synced
  checkpoint's) is the logical tail (Cursor.tail). Bytes between them are released by
  the next synced checkpoint anyway, and a record there may be dead only by an ACK a
  crash undoes (an ACK of the oldest message writes nothing: that checkpoint retires it,
  curb.log.checkpoints rule 6). Copies that spent the free bytes before then could
  leave a restarted log with that message at its tail and no contiguous room to copy
  it: every SEND refused until a consumer ACKs it. Admission's plan (Ring.clears)
  counts on the same order: each copy after a checkpoint released every byte before it.
- Compaction copies no record lying past one whose ACK a crash can still undo (an ACK
  patch not yet synced, an ACK up to an id no durable checkpoint carries: curb.log.dying).
  A crash that brings such a message back then kept only copies of records before it,
  whose originals the next checkpoint releases: the restarted log has at least the
  room it had before them to copy it.
- Every parked record is in the index from the moment it is placed: a copy of a parked
  record and a kept record copied to the head become entries at the head, in ring
  order, so the cursor never has to park what it meets (curb.log.cursor).
- The file grows before anything is placed in the bytes it adds: a full disk refuses the
  write before a record is counted as placed.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from curb.log import record as fmt
from curb.log.admission import Admission
from curb.log.browses import Browses
from curb.log.cursor import Cursor, Record
from curb.log.disk import Disk
from curb.log.dying import Dying
from curb.log.kept import DEAD_INDEX, Kept
from curb.log.parked import DELAYED, Parked
from curb.log.record import DEAD_STATES, PAD_SIZE, RING_START, STATE_PAD, STATE_RDY, FormatError, record_bytes
from curb.log.ring import Ring

ALLOCATE_STEP = 1 << 20


@dataclass(slots=True)
class WriteRuns:
    """Buffers to write, grouped into runs of adjacent bytes: one pwritev per run."""

    runs: list[tuple[int, list[bytes]]]
    ends: list[int]

    def add(self, off: int, size: int, bufs: tuple[bytes, ...]) -> None:
        if not self.runs or self.ends[-1] != off:
            self.runs.append((off, []))
            self.ends.append(off)
        self.runs[-1][1].extend(bufs)
        self.ends[-1] = off + size

    def write(self, disk: Disk) -> None:
        for off, bufs in self.runs:
            disk.pwritev(bufs, off)


class Placement:
    """The ring's head, the write sequence and the file's size, and the copies made."""

    def __init__(
        self,
        disk: Disk,
        ring: Ring,
        next_wseq: int,
        allocated: int,
        admission: Admission,
        cursor: Cursor,
        parked: Parked,
        kept: Kept,
        browses: Browses,
        dying: Dying,
        metrics: Any,
    ):
        self.disk = disk
        self.ring = ring
        self.end = ring.end
        self.capacity = ring.end - RING_START
        self.next_wseq = next_wseq
        self.allocated = allocated  # bytes of the file
        self.admission = admission
        self.cursor = cursor
        self.parked = parked
        self.kept = kept
        self.browses = browses
        self.dying = dying
        self.metrics = metrics

    def room_for_append(self, size: int, runs: WriteRuns, reserve: int) -> int | None:
        """Where a new record of `size` bytes goes now, leaving the reserve free for
        copies; None while the room is yet to come. Compaction starts early, once the
        free bytes fall below a quarter of the ring and a held message has pinned the
        tail for a while (curb.log.admission's `pinned`), so that its copies go in large batches while
        producers still have room (messages held only briefly are acked before they
        would be copied, rather than copied and then dead ahead of the cursor); early
        copies leave this record and the reserve their room."""
        admission = self.admission
        if self.cursor.behind and self.ring.free() - size < admission.early(reserve) and admission.pinned():
            self._compact(size, runs, keep=size + reserve + PAD_SIZE)
        off = self._place_new(size, runs, reserve)
        if off is None:
            self._compact(size, runs, keep=0)
            off = self._place_new(size, runs, reserve)
        return off

    def _place_new(self, size: int, runs: WriteRuns, reserve: int) -> int | None:
        ring = self.ring
        spot = ring.place(size)
        if spot is None:
            return None
        _off, wraps = spot
        used = size + (self.end - ring.head if wraps else 0)
        if ring.free() - used < reserve:
            return None
        return self._take(spot, size, runs)

    def _take(self, spot: tuple[int, bool], size: int, runs: WriteRuns) -> int:
        """Claim a spot from Ring.place: grow the file to cover it (a full disk raises
        here, before anything is placed), and end the lap with a pad if it wraps."""
        off, wraps = spot
        self.allocate(off + size + PAD_SIZE)
        if wraps:
            ring = self.ring
            header = fmt.encode_record(STATE_PAD, 0, 0, self.next_wseq, 0, b"")
            self.next_wseq += 1
            runs.add(ring.head, PAD_SIZE, record_bytes(header, b""))
            ring.head = RING_START
        return off

    def allocate(self, upto: int) -> None:
        """Grow the file to cover `upto`: a step ahead when the disk has room, else just
        what is needed, so a nearly full file system still takes small messages."""
        if upto <= self.allocated:
            return
        want = min(self.end, max(upto, self.allocated + ALLOCATE_STEP))
        try:
            self.disk.allocate(want)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT) or want == upto:
                raise
            want = min(self.end, -(-upto // 4096) * 4096)
            self.disk.allocate(want)
        self.allocated = want

    def _compact(self, size: int, runs: WriteRuns, keep: int) -> None:
        """Make room for `size` bytes: copy the held and parked messages that pin the tail
        to the head, oldest first, in one batch covering a quarter of the ring (so that
        one sync and one checkpoint release plenty of room, not one record's worth), while
        copies fit. Only once the durable tail is the logical tail: until then the next
        synced checkpoint releases bytes first, and they may be dead only by ACKs a crash
        can undo. And only when dead bytes lie among the live records up to the read
        position: copying a run of live messages with none after it just moves them round
        the ring. Copies leave `keep` bytes free."""
        ring, cursor, parked = self.ring, self.cursor, self.parked
        cursor.pass_dead()
        if cursor.tail() != ring.tail:
            return  # the next synced checkpoint frees room first (see the module's invariants)
        pinning = cursor.behind_bytes + parked.bytes - parked.unpassed_bytes
        if ring.distance(ring.tail, cursor.rpos) <= pinning:
            return  # the live records are not followed by dead bytes: copying them gains nothing
        span = min(size + self.admission.reserve() + self.capacity // 4, self.dying.first(ring))
        used = ring.distance(ring.tail, ring.head)
        while True:
            first = next(cursor.pinning(), None)
            if first is None:
                break
            offset, rec_size, rec, seq = first
            dist = ring.distance(ring.tail, offset)
            if dist >= span or dist >= used:
                break
            spot = ring.copy_spot(rec_size, keep)
            if spot is None:
                break
            if seq is None:
                assert rec is not None
                if not self._move(rec, spot, runs):
                    break
            elif not self._move_parked(seq, spot, runs):
                break

    def _move_parked(self, seq: int, spot: tuple[int, bool], runs: WriteRuns) -> bool:
        """Copy a parked record to the head: a Record released from it moves as a held
        one; any other is read back, with a rewrite of its mutable block still waiting
        applied, and its entry moves to the copy (a new entry at the head, in ring order:
        the cursor steps over the copy when it gets there)."""
        parked = self.parked
        held = parked.held.get(seq)
        if held is not None:
            if not self._copy(held, spot, runs):
                return False
            parked.remove(seq)
            held.slot = -1
            cursor = self.cursor
            cursor.outstanding_bytes += held.size
            cursor.ahead[held.id] = held  # a held copy ahead of the cursor, as `Cursor.moved` makes
            return True
        size = parked.size(seq)
        checked = self.kept.checked(parked.offset(seq), size, parked.id(seq))
        if checked is None:
            self.kept.lost(seq)
            return True  # lost to damage: nothing to copy, and the tail may pass it
        hdr, raw = checked
        payload = bytes(hdr.payload(raw, 0))
        off = self._take(spot, size, runs)
        wseq = self.next_wseq
        self.next_wseq += 1
        header = fmt.encode_record(
            hdr.state, hdr.deliveries, hdr.id, wseq, hdr.timestamp_ms, payload, True, hdr.due_ms, hdr.expires_ms
        )
        runs.add(off, size, record_bytes(header, payload))
        self.ring.head = off + size
        state = parked.state(seq)
        parked.remove(seq)
        parked.add(off, size, hdr.id, state, hdr.due_ms, passed=False)
        self.browses.moved(hdr.id, hdr.wseq, wseq)
        if self.metrics is not None:
            self.metrics.compactions += 1
        return True

    def _move(self, rec: Record, spot: tuple[int, bool], runs: WriteRuns) -> bool:
        """Copy a held message to the head (`_copy`); the cursor knows the new copy, or
        the index does, if the log keeps the record (`_reparked`)."""
        if not self._copy(rec, spot, runs):
            return False
        if rec.parked:
            self._reparked(rec)
        else:
            self.cursor.moved(rec)
        return True

    def write_reparks(self) -> bool:
        """Copy the records the log keeps (curb.log.kept) to the head, as entries of the
        index, while the ring keeps the room below which compaction starts early (a
        quarter of it at least); the rest wait for a later flush, or for compaction,
        which copies them with the held records that pin the tail. The caller asks only
        while no append waits for room. Returns whether anything was written."""
        reparks, ring, admission = self.kept.reparks, self.ring, self.admission
        runs = WriteRuns([], [])
        keep = admission.early(admission.reserve())
        while reparks:
            rec = reparks[0]
            spot = ring.copy_spot(rec.size, keep)
            if spot is None:
                break
            try:
                copied = self._copy(rec, spot, runs)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                break  # the file cannot grow now: the copy waits, nothing was placed
            if copied:
                self._reparked(rec)
            else:  # damaged, and reported: it stays held, as compaction leaves it
                self.kept.unkeep(rec)
        if not runs.runs:
            return False
        runs.write(self.disk)
        cursor = self.cursor
        cursor.whead, cursor.next_wseq = ring.head, self.next_wseq
        return True

    def _reparked(self, rec: Record) -> None:
        """A record the log keeps was copied to the head: its copy is an entry of the
        index from now on (DELAYED with its due time, or dead), the cursor no longer holds
        it, and the Record is no longer the log's."""
        cursor = self.cursor
        if cursor.behind.pop(rec.id, None) is not None:
            cursor.behind_bytes -= rec.size
        else:
            cursor.ahead.pop(rec.id, None)
        cursor.outstanding_bytes -= rec.size
        state = DEAD_INDEX[rec.dead] if rec.dead else DELAYED
        self.parked.add(rec.offset, rec.size, rec.id, state, rec.due_ms, passed=False)
        self.kept.unkeep(rec)

    def _copy(self, rec: Record, spot: tuple[int, bool], runs: WriteRuns) -> bool:
        """Write a copy of a held message at the head: same id, its state, delivery count
        and due time as they are now, new write sequence. Its old copy is dead from now on."""
        kept = rec.payload  # a held message keeps only a small payload, as bytes
        if kept is not None:
            payload = bytes(kept)
        else:
            raw = self.disk.pread(rec.size, rec.offset)
            try:
                hdr = fmt.parse_header(raw, 0)
            except FormatError:
                hdr = None
            if hdr is None or hdr.id != rec.id or not fmt.check_payload(raw, 0, hdr):
                self.kept.damaged(f"message {rec.id} at byte {rec.offset} is damaged and cannot be copied")
                return False
            payload = bytes(hdr.payload(raw, 0))
        off = self._take(spot, rec.size, runs)
        old_wseq = rec.wseq
        rec.wseq = self.next_wseq
        self.next_wseq += 1
        state = DEAD_STATES[rec.dead] if rec.dead else STATE_RDY
        header = fmt.encode_record(
            state, rec.deliveries, rec.id, rec.wseq, rec.timestamp_ms, payload, True, rec.due_ms, rec.expires_ms
        )
        runs.add(off, rec.size, record_bytes(header, payload))
        rec.offset = off
        self.ring.head = off + rec.size
        self.browses.moved(rec.id, old_wseq, rec.wseq)
        if self.metrics is not None:
            self.metrics.compactions += 1
        return True
