"""Walking a log file's records from a checkpoint: start-up recovery and offline reads.

The checkpoint names a region [tail, head) whose records were all durable before it was
written, in write-sequence order, with write sequences below the checkpoint's. A damaged
record there is corruption: it is skipped by finding the next intact record whose write
sequence fits (see curb.reader), and reported. Past `head`, records written after the
checkpoint are accepted only while their write sequence continues the checkpoint's and
they are intact; the first that is not ends the log (a torn tail if it looks like the
record due next, cut short).

A message may occur more than once: compaction copies held messages forward, marking
each copy as one (curb.record's COPY_FLAG). The last intact occurrence in write order is
the message and the earlier ones are dead: a copy counts only once its CRC holds, also
where the walk skims by headers, so that damage to a copy never takes the intact
occurrence before it with it (a skimmed walk and a checked one agree). Fresh messages are written in id order, so a
copy's original lies in the walk exactly when its id is at least the first fresh id
walked; then the original was counted and is uncounted when the copy is met. A copy
supersedes an earlier occurrence in the walk when its original lies there, or an earlier
copy does: one in `last` or in `copied`. `last` maps a copied id to the offset of its
last occurrence, for the copies that supersede one and for those counted as messages
(the cursor needs both: curb.log.cursor); `copied` (curb.log.idset, 8 bytes an id) holds
the other copies, parked or acked ones with no earlier occurrence, which is what a dead
letter buried while running leaves: so a million of those cost no dict entry each, and
the walk adds them to the index in batches like originals. Neither holds an entry per
queued message. `classes` counts live records by size class (bit length), so
the log knows how large its largest live record may be. A message whose id is at most the
checkpoint's ack-up-to watermark is dead whatever its record's state says: it counts as
acked.

Parked records (curb.log.parked: a `rdy` record due after `now_ms`, a dead letter) are not
counted as messages: the walk hands them to `parked`, from their headers alone (state and
due time are in the header, so no body is read for them either). A copy supersedes an
earlier occurrence wherever that was counted: once the walk is done, parked entries of
ids copied later are dropped (`_drop_superseded`).

Older records are skimmed by their headers alone (`_skim`): one at a time, or, where
records of one shape lie end to end (curb.log.shapes), a run at once. Invariant: a run
changes nothing the walk finds; it is taken only where every case in it is uniform (ids
rising above those seen, due all now or all later, no copy in `last`, no mark due inside
it), and the loop of one record at a time reads everything else.

A file of the first format (curb.record's V1) is walked with every CRC checked (it is
read only once, to upgrade it); it has no parked records.

Nothing in the file can make the walk fail: every length is bounded by the largest
record before anything is read, every loop by the size of the ring.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import compress, islice, repeat
from operator import lt

from curb import payload as stored
from curb.log import record as fmt
from curb.log import shapes
from curb.log.disk import Disk, FileDisk
from curb.log.idset import IdSet
from curb.log.marks import Marks
from curb.log.parked import DELAYED, EXP, MAX, Parked
from curb.log.reader import RecordReader
from curb.log.record import (
    ALIGN,
    RECORD_HEADER,
    RING_START,
    STATE_ACK,
    STATE_EXP,
    STATE_MAX,
    STATE_PAD,
    STATE_RDY,
    V2,
    FormatError,
    Layout,
    RecordHeader,
)
from curb.log.sizes import SizeClasses

VERIFY_NEAR_HEAD = 4 << 20
PAD_ID = b"0" * 12
PAD_LENGTH = b"0" * 8
NO_DUE = b"0" * 12
PARK_BATCH = 4096  # parked records the skim gathers before it adds them to the index
RUN_MOST = 4096  # records of one shape the skim counts at once (curb.log.shapes)
COOL = 64  # records the skim reads one at a time after a run was not there
PARKED_STATES = {STATE_MAX: MAX, STATE_EXP: EXP}
# The skim's batch: parked records' offsets, sizes, ids, states and due times, and the
# rising ids of copies that supersede nothing.
Batch = tuple[list[int], list[int], list[int], bytearray, list[int], list[int]]
# A record the skim read and holds back until the header after it parses: its state, id,
# size, offset, write sequence (-1 where no mark is due), due time and whether it is a copy.
Held = tuple[bytes, int, int, int, int, int, bool]


class LogError(Exception):
    """The log file cannot be used; str() says what to fix. `exit_status` is the
    broker's: 2, the operator must change a flag or the file."""

    exit_status = 2


