"""The log core: ties the log's units (curb.log) into one log over a Disk.

`LogCore` does every step without threads, timers or an event loop of its own, so the
crash simulator in the tests drives it over a simulated disk; it tells its pacer
(curb.log.pacing) what waits to be flushed or synced, and `Log` (curb.log.driver) paces
it from an asyncio loop, with fdatasync in a thread (group commit). Admission
(curb.log.admission), the callers waiting for durability (curb.log.waiters) and the open
browses (curb.log.browses) are units of their own, each with the invariants it keeps.

Invariants kept here:
- Space is reused only once a synced checkpoint no longer names it (curb.log.checkpoints,
  curb.log.ring): the head never passes the tail of the newest *durable* checkpoint.
- A copy made by compaction has the message's id and a new write sequence; the last copy
  in write order is the message (curb.log.cursor, curb.log.scan). ACK and requeue patch
  the record's current copy only, so older copies stay `rdy` and dead.
- An ACK of the oldest message held (the first of the cursor's `behind`, whose offset is
  the logical tail) is *retired*: no patch is written, and the next snapshot's tail lies
  past the message, so the first durable checkpoint after it makes the ACK durable
  (curb.log.checkpoints, rule 6). Until then a crash brings the message back, as a lost
  patch would. While retired ACKs are not covered a checkpoint is written at every
  flush the pipeline allows, so they become durable within the same few sync cycles as
  a patch would (and `on_durable` waits for them, curb.log.waiters).
- The ack-up-to watermark (`ack_upto`) makes every message with an id up to it dead at
  once, with no per-record write: it is a field of every checkpoint
  (curb.log.checkpoints), its RECEIPT waits for the first checkpoint carrying it to be
  synced, and recovery counts such records as acked. Message ids are never reused:
  recovery resumes above the checkpoint's next id, every id it finds and the watermark.
- No call holds the event loop for long: every walk of the ring (the cursor passing
  dead records, after an ACK up to an id or before a delivery, and a browse) does at
  most `slice_work` of reading (curb.log.cursor's SLICE_WORK, a millisecond or two) per
  call, and goes on in the next slice: the cursor's at the next `flush` (which it asks
  for when it stalls), a browse's at its next step. Nothing durable waits for a walk:
  an ACK up to an id is durable once a synced checkpoint carries its watermark, walked
  or not.
- Ids are never reused: they stay below the reservation of the newest durable
  checkpoint (curb.log.checkpoints, rule 5), and recovery resumes at that reservation.
- Recovery never trusts unsynced bytes twice: it syncs what it found before naming it in
  a checkpoint, and moves the write sequence past every value a stale record could hold,
  so bytes left by an earlier run can never continue the chain.
- The header's cap line (curb.log.record) names the ring's end of the run that last
  opened the file: recovery rewrites it when it differs, and nothing but offline readers
  reads it.

Delayed messages, dead letters and the delivery count (the design; curb.log.record has
the format, curb.log.parked the index):
- Where they are recorded: in the record itself. Its first 32 bytes, the *mutable block*,
  hold the state (`rdy`; `max` or `exp` for a dead letter of reason max-deliveries or
  expired; `ack`), the delivery count (8 hex digits: no user reaches its end) and the due
  time (wall ms; 0 or past: rdy now). The expiry time is fixed at SEND and covered by the
  CRC. A delayed SEND is written with its due time; a requeue (with or without a delay),
  a burial and a redrive rewrite the mutable block in place, like the ACK patch, and are
  durable like it (`on_durable` covers them). Records start at multiples of 32 bytes,
  so the block lies in one 512-byte sector and a patch is never torn: after a crash the
  record shows the block before the patch or after it, never a mix. So a due time or a
  dead mark that was synced is kept, and one that was not is as if never asked (the
  message is rdy as before it: delivered again, never lost).
- The delivery count on disk is the count at the record's last patch: every way back
  (NACK, deadline, disconnect, shutdown) patches it, so a crash loses only deliveries
  since the message's last patch reached disk: the delivery of a message held at the
  crash, and those whose return was not yet synced. It never goes below a count a
  RECEIPT covered. A redrive resets it to 0, as the operator asked.
- The wall clock is injected (`wall_ms`), as `clock` is: the log has no clock of its own.
  A record whose due time is ahead is *parked*: the read cursor never hands it out, and
  dead letters never either. Parked records stay where they are in the ring; the log
  keeps them in `curb.log.parked`: in ring order (offset, size, id, a state byte: 17 bytes
  each in a ring up to 4 GiB) for compaction and the logical tail, and by due time in
  sorted runs of packed keys (8 bytes each) for `due(now_ms)`. So 1,000,000 delayed
  messages cost about 25 MB of index, not Python objects, and the queue sees a message only once it is due.
- Compaction copies parked records like held ones: one that pins the tail is copied to
  the head (same id, new write sequence, the mutable block as it is now) and its index
  entry moves to the copy, at once. Long-lived records therefore never pin the tail,
  whatever their due time.
- Start-up rebuilds the index from the record headers alone: recovery's walk reads the
  state and due field of each header it skims (never a body) and hands the parked ones
  to the index in batches; the cursor then steps over runs of them by their recorded
  sizes. The cost is the walk's (about a second per million records on a quiet machine)
  plus the index's appends and one sort per RUN keys: about twice the CPU of a walk over
  as many plain records (bin/bench-delayed measures both).
- A message parked while held is patched in place and stays a Record: requeued with a
  delay, the log keeps it (`_later`) until `due` hands it back; buried, its holder keeps
  it (the broker's dead letters). Compaction copies such records as held ones. Delayed
  SENDs and every parked record found at start-up are never objects.
- Every parked record is in the index from the moment it is placed: recovery indexes
  those it finds, and `_write_appends` and `_move_parked` index a delayed append and a
  copy of a parked record when they place it at the head, so the index keeps ring order
  and the cursor never has to park what it meets (curb.log.cursor). So every delayed
  message and dead letter the log counts is one `due`, `next_dead`, `dead_records` and
  `redrive` reach: there is no state in between ("in transit") that a reader misses.
  Dead letters and delayed messages count in `live_bytes` against -cap like any message.
"""

from __future__ import annotations

import collections
import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curb.log import record as fmt
from curb.log.admission import Admission, QueueFull
from curb.log.browse import Browse
from curb.log.browses import Browses
from curb.log.checkpoints import Checkpoints, Snapshot
from curb.log.cursor import KEEP_PAYLOAD, PARKED_LAST, SLICE_WORK, Cursor, Record
from curb.log.disk import Disk
from curb.log.marks import Marks, spacing_for
from curb.log.pacing import ByHand, Pacer
from curb.log.parked import DEAD_HELD, DELAYED, EXP, HELD, MAX, READY
from curb.log.reader import RecordReader
from curb.log.record import (
    DEAD_REASONS,
    DEAD_STATES,
    PAD_SIZE,
    RECORD_HEADER,
    RING_START,
    STATE_ACK,
    STATE_EXP,
    STATE_MAX,
    STATE_PAD,
    STATE_RDY,
    FormatError,
    mutable_block,
    record_bytes,
    record_size,
)
from curb.log.ring import Ring
from curb.log.scan import LogDamaged, LogError, Scan
from curb.log.waiters import Done, Waiters

