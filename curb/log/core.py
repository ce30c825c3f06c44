"""The log core: ties the log's units (curb.log) into one log over a Disk.

`LogCore` does every step without threads, timers or an event loop of its own, so the
crash simulator in the tests drives it over a simulated disk; it tells its pacer
(curb.log.pacing) what waits to be flushed or synced, its owner what happened through
the events it was made with (curb.log.events), and `Log` (curb.log.driver) paces it
from an asyncio loop, with fdatasync in a thread (group commit). It is the facade the
broker calls: start-up (curb.log.recovery), admission (curb.log.admission), the pending
line (curb.log.appends), placement and compaction (curb.log.placement), the parked and
kept records (curb.log.kept), syncing (curb.log.syncing), the callers waiting for
durability (curb.log.waiters) and the open browses (curb.log.browses) are units of their
own, each with the invariants it keeps.

Invariants kept here:
- An ACK of the oldest message held (the first of the cursor's `behind`, whose offset is
  the logical tail) is *retired*: no patch is written, and the next snapshot's tail lies
  past the message, so the first durable checkpoint after it makes the ACK durable
  (curb.log.checkpoints, rule 6). Until then a crash brings the message back, as a lost
  patch would. While retired ACKs are not covered a checkpoint is written at every
  flush the pipeline allows, so they become durable within the same few sync cycles as
  a patch would (and `on_durable` waits for them, curb.log.waiters).
- No room is spent on an ACK a crash can undo, retired, patched or up to an id: its size
  still bounds the reserve and compaction copies nothing past it until it is durable
  (curb.log.dying), so a message a crash brings back can always be copied forward.
- The ack-up-to watermark (`ack_upto`) makes every message with an id up to it dead at
  once, with no per-record write: it is a field of every checkpoint
  (curb.log.checkpoints), its RECEIPT waits for the first checkpoint carrying it to be
  synced, and recovery counts such records as acked.
- Ids are never reused: they stay below the reservation of the newest durable
  checkpoint (curb.log.checkpoints, rule 5), and recovery resumes at that reservation.
- No call holds the event loop for long: every walk of the ring (the cursor passing
  dead records, after an ACK up to an id or before a delivery, and a browse) does at
  most `slice_work` of reading (curb.log.cursor's SLICE_WORK, a millisecond or two) per
  call, and goes on in the next slice: the cursor's at the next `flush` (which it asks
  for when it stalls), a browse's at its next step. Nothing durable waits for a walk:
  an ACK up to an id is durable once a synced checkpoint carries its watermark, walked
  or not.
- A rewrite of a record's mutable block (ACK, requeue, burial, redrive) waits in
  `_patches` for the next flush, the newest per record only; it is durable like an
  append (`on_durable` covers it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from curb.log import record as fmt
from curb.log.admission import Admission, QueueFull
from curb.log.appends import Appends
from curb.log.browses import Browses
from curb.log.checkpoints import Snapshot
from curb.log.cursor import SLICE_WORK, Record, take_payload
from curb.log.disk import Disk
from curb.log.dying import Dying
from curb.log.events import LogEvents, NoEvents
from curb.log.kept import Kept
from curb.log.marks import Marks, spacing_for
from curb.log.pacing import ByHand, Pacer
from curb.log.placement import Placement
from curb.log.record import PAD_SIZE, RING_START, STATE_ACK, mutable_block, record_size
from curb.log.recovery import ID_RESERVE, Recovery, recover
from curb.log.scan import LogError
from curb.log.syncing import Syncs
from curb.log.waiters import Done, Waiters

MIN_CAP = 16 * 1024
CHECKPOINT_EVERY = 0.05


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
    """The queue's log over a Disk, as the broker sees it: its calls, the counts, and the
    flush that writes what they asked, composed of the log's units. Sans I/O of its own:
    its pacer decides when to `flush` and when to `sync`. It reads no clock of its own
    either: `clock` (monotonic seconds: checkpoint cadence, pinned tails, timings) and
    `wall_ms` (epoch milliseconds: send stamps) are given, so a simulator controls time.
    What happens is told to `events` (curb.log.events)."""

    def __init__(
        self,
        disk: Disk,
        cap: int,
        *,
        events: LogEvents | None = None,
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
        self.events: LogEvents = events or NoEvents()
        self.wall_ms = wall_ms  # the wall clock: send stamps, and whether a record is due
        self.end = cap - cap % 4096
        self.capacity = self.end - RING_START
        self.max_message = max_message_for(cap, max_payload)
        self.max_record = record_size(self.max_message)
        # True while the caller is about to flush in the same call (the broker, handling a
        # connection's frames): a flush asked for meanwhile need not be arranged (the
        # pacer reads it).
        self.hold_flush = False
        # Rewrites of mutable blocks waiting for the next flush, by record offset: only the
        # newest rewrite of a block matters, and a read of a record finds its own at once.
        self._patches: dict[int, bytes] = {}
        self._ckpt_due = 0.0
        self._broken: str | None = None
        self._retired = 0  # ACKs retired by the tail in this run (curb.checkpoints, rule 6)
        self._ids_wanted = False
        self.slice_work = slice_work  # the work of one slice of a walk of the ring (curb.cursor)
        self.marks = Marks(mark_spacing or spacing_for(self.capacity))  # filled by recovery
        found = recover(disk, self.end, name, self.marks, clock, wall_ms(), slice_work, self._damaged, self._schedule)
        self.recovery: Recovery = found.recovery
        self._next_id, self._acked_upto = found.next_id, found.acked_upto
        self._ring, self._cursor, self._parked = ring, cursor, parked = found.ring, found.cursor, found.parked
        self._checkpoints = checkpoints = found.checkpoints
        self.waiters = waiters = Waiters(checkpoints)
        self._dying = dying = Dying(found.classes)  # ACKs a crash can undo: no room is spent on them
        self.admission = Admission(self.capacity, self.max_message, ring, cursor, found.classes, dying, clock)
        self.browses = Browses(disk, self.end, cursor, ring, self.marks, self._waits_for, slice_work)
        self._kept = kept = Kept(
            disk, parked, cursor, dying, self._patches, self.pacer, self.events, wall_ms, self._patch,
            self._damaged, self._ready_changed,
        )  # fmt: skip
        self._placement = Placement(
            disk, ring, found.next_wseq, found.allocated, self.admission, cursor, parked, self._kept, self.browses,
            dying, metrics,
        )  # fmt: skip
        # Every id below the next is on disk now, or will never be assigned.
        self._syncs = Syncs(
            self.pacer, ring, parked, self.browses, checkpoints, waiters, self.events, metrics, self._next_id - 1
        )
        self._appends = Appends(
            name, self._placement, self.admission, cursor, parked, self.marks, checkpoints, waiters, self._syncs,
            dying, self.events, metrics, wall_ms,
        )  # fmt: skip
        self._pending = self._appends.line
        self.next_ready: Callable[[], Record | None] = cursor.next_ready
        # Calls the units answer as they are: browses (curb.log.browses), the pending
        # line's refusal, the start of a sync, and parked records and dead letters.
        self.browse, self.end_browse = self.browses.start, self.browses.end_browse
        self.cancel_pending, self.begin_sync = self._appends.cancel, self._syncs.begin
        self.requeue, self.bury, self.keep_dead, self.revive = kept.requeue, kept.bury, kept.keep_dead, kept.revive
        self.release, self.redrive = kept.release, kept.redrive
        self.next_dead, self.dead_letters, self.read_dead = kept.next_dead, kept.dead_letters, kept.read_dead
        self.dead_after = parked.dead_after

    def _damaged(self, text: str) -> None:
        self.events.damage(f"{self.name}: {text}")

    # ---------------------------------------------------------------- accounting

    @property
    def file_bytes(self) -> int:
        return self.disk.size()

    @property
    def unread(self) -> int:
        """Messages accepted, due and never handed out (the ready line's too)."""
        pending = len(self._pending) - self._appends.delayed
        return self._cursor.unread + pending + self._kept.ready_waiting

    @property
    def live_bytes(self) -> int:
        """Bytes of every message not yet acked, as records."""
        return self.admission.live_bytes

    @property
    def delayed(self) -> int:
        """Messages waiting for their due time (parked, and held ones requeued with a delay)."""
        return self._kept.delayed + self._appends.delayed

    @property
    def dead(self) -> int:
        """Dead letters the log holds and has not handed out (found at start-up; those
        buried in this run, or taken by `next_dead`, are their holder's to count)."""
        return self._kept.dead

    @property
    def last_id(self) -> int:
        """The highest message id assigned so far (0 before the first)."""
        return self._next_id - 1

    @property
    def durable_id(self) -> int:
        """The highest id up to which every message is fsynced or never will exist: a
        range ending there reads the same after a power loss (curb.log.syncing)."""
        return self._syncs.durable_id

    @property
    def walking(self) -> bool:
        """Whether a walk of the ring waits for its next slice, which the next `flush`
        grants (until then `next_ready` may say None with messages left to hand out)."""
        return self._cursor.stalled or self._parked.upto_at is not None

    @property
    def acked_upto(self) -> int:
        """The ack-up-to watermark: every message with an id up to it is acked."""
        return self._acked_upto

    @property
    def ready_waiting(self) -> int:
        """Messages in the ready line: `next_ready` hands these out before the cursor's."""
        return self._kept.ready_waiting

    @property
    def broken(self) -> str | None:
        """Why the log stopped for good (a write or sync failed), or None."""
        return self._broken

    @property
    def busy(self) -> bool:
        """Whether anything asked of the log is not yet written, synced or checkpointed."""
        waiters, syncs = self.waiters, self._syncs
        return bool(
            self._pending
            or self._patches
            or waiters.untagged
            or waiters.watermark
            or waiters.retired
            or syncs.written_no > syncs.synced_no
            or self._checkpoints.writing is not None
        )

    def _snapshot(self) -> Snapshot:
        head, wseq = self._ring.head, self._placement.next_wseq
        return Snapshot(self._cursor.tail(), head, self._next_id, wseq, self._acked_upto, self._retired)

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
            appends = self._appends
            appends.delayed += 1
            if appends.due is None or due_ms < appends.due:
                appends.due = due_ms
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
            self._kept.unkeep(rec)
        cur = self._cursor
        if rec.slot >= 0:  # released from the parked index: it pins the tail from there
            self._parked.remove(rec.slot)
            rec.slot = -1
        else:
            # Retired only when nothing older pins the tail (a parked record may).
            oldest = next(iter(cur.behind), None) == rec.id and cur.tail() == rec.offset
            cur.settled(rec)
            if oldest:
                self._retired += 1
                self._dying.retired.append(rec.size)
                self._schedule()
                return
        self._dying.acked.append((rec.offset, rec.size))
        self._patch(rec, STATE_ACK)

    def ack_upto(self, upto: int, done: Done | None = None) -> None:
        """Every message with an id up to `upto` is done for good, wherever it is (never
        delivered, rdy again, or held by any consumer): raise the watermark, forget the
        held ones, pass the dead ones ahead, and never write those not yet written (their
        SEND's `done` then waits for the watermark instead). `done(None)` runs once a
        synced checkpoint carries the watermark. The caller checks `upto <= last_id`."""
        if upto > self._acked_upto:
            self._acked_upto = self._dying.upto = upto
            self._appends.drop_upto(upto)
            self._kept.ack_upto(upto)
            self._kept.walk_upto()
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

    def _waits_for(self, msg_id: int) -> bool:
        """Whether a message with an id up to `msg_id` is accepted but not yet written."""
        return self._appends.waits_for(msg_id)

    def _patch(self, rec: Record, state: bytes) -> None:
        """Rewrite the mutable block of a record's current copy (one sector: never torn)."""
        self._patches[rec.offset] = mutable_block(state, rec.deliveries, rec.due_ms, rec.wseq)
        self._schedule()

    def next_due(self) -> int | None:
        """The earliest due time (wall ms) of a parked message, or of a delayed one the
        cursor has yet to pass (`next_ready` hands that one out once due); it may be
        early (a timer armed for it then finds nothing due, and asks again), never late."""
        soonest = self._kept.next_due()
        pending = self._appends.next_due(self.wall_ms())
        if pending is not None and (soonest is None or pending < soonest):
            soonest = pending
        return soonest

    def _ready_changed(self) -> None:
        """`next_ready` takes from the ready line while it has messages, else straight
        from the cursor (no cost to a queue with none)."""
        kept = self._kept
        self.next_ready = kept.next_ready_line if self._parked.ready or kept.ready_kept else self._cursor.next_ready

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
        """The stored SEND headers and body of a record (curb.log.cursor.take_payload)."""
        return take_payload(rec, self.disk)

    # ---------------------------------------------------------------- writing

    def _schedule(self) -> None:
        """Something waits to be flushed."""
        self.pacer.flush_wanted()

    def flush(self) -> None:
        """Write what is pending, if the pacer says a flush is due (a caller pacing the
        core by hand always has one)."""
        if self.pacer.take_flush():
            self._flush()

    def _flush(self) -> None:
        """Write what is pending: appends as far as the ring has room (compacting to
        make room), the records the log keeps, patches, and a checkpoint when one is due
        and allowed."""
        if self._broken:
            return
        resumed = self._next_slice()
        syncs = self._syncs
        syncs.flush_no += 1
        fno = syncs.flush_no
        try:
            placed, wrote = self._write(fno)
        except OSError as err:
            self.fail(f"cannot write {self.name}: {err.strerror or err}")
            return
        waiters = self.waiters
        waiters.appends_written(self._waits_for)
        if waiters.tag(fno) or self._appends.room_wanted or waiters.watermark or self._ids_wanted or waiters.retired:
            syncs.urgent_upto = fno
        if wrote:
            syncs.written_no = fno
            self._checkpoints.taken(fno, self._snapshot())
        syncs.want_sync()
        if placed or resumed:
            self.events.written()

    def _write(self, fno: int) -> tuple[int, bool]:
        """Flush `fno`'s writes: how many appends were placed, and whether anything was
        written."""
        syncs, patches = self._syncs, self._patches
        if self._pending:
            placed, wrote = self._appends.write(fno)
        else:  # a flush for ACKs alone: nothing to place, nothing to compact
            self._appends.room_wanted = False
            self.admission.pending_largest = 0
            placed, wrote = 0, False
        syncs.unsynced_ops += placed
        if self._kept.reparks and not self._pending and self._placement.write_reparks():
            wrote = True
        if patches:
            wrote = True
            syncs.unsynced_ops += len(patches)
            for off, patch in patches.items():
                self.disk.pwrite(patch, off)
            patches.clear()
            self._dying.flushed(fno)
        if self._checkpoints.writing is None and self._checkpoint_if_due(fno, wrote):
            wrote = True
        return placed, wrote

    def _next_slice(self) -> bool:
        """Grant the cursor its next slice of work, and go on with a walk that stopped
        for want of it (passing dead records after an ACK up to an id, or the records a
        delivery had to pass). Returns whether a walk went on: then the counts changed
        (what it passed is no longer unread) and it may have reached a message to hand
        out, both of which the owner hears of through `events.written`."""
        cursor = self._cursor
        cursor.allowance = self.slice_work
        walked = self._parked.upto_at is not None and self._kept.walk_upto()  # (no call a flush when none)
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
            not self._appends.room_wanted
            and not self.waiters.watermark
            and not self._ids_wanted
            and self._retired <= self._checkpoints.durable.retired
            and now < self._ckpt_due
        ):
            return False
        syncs = self._syncs
        written_no = fno if wrote else syncs.written_no
        snap = self._checkpoints.writable(syncs.synced_no, written_no, self._snapshot())
        if snap is None:
            return False
        self._checkpoints.write(snap, fno, ID_RESERVE)
        self._ids_wanted = False
        self._ckpt_due = now + CHECKPOINT_EVERY
        return True

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

    def end_sync(self, target: int, seconds: float, err: OSError | None) -> None:
        """Everything written up to flush `target` is on disk: answer its waiters, let a
        checkpoint name it, and let space a synced checkpoint released be reused
        (curb.log.syncing); then flush what waits for it, or sync what is left."""
        if err is not None:
            self.fail(f"fdatasync of {self.name} failed: {err.strerror or err}")
            return
        if self._broken:
            return
        self._syncs.synced(target, seconds)
        self._dying.synced(target, self._checkpoints.durable)
        waiters = self.waiters
        answers = waiters.untagged or waiters.watermark or self._retired > self._checkpoints.durable.retired
        if self._pending or self._patches or answers:  # a flush has work: the sync after it follows
            self._schedule()
        elif not self._broken:
            self._syncs.want_sync()

    def fail(self, reason: str) -> None:
        """A write or sync failed: what it covered may not be on disk, so stop for good."""
        self._broken = reason
        self._appends.cancel(reason)
        self.waiters.fail(reason)
        self.events.fatal(reason)

    def final_checkpoint(self) -> None:
        """Sync everything and leave a checkpoint naming the final state, so that the
        next start-up reads no further than needed."""
        if self._broken:
            return
        self._flush()
        self.sync()
        if self._broken:
            return
        fno = self._syncs.flush_no
        self._checkpoints.write(self._snapshot(), fno, 0)
        self.disk.sync()
        self._checkpoints.synced(fno)