class LogDamaged(LogError):
    """The file is a curb log damaged past what start-up can skip (both checkpoint
    slots unreadable): exit status 3, distinct from usage errors, and not retried."""

    exit_status = 3


class Scan:
    """One pass over a log's records, counting what recovery needs to know."""

    def __init__(
        self,
        disk: Disk,
        ckpt: fmt.Checkpoint,
        end: int,
        marks: Marks | None = None,
        layout: Layout = V2,
        now_ms: int = 0,
    ):
        self.ckpt = ckpt
        self.marks = Marks(1 << 62) if marks is None else marks  # filled for the log (curb.marks)
        self.end = end
        self.file_size = disk.size()
        self.layout = layout
        self.now_ms = now_ms
        self.parked = Parked(end)
        self.reader = RecordReader(disk, end - RING_START, layout)
        self.head = ckpt.head
        self.next_wseq = ckpt.next_wseq
        self.max_id = 0
        self.upto = ckpt.acked_upto
        self.first_fresh: int | None = None
        self.last: dict[int, int] = {}
        self.copied = IdSet()
        self.messages = 0
        self.acked = 0
        self.live_bytes = 0
        self.dead_bytes = 0
        self.classes = SizeClasses()
        self.oldest_ms: int | None = None
        self.damaged: list[str] = []
        self.skipped_bytes = 0
        self.torn: str | None = None

    def run(self) -> None:
        """Count the records, checking every CRC near the head and past it, where a crash
        can tear a write; older records were synced before the checkpoint named them, so
        there only their headers are read (the cursor checks each CRC before delivery)."""
        for _ in self._walk(VERIFY_NEAR_HEAD if self.layout is V2 else None):
            pass
        self._drop_superseded()
        self._note_damage()

    def _drop_superseded(self) -> None:
        """Parked entries whose message has a later copy are not the message: drop them,
        and count back the message the copy uncounted for them (`_count` takes every
        earlier occurrence for a counted message)."""
        parked, last = self.parked, self.last
        for seq in self.entries_in_last():
            if last[parked.id(seq)] != parked.offset(seq):
                size = parked.size(seq)
                parked.remove(seq)
                self.messages += 1
                self.live_bytes += size

    def entries_in_last(self) -> list[int]:
        """The seqs of the parked entries whose message is in `last`: few, found by one
        pass in C over the index's ids (a million parked records, a few copies)."""
        parked, last = self.parked, self.last
        if not last:
            return []
        ids = parked.ids
        return [parked.base + at for at in compress(range(len(ids)), map(last.__contains__, ids))]

    def records(self) -> Iterator[tuple[int, RecordHeader, bytes, int]]:
        """Yield (offset, header, buffer, index) of every message's live occurrence in
        queue order, each checked against its CRC. Call on a Scan that has `run()`, so
        that it knows the copies."""
        last = dict(self.last)
        again = Scan(self.reader.disk, self.ckpt, self.end, layout=self.layout)
        for pos, hdr, buf, off in again._walk(None):
            if last.get(hdr.id, pos) == pos:
                yield pos, hdr, buf, off

    def _note_damage(self) -> None:
        if self.damaged:
            note = "; ".join(self.damaged)
            self.torn = note if self.torn is None else f"{note}; {self.torn}"

    def _count(self, state: bytes, msg_id: int, size: int, pos: int, copy: bool, due_ms: int = 0) -> None:
        if msg_id <= self.upto:
            state = STATE_ACK  # (a copy: dead, and so is its original: neither counted as live)
        if copy:
            if msg_id > self.upto:
                self._copy(msg_id, size, pos, state == STATE_RDY and due_ms <= self.now_ms)
        else:
            self.max_id = max(self.max_id, msg_id)
            if self.first_fresh is None:
                self.first_fresh = msg_id
        if state == STATE_RDY and due_ms <= self.now_ms:
            self.messages += 1
            self.live_bytes += size
            self.classes.add(size)
        elif state != STATE_ACK:
            self.parked.add(pos, size, msg_id, PARKED_STATES.get(state, DELAYED), due_ms, passed=False)
            self.classes.add(size)
        else:
            self.acked += 1
            self.dead_bytes += size

    def _copy(self, msg_id: int, size: int, pos: int, counted: bool) -> None:
        """A copy of a message not acked up to the watermark: it supersedes the message's
        earlier occurrence in the walk, if any (uncounted here; a parked one is dropped
        by `_drop_superseded`). `counted`: the copy counts as a message."""
        fresh = self.first_fresh
        if msg_id in self.last or (fresh is not None and fresh <= msg_id <= self.max_id) or msg_id in self.copied:
            self.messages -= 1
            self.live_bytes -= size
            self.classes.remove(size)
            self.last[msg_id] = pos
        elif counted:
            self.last[msg_id] = pos
        else:
            self.copied.add(msg_id)

    def _walk(self, trust_until: int | None) -> Iterator[tuple[int, RecordHeader, bytes, int]]:
        """Phase 1: the checkpoint's region; phase 2: records written after it. With
        `trust_until`, records more than that many bytes before the checkpoint's head
        are skimmed by their headers alone."""
        reader = self.reader
        pos, stop, high = self.ckpt.tail, self.ckpt.head, self.ckpt.next_wseq
        low = -1
        budget = 2 * (self.end - RING_START) + 1
        while pos != stop and budget > 0:
            if trust_until is not None and (pos > stop or stop - pos > trust_until):
                start = pos
                pos = self._skim(pos, stop, trust_until)
                budget -= abs(pos - start)
                if pos != start:
                    continue
            limit = stop if pos < stop else self.end
            found = reader.intact(pos, limit)
            if found is None or not low < found[0].wseq < high:
                budget -= 1

                def accept(h: RecordHeader, lo: int = low) -> bool:
                    return lo < h.wseq < high

                pos = self._skip(pos, limit, pos > stop, accept)
                continue
            hdr, buf, off = found
            low = hdr.wseq
            budget -= hdr.size
            if hdr.state == STATE_PAD:
                pos = RING_START
                continue
            self._first_rdy(hdr)
            self._mark(pos, hdr)
            self._count(hdr.state, hdr.id, hdr.size, pos, hdr.copy, hdr.due_ms)
            yield pos, hdr, buf, off
            pos += hdr.size
        pos, expect = stop, self.next_wseq
        while budget > 0:
            found = reader.intact(pos, self.end)
            if found is None or found[0].wseq != expect:
                if found is None and self._looks_torn(pos, expect):
                    self.torn = f"torn tail: record at byte {pos} dropped"
                break
            hdr, buf, off = found
            budget -= hdr.size
            expect += 1
            if hdr.state == STATE_PAD:
                pos = self.head = RING_START
                continue
            self._first_rdy(hdr)
            self._mark(pos, hdr)
            self._count(hdr.state, hdr.id, hdr.size, pos, hdr.copy, hdr.due_ms)
            yield pos, hdr, buf, off
            pos = self.head = pos + hdr.size
        self.next_wseq = expect

    def _mark(self, pos: int, hdr: RecordHeader) -> None:
        """Mark an original whose id is above every id before it, when one is due."""
        if not hdr.copy and hdr.id > self.max_id and self.marks.due(pos):
            self.marks.add(hdr.id, pos, hdr.wseq)

    def _first_rdy(self, hdr: RecordHeader) -> None:
        if self.oldest_ms is None and hdr.state == STATE_RDY:
            self.oldest_ms = hdr.timestamp_ms

    def _skip(self, pos: int, limit: int, wrapped: bool, accept: Callable[[RecordHeader], bool]) -> int:
        """Past damage at pos inside the checkpoint's region: the next intact record, or
        the end of the lap (RING_START) or of the region when there is none."""
        nxt = self.reader.resync(pos, limit, accept)
        if nxt is None and self.file_size < limit:
            self.damaged.append(f"torn tail: bytes {pos}..{limit} dropped (the file ends at {self.file_size})")
        else:
            self.damaged.append(f"damaged bytes {pos}..{nxt or limit} skipped")
        if nxt is None:
            nxt = RING_START if wrapped else limit
        self.skipped_bytes += nxt - pos if nxt >= pos else (self.end - pos) + (nxt - RING_START)
        return nxt

    def _skim(self, pos: int, stop: int, trust_until: int) -> int:
        """Count well-formed records from pos by their headers alone while they are more
        than `trust_until` bytes before the checkpoint's head; return where it stopped
        (there the checked path takes over, also at anything odd). See `Skim`."""
        return Skim(self, stop, trust_until).run(pos)

    def _copy_intact(self, pos: int, size: int) -> bool:
        """Whether the skimmed copy at pos (its header well formed) is whole and its CRC holds."""
        buf, off = self.reader.window(pos, size, self.end)
        return fmt.crc_holds(buf, off, size)

    def _park_batch(self, batch: Batch) -> None:
        """Add the parked records the skim met to the index, and the copies to `copied`,
        and empty the batch."""
        offsets, sizes, ids, states, dues, copies = batch
        self.copied.extend_above(copies)
        if offsets:
            self.parked.extend(offsets, sizes, ids, states, dues)
            for size, n in Counter(sizes).items():
                self.classes.add(size, n)
        for part in batch:
            part.clear()

    def _looks_torn(self, pos: int, expect: int) -> bool:
        """Whether the bytes at pos are the start of the record due next, cut short."""
        if pos >= self.end:
            return False
        header = self.layout.header
        buf, off = self.reader.window(pos, header, self.end)
        start = buf[off : off + 4]
        if not start or not any(s.startswith(start) for s in (b"rdy ", b"ack ", b"pad ", b"max ", b"exp ")):
            return False
        try:
            return self.layout.parse(buf, off).wseq == expect
        except FormatError:
            return len(buf) - off < header