MIN_CAP = 16 * 1024
ALLOCATE_STEP = 1 << 20
CHECKPOINT_EVERY = 0.05
INLINE_SYNC_OPS = 4  # a sync of at most this many writes is small (Pacer.sync_soon)
ID_RESERVE = 1 << 16  # ids a checkpoint reserves: at most this gap in ids after a crash
# Due messages moved to the ready line per call of `release`: no read each, so a call is
# a few milliseconds at most.
RELEASE_SLICE = 4096
# Parked entries an ACK up to an id's walk looks at per slice (blocks of ids all above
# its watermark skipped unread): a few milliseconds of CPU.
UPTO_SLICE = 2048


@dataclass(slots=True)
class Recovery:
    """What start-up found in the file."""

    messages: int
    acked: int
    live_bytes: int
    torn: str | None
    skipped_bytes: int
    seconds: float


# A dead letter's reason (Record.dead) as its state in the index.
DEAD_INDEX = {DEAD_REASONS[STATE_MAX]: MAX, DEAD_REASONS[STATE_EXP]: EXP}


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


def parse_size(text: str) -> int:
    """Bytes in '10MiB', '512KiB', '1GiB', '4096B' or '4096'; ValueError otherwise."""
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
    raw = text.strip()
    digits = raw.rstrip("BbKkMmGgTtIi")
    unit = raw[len(digits) :].upper()
    if not digits.isdigit() or unit not in units:
        raise ValueError(f"bad size {text!r}: use a number of bytes with B, KiB, MiB or GiB, e.g. 10MiB")
    return int(digits) * units[unit]


