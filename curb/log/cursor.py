"""The read cursor: hands out the queue's messages in file order, once each per run.

The broker keeps no index of queued messages: the queue order is the ring's order, so
the cursor is a read position plus the messages handed out and not yet acked (`behind`,
in ring order; the first of them, or the read position, is the logical tail).

Invariants:
- Each message is handed out at most once per run. A message can be in the ring more
  than once: compaction copies a held message forward (same id, new write sequence), and
  a crash can leave the original behind. The *last* copy in write order is the message;
  earlier copies are dead. In a run, a copy ahead of the cursor is known by `ahead`
  (id -> the held Record, whose offset is the copy); copies found at start-up are known by
  `last` (id -> offset of the last copy, or PARKED_LAST when that copy is parked).
  Neither grows with queue depth. Fresh messages are written in id order, so any other
  record whose id is not above every id read
  before it is a copy nobody vouches for (left by damage recovery skipped), never a
  message.
- The window of bytes the cursor reads through never outlives a lap: it is dropped at
  every pad, so bytes rewritten since a lap ago are never taken for records.
- Records are read in strictly rising write sequence (every record, pad and copy gets a
  new one when written), so bytes that are intact but out of place (a sector written to
  the wrong spot, a stale record) count as damage, never as a second message.
- A damaged record is never handed out: the cursor reads through the same RecordReader
  as recovery, skips to the next intact record (reported through `damaged`), and
  counts what is left exactly: `unread` is what recovery counted plus what was written
  since, minus what was handed out, and is reset to 0 whenever the cursor reaches the
  head (recovery's count can be off only where it skimmed over damage).
- A message whose id is at most `upto` (the ack-up-to watermark) is dead wherever it is:
  never handed out, and uncounted from `unread` when the cursor passes it, if `unread`
  counted it: recovery counts no record with an id up to the watermark it found
  (`counted_above`), original or copy, so passing one uncounts nothing; only records
  above it, which this run's ACKs up to an id made dead, are still counted until passed.
  Every uncount goes through `_uncount`, which asks this one rule.
- The cursor's work is bounded: it reads on for at most `allowance` work (bytes read
  plus RECORD_WORK a record, STEP_WORK a parked record it steps over unread) per slice,
  then stops where it is, sets `stalled` and calls `wants_slice`; its owner (the log)
  grants the next slice later, from the event loop's next pass, so that passing a
  million dead records never holds the loop.
- Parked records (curb.log.parked: due later, or dead) are never handed out by
  `next_ready`: every one is in the index before the cursor can meet it, so the cursor
  only steps over them (by their recorded sizes, unread) and never parks one itself.
  Recovery indexes those it finds; the log indexes a delayed append and a compaction
  copy of a parked record when it places them, at the head, so entries are added in
  ring order only (curb.log.parked). A record the cursor meets that is not indexed is
  therefore never parked: a `rdy` one was due when it was written (or recovered) and
  is handed out, whatever its due field says now (a wall clock set back); a dead one
  the cursor does not know is a stale occurrence, never a message.
- `is_live` is the one answer, for any other reader of the ring (a browse), to "is this
  record the live occurrence of a message not yet acked?": held messages by their
  current copy's offset, records the cursor has read by whether it holds them, unread
  records by their state and the copies recovery found (`last`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

from curb.log.disk import Disk
from curb.log.parked import DELAYED, HELD, READY, Parked
from curb.log.reader import RecordReader
from curb.log.record import (
    RECORD_HEADER,
    RING_START,
    STATE_ACK,
    STATE_EXP,
    STATE_MAX,
    STATE_PAD,
    STATE_RDY,
    RecordHeader,
)

# A payload up to this size stays with its record while the message is held (for
# redelivery and compaction); a larger one only from its read or write until its
# delivery takes it (Log.payload), so that messages in flight do not pin their bytes.
KEEP_PAYLOAD = 64 * 1024
FRESH_BYTES = 1 << 20
# The work of one slice of reading the ring: bytes read, plus RECORD_WORK for each record
# (its header's parse and checks cost about what reading 2 KiB does). About 250 small
# records: their reading is a millisecond of CPU, and the deliveries a slice makes
# (each rendered and written, tens of microseconds) stay well under 50 ms with the ACKs
# of a frame that acknowledges a thousand (1 MiB slices let such a pass reach 51-57 ms).
RECORD_WORK = 2048
SLICE_WORK = 1 << 19
# The work of stepping over one parked record by its index entry (no read): a slice steps
# over at most SLICE_WORK / STEP_WORK of them, a few milliseconds of CPU.
STEP_WORK = 64
PARKED_LAST = -2  # in `last`: the message's last occurrence is parked (curb.log.parked)


class Record:
    """A message handed out by the cursor and not yet acked: the broker's only
    per-message memory, bounded by what consumers hold in flight."""

    __slots__ = (
        "acked",
        "dead",
        "deliveries",
        "due_ms",
        "expires_ms",
        "id",
        "offset",
        "parked",
        "payload",
        "size",
        "slot",
        "timestamp_ms",
        "wseq",
    )

    def __init__(
        self,
        msg_id: int,
        offset: int,
        size: int,
        deliveries: int,
        timestamp_ms: int,
        payload: bytes | memoryview | None,
        wseq: int = 0,
        due_ms: int = 0,
        expires_ms: int = 0,
    ):
        self.id = msg_id
        self.offset = offset
        self.size = size
        self.deliveries = deliveries
        self.timestamp_ms = timestamp_ms
        self.payload = payload
        self.wseq = wseq
        self.acked = False
        self.due_ms = due_ms  # wall ms before which it is not delivered; 0: no delay
        self.expires_ms = expires_ms  # wall ms from which it is never delivered; 0: never
        self.dead = ""  # a dead letter's reason: "max-deliveries" or "expired"
        self.slot = -1  # its entry in curb.log.parked while it has one (released from it)
        self.parked = False  # held by no one: requeued with a delay, or buried


def take_payload(rec: Record, disk: Disk) -> bytes | memoryview:
    """The stored SEND headers and body of a record, as written or read (a view, never a
    copy), read from `disk` if its record no longer holds them. One larger than
    KEEP_PAYLOAD stays with its record only until this call takes it for a delivery, so
    that a held message does not pin its bytes."""
    data = rec.payload
    if data is None:
        raw = disk.pread(rec.size, rec.offset)
        return memoryview(raw)[RECORD_HEADER : RECORD_HEADER + int(raw[85:93], 16)]
    if rec.size > KEEP_PAYLOAD:
        rec.payload = None
    return data


class Cursor:
    """The read position, the messages handed out, and the counts of what is left."""

    def __init__(
        self,
        reader: RecordReader,
        end: int,
        tail: int,
        head: int,
        next_wseq: int,
        last: dict[int, int],
        unread: int,
        unread_bytes: int,
        damaged: Callable[[str], None],
        wants_slice: Callable[[], None],
    ):
        self.reader = reader
        self.end = end
        self.rpos = tail
        self.whead = head
        self.next_wseq = next_wseq
        self.last_wseq = -1
        self.max_id = 0
        self.upto = 0
        self.counted_above = 0  # `unread` never counted a record with an id up to this
        self.last = last
        self.unread = unread
        self.unread_bytes = unread_bytes
        self.outstanding_bytes = 0
        self.behind_bytes = 0
        self.behind: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self.ahead: dict[int, Record] = {}
        self.fresh: collections.deque[Record] = collections.deque()
        self.fresh_bytes = 0
        self.damaged = damaged  # told of damaged bytes skipped
        self.allowance = SLICE_WORK  # work left in this slice
        self.stalled = False  # stopped for want of allowance, with records left to read
        self.wants_slice = wants_slice  # told when it stalls: the owner grants the next slice
        self.parked = Parked()  # recovery's index replaces it (curb.log.parked)

    def tail(self) -> int:
        """The oldest byte still needed: the first message behind the read position that
        is not acked, or the first parked record the cursor passed, else the read
        position itself."""
        # `pinning`'s first item, without its generators: this runs for every ACK.
        rec = next(iter(self.behind.values()), None)
        parked = self.parked
        seq = parked.first_passed_live()
        if seq is None:
            return self.rpos if rec is None else rec.offset
        at = parked.offset(seq)
        return at if rec is None or self.back(at) > self.back(rec.offset) else rec.offset

    def pinning(self) -> Iterator[tuple[int, int, Record | None, int | None]]:
        """What pins the tail, oldest first: (offset, size, held Record or None, parked
        seq or None) for each message behind the read position and each parked record
        the cursor passed, merged in ring order. Compaction copies in this order and
        admission's walk (Ring.clears) plans by it, so they never disagree on what must
        be copied before the tail can pass."""
        held = iter(self.behind.values())
        seqs = self.parked.passed_live()
        parked = self.parked
        rec = next(held, None)
        seq = next(seqs, None)
        while rec is not None or seq is not None:
            if seq is not None and (rec is None or self.back(parked.offset(seq)) > self.back(rec.offset)):
                yield parked.offset(seq), parked.size(seq), None, seq
                seq = next(seqs, None)
            else:
                assert rec is not None
                yield rec.offset, rec.size, rec, None
                rec = next(held, None)

    def back(self, pos: int) -> int:
        """Bytes from `pos` forward to the read position: how far behind it `pos` is."""
        rpos = self.rpos
        return rpos - pos if rpos >= pos else (self.end - pos) + (rpos - RING_START)

    def written(self, rec: Record, payload: bytes) -> None:
        """A new message is in the file (the caller moved `whead` past it: `whead` never
        covers bytes not yet written, so the cursor never reads them); keep it in
        memory (bounded) so a consumer keeping up takes it without reading it back."""
        self.unread += 1
        self.unread_bytes += rec.size
        if self.fresh_bytes + rec.size > FRESH_BYTES:
            self.fresh.clear()
            self.fresh_bytes = 0
        rec.payload = payload
        self.fresh.append(rec)
        self.fresh_bytes += rec.size

    def moved(self, rec: Record) -> None:
        """A held message is being copied to rec.offset, ahead of the cursor (which reads
        it once the caller has written it and moved `whead`)."""
        del self.behind[rec.id]
        self.behind_bytes -= rec.size
        self.ahead[rec.id] = rec

    def settled(self, rec: Record) -> None:
        """The message was acked: it no longer pins the tail."""
        self.outstanding_bytes -= rec.size
        if self.behind.pop(rec.id, None) is not None:
            self.behind_bytes -= rec.size

    def is_live(self, pos: int, mid: int, wseq: int, state: bytes) -> bool:
        """Whether the intact record at `pos` (message `mid`, write sequence `wseq`, in
        `state`) is the live occurrence of a message not yet acked, as of now (see the
        module's invariants)."""
        if mid <= self.upto or state == STATE_PAD:
            return False
        # What memory knows first: a rewrite of the state may not be flushed yet.
        held = self.behind.get(mid) or self.ahead.get(mid)
        if held is not None:
            return held.offset == pos and not held.acked and not held.dead
        seq = self.parked.find(pos, self._distance, gone=True)
        if seq is not None:  # parked, or was (then dead here: acked, or copied on)
            return self.parked.state(seq) in (DELAYED, READY, HELD)
        if state in (STATE_MAX, STATE_EXP):
            return False
        if wseq <= self.last_wseq or state == STATE_ACK:
            return False  # read by the cursor and no longer held, or acked in an earlier run
        live_at = self.last.get(mid)
        if live_at is not None:
            return live_at == pos
        # Ahead of the cursor, named by no index, nothing holds it: a message never read
        # has an id above every one read (as `next_ready` judges); a lower one is a copy
        # whose message moved on (a held copy the log later copied into the index).
        return mid > self.max_id

    def ack_upto(self, upto: int) -> None:
        """Raise the watermark: uncount the unread messages it makes dead, those the
        cursor reaches by passing dead records now and the copies recovery found further
        on (their `last` entry then names no offset, so neither occurrence counts again)."""
        self.upto = upto
        # A reader of its own: the cursor's window must never hold bytes ahead of the
        # head, which a later write would make stale.
        reader = RecordReader(self.reader.disk, self.reader.max_size)
        for mid, at in list(self.last.items()):
            if mid <= upto and at >= 0:
                found = reader.intact(at, self.end)
                if found is not None and found[0].id == mid and found[0].state != STATE_ACK:
                    self._uncount(mid, found[0].size)
                self.last[mid] = -1
        self.pass_dead()

    def next_ready(self) -> Record | None:
        """The next never-delivered message in queue order, now in flight; None when
        every written record has been handed out, or when this slice's allowance ran
        out first (`stalled`)."""
        return self._advance(True)

    def pass_dead(self) -> None:
        """Move the read position past dead records (acked, dead copies, damage) up to
        the next message to hand out, so that the tail can pass them with no consumer;
        as far as this slice's allowance goes (`stalled` says whether it went all the way)."""
        self._advance(False)

    def spend(self) -> bool:
        """Charge this slice's allowance for reading one more record, if any is left;
        else stall (`stalled`, `wants_slice`) until the owner grants the next slice. For
        every reader of the ring the log paces: the walk here, and the log's reads of
        parked records back (the ready line, dead letters)."""
        if self.allowance <= 0:
            self._stall()
            return False
        self.allowance -= RECORD_WORK
        return True

    def _stall(self) -> None:
        if not self.stalled:
            self.stalled = True
            self.wants_slice()

    def _advance(self, hand_out: bool) -> Record | None:
        """Read on from the read position, a step per record: one kept in memory since
        its write (`fresh`), parked ones stepped over by the index, and any other read
        and judged (`_read`, `_judge`). Returns the message handed out, or None: every
        written record is passed, the allowance ran out, or (not `hand_out`) the next
        record is a message to hand out, which stays unpassed."""
        parked = self.parked
        while self.rpos != self.whead:
            if self.allowance <= 0:
                self._stall()
                return None
            self.allowance -= RECORD_WORK  # (`spend`, inlined: once a record)
            pos = self.rpos
            fresh = self.fresh
            if fresh and fresh[0].offset == pos:
                rec = fresh[0]
                if not hand_out and rec.id > self.upto:
                    self.allowance += RECORD_WORK
                    return None
                fresh.popleft()
                self.max_id = rec.id
                self.fresh_bytes -= rec.size
                self.rpos = pos + rec.size
                self.last_wseq = rec.wseq
                if rec.id <= self.upto:
                    self._uncount(rec.id, rec.size)
                    continue
                return self._hand_out(rec)
            passed = parked.passed
            stepped = parked.step_over(pos, self.whead, self.allowance // STEP_WORK)
            if stepped is not None:
                self._stepped(pos, stepped, parked.passed - passed)
                continue
            found = self._read(pos)
            if found is None:
                continue
            got = self._judge(pos, found, hand_out)
            if got is True:
                continue
            if got is False:
                return None
            return self._hand_out(got)
        # Every written record is handed out: the counts are exact again, whatever
        # damage made recovery's estimate of them wrong.
        self.unread = self.unread_bytes = 0
        return None

    def _stepped(self, pos: int, stepped: tuple[int, int], entries: int) -> None:
        """Parked records at pos were stepped over (`entries` of them, `stepped[0]` bytes,
        the highest id `stepped[1]`): indexed, never handed out here."""
        self.allowance -= (entries - 1) * STEP_WORK
        self.rpos = pos + stepped[0]
        # Their ids count as read: an occurrence of one of them met later that nothing
        # holds (`ahead`) or names (`last`) is stale. No unread message lies after them
        # with an id below theirs (ids are assigned in write order).
        self.max_id = max(self.max_id, stepped[1])

    def _read(self, pos: int) -> tuple[RecordHeader, bytes, int] | None:
        """The intact record at pos, if it continues the write sequence; else, past
        damage (reported) or a pad (the next lap), None, the read position moved on."""
        limit = self.whead if self.whead > pos else self.end
        found = self.reader.intact(pos, limit)
        if found is None or not self.last_wseq < found[0].wseq < self.next_wseq:
            self._skip_damage(pos, limit)
            return None
        if found[0].state == STATE_PAD:
            self.last_wseq = found[0].wseq
            self.rpos = RING_START
            self.reader.drop()
            return None
        return found

    def _judge(self, pos: int, found: tuple[RecordHeader, bytes, int], hand_out: bool) -> Record | bool:
        """The record read at pos, passed: True when it is no message to hand out (a held
        copy reached, an occurrence that is not the message, a dead or acked one); else
        its Record to hand out, or (not `hand_out`) False, with nothing passed."""
        hdr, buf, off = found
        prev_wseq, self.last_wseq = self.last_wseq, hdr.wseq
        size = hdr.size
        self.allowance -= size
        self.rpos = pos + size
        mid = hdr.id
        if self.ahead and self._reached_copy(pos, mid, size):
            return True
        live_at = self.last.get(mid) if self.last else None
        if live_at is not None:
            if live_at != pos:
                return True
            del self.last[mid]
        elif mid <= self.max_id:
            return True
        state = hdr.state
        if mid <= self.upto or state != STATE_RDY:
            return self._passed_dead(mid, size, state)
        if not hand_out:
            return self._stop_before(pos, size, prev_wseq, mid, live_at)
        if mid > self.max_id:
            self.max_id = mid
        # A small payload is copied out of the window (it may stay long); a large one is
        # a view of the bytes just read and CRC-checked, taken by its delivery.
        start = off + hdr.body_at
        stop = start + hdr.length
        payload = bytes(buf[start:stop]) if size <= KEEP_PAYLOAD else memoryview(buf)[start:stop]
        return Record(mid, pos, size, hdr.deliveries, hdr.timestamp_ms, payload, hdr.wseq, hdr.due_ms, hdr.expires_ms)

    def _reached_copy(self, pos: int, mid: int, size: int) -> bool:
        """Whether the record at pos is the copy of a held message that compaction made
        ahead of the cursor: then it holds it behind the read position again, if not acked."""
        moved = self.ahead.get(mid)
        if moved is None or moved.offset != pos:
            return False
        del self.ahead[mid]
        if not moved.acked:
            self.behind[mid] = moved
            self.behind_bytes += size
        return True

    def _passed_dead(self, mid: int, size: int, state: bytes) -> bool:
        """An occurrence of a message that is dead: acked up to the watermark (uncounted,
        if it was counted), acked, or a dead letter no index names (stale)."""
        if mid > self.max_id:
            self.max_id = mid
        if mid <= self.upto and state != STATE_ACK:
            self._uncount(mid, size)
        return True

    def _stop_before(self, pos: int, size: int, prev_wseq: int, mid: int, live_at: int | None) -> bool:
        """Stop before the message at pos, to hand out: not passed, so not charged (the
        next slice's hand-out always makes progress)."""
        self.allowance += RECORD_WORK + size
        self.rpos, self.last_wseq = pos, prev_wseq
        if live_at is not None:
            self.last[mid] = pos
        return False

    def _uncount(self, mid: int, size: int) -> None:
        """An unread message is passed that the watermark made dead, or that is parked:
        no longer unread, unless `unread` never counted it (see the module's invariants)."""
        if mid <= self.counted_above:
            return
        self.unread = max(0, self.unread - 1)
        self.unread_bytes = max(0, self.unread_bytes - size)

    def _hand_out(self, rec: Record, unread: bool = True) -> Record:
        if unread:
            self.unread -= 1
            self.unread_bytes -= rec.size
        self.outstanding_bytes += rec.size
        self.behind_bytes += rec.size
        self.behind[rec.id] = rec
        return rec

    def _skip_damage(self, pos: int, limit: int) -> None:
        """Move past damaged bytes at pos to the next intact record of this lap, or to
        the next lap when none is left before the end of the ring."""
        nxt = self.reader.past_damage(pos, limit, self.last_wseq, self.next_wseq, self.whead)
        self.damaged(f"damaged bytes {pos}..{nxt} skipped while reading; never delivered")
        self.parked.pass_span(pos, nxt, self._distance)
        self.rpos = nxt

    def _distance(self, a: int, b: int) -> int:
        return b - a if b >= a else (self.end - a) + (b - RING_START)