class Skim:
    """One skim of a Scan's records by their headers alone (`Scan._skim`). A record is
    counted only once the header after it is well formed too: when it is not, the
    record's own length may be the damage, so the checked path starts again at that
    record (a damaged length must not make the walk skip the records after it). The
    recovery of a large log spends its time here, so the counts are kept here and added
    to the Scan's at the end. Where records are plain (originals with no mark due, the
    most of a log), one loop reads each header and counts the record held before it,
    with the hot values in locals (`_plain`); any other record is two steps: its header
    read (`_header`), then the record held back before it counted (`_count_held`); and
    where records of one shape lie end to end, a run at once (`_run`). Parked records
    go to `parked` in batches, and so do parked copies that supersede nothing
    (`copied`); other copies (rare) go through `Scan._count`, once their CRC holds
    (`_count_copy`): a copy supersedes its message's earlier occurrences, so a damaged
    one taken on its header alone would lose the message, where the checked path skips
    it and keeps the intact occurrence before it."""

    __slots__ = (
        "acked",
        "b_copied",
        "b_due",
        "b_id",
        "b_off",
        "b_size",
        "b_state",
        "base",
        "batch",
        "buf",
        "cool",
        "copied_high",
        "dead_bytes",
        "end",
        "find_oldest",
        "fresh",
        "held",
        "mark_last",
        "mark_next",
        "max_id",
        "max_size",
        "now_ms",
        "rdy_sizes",
        "scan",
        "stop",
        "trust_until",
        "upto",
    )

    def __init__(self, scan: Scan, stop: int, trust_until: int):
        self.scan = scan
        self.stop = stop
        self.trust_until = trust_until
        reader = scan.reader
        self.end, self.max_size, self.upto, self.now_ms = scan.end, reader.max_size, scan.upto, scan.now_ms
        self.buf, self.base = reader.buf, reader.base
        self.rdy_sizes: dict[int, int] = {}
        self.acked = self.dead_bytes = 0
        self.max_id = scan.max_id
        self.mark_next, self.mark_last = scan.marks.next_at, scan.marks.last_at  # `marks.due`, inlined
        self.fresh = scan.first_fresh
        self.find_oldest = scan.oldest_ms is None
        # Parked records met, in ring order, added to the index in one go (`_park_batch`),
        # and the ids of copies that supersede nothing, rising, added to `copied` with them.
        self.batch: Batch = ([], [], [], bytearray(), [], [])
        self.b_off, self.b_size, self.b_id, self.b_state, self.b_due, self.b_copied = self.batch
        self.copied_high = scan.copied.high
        self.held: Held | None = None  # the record held back: counted once its successor parses
        self.cool = 0  # records to read one at a time before a run is tried again

    def run(self, pos: int) -> int:
        """Skim from pos; returns where the checked path takes over."""
        stop, trust_until, reader, end = self.stop, self.trust_until, self.scan.reader, self.scan.end
        buf, base, held, odd = self.buf, self.base, self.held, False
        while pos != stop and (pos > stop or stop - pos > trust_until):
            odd = True
            off = pos - base
            if off < 0 or off + RECORD_HEADER > len(buf):
                buf, off = reader.window(pos, RECORD_HEADER, end)
                self.buf, base = buf, reader.base
                if off + RECORD_HEADER > len(buf):
                    break
            self.cool -= 1
            if held is not None and self.cool < 0 and (held[6] or held[4] < 0):
                self.held = held
                after = self._run(pos, off)
                if after >= 0:
                    pos, held, odd = after, self.held, False
                    continue
            found = self._header(buf, pos, off)
            if found is None:
                break
            if held is not None and not self._count_held(held):
                break  # a damaged copy: the checked path skips it, reported (`odd`)
            odd = False
            if found[0] == STATE_PAD:
                pos, held = RING_START, None
                continue
            held = found
            pos += found[2]
            if self.cool > 0 and not found[6] and found[4] < 0:
                pos, held = self._plain(pos, found, base)
        self.base, self.held = base, held
        return self._finish(pos, odd)

    def _plain(self, pos: int, held: Held, base: int) -> tuple[int, Held]:
        """Read on from pos (the held record an original with no mark due) while each
        record is plain: an original of a known state with no mark due at it, not a rdy
        one while the oldest timestamp is still to find, and the one held before it of an
        id above those read. Each is one pass of the loop, its header read and the one
        held before it counted, with the hot values in locals; returns where it stopped
        and the record held there (the steps in `run` read the record at that position,
        whatever it is). It stops too before a run is due again (`cool`), and at the end
        of the window, of the skimmed region or of the marks' spacing."""
        buf, stop, end = self.buf, self.stop, self.end
        h_state, h_id, h_size, h_pos, _, h_due, _ = held
        max_id, upto, now_ms, fresh, find_oldest = self.max_id, self.upto, self.now_ms, self.fresh, self.find_oldest
        rdy, ack, max_size, rdy_sizes = STATE_RDY, STATE_ACK, self.max_size, self.rdy_sizes
        room = stop if pos < stop else end  # (pos rises here: it stays on its side of stop)
        until = min(
            self.mark_next if self.mark_last <= pos else pos,
            stop - self.trust_until if pos <= stop else end,
            base + len(buf) - RECORD_HEADER + 1,
        )
        cool, acked, dead_bytes = self.cool, 0, 0
        while pos < until and cool > 0 and fresh is not None:
            off = pos - base
            state = buf[off : off + 3]
            if (
                buf[off + RECORD_HEADER - 1] != 10
                or buf[off + 26 : off + 32] != buf[off + 52 : off + 58]
                or buf[off + 59] >= 56  # a copy (see `_header`)
                or (state != rdy and state != ack and state not in PARKED_STATES)
                or (find_oldest and state == rdy)
                or h_id <= max_id
            ):
                break
            try:
                msg_id = int(buf[off + 33 : off + 45], 16)
                size = (RECORD_HEADER + ALIGN + int(buf[off + 85 : off + 93], 16)) & -ALIGN
                due = int(buf[off + 13 : off + 25], 16) if buf[off + 13 : off + 25] != NO_DUE else 0
            except ValueError:
                break
            if size > max_size or pos + size > room or not msg_id:
                break
            max_id = h_id  # the held record, counted now that this header parsed
            if h_id <= upto or h_state == ack:
                acked += 1
                dead_bytes += h_size
            elif h_state == rdy and h_due <= now_ms:
                rdy_sizes[h_size] = rdy_sizes.get(h_size, 0) + 1
            else:
                self._park(h_state, h_id, h_size, h_pos, h_due)
            h_state, h_id, h_size, h_pos, h_due = state, msg_id, size, pos, due
            pos += size
            cool -= 1
        self.max_id, self.cool = max_id, cool
        self.acked += acked
        self.dead_bytes += dead_bytes
        return pos, (h_state, h_id, h_size, h_pos, -1, h_due, False)

    def _header(self, buf: bytes, pos: int, off: int) -> Held | None:
        """The record at pos whose header starts at buf[off], read in place if it is well
        formed; None if it is odd (the checked path judges it). Its write sequence is
        read only where a mark is due (else -1)."""
        if buf[off + RECORD_HEADER - 1] != 10 or buf[off + 26 : off + 32] != buf[off + 52 : off + 58]:
            return None  # no header, or the tag is not the write sequence's
        state = buf[off : off + 3]
        if state == STATE_PAD:
            if buf[off + 33 : off + 45] != PAD_ID or buf[off + 85 : off + 93] != PAD_LENGTH:
                return None
            return state, 0, 0, pos, -1, 0, False
        if state != STATE_RDY and state != STATE_ACK and state not in PARKED_STATES:
            return None
        wseq = -1
        try:
            msg_id = int(buf[off + 33 : off + 45], 16)
            size = (RECORD_HEADER + ALIGN + int(buf[off + 85 : off + 93], 16)) & -ALIGN
            due = int(buf[off + 13 : off + 25], 16) if buf[off + 13 : off + 25] != NO_DUE else 0
            if pos >= self.mark_next or pos < self.mark_last:
                wseq = int(buf[off + 46 : off + 58], 16)
            if self.find_oldest and state == STATE_RDY:
                self.scan.oldest_ms = int(buf[off + 59 : off + 71], 16) & ~fmt.COPY_FLAG
                self.find_oldest = False
        except ValueError:
            return None
        if size > self.max_size or pos + size > (self.stop if pos < self.stop else self.end):
            return None
        # (The top time digit 8-f: COPY_FLAG.)
        return (state, msg_id, size, pos, wseq, due, buf[off + 59] >= 56) if msg_id else None

    def _count_held(self, held: Held) -> bool:
        """Count the record held back (its successor parsed): an original, or a copy
        parked or acked that supersedes nothing, here; any other copy by `_count_copy`.
        False if that copy is damaged."""
        state, h_id, size, h_pos, wseq, due, copy = held
        if copy and not self._copy_alone(held):
            return self._count_copy(held)
        if copy:
            self.b_copied.append(h_id)  # into `copied` with the batch
            self.copied_high = h_id
        else:  # an original: its id may be a mark, and is the highest read
            if h_id > self.max_id:
                if wseq >= 0 and (h_pos >= self.mark_next or h_pos < self.mark_last):
                    marks = self.scan.marks  # (the one before may have taken it)
                    marks.add(h_id, h_pos, wseq)
                    self.mark_next, self.mark_last = marks.next_at, marks.last_at
                self.max_id = h_id
            if self.fresh is None:
                self.fresh = self.scan.first_fresh = h_id
        if h_id <= self.upto or state == STATE_ACK:
            self.acked += 1
            self.dead_bytes += size
        elif state == STATE_RDY and due <= self.now_ms:
            self.rdy_sizes[size] = self.rdy_sizes.get(size, 0) + 1
        else:
            self._park(state, h_id, size, h_pos, due)
        return True

    def _park(self, state: bytes, msg_id: int, size: int, pos: int, due: int) -> None:
        """A parked record: into the batch."""
        self.b_off.append(pos)
        self.b_size.append(size)
        self.b_id.append(msg_id)
        self.b_state.append(DELAYED if state == STATE_RDY else PARKED_STATES[state])
        self.b_due.append(due)
        if len(self.b_off) >= PARK_BATCH:  # bounded: Python ints in lists cost ~40 B each
            self.scan._park_batch(self.batch)

    def _copy_alone(self, held: Held) -> bool:
        """Whether the held copy supersedes nothing and is parked or acked (`Scan._copy`'s
        test, with `copied` known to hold only ids up to `copied_high`)."""
        state, h_id, _, _, _, due, _ = held
        scan, fresh = self.scan, self.fresh
        return (
            h_id > self.copied_high
            and h_id > scan.upto
            and (state != STATE_RDY or due > scan.now_ms)
            and h_id not in scan.last
            and (fresh is None or h_id < fresh or h_id > self.max_id)
        )

    def _count_copy(self, held: Held) -> bool:
        """The held copy supersedes an occurrence, or counts as a message: counted by
        `Scan._count` once its CRC holds, after the batch (in ring order)."""
        state, h_id, size, h_pos, _, due, _ = held
        scan = self.scan
        if not scan._copy_intact(h_pos, size):
            return False
        scan.max_id = self.max_id
        scan._park_batch(self.batch)
        scan._count(state, h_id, size, h_pos, True, due)
        self.copied_high = scan.copied.high
        return True

    def _run(self, pos: int, off: int) -> int:
        """A run of records of the held one's shape (curb.log.shapes) from pos, counted at
        once with it as if one at a time; returns where it ends, the run's last record
        held, or -1 when there is none (any case it does not cover is left to the records
        one at a time). Originals only up to the next mark's offset (none is due in it)."""
        held, scan, buf = self.held, self.scan, self.buf
        assert held is not None
        state, _, s, _, _, _, copy = held
        most = min(RUN_MOST, (len(buf) - off) // s)
        if pos < self.stop:
            most = min(most, (self.stop - pos) // s, (self.stop - self.trust_until - pos - 1) // s + 1)
        else:
            most = min(most, (scan.end - pos) // s)
        if not copy:
            most = min(most, (self.mark_next - pos - 1) // s + 2 if self.mark_last <= pos < self.mark_next else 1)
        if most < shapes.FIRST:
            return -1  # a boundary is near: the next record tries again
        length = buf[off + 85 : off + 93]
        if length == buf[off + s + 85 : off + s + 93] and shapes.size_of(length) == s:
            rows = shapes.run_rows(buf, off, shapes.pattern(state, copy, length, s), s, most)
            taken = self._take_run(held, rows) if len(rows) >= shapes.FIRST else None
            if taken is not None:
                self.held, self.cool = taken, 0
                return taken[3] + s
        self.cool = COOL  # not a run here: read on one at a time for a while
        return -1

    def _take_run(self, held: Held, rows: list[tuple[bytes, ...]]) -> Held | None:
        """Count the held record and the run's rows but the last, which it returns to be
        held next, if every case in them is uniform; else count nothing (None)."""
        state, h_id, s, h_pos, _, h_due, copy = held
        k, scan = len(rows), self.scan
        ids = list(map(int, map(shapes.IDS, rows), repeat(16)))
        dues = list(map(int, map(shapes.DUES, rows), repeat(16))) if state == STATE_RDY else [0] * k
        g_ids, g_dues = [h_id, *ids[:-1]], [h_due, *dues[:-1]]  # counted now; the last is held
        g_last = g_ids[-1]
        now = later = False
        if state == STATE_RDY:
            now, later = max(g_dues) <= scan.now_ms, min(g_dues) > scan.now_ms
        dead = not copy and g_last <= scan.upto
        if not (
            self._run_copies(held, g_ids, later) if copy else self._run_originals(held, now or later or dead, dead)
        ):
            return None
        if h_id >= ids[0] or not all(map(lt, ids, islice(ids, 1, None))):
            return None
        if copy:
            self.b_copied.extend(g_ids)
            self.copied_high = g_last
        else:
            self.max_id = g_last
            if self.fresh is None:
                self.fresh = scan.first_fresh = h_id
        if state == STATE_ACK or dead:
            self.acked += k
            self.dead_bytes += k * s
        elif now:
            self.rdy_sizes[s] = self.rdy_sizes.get(s, 0) + k
        else:
            self._park_run(held, g_ids, g_dues)
        h_pos += k * s
        wseq = -1
        if h_pos >= self.mark_next or h_pos < self.mark_last:
            wseq = int(rows[-1][shapes.WSEQ_HIGH] + rows[-1][shapes.TAG], 16)
        return state, ids[-1], s, h_pos, wseq, dues[-1], copy

    def _run_copies(self, held: Held, g_ids: list[int], later: bool) -> bool:
        """Whether a run of copies is uniform: each supersedes nothing and is parked or acked."""
        h_id, scan, fresh, last = held[1], self.scan, self.fresh, self.scan.last
        return (
            h_id > self.copied_high
            and h_id > scan.upto
            and (held[0] != STATE_RDY or later)
            and not (last and any(map(last.__contains__, g_ids)))
            and (fresh is None or g_ids[-1] < fresh or h_id > self.max_id)
        )

    def _run_originals(self, held: Held, uniform_due: bool, dead: bool) -> bool:
        """Whether a run of originals is uniform: ids above those read, all acked up to the
        watermark or all above it, and (rdy ones) all due now or all later."""
        h_id = held[1]
        return h_id > self.max_id and (dead or h_id > self.upto) and (held[0] != STATE_RDY or uniform_due)

    def _park_run(self, held: Held, g_ids: list[int], g_dues: list[int]) -> None:
        """The run's records are parked: into the batch."""
        state, _, s, h_pos, _, _, _ = held
        k = len(g_ids)
        self.b_off.extend(range(h_pos, h_pos + k * s, s))
        self.b_size.extend(repeat(s, k))
        self.b_id.extend(g_ids)
        self.b_state.extend(bytes((DELAYED if state == STATE_RDY else PARKED_STATES[state],)) * k)
        self.b_due.extend(g_dues)
        if len(self.b_off) >= PARK_BATCH:
            self.scan._park_batch(self.batch)

    def _finish(self, pos: int, odd: bool) -> int:
        """Add the skim's counts to the Scan's, and count the record held back, unless odd
        bytes follow it (`odd`) or it is a damaged copy: then the checked path reads it
        again."""
        scan = self.scan
        scan.max_id = self.max_id
        scan.acked += self.acked
        scan.dead_bytes += self.dead_bytes
        scan._park_batch(self.batch)
        for size, n in self.rdy_sizes.items():
            scan.messages += n
            scan.live_bytes += size * n
            scan.classes.add(size, n)
        held = self.held
        if held is not None:
            state, h_id, size, h_pos, _, due, copy = held
            if odd or (copy and not scan._copy_intact(h_pos, size)):
                return h_pos
            scan._count(state, h_id, size, h_pos, copy, due)
        return pos


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of a log file, as an offline reader sees it."""

    id: int
    state: str
    deliveries: int
    timestamp_ms: int
    offset: int
    size: int
    headers: dict[str, str]
    body: bytes
    due_ms: int = 0
    expires_ms: int = 0


@dataclass(frozen=True, slots=True)
class Summary:
    """What a log file holds. `cap` is the ring's end the broker last opened it with
    (-cap rounded down to 4 KiB), None for a file that does not record it. `messages`
    are rdy now; `delayed` wait for their due time and `dead` are dead letters (both in
    `live_bytes`)."""

    path: str
    file_bytes: int
    cap: int | None
    messages: int
    acked: int
    live_bytes: int
    dead_bytes: int
    oldest_timestamp_ms: int | None
    torn: str | None
    delayed: int = 0
    dead: int = 0


class LogReader:
    """A read-only view of a log file: it takes no lock, so it works on the file of a
    stopped broker and of a running one (whose newest records may show as torn)."""

    def __init__(self, path: str, now_ms: int | None = None):
        self.path = str(path)
        # Whether a record is delayed depends on the time: an offline reader's is now.
        self.now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        try:
            self.disk = FileDisk(self.path, readonly=True)
        except OSError as err:
            raise LogError(f"cannot read {self.path}: {err.strerror}") from None
        header = self.disk.pread(RING_START, 0)
        try:
            self.ckpt = fmt.latest_checkpoint(header)
        except FormatError as err:
            self.disk.close()
            damaged = LogDamaged if fmt.layout_of(header) is not None else LogError
            raise damaged(f"{self.path}: {err}") from None
        layout = fmt.layout_of(header)
        assert layout is not None, "latest_checkpoint accepted the header"
        self.layout = layout
        self.cap = fmt.recorded_cap(header)
        self.end = max(self.disk.size(), self.ckpt.head, self.ckpt.tail, RING_START + fmt.PAD_SIZE)

    def close(self) -> None:
        self.disk.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scan(self) -> Scan:
        scan = Scan(self.disk, self.ckpt, self.end, layout=self.layout, now_ms=self.now_ms)
        scan.run()
        return scan

    def entries(self) -> Iterator[Entry]:
        """Every message still in the live region, in queue order, once each; acked ones
        included."""
        scan = self._scan()
        for pos, hdr, buf, off in scan.records():
            payload = bytes(hdr.payload(buf, off))
            try:
                head, body = stored.split(payload)
            except stored.PayloadError:
                head, body = b"", payload
            yield Entry(
                hdr.id,
                "ack" if hdr.id <= scan.upto else hdr.state.decode(),
                hdr.deliveries,
                hdr.timestamp_ms,
                pos,
                hdr.size,
                stored.decode_headers(head),
                body,
                hdr.due_ms,
                hdr.expires_ms,
            )

    def summary(self) -> Summary:
        scan = self._scan()
        return Summary(
            self.path,
            scan.file_size,
            self.cap,
            scan.messages,
            scan.acked,
            scan.live_bytes + scan.parked.bytes,
            scan.dead_bytes,
            scan.oldest_ms,
            scan.torn,
            scan.parked.delayed,
            scan.parked.dead,
        )
