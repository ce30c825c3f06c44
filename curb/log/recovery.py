"""Start-up: from the file on disk to the log's units, with what was found made durable.

Recovery reads the newest intact checkpoint, walks the records after it (curb.log.scan),
and builds the ring, the read cursor and the parked index from what the walk found;
then it syncs that and names it in a checkpoint of its own, so the log (curb.log.core)
starts from a durable state. It is a step of its own because nothing else in the log
reads the file's header or trusts a walk's estimates.

Invariants kept here:
- Recovery never trusts unsynced bytes twice: it syncs what it found before naming it in
  a checkpoint, and moves the write sequence past every value a stale record could hold,
  so bytes left by an earlier run can never continue the chain.
- Message ids are never reused: the next id is above the checkpoint's reservation
  (curb.log.checkpoints, rule 5), every id found and the ack-up-to watermark.
- The header's cap line (curb.log.record) names the ring's end of the run that last
  opened the file: recovery rewrites it when it differs, and nothing but offline readers
  reads it.
- Every parked record found is in the index before the cursor can meet it (curb.log.cursor),
  and dead letters in it are oldest first, whatever ring order they had.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from curb.log import record as fmt
from curb.log.checkpoints import Checkpoints, Snapshot
from curb.log.cursor import PARKED_LAST, Cursor
from curb.log.disk import Disk
from curb.log.marks import Marks
from curb.log.parked import Parked
from curb.log.reader import RecordReader
from curb.log.record import PAD_SIZE, RING_START, FormatError
from curb.log.ring import Ring
from curb.log.scan import LogDamaged, LogError, Scan
from curb.log.sizes import SizeClasses

ID_RESERVE = 1 << 16  # ids a checkpoint reserves: at most this gap in ids after a crash


@dataclass(slots=True)
class Recovery:
    """What start-up found in the file."""

    messages: int
    acked: int
    live_bytes: int
    torn: str | None
    skipped_bytes: int
    seconds: float


@dataclass(slots=True)
class Recovered:
    """The log's state as recovery left it: durable, named by checkpoint 0."""

    ring: Ring
    cursor: Cursor
    parked: Parked
    checkpoints: Checkpoints
    classes: SizeClasses  # live records by size class (curb.log.sizes)
    next_id: int
    acked_upto: int
    next_wseq: int
    allocated: int  # bytes of the file
    recovery: Recovery


def recover(
    disk: Disk,
    end: int,
    name: str,
    marks: Marks,
    clock: Callable[[], float],
    wall_ms: int,
    slice_work: int,
    damaged: Callable[[str], None],
    stalled: Callable[[], None],
) -> Recovered:
    """Find the live region from the newest intact checkpoint, follow the records written
    after it, make what was found durable, then checkpoint it with the write sequence
    moved past anything an earlier run may have left in the file. `marks` is filled as
    the walk goes; `slice_work`, `damaged` and `stalled` are the cursor's (curb.log.cursor)."""
    started = clock()
    capacity = end - RING_START
    size = disk.size()
    if size == 0:
        disk.pwrite(fmt.initial_header(end), 0)
        disk.sync()
        size = RING_START
    ckpt = _checkpoint(disk.pread(RING_START, 0), disk, size, end, name)
    scan = Scan(disk, ckpt, end, marks=marks, now_ms=wall_ms)
    scan.run()
    next_id = max(ckpt.next_id, scan.max_id + 1, ckpt.acked_upto + 1)
    next_wseq = scan.next_wseq + capacity // PAD_SIZE + 1
    ring = Ring(end, scan.head, ckpt.tail)
    if scan.last:
        # A copied message whose last occurrence is parked: the cursor skips every
        # occurrence it reads (it steps over the parked one), and none is unread.
        for seq in scan.entries_in_last():
            mid = scan.parked.id(seq)
            if scan.last[mid] == scan.parked.offset(seq):
                scan.last[mid] = PARKED_LAST
    reader = RecordReader(disk, capacity)
    cursor = Cursor(
        reader, end, ckpt.tail, scan.head, next_wseq, scan.last, scan.messages, scan.live_bytes, damaged, stalled
    )
    cursor.parked = parked = scan.parked
    parked.sort_dead()  # dead letters oldest first, whatever ring order they had
    cursor.upto = cursor.counted_above = ckpt.acked_upto
    checkpoints = Checkpoints(
        disk, ckpt.gen, Snapshot(ckpt.tail, ckpt.head, ckpt.next_id, ckpt.next_wseq, ckpt.acked_upto)
    )
    # Start-up passes the dead records at the tail in one go: nobody waits for it yet.
    cursor.allowance = 1 << 62
    cursor.pass_dead()
    cursor.allowance = slice_work
    disk.sync()
    checkpoints.write(Snapshot(cursor.tail(), ring.head, next_id, next_wseq, ckpt.acked_upto, 0), 0, ID_RESERVE)
    disk.sync()
    written = checkpoints.synced(0)
    assert written is not None, "the checkpoint just written as flush 0 is synced by the sync above"
    ring.tail = written.tail
    parked.freed(ring.distance, ckpt.tail, written.tail)
    marks.drop_freed(ring.distance, ckpt.tail, written.tail)
    found = Recovery(scan.messages, scan.acked, scan.live_bytes, scan.torn, scan.skipped_bytes, clock() - started)
    return Recovered(ring, cursor, parked, checkpoints, scan.classes, next_id, ckpt.acked_upto, next_wseq, size, found)


def _checkpoint(header: bytes, disk: Disk, size: int, end: int, name: str) -> fmt.Checkpoint:
    """The newest intact checkpoint of the file whose header is `header`, once the file is
    known to be a log of this format that fits the ring; the cap line made to say `end`."""
    try:
        ckpt = fmt.latest_checkpoint(header)
    except FormatError as err:
        if fmt.layout_of(header) is None:
            raise LogError(f"{name}: {err}; move it away or pick another -file") from None
        raise LogDamaged(
            f"{name}: {err}; keep a copy for `curb inspect`, move it away "
            f"and start again (its messages cannot be recovered by start-up)"
        ) from None
    if not header.startswith(fmt.MAGIC):
        raise LogError(
            f"{name} is a log of an older format ({header[:10].decode()}): a broker upgrades it when it "
            f"starts on the file (curb.log.upgrade)"
        )
    if size > end or max(ckpt.head, ckpt.tail) > end - PAD_SIZE:
        need = max(size, ckpt.head + PAD_SIZE, ckpt.tail + PAD_SIZE)
        raise LogError(
            f"{name} holds {need} bytes, more than -cap allows ({end}); "
            f"start with -cap {-(-need // (1 << 20))}MiB or larger"
        )
    if min(ckpt.head, ckpt.tail) < RING_START:
        raise LogDamaged(
            f"{name}: the log's checkpoint is not valid; keep a copy for `curb inspect`, move it away and start again"
        )
    if fmt.recorded_cap(header) != end:
        # For offline readers only (curb inspect); synced with what recovery found.
        disk.pwrite(fmt.cap_line(end), fmt.CAP_OFFSET)
    return ckpt