def max_message_for(cap: int, max_payload: int = 16 << 20) -> int:
    """The largest stored payload (SEND headers and body) under -cap: a sixth of the
    ring, so that one such message fits beside the headroom it needs, and -max-frame."""
    capacity = cap - cap % 4096 - RING_START
    return min(max_payload, capacity // 6 - PAD_SIZE)


class LogCore:
    """The queue's log over a Disk: recovery, admission, placement, compaction, the
    checkpoint pipeline and group-commit bookkeeping. Sans I/O of its own: its pacer
    decides when to `flush` and when to `sync`. It reads no clock of its own either:
    `clock` (monotonic seconds: checkpoint cadence, pinned tails, timings) and `wall_ms`
    (epoch milliseconds: send stamps) are given, so a simulator controls time."""

    def __init__(
        self,
        disk: Disk,
        cap: int,
        *,
        max_payload: int = 16 << 20,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        name: str = "log",
        slice_work: int = SLICE_WORK,
        mark_spacing: int | None = None,
        pacer: Pacer | None = None,
    ):
        if cap < MIN_CAP:
            raise LogError(f"-cap {cap} is too small: the log needs at least {MIN_CAP // 1024}KiB")
        self.disk = disk
        self.name = name
        self.metrics = metrics
        self.clock = clock
        self.pacer: Pacer = pacer or ByHand()
        self.wall_ms = wall_ms  # the wall clock: send stamps, and whether a record is due
        self.end = cap - cap % 4096
        self.capacity = self.end - RING_START
        self.max_message = max_message_for(cap, max_payload)
        self.max_record = record_size(self.max_message)
        self.on_written: Callable[[], None] = lambda: None
        self.on_walked: Callable[[], None] = lambda: None  # an ACK up to an id's walk is done
        self.on_fatal: Callable[[str], None] = lambda reason: None
        self.on_answered: Callable[[], None] = lambda: None
        self.on_damage: Callable[[str], None] = lambda text: None
        # The file system had no room to grow the file: this many pending SENDs were refused.
        self.on_disk_full: Callable[[int, str], None] = lambda refused, why: None
        # True while the caller is about to flush in the same call (the broker, handling a
        # connection's frames): a flush asked for meanwhile need not be arranged (the
        # pacer reads it).
        self.hold_flush = False
        self._pending: collections.deque[tuple[Record, bytes, Done | None, bool]] = collections.deque()
        # Rewrites of mutable blocks waiting for the next flush, by record offset: only the
        # newest rewrite of a block matters, and a read of a record finds its own at once.
        self._patches: dict[int, bytes] = {}
        self._flush_no = 0
        self._written_ids: collections.deque[tuple[int, int]] = collections.deque()  # (flush, its last id)
        self._durable_id = 0
        self._written_no = 0
        self._synced_no = 0
        self._urgent_upto = 0
        self._unsynced_ops = 0
        self._room_wanted = False
        self._ckpt_due = 0.0
        self._broken: str | None = None
        self._retired = 0  # ACKs retired by the tail in this run (curb.checkpoints, rule 6)
        self._ids_wanted = False
        # Held records the log keeps from now on (requeued with a delay, or dead letters
        # their holder let go of), until a flush copies each to the head as an entry of
        # the index (`_reparked`). A record is here exactly while it is `parked`.
        self._reparks: collections.deque[Record] = collections.deque()
        # Kept records that came due or were redriven before a flush copied them: the
        # front of the ready line, ahead of the index's (`next_ready`).
        self._ready_kept: collections.deque[Record] = collections.deque()
        # Delayed appends not yet written (then they are in the index, curb.log.parked):
        # how many, and the earliest due time among them, so that `delayed` and
        # `next_due` know them from the start.
        self._pending_delayed = 0
        self._pending_due: int | None = None
        self.slice_work = slice_work  # the work of one slice of a walk of the ring (curb.cursor)
        self.marks = Marks(mark_spacing or spacing_for(self.capacity))  # filled by recovery
        self.recovery = self._recover()
        self.next_ready: Callable[[], Record | None] = self._cursor.next_ready

    # ---------------------------------------------------------------- recovery

    def _recover(self) -> Recovery:
        """Find the live region from the newest intact checkpoint, follow the records
        written after it, make what was found durable, then checkpoint it with the write
        sequence moved past anything an earlier run may have left in the file."""
        started = self.clock()
        disk = self.disk
        size = disk.size()
        if size == 0:
            disk.pwrite(fmt.initial_header(self.end), 0)
            disk.sync()
            size = RING_START
        header = disk.pread(RING_START, 0)
        try:
            ckpt = fmt.latest_checkpoint(header)
        except FormatError as err:
            if fmt.layout_of(header) is None:
                raise LogError(f"{self.name}: {err}; move it away or pick another -file") from None
            raise LogDamaged(
                f"{self.name}: {err}; keep a copy for `curb inspect`, move it away "
                f"and start again (its messages cannot be recovered by start-up)"
            ) from None
        if not header.startswith(fmt.MAGIC):
            raise LogError(
                f"{self.name} is a log of an older format ({header[:10].decode()}): a broker upgrades it when it "
                f"starts on the file (curb.log.upgrade)"
            )
        if size > self.end or max(ckpt.head, ckpt.tail) > self.end - PAD_SIZE:
            need = max(size, ckpt.head + PAD_SIZE, ckpt.tail + PAD_SIZE)
            raise LogError(
                f"{self.name} holds {need} bytes, more than -cap allows ({self.end}); "
                f"start with -cap {-(-need // (1 << 20))}MiB or larger"
            )
        if min(ckpt.head, ckpt.tail) < RING_START:
            raise LogDamaged(
                f"{self.name}: the log's checkpoint is not valid; keep a copy for `curb inspect`, "
                f"move it away and start again"
            )
        if fmt.recorded_cap(header) != self.end:
            # For offline readers only (curb inspect); synced with what recovery found.
            disk.pwrite(fmt.cap_line(self.end), fmt.CAP_OFFSET)
        scan = Scan(disk, ckpt, self.end, marks=self.marks, now_ms=self.wall_ms())
        scan.run()
        self._next_id = max(ckpt.next_id, scan.max_id + 1, ckpt.acked_upto + 1)
        self._acked_upto = ckpt.acked_upto
        self._next_wseq = scan.next_wseq + self.capacity // PAD_SIZE + 1
        self._ring = Ring(self.end, scan.head, ckpt.tail)
        self._allocated = size
        reader = RecordReader(disk, self.capacity)
        if scan.last:
            # A copied message whose last occurrence is parked: the cursor skips every
            # occurrence it reads (it steps over the parked one), and none is unread.
            for seq in scan.entries_in_last():
                mid = scan.parked.id(seq)
                if scan.last[mid] == scan.parked.offset(seq):
                    scan.last[mid] = PARKED_LAST
        self._cursor = Cursor(
            reader, self.end, ckpt.tail, scan.head, self._next_wseq, scan.last, scan.messages, scan.live_bytes
        )
        self._cursor.on_damage = self._damaged
        self._cursor.on_stalled = self._schedule
        self._cursor.parked = self._parked = scan.parked
        scan.parked.sort_dead()  # dead letters oldest first, whatever ring order they had
        self._cursor.upto = self._cursor.counted_above = ckpt.acked_upto
        durable = Snapshot(ckpt.tail, ckpt.head, ckpt.next_id, ckpt.next_wseq, ckpt.acked_upto)
        self._checkpoints = Checkpoints(disk, ckpt.gen, durable)
        self.waiters = Waiters(self._checkpoints)
        self.admission = Admission(self.capacity, self.max_message, self._ring, self._cursor, scan.classes, self.clock)
        self.browses = Browses(disk, self.end, self._cursor, self._ring, self.marks, self._waits_for, self.slice_work)
        # Start-up passes the dead records at the tail in one go: nobody waits for it yet.
        self._cursor.allowance = 1 << 62
        self._cursor.pass_dead()
        self._cursor.allowance = self.slice_work
        disk.sync()
        self._checkpoints.write(self._snapshot(), 0, ID_RESERVE)
        disk.sync()
        written = self._checkpoints.synced(0)
        assert written is not None, "the checkpoint just written as flush 0 is synced by the sync above"
        self._ring.tail = written.tail
        self.browses.freed(ckpt.tail, written.tail)
        self._parked.freed(self._ring.distance, ckpt.tail, written.tail)
        # Every id below the next is on disk now, or will never be assigned.
        self._durable_id = self._next_id - 1
        return Recovery(
            scan.messages, scan.acked, scan.live_bytes, scan.torn, scan.skipped_bytes, self.clock() - started
        )

    def _damaged(self, text: str) -> None:
        self.on_damage(f"{self.name}: {text}")

    # ---------------------------------------------------------------- accounting

    @property
    def file_bytes(self) -> int:
        return self.disk.size()

    @property
    def unread(self) -> int:
        """Messages accepted, due and never handed out (the ready line's too)."""
        pending = len(self._pending) - self._pending_delayed
        return self._cursor.unread + pending + self.ready_waiting

    @property
    def live_bytes(self) -> int:
        """Bytes of every message not yet acked, as records."""
        return self.admission.live_bytes

    @property
    def delayed(self) -> int:
        """Messages waiting for their due time (parked, and held ones requeued with a delay)."""
        later = sum(1 for rec in self._reparks if not rec.dead)
        return self._parked.delayed + self._pending_delayed + later

    @property
    def dead(self) -> int:
        """Dead letters the log holds and has not handed out (found at start-up; those
        buried in this run, or taken by `next_dead`, are their holder's to count)."""
        parked = self._parked
        held = sum(1 for seq in parked.held if parked.state(seq) == DEAD_HELD)
        kept = sum(1 for rec in self._reparks if rec.dead)
        return parked.dead - held + kept

    @property
    def last_id(self) -> int:
        """The highest message id assigned so far (0 before the first)."""
        return self._next_id - 1

    @property
    def durable_id(self) -> int:
        """The highest id up to which every message is fsynced or never will exist: a
        range ending there reads the same after a power loss (appends are written in id
        order, and a sync covers every write before it)."""
        return self._durable_id

    @property
    def walking(self) -> bool:
        """Whether a walk of the ring waits for its next slice, which the next `flush`
        grants (until then `next_ready` may say None with messages left to hand out)."""
        return self._cursor.stalled or self._parked.upto_at is not None

    @property
    def acked_upto(self) -> int:
        """The ack-up-to watermark: every message with an id up to it is acked."""
        return self._acked_upto

    def _snapshot(self) -> Snapshot:
        return Snapshot(
            self._cursor.tail(), self._ring.head, self._next_id, self._next_wseq, self._acked_upto, self._retired
        )

    # ---------------------------------------------------------------- the broker's calls

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> Record:
        """Queue a message (its SEND headers and body as a stored payload). It is written
        in the next flush and `done(None)` runs once it is fsynced, or `done(reason)` if it
        could not be stored after all. urgent=False: nobody waits, so it may wait for
        company. Raises TooLarge or QueueFull (nothing stored) when it cannot be accepted.
        `due_ms`: not handed out before this wall time (parked until then); `expires_ms`
        is kept with it for the caller (0: none); both below fmt.MAX_TIME_MS."""
        if not (0 <= due_ms <= fmt.MAX_TIME_MS and 0 <= expires_ms <= fmt.MAX_TIME_MS):
            raise ValueError(f"due and expiry times must be from 0 to {fmt.MAX_TIME_MS} ms since the epoch")
        size = self.admission.admit(len(payload))
        if self._next_id >= self._checkpoints.id_limit:
            # Ids reserved by the durable checkpoint are used up (checkpoints come every
            # CHECKPOINT_EVERY, so only at more than ID_RESERVE messages in that time).
            self._ids_wanted = True
            self._schedule()
            raise QueueFull("queue full now: message ids are being reserved; retry at once")
        rec = Record(self._next_id, -1, size, 0, self.wall_ms(), None, 0, due_ms, expires_ms)
        if due_ms:
            self._pending_delayed += 1
            if self._pending_due is None or due_ms < self._pending_due:
                self._pending_due = due_ms
        self._next_id += 1
        if self._broken:
            if done is not None:
                done(self._broken)
            return rec
        self._pending.append((rec, payload, done, urgent))
        self.admission.accepted(size)
        self._schedule()
        return rec

    def delivered(self, rec: Record) -> None:
        """The queue handed the message to a consumer: count it (the MESSAGE says how
        often it came before, and the record's next state write keeps the count)."""
        rec.deliveries += 1

    def ack(self, rec: Record) -> None:
        """The message is done: it is never delivered again. The oldest message held is
        retired by the next checkpoint's tail; any other gets its state flipped on disk."""
        if rec.acked:
            return
        rec.acked = True
        if rec.parked:
            self._unkeep(rec)
        cur = self._cursor
        self.admission.classes.remove(rec.size)
        if rec.slot >= 0:  # released from the parked index: it pins the tail from there
            self._parked.remove(rec.slot)
            rec.slot = -1
        else:
            # Retired only when nothing older pins the tail (a parked record may).
            oldest = next(iter(cur.behind), None) == rec.id and cur.tail() == rec.offset
            cur.settled(rec)
            if oldest:
                self._retired += 1
                self._schedule()
                return
        self._patch(rec, STATE_ACK)

    def ack_upto(self, upto: int, done: Done | None = None) -> None:
        """Every message with an id up to `upto` is done for good, wherever it is (never
        delivered, rdy again, or held by any consumer): raise the watermark, forget the
        held ones, pass the dead ones ahead, and never write those not yet written (their
        SEND's `done` then waits for the watermark instead). `done(None)` runs once a
        synced checkpoint carries the watermark. The caller checks `upto <= last_id`."""
        if upto > self._acked_upto:
            self._acked_upto = upto
            pending, admission, waiters = self._pending, self.admission, self.waiters
            while pending and pending[0][0].id <= upto:
                rec, _, sent, _ = pending.popleft()
                admission.pending_bytes -= rec.size
                if sent is not None:
                    waiters.watermark.append((upto, sent))
            waiters.taken_upto(upto)
            self._pending_left()
            if not pending:
                admission.pending_largest = 0
            cur = self._cursor
            for held in (cur.behind, cur.ahead):
                for rec in [r for r in held.values() if r.id <= upto and not r.acked]:
                    rec.acked = True
                    if rec.parked:
                        self._unkeep(rec)
                    cur.settled(rec)
                    admission.classes.remove(rec.size)
            if self._ready_kept:
                self._ready_kept = collections.deque(rec for rec in self._ready_kept if not rec.acked)
            cur.ack_upto(upto)  # first: it tells parked records from unread ones by the index
            parked = self._parked
            for seq in [seq for seq, held_rec in parked.held.items() if held_rec.id <= upto]:
                self._drop_parked(seq)  # held ones at once: their records are acked now
            parked.ack_upto(upto)
            self._walk_upto()
            self._ready_changed()
        if done is None:
            pass
        elif upto <= self._checkpoints.durable.acked_upto:
            self.on_durable(done)
        elif self._broken:
            done(self._broken)
        else:
            # Waiters wait for the watermark as it is now, so that their deque is in
            # watermark order: each is answered by the first durable checkpoint past it.
            self.waiters.watermark.append((self._acked_upto, done))
        self._schedule()

    def _walk_upto(self) -> bool:
        """One slice of an ACK up to an id's walk of the parked index, if one is under
        way (whether it was): it removes the entries the watermark acked, the next slice
        at the next flush; `on_walked` once the counts are exact again."""
        parked = self._parked
        if parked.upto_at is None:
            return False
        for seq in parked.walk_upto(UPTO_SLICE):
            self._drop_parked(seq)
        if parked.upto_at is None:
            self.on_walked()
        else:
            self._schedule()
        return True

    def _drop_parked(self, seq: int) -> None:
        """A parked entry is acked: removed, and its record, if one is held, acked."""
        parked = self._parked
        held_rec = parked.held.get(seq)
        if held_rec is not None:
            held_rec.acked = True
            held_rec.slot = -1
        self.admission.classes.remove(parked.size(seq))
        parked.remove(seq)

    def browse(self, from_id: int, to_id: int) -> Browse:
        """A read of the live messages with ids in [from_id, to_id] (curb.log.browse); the
        caller steps it and ends it with `end_browse`."""
        return self.browses.start(from_id, to_id)

    def end_browse(self, browse: Browse) -> None:
        self.browses.end_browse(browse)

    def _waits_for(self, msg_id: int) -> bool:
        """Whether a message with an id up to `msg_id` is accepted but not yet written."""
        return bool(self._pending) and self._pending[0][0].id <= msg_id

    def requeue(self, rec: Record, due_ms: int = 0) -> None:
        """The message goes back: its delivery count and due time are written in place
        (durable like an ACK; `on_durable` covers it). With `due_ms` ahead of the wall
        clock it is parked: the caller lets go of it, and `due` hands it back once due.
        Otherwise the caller keeps it, rdy again (a dead letter stays dead: nothing is
        written)."""
        if rec.acked:
            return
        if rec.dead:
            return
        if due_ms > self.wall_ms():
            rec.due_ms = due_ms
            if rec.slot >= 0:
                self._parked.set(rec.slot, DELAYED, due_ms)
                rec.slot = -1
            else:
                self._keep(rec)
        else:
            rec.due_ms = 0
        self._patch(rec, STATE_RDY)

    def bury(self, rec: Record, reason: str) -> None:
        """The held message becomes a dead letter, for `reason` ("max-deliveries" or
        "expired"): written in place (durable like an ACK), never handed out by
        `next_ready` again, also after a restart. The caller keeps the record (its dead
        letters' queue); `ack` deletes it for good, `revive` makes it rdy again."""
        if rec.acked:
            return
        state = DEAD_STATES[reason]
        rec.dead = reason
        rec.due_ms = 0
        if rec.slot >= 0:
            self._parked.set(rec.slot, DEAD_HELD)
        self._patch(rec, state)

    def keep_dead(self, rec: Record) -> None:
        """The caller lets go of a dead letter it holds (one it buried): the log keeps it
        from now on, as it keeps those found at start-up, and `next_dead` hands it out."""
        if rec.acked or not rec.dead:
            return
        if rec.slot >= 0:
            self._parked.set(rec.slot, DEAD_INDEX[rec.dead])
            rec.slot = -1
        else:
            self._keep(rec)

    def _keep(self, rec: Record) -> None:
        """A held record (not from the index) becomes the log's to keep: copied to the head
        at the next flush, as an entry of the index (`_repark`), and no object after that."""
        rec.parked = True
        self._reparks.append(rec)
        self._schedule()

    def _unkeep(self, rec: Record) -> None:
        """A record the log kept is handed out, or copied into the index."""
        rec.parked = False
        self._reparks.remove(rec)

    def revive(self, rec: Record) -> None:
        """A dead letter the caller holds is rdy again with its delivery count reset
        (a redrive), written in place; the caller puts it in the queue."""
        if rec.acked or not rec.dead:
            return
        rec.dead = ""
        rec.deliveries = 0
        if rec.slot >= 0:
            self._parked.set(rec.slot, HELD)
        self._patch(rec, STATE_RDY)

    def _patch(self, rec: Record, state: bytes) -> None:
        """Rewrite the mutable block of a record's current copy (one sector: never torn)."""
        self._patches[rec.offset] = mutable_block(state, rec.deliveries, rec.due_ms, rec.wseq)
        self._schedule()

    # ---------------------------------------------------------------- parked records

    def next_due(self) -> int | None:
        """The earliest due time (wall ms) of a parked message, or of a delayed one the
        cursor has yet to pass (`next_ready` hands that one out once due); it may be
        early (a timer armed for it then finds nothing due, and asks again), never late."""
        soonest = self._parked.next_due()
        later = min((rec.due_ms for rec in self._reparks if not rec.dead), default=None)
        if later is not None and (soonest is None or later < soonest):
            soonest = later
        # Appends not yet written: indexed once written, if not due by then (those due by
        # then the cursor hands out, once written: they wait for that, not for a timer).
        pending, now = self._pending_due, self.wall_ms()
        if pending is not None and pending <= now:
            pending = self._pending_due = min(
                (r.due_ms for r, _, _, _ in self._pending if r.due_ms > now), default=None
            )
        if pending is not None and (soonest is None or pending < soonest):
            soonest = pending
        return soonest

    def release(self, now_ms: int, limit: int = RELEASE_SLICE) -> bool:
        """Up to `limit` messages due by `now_ms` join the ready line, where `next_ready`
        hands them out first, reading each only then (a million due at once cost no
        object each, and no read, until consumers take them). Returns whether more are
        due by then: the caller goes on in its next loop pass."""
        for rec in [r for r in self._reparks if not r.dead and r.due_ms <= now_ms]:
            self._unkeep(rec)
            self._ready_kept.append(rec)
        moved = self._parked.release(now_ms, limit)
        self._ready_changed()
        return moved >= limit

    @property
    def ready_waiting(self) -> int:
        """Messages in the ready line: `next_ready` hands these out before the cursor's."""
        return self._parked.ready + len(self._ready_kept)

    def _ready_changed(self) -> None:
        """`next_ready` takes from the ready line while it has messages, else straight
        from the cursor (no cost to a queue with none)."""
        ready = self._parked.ready or self._ready_kept
        self.next_ready = self._next_ready_line if ready else self._cursor.next_ready

    def _next_ready_line(self) -> Record | None:
        """The ready line's oldest message (a kept record's, or the index's, read now),
        then the cursor's; each now in flight, as `next_ready` hands them out."""
        kept = self._ready_kept
        while kept:
            rec = kept.popleft()
            if not rec.acked:
                return rec
        parked = self._parked
        while self._cursor.spend() and (seq := parked.take_ready()) is not None:
            found = self._read_parked(seq)
            if found is None:
                continue
            found.slot = seq
            parked.held[seq] = found
            return found
        if self._cursor.stalled:
            return None  # this slice's reading is spent: the next flush grants another
        self._ready_changed()
        return self._cursor.next_ready()

    def next_dead(self) -> Record | None:
        """The next dead letter the log holds (found at start-up, or kept since), now
        held by the caller: `ack` deletes it for good; `requeue` keeps it dead in the
        caller's hands, `keep_dead` gives it back; `revive` makes it rdy."""
        parked = self._parked
        while (seq := parked.next_dead()) is not None and self._cursor.spend():
            rec = self._read_parked(seq)
            if rec is None:
                continue
            rec.slot = seq
            parked.set(seq, DEAD_HELD)
            parked.held[seq] = rec
            return rec
        if self._cursor.stalled:
            return None  # this slice's reading is spent: the next flush grants another
        for rec in self._reparks:
            if rec.dead:
                self._unkeep(rec)
                return rec
        return None

    def dead_letters(self) -> tuple[int, list[Record]]:
        """Where a browse of the dead letters the log holds stops, and what it holds apart:
        the highest id among its index's (`dead_after` lists them from there in slices,
        `read_dead` reads each) and the records it keeps until a flush copies them."""
        return self._parked.last_dead(), [rec for rec in self._reparks if rec.dead]

    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]:
        """The next slice of the index's dead letters by id (curb.log.parked.dead_after)."""
        return self._parked.dead_after(after, last, limit)

    def read_dead(self, mid: int) -> Record | None:
        """Dead letter `mid` of the index, read now, if it is one still (also one a
        reader of the dead letters holds: it is dead until acked or redriven)."""
        seq = self._parked.dead_entry(mid)
        return None if seq is None else self._read_parked(seq)

    def redrive(self, count: int) -> list[int]:
        """Up to `count` of the dead letters the log holds, oldest first, are rdy again
        with their delivery count reset, written in place, and join the ready line.
        Returns the ids of those that moved (fewer: none left); `on_durable` tells when
        that is on disk."""
        parked = self._parked
        moved: list[int] = []
        while len(moved) < count:
            seq = parked.next_dead()
            if seq is None:
                break
            rec = self._read_parked(seq)
            if rec is None:
                continue
            rec.deliveries = 0
            rec.due_ms = 0
            self._patch(rec, STATE_RDY)
            parked.set(seq, READY)
            moved.append(rec.id)
        for rec in [r for r in self._reparks if r.dead][: count - len(moved)]:
            self.revive(rec)
            self._unkeep(rec)
            self._ready_kept.append(rec)
            moved.append(rec.id)
        self._ready_changed()
        return moved

    def _lost(self, seq: int) -> None:
        """A parked record that damage took (reported where it was found): forget it."""
        self.admission.classes.remove(self._parked.size(seq))
        self._parked.remove(seq)

    def _read_current(self, offset: int, size: int) -> bytearray:
        """The record at `offset` as it is now: read back, with the rewrites of its mutable
        block that wait for the next flush applied."""
        raw = bytearray(self.disk.pread(size, offset))
        patch = self._patches.get(offset)
        if patch is not None:
            raw[: len(patch)] = patch
        return raw

    def _checked(self, offset: int, size: int, mid: int) -> tuple[fmt.RecordHeader, bytearray] | None:
        """The record of message `mid` at `offset` as it is now, read and checked; None
        if damage took it (reported)."""
        raw = self._read_current(offset, size)
        try:
            hdr = fmt.parse_header(raw, 0)
        except FormatError:
            hdr = None
        if hdr is None or hdr.id != mid or not fmt.check_payload(raw, 0, hdr):
            self._damaged(f"parked message {mid} at byte {offset} is damaged; never delivered")
            return None
        return hdr, raw

    def _read_parked(self, seq: int) -> Record | None:
        """The Record of a parked entry; None if damage took it (reported, and the entry
        forgotten: it must not pin the tail for good)."""
        parked = self._parked
        offset, size = parked.offset(seq), parked.size(seq)
        checked = self._checked(offset, size, parked.id(seq))
        if checked is None:
            if seq not in parked.held:  # one in a reader's hands goes when the reader lets go
                self._lost(seq)
            return None
        return self._record_of(*checked, offset, size)

    def _record_of(self, hdr: fmt.RecordHeader, raw: bytearray, offset: int, size: int) -> Record:
        """The Record of a checked record read back whole (`_checked`)."""
        view = memoryview(raw)[RECORD_HEADER : RECORD_HEADER + hdr.length]
        rec = Record(
            hdr.id,
            offset,
            size,
            hdr.deliveries,
            hdr.timestamp_ms,
            bytes(view) if size <= KEEP_PAYLOAD else view,  # as the cursor keeps payloads
            hdr.wseq,
            hdr.due_ms,
            hdr.expires_ms,
        )
        rec.dead = DEAD_REASONS.get(hdr.state, "")
        return rec

    def on_durable(self, done: Done) -> None:
        """Run done(None) once everything asked of the log so far is on disk, every append
        accepted so far included; done(reason) if one of those appends is refused."""
        if self._broken:
            done(self._broken)
            return
        last_pending = self._pending[-1][0].id if self._pending else None
        self.waiters.on_durable(done, last_pending, self._retired, self._acked_upto)
        self._schedule()

    def payload(self, rec: Record) -> bytes | memoryview:
        """The stored SEND headers and body of a record, as written or read (a view, never
        a copy). One larger than KEEP_PAYLOAD stays with its record only until this call
        takes it for a delivery, so that a held message does not pin its bytes."""
        data = rec.payload
        if data is None:
            raw = self.disk.pread(rec.size, rec.offset)
            return memoryview(raw)[RECORD_HEADER : RECORD_HEADER + int(raw[85:93], 16)]
        if rec.size > KEEP_PAYLOAD:
            rec.payload = None
        return data

    # ---------------------------------------------------------------- writing

    def _schedule(self) -> None:
        """Something waits to be flushed."""
        self.pacer.flush_wanted()

    def _want_sync(self) -> None:
        """Something written may wait for a sync: soon when a receipt (or an append
        waiting for room) waits on it, else whenever the pacer likes."""
        if self._broken:
            return
        if self._urgent_upto > self._synced_no:
            self.pacer.sync_soon(self._unsynced_ops <= INLINE_SYNC_OPS)
        elif self._written_no > self._synced_no or self.waiters.synced:
            self.pacer.sync_later()

    def flush(self) -> None:
        """Write what is pending, if the pacer says a flush is due (a caller pacing the
        core by hand always has one)."""
        if self.pacer.take_flush():
            self._flush()

    def _flush(self) -> None:
        """Write what is pending: appends as far as the ring has room (compacting to
        make room), patches, and a checkpoint when one is due and allowed."""
        if self._broken:
            return
        resumed = self._next_slice()
        self._flush_no += 1
        fno = self._flush_no
        patches = self._patches
        try:
            if self._pending:
                placed, wrote = self._write_appends(fno)
            else:  # a flush for ACKs alone: nothing to place, nothing to compact
                self._room_wanted = False
                self.admission.pending_largest = 0
                placed, wrote = 0, False
            self._unsynced_ops += placed
            if self._reparks and self._write_reparks():
                wrote = True
            if patches:
                wrote = True
                self._unsynced_ops += len(patches)
                for off, patch in patches.items():
                    self.disk.pwrite(patch, off)
                patches.clear()
            if self._checkpoints.writing is None and self._checkpoint_if_due(fno, wrote):
                wrote = True
        except OSError as err:
            self.fail(f"cannot write {self.name}: {err.strerror or err}")
            return
        waiters = self.waiters
        waiters.appends_written(self._waits_for)
        if waiters.tag(fno):
            self._urgent_upto = fno
        if self._room_wanted or waiters.watermark or self._ids_wanted or waiters.retired:
            self._urgent_upto = fno
        if wrote:
            self._written_no = fno
            self._checkpoints.taken(fno, self._snapshot())
        self._want_sync()
        if placed or resumed:
            self.on_written()

    def _next_slice(self) -> bool:
        """Grant the cursor its next slice of work, and go on with a walk that stopped
        for want of it (passing dead records after an ACK up to an id, or the records a
        delivery had to pass). Returns whether a walk went on: then the counts changed
        (what it passed is no longer unread) and it may have reached a message to hand
        out, both of which the owner hears of through `on_written`."""
        cursor = self._cursor
        cursor.allowance = self.slice_work
        walked = self._parked.upto_at is not None and self._walk_upto()  # (no call a flush when none)
        if not cursor.stalled:
            return walked
        cursor.stalled = False
        cursor.pass_dead()
        return True

    def _checkpoint_if_due(self, fno: int, wrote: bool) -> bool:
        """Write the newest writable checkpoint when the cadence says so, an append waits
        for room or retired ACKs wait for one. Returns whether it wrote one. The caller
        asks only while no checkpoint write is unsynced (one at a time)."""
        now = self.clock()
        if (
            not self._room_wanted
            and not self.waiters.watermark
            and not self._ids_wanted
            and self._retired <= self._checkpoints.durable.retired
            and now < self._ckpt_due
        ):
            return False
        written_no = fno if wrote else self._written_no
        snap = self._checkpoints.writable(self._synced_no, written_no, self._snapshot())
        if snap is None:
            return False
        self._checkpoints.write(snap, fno, ID_RESERVE)
        self._ids_wanted = False
        self._ckpt_due = now + CHECKPOINT_EVERY
        return True

    def _write_appends(self, fno: int) -> tuple[int, bool]:
        """Place and write pending appends in order, stopping at the first that has no
        room yet. Returns how many were placed, and whether anything was written (the
        copies and pads compaction made count: a checkpoint must wait for their sync)."""
        self._room_wanted = False
        runs = WriteRuns([], [])
        written: list[tuple[Record, bytes]] = []
        parked_any = False  # some were delayed: indexed, not the cursor's to hand out
        wall = self.wall_ms()
        pending, ring, end, capacity = self._pending, self._ring, self.end, self.capacity
        admission, synced = self.admission, self.waiters.synced
        reserve = early = -1  # computed when first needed, and again once a record outgrows it
        while pending:
            rec, payload, done, urgent = pending[0]
            size = rec.size
            head, tail = ring.head, ring.tail
            if reserve < 0:
                reserve = admission.reserve()
                early = admission.early(reserve)
            try:
                if head >= tail and head + size + PAD_SIZE <= end and capacity - (head - tail) - size >= early:
                    # The common case: room at the head, far from the tail.
                    if head + size + PAD_SIZE > self._allocated:
                        self._allocate(head + size + PAD_SIZE)
                    off: int | None = head
                else:
                    off = self._room_for_append(size, runs, reserve)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                refused = len(pending)
                self.cancel_pending(f"disk full ({err.strerror}): message not stored")
                self.on_disk_full(refused, f"cannot grow {self.name}: {err.strerror}")
                break
            if off is None:
                self._room_wanted = True
                break
            rec.wseq = wseq = self._next_wseq
            self._next_wseq = wseq + 1
            header = fmt.encode_record(
                STATE_RDY, 0, rec.id, wseq, rec.timestamp_ms, payload, due_ms=rec.due_ms, expires_ms=rec.expires_ms
            )
            runs.add(off, size, record_bytes(header, payload))
            rec.offset = off
            ring.head = off + size
            if rec.due_ms and rec.due_ms > wall:  # parked from its write on, at the head: in ring order
                self._parked.add(off, size, rec.id, DELAYED, rec.due_ms, passed=False)
                parked_any = True
            pending.popleft()
            admission.pending_bytes -= size
            admission.classes.add(size)
            if 2 * (size + PAD_SIZE) > reserve:
                reserve = -1
            written.append((rec, payload))
            if done is not None:
                synced.append((fno, done))
            if urgent:
                self._urgent_upto = fno
        if not self._pending:
            admission.pending_largest = 0
        if written and (self._pending_delayed or self._pending_due is not None):
            self._pending_left()
        runs.write(self.disk)
        cursor = self._cursor
        cursor.whead, cursor.next_wseq = self._ring.head, self._next_wseq
        marks = self.marks
        for rec, payload in written:
            if not (parked_any and rec.due_ms > wall):
                cursor.written(rec, payload)
            if marks.due(rec.offset):
                marks.add(rec.id, rec.offset, rec.wseq)
        if written:
            self._written_ids.append((fno, written[-1][0].id))
        if self._pending and self._room_wanted and not self._can_progress():
            if self.metrics is not None:
                self.metrics.refused_full += len(self._pending)
            self.cancel_pending("queue full: the log has no room for this message; it was not stored")
        return len(written), bool(runs.runs)

    def _room_for_append(self, size: int, runs: WriteRuns, reserve: int) -> int | None:
        """Where a new record of `size` bytes goes now, leaving the reserve free for
        copies; None while the room is yet to come. Compaction starts early, once the
        free bytes fall below a quarter of the ring and a held message has pinned the
        tail for a while (curb.log.admission's `pinned`), so that its copies go in large batches while
        producers still have room (messages held only briefly are acked before they
        would be copied, rather than copied and then dead ahead of the cursor); early
        copies leave this record and the reserve their room."""
        admission = self.admission
        if self._cursor.behind and self._ring.free() - size < admission.early(reserve) and admission.pinned():
            self._compact(size, runs, keep=size + reserve + PAD_SIZE)
        off = self._place_new(size, runs, reserve)
        if off is None:
            self._compact(size, runs, keep=0)
            off = self._place_new(size, runs, reserve)
        return off

    def _place_new(self, size: int, runs: WriteRuns, reserve: int) -> int | None:
        ring = self._ring
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
        self._allocate(off + size + PAD_SIZE)
        if wraps:
            ring = self._ring
            header = fmt.encode_record(STATE_PAD, 0, 0, self._next_wseq, 0, b"")
            self._next_wseq += 1
            runs.add(ring.head, PAD_SIZE, record_bytes(header, b""))
            ring.head = RING_START
        return off

    def _allocate(self, upto: int) -> None:
        """Grow the file to cover `upto`: a step ahead when the disk has room, else just
        what is needed, so a nearly full file system still takes small messages."""
        if upto <= self._allocated:
            return
        want = min(self.end, max(upto, self._allocated + ALLOCATE_STEP))
        try:
            self.disk.allocate(want)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT) or want == upto:
                raise
            want = min(self.end, -(-upto // 4096) * 4096)
            self.disk.allocate(want)
        self._allocated = want

    def _compact(self, size: int, runs: WriteRuns, keep: int) -> None:
        """Make room for `size` bytes: copy the held and parked messages that pin the tail
        to the head, oldest first, in one batch covering a quarter of the ring (so that
        one sync and one checkpoint release plenty of room, not one record's worth), while
        copies fit. Only when that frees more than the next checkpoint would anyway:
        copying a run of live messages with no dead bytes after it just moves them round
        the ring. Copies leave `keep` bytes free."""
        ring, cursor, parked = self._ring, self._cursor, self._parked
        cursor.pass_dead()
        freed_by_checkpoint = ring.distance(ring.tail, cursor.tail())
        pinning = cursor.behind_bytes + parked.bytes - parked.unpassed_bytes
        freed_by_moving = ring.distance(ring.tail, cursor.rpos) - pinning
        if freed_by_moving <= freed_by_checkpoint:
            return  # the live records are not followed by dead bytes: copying them gains nothing
        span = size + self.admission.reserve() + self.capacity // 4
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
        parked = self._parked
        held = parked.held.get(seq)
        if held is not None:
            if not self._copy(held, spot, runs):
                return False
            parked.remove(seq)
            held.slot = -1
            cursor = self._cursor
            cursor.outstanding_bytes += held.size
            cursor.ahead[held.id] = held  # a held copy ahead of the cursor, as `Cursor.moved` makes
            return True
        size = parked.size(seq)
        checked = self._checked(parked.offset(seq), size, parked.id(seq))
        if checked is None:
            self._lost(seq)
            return True  # lost to damage: nothing to copy, and the tail may pass it
        hdr, raw = checked
        payload = bytes(hdr.payload(raw, 0))
        off = self._take(spot, size, runs)
        wseq = self._next_wseq
        self._next_wseq += 1
        header = fmt.encode_record(
            hdr.state, hdr.deliveries, hdr.id, wseq, hdr.timestamp_ms, payload, True, hdr.due_ms, hdr.expires_ms
        )
        runs.add(off, size, record_bytes(header, payload))
        self._ring.head = off + size
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
            self._cursor.moved(rec)
        return True

    def _write_reparks(self) -> bool:
        """Copy the records the log keeps (`_reparks`) to the head, as entries of the
        index, while no append waits for room and the ring keeps the room below which
        compaction starts early (a quarter of it at least); the rest wait for a later
        flush, or for compaction, which copies them with the held records that pin the
        tail. Returns whether anything was written."""
        reparks, ring, admission = self._reparks, self._ring, self.admission
        if self._pending:
            return False
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
                self._unkeep(rec)
        if not runs.runs:
            return False
        runs.write(self.disk)
        cursor = self._cursor
        cursor.whead, cursor.next_wseq = ring.head, self._next_wseq
        return True

    def _reparked(self, rec: Record) -> None:
        """A record the log keeps was copied to the head: its copy is an entry of the
        index from now on (DELAYED with its due time, or dead), the cursor no longer holds
        it, and the Record is no longer the log's."""
        cursor = self._cursor
        if cursor.behind.pop(rec.id, None) is not None:
            cursor.behind_bytes -= rec.size
        else:
            cursor.ahead.pop(rec.id, None)
        cursor.outstanding_bytes -= rec.size
        state = DEAD_INDEX[rec.dead] if rec.dead else DELAYED
        self._parked.add(rec.offset, rec.size, rec.id, state, rec.due_ms, passed=False)
        self._unkeep(rec)

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
                self._damaged(f"message {rec.id} at byte {rec.offset} is damaged and cannot be copied")
                return False
            payload = bytes(hdr.payload(raw, 0))
        off = self._take(spot, rec.size, runs)
        old_wseq = rec.wseq
        rec.wseq = self._next_wseq
        self._next_wseq += 1
        state = DEAD_STATES[rec.dead] if rec.dead else STATE_RDY
        header = fmt.encode_record(
            state, rec.deliveries, rec.id, rec.wseq, rec.timestamp_ms, payload, True, rec.due_ms, rec.expires_ms
        )
        runs.add(off, rec.size, record_bytes(header, payload))
        rec.offset = off
        self._ring.head = off + rec.size
        self.browses.moved(rec.id, old_wseq, rec.wseq)
        if self.metrics is not None:
            self.metrics.compactions += 1
        return True

    def _can_progress(self) -> bool:
        """Whether room will come without new ACKs: a checkpoint yet to be written or
        synced will release space behind the tail."""
        return (
            self._cursor.tail() != self._ring.tail
            or self._checkpoints.writing is not None
            or self._written_no > self._synced_no
        )

    def cancel_pending(self, reason: str) -> None:
        """Refuse every append still waiting for room, and the on_durable calls after them."""
        admission = self.admission
        while self._pending:
            rec, _, done, _ = self._pending.popleft()
            admission.pending_bytes -= rec.size
            if done is not None:
                done(reason)
        self._pending_left()
        admission.pending_largest = 0
        self.waiters.refuse_after_appends(reason)

    def _pending_left(self) -> None:
        """Appends left the pending line (written, refused, or taken by an ACK up to an
        id): count the delayed ones still in it, and their earliest due time, anew."""
        dues = [rec.due_ms for rec, _, _, _ in self._pending if rec.due_ms]
        self._pending_delayed = len(dues)
        self._pending_due = min(dues, default=None)

    # ---------------------------------------------------------------- syncing

    def sync(self) -> None:
        """fdatasync everything written so far, then do what follows a sync."""
        target = self.begin_sync()
        started = self.clock()
        try:
            self.disk.sync()
        except OSError as err:
            self.end_sync(target, 0.0, err)
            return
        self.end_sync(target, self.clock() - started, None)

    def begin_sync(self) -> int:
        """The flush a sync starting now covers."""
        self._unsynced_ops = 0
        return self._flush_no

    def end_sync(self, target: int, seconds: float, err: OSError | None) -> None:
        """Everything written up to flush `target` is on disk: answer its waiters, let a
        checkpoint name it, and let space a synced checkpoint released be reused."""
        if err is not None:
            self.fail(f"fdatasync of {self.name} failed: {err.strerror or err}")
            return
        if self._broken:
            return
        if self.metrics is not None:
            self.metrics.observe_fsync(seconds)
        self._synced_no = max(self._synced_no, target)
        written_ids = self._written_ids
        while written_ids and written_ids[0][0] <= target:
            self._durable_id = written_ids.popleft()[1]
        waiters = self.waiters
        if waiters.synced_upto(target):
            self.on_answered()
        durable = self._checkpoints.synced(target)
        if durable is not None:
            self._durable(durable)
        if (
            self._pending
            or self._patches
            or waiters.untagged
            or waiters.watermark
            or self._retired > self._checkpoints.durable.retired
        ):
            self._schedule()
        else:
            self._want_sync()

    def _durable(self, durable: Snapshot) -> None:
        """A checkpoint is synced: space behind its tail may be reused, and ACKs up to
        its watermark, and those its tail retired, are answered."""
        ring = self._ring
        old, ring.tail = ring.tail, durable.tail
        if old != durable.tail:
            self.browses.freed(old, durable.tail)
            self._parked.freed(ring.distance, old, durable.tail)
        if self.waiters.checkpoint_synced(durable):
            self.on_answered()

    def fail(self, reason: str) -> None:
        """A write or sync failed: what it covered may not be on disk, so stop for good."""
        self._broken = reason
        self.cancel_pending(reason)
        self.waiters.fail(reason)
        self.on_fatal(reason)

    @property
    def broken(self) -> str | None:
        """Why the log stopped for good (a write or sync failed), or None."""
        return self._broken

    @property
    def busy(self) -> bool:
        """Whether anything asked of the log is not yet written, synced or checkpointed."""
        return bool(
            self._pending
            or self._patches
            or self.waiters.untagged
            or self.waiters.watermark
            or self.waiters.retired
            or self._written_no > self._synced_no
            or self._checkpoints.writing is not None
        )

    def final_checkpoint(self) -> None:
        """Sync everything and leave a checkpoint naming the final state, so that the
        next start-up reads no further than needed."""
        if self._broken:
            return
        self._flush()
        self.sync()
        if self._broken:
            return
        self._checkpoints.write(self._snapshot(), self._flush_no, 0)
        self.disk.sync()
        self._checkpoints.synced(self._flush_no)
