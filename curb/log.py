"""The capped log file: the one owner of the queue's bytes on disk.

The file is a header (magic and two checkpoint slots) followed by a ring of records
(see curb.record). New records go at the head; the queue is read from the tail in file
order, so the broker keeps only a read position and its in-flight records in memory,
never an index of every queued message. ACK flips a record's state in place.

Space comes back as the tail moves past acked records. A record still in flight at the
tail (a slow consumer's) is copied forward to the head so that it cannot pin the ring;
each copy is paid for by the append that needed the room.

Durability: appends and patches are written at once (so consumers see them) and made
durable by one fdatasync per batch in a worker thread while the next batch gathers
(group commit). A checkpoint slot, written in a later batch than the data it names,
records the tail and head; space behind the tail is reused only once a synced checkpoint
says so, so a crash at any point leaves a checkpoint whose region is intact. Recovery
trusts the checkpoint, then follows records written after it by their write sequence and
drops a torn tail.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from curb import record as fmt
from curb.record import (PAD_SIZE, RECORD_HEADER, RING_START, STATE_ACK, STATE_PAD,
                         STATE_RDY, Checkpoint, FormatError)
from curb.scan import Entry, LogError, LogReader, Scan, Summary

__all__ = ["Entry", "Log", "LogError", "LogReader", "QueueFull", "Record", "Summary", "TooLarge"]

READ_CHUNK = 1 << 20
KEEP_PAYLOAD = 64 * 1024
FRESH_BYTES = 1 << 20
MIN_CAP = 16 * 1024
Done = Callable[[str | None], None]


class QueueFull(Exception):
    """No room now: the message was not stored."""


class TooLarge(Exception):
    """The message can never fit under the cap: it was not stored."""


class Record:
    """A message handed out by the read cursor and not yet acked: the broker's only
    per-message memory, bounded by what consumers hold in flight."""

    __slots__ = ("id", "offset", "size", "deliveries", "timestamp_ms", "payload",
                 "origin", "acked")

    def __init__(self, msg_id, offset, size, deliveries, timestamp_ms, payload):
        self.id = msg_id
        self.offset = offset
        self.size = size
        self.deliveries = deliveries
        self.timestamp_ms = timestamp_ms
        self.payload = payload
        self.origin = None
        self.acked = False


@dataclass(slots=True)
class Recovery:
    """What start-up found in the file."""

    messages: int
    acked: int
    live_bytes: int
    torn: str | None
    seconds: float


def parse_size(text: str) -> int:
    """Bytes in '10MiB', '512KiB', '1GiB', '4096B' or '4096'; ValueError otherwise."""
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
    raw = text.strip()
    digits = raw.rstrip("BbKkMmGgTtIi")
    unit = raw[len(digits):].upper()
    if not digits.isdigit() or unit not in units:
        raise ValueError(f"bad size {text!r}: use a number of bytes with B, KiB, MiB or GiB, e.g. 10MiB")
    return int(digits) * units[unit]


class Log:
    """The queue's log file, opened exclusively by one broker."""

    def __init__(self, path: str | os.PathLike, cap: int, *, max_payload: int = 16 << 20,
                 metrics=None):
        self.path = os.fspath(path)
        self.metrics = metrics
        if cap < MIN_CAP:
            raise LogError(f"-cap {cap} is too small: the log needs at least {MIN_CAP // 1024}KiB")
        self.end = cap - cap % 4096
        self.capacity = self.end - RING_START
        self.max_record = min(max_payload + PAD_SIZE, self.capacity // 32)
        self._reserve = 2 * (self.max_record + PAD_SIZE)
        self.on_written: Callable[[], None] = lambda: None
        self.on_fatal: Callable[[str], None] = lambda reason: None
        self.on_answered: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._syncer: Syncer | None = None
        self._pending: collections.deque[tuple[Record, bytes, Done | None, bool]] = collections.deque()
        self._patches: list[tuple[int, bytes]] = []
        self._waiters: collections.deque[tuple[int, Done]] = collections.deque()
        self._untagged: list[Done] = []
        self._flush_scheduled = False
        self._flush_no = 0
        self._written_no = 0
        self._synced_no = 0
        self._syncing = False
        self._snapshots: collections.deque[tuple[int, tuple]] = collections.deque()
        self._ckpt_to_write: tuple[int, tuple] | None = None
        self._ckpt_written: tuple[int, tuple[int, tuple]] | None = None
        self._ckpt_due = 0.0
        self._urgent_upto = 0
        self._unsynced_ops = 0
        self._lazy: asyncio.TimerHandle | None = None
        self._moves: collections.deque[tuple[int, Record]] = collections.deque()
        self._behind: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self._fresh: collections.deque[Record] = collections.deque()
        self._fresh_bytes = 0
        self._ahead: dict[int, Record] = {}
        self._broken: str | None = None
        self.outstanding_bytes = 0
        self.ahead_dead_bytes = 0
        self.fd = _open_locked(self.path)
        try:
            self.recovery = self._recover()
        except BaseException:
            os.close(self.fd)
            raise

    # ---------------------------------------------------------------- recovery

    def _recover(self) -> Recovery:
        """Find the live region from the newest intact checkpoint, follow the records
        written after it, drop a torn tail, and start reading at the tail."""
        started = time.monotonic()
        size = os.fstat(self.fd).st_size
        if size == 0:
            os.pwrite(self.fd, fmt.initial_header(), 0)
            os.fdatasync(self.fd)
            size = RING_START
        try:
            ckpt = fmt.latest_checkpoint(os.pread(self.fd, RING_START, 0))
        except FormatError as err:
            raise LogError(f"{self.path}: {err}; move it away or pick another -file") from None
        if size > self.end:
            raise LogError(f"{self.path} is {size} bytes, more than -cap allows ({self.end}); "
                           f"start with -cap {_round_up_mib(size)} or larger")
        scan = Scan(self.fd, ckpt)
        scan.run()
        self._gen = ckpt.gen
        self._head = self._whead = scan.head
        self._next_id = max(ckpt.next_id, scan.max_id + 1)
        self._next_wseq = scan.next_wseq
        self._durable_tail = self._rpos = self._rbase = ckpt.tail
        self._rbuf = b""
        self._allocated = size
        self._dups: dict[int, bool] = dict.fromkeys(scan.copies, False)
        self.unread = scan.messages
        self.unread_bytes = scan.live_bytes
        snap = self._snapshot()
        self._last_snapshot = snap
        if snap != (ckpt.tail, ckpt.head, ckpt.next_id, ckpt.next_wseq):
            self._write_checkpoint(snap)
            os.fdatasync(self.fd)
        return Recovery(scan.messages, scan.acked, scan.live_bytes, scan.torn,
                        time.monotonic() - started)

    # ---------------------------------------------------------------- accounting

    @property
    def file_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    @property
    def live_bytes(self) -> int:
        return self.unread_bytes + self.outstanding_bytes

    def _tail(self) -> int:
        """The oldest byte still needed: the first in-flight record behind the read
        position, else the read position itself."""
        for rec in self._behind.values():
            return rec.offset
        return self._rpos

    def _checkpoint(self) -> Checkpoint:
        return Checkpoint(self._gen + 1, self._tail(), self._head, self._next_id, self._next_wseq)

    # ---------------------------------------------------------------- the broker's calls

    def append(self, payload: bytes, done: Done | None = None, urgent: bool = True) -> Record:
        """Queue a message (its SEND headers and body as a stored payload). It is
        written in the next batch and `done(None)` runs once it is fsynced, or
        `done(reason)` if it could not be stored after all. With urgent=False nobody
        waits for the sync, so it may wait up to LAZY_SYNC for company. Raises TooLarge or
        QueueFull (nothing stored) when it cannot be accepted."""
        size = RECORD_HEADER + len(payload) + 1
        if size > self.max_record:
            raise TooLarge(
                f"message of {len(payload)} bytes can never be stored: the largest is "
                f"{self.max_record - PAD_SIZE} bytes with this -cap and -max-frame")
        if self.live_bytes + self.ahead_dead_bytes + size > self.capacity - self._reserve:
            raise QueueFull(
                f"queue full: {self.live_bytes} of {self.capacity - self._reserve} bytes "
                f"are queued; retry once consumers have caught up")
        msg_id = self._next_id
        self._next_id += 1
        ts = time.time_ns() // 1_000_000
        rec = Record(msg_id, -1, size, 0, ts, None)
        self._pending.append((rec, payload, done, urgent))
        self.unread += 1
        self.unread_bytes += size
        self._schedule()
        return rec

    def ack(self, rec: Record) -> None:
        """The message is done: flip its state on disk; it is never delivered again."""
        if rec.acked:
            return
        rec.acked = True
        self.outstanding_bytes -= rec.size
        if self._behind.pop(rec.id, None) is None and rec.id in self._ahead:
            self.ahead_dead_bytes += rec.size
        patch = fmt.state_patch(STATE_ACK, rec.deliveries)
        self._patches.append((rec.offset, patch))
        if rec.origin is not None:
            self._patches.append((rec.origin, patch))
        self._schedule()

    def requeue(self, rec: Record) -> None:
        """The message goes back to rdy: keep its delivery count on disk."""
        self._patches.append((rec.offset, fmt.state_patch(STATE_RDY, rec.deliveries)))
        self._schedule()

    def on_durable(self, done: Done) -> None:
        """Run done(None) once everything asked of the log so far (appends excepted,
        which have their own callback) is on disk."""
        self._untagged.append(done)
        self._schedule()

    def payload(self, rec: Record) -> bytes:
        """The stored SEND headers and body of a record."""
        if rec.payload is not None:
            return rec.payload
        raw = os.pread(self.fd, rec.size, rec.offset)
        return raw[RECORD_HEADER:-1]

    def next_ready(self) -> Record | None:
        """The next never-delivered message in queue order, now in flight; None if
        every written record has been handed out."""
        while self._rpos != self._whead:
            pos = self._rpos
            fresh = self._fresh
            if fresh and fresh[0].offset == pos:
                rec = fresh.popleft()
                size = rec.size
                self._fresh_bytes -= size
                self._rpos = pos + size
                self.unread -= 1
                self.unread_bytes -= size
                self.outstanding_bytes += size
                self._behind[rec.id] = rec
                return rec
            off = pos - self._rbase
            buf = self._rbuf
            if off < 0 or off + RECORD_HEADER > len(buf):
                buf, off = self._refill(pos, RECORD_HEADER), 0
            hdr = fmt.parse_header(buf, off)
            size = hdr.size
            if off + size > len(buf):
                buf, off = self._refill(pos, size), 0
            if hdr.state == STATE_PAD:
                self._rpos = RING_START
                continue
            self._rpos = pos + size
            mid = hdr.id
            moved = self._ahead.get(mid)
            if moved is not None and moved.offset == pos:
                del self._ahead[mid]
                if moved.acked:
                    self.ahead_dead_bytes -= size
                else:
                    self._behind[mid] = moved
                continue
            if mid in self._dups and self._skip_duplicate(mid, pos, hdr):
                continue
            if hdr.state == STATE_ACK:
                continue
            self.unread -= 1
            self.unread_bytes -= size
            if not fmt.check_payload(buf, off, hdr):
                continue
            payload = bytes(buf[off + RECORD_HEADER:off + size - 1]) if size <= KEEP_PAYLOAD else None
            rec = Record(mid, pos, size, hdr.deliveries, hdr.timestamp_ms, payload)
            self.outstanding_bytes += size
            self._behind[mid] = rec
            return rec
        return None

    def _keep_fresh(self, rec: Record, payload: bytes) -> None:
        """Remember a record just written, so that a consumer keeping up takes it from
        memory instead of reading and parsing it back. Bounded: past FRESH_BYTES the
        list restarts, and the cursor reads the file until it reaches it again."""
        if self._fresh_bytes + rec.size > FRESH_BYTES:
            self._fresh.clear()
            self._fresh_bytes = 0
        if rec.size <= KEEP_PAYLOAD:
            rec.payload = payload
        self._fresh.append(rec)
        self._fresh_bytes += rec.size

    def _skip_duplicate(self, mid: int, pos: int, hdr: fmt.RecordHeader) -> bool:
        """A record copied forward shortly before a crash can be in the file twice. The
        first occurrence is the message (acked if it says so); a later one is retired."""
        if not self._dups[mid]:
            self._dups[mid] = True
            return False
        del self._dups[mid]
        if hdr.state == STATE_RDY:
            self.unread -= 1
            self.unread_bytes -= hdr.size
            self._patches.append((pos, fmt.state_patch(STATE_ACK, 0)))
            self._schedule()
        return True

    def _refill(self, pos: int, need: int) -> bytes:
        limit = self._whead if self._whead > pos else self.end
        self._rbuf = os.pread(self.fd, max(need, min(READ_CHUNK, limit - pos)), pos)
        self._rbase = pos
        return self._rbuf

    # ---------------------------------------------------------------- writing

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin writing: batches are flushed from this event loop."""
        self._loop = loop
        self._syncer = Syncer(self.fd, loop, self._synced)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._flush_handle = self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write what is pending now rather than later in this loop pass, so that a
        message sent can be delivered in the same pass."""
        if self._flush_scheduled:
            self._flush_handle.cancel()
            self._flush()

    def _flush(self) -> None:
        """Write what is pending (appends as far as the ring has room, patches, a
        checkpoint) and make sure a sync will cover it."""
        self._flush_scheduled = False
        if self._broken:
            return
        self._flush_no += 1
        fno = self._flush_no
        try:
            placed = self._write_appends(fno)
            wrote = placed > 0 or bool(self._patches)
            self._unsynced_ops += placed + len(self._patches)
            for off, patch in self._patches:
                os.pwrite(self.fd, patch, off)
            self._patches.clear()
            now = time.monotonic()
            if self._ckpt_to_write is not None and (self._pending or now >= self._ckpt_due):
                self._write_checkpoint(self._ckpt_to_write[1])
                self._ckpt_written = (fno, self._ckpt_to_write)
                self._ckpt_to_write = None
                self._ckpt_due = now + CHECKPOINT_EVERY
                wrote = True
        except OSError as err:
            self._fail(f"cannot write {self.path}: {err.strerror}")
            return
        if self._untagged:
            self._urgent_upto = fno
        for done in self._untagged:
            self._waiters.append((fno, done))
        self._untagged.clear()
        if wrote:
            self._written_no = fno
            snap = self._snapshot()
            if not self._snapshots or self._snapshots[-1][1] != snap:
                self._snapshots.append((fno, snap))
        self._want_sync()
        if placed:
            self.on_written()

    def _snapshot(self) -> tuple[int, int, int, int]:
        """(tail, head, next id, next write sequence) as a checkpoint would name them."""
        return (self._tail(), self._whead, self._next_id, self._next_wseq)

    def _write_appends(self, fno: int) -> int:
        """Place and write pending appends in order, stopping at the first that has no
        room yet. Returns how many were written."""
        runs: list[list] = []
        placed = 0
        while self._pending:
            rec, payload, done, urgent = self._pending[0]
            try:
                self._compact(rec.size, runs, fno)
                off = self._room(rec.size, runs)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self._cancel_pending(f"disk full ({err.strerror}): message not stored")
                break
            if off is None:
                break
            wseq = self._next_wseq
            self._next_wseq += 1
            header = fmt.encode_record(STATE_RDY, 0, rec.id, wseq, rec.timestamp_ms, payload)
            _add_run(runs, off, rec.size, (header, payload, b"\n"))
            rec.offset = off
            self._head = off + rec.size
            self._pending.popleft()
            self._keep_fresh(rec, payload)
            if done is not None:
                self._waiters.append((fno, done))
            if urgent:
                self._urgent_upto = fno
            placed += 1
        for off, _, bufs in runs:
            _pwritev_all(self.fd, bufs, off)
        self._whead = self._head
        if self._pending and not self._can_progress():
            self._cancel_pending("queue full: the log has no room for this message; it was not stored")
        return placed

    def _room(self, size: int, runs) -> int | None:
        """Where a record of `size` bytes can go now, writing a pad to wrap the ring if
        that is what it takes; None while the space it needs is still in use or not yet
        released by a synced checkpoint. The file grows ahead of the head, so a full
        disk shows here, before anything is placed."""
        head, tail = self._head, self._durable_tail
        if head >= tail:
            if head + size + PAD_SIZE <= self.end:
                self._allocate(head + size + PAD_SIZE)
                return head
            if RING_START + size < tail:
                wseq = self._next_wseq
                self._next_wseq += 1
                header = fmt.encode_record(STATE_PAD, 0, 0, wseq, 0, b"")
                _add_run(runs, head, PAD_SIZE, (header, b"\n"))
                self._head = RING_START
                return RING_START
            return None
        if head + size < tail:
            return head
        return None

    def _free(self) -> int:
        """Bytes the head may still write before it meets the durable tail."""
        head, tail = self._head, self._durable_tail
        if head >= tail:
            return max(0, self.end - head - PAD_SIZE) + (tail - RING_START)
        return tail - head

    def _compact(self, size: int, runs, fno: int) -> None:
        """Keep a reserve of free space by copying in-flight records that pin the tail to
        the head, before the head runs out of room to copy them to."""
        while self._free() < size + self._reserve and self._move_tail_record(runs, fno):
            pass

    def _allocate(self, upto: int) -> None:
        if upto > self._allocated:
            target = min(self.end, max(upto, self._allocated + ALLOCATE_STEP))
            os.posix_fallocate(self.fd, self._allocated, target - self._allocated)
            self._allocated = target

    def _move_tail_record(self, runs, fno: int) -> bool:
        """Copy the in-flight record that pins the durable tail to the head, so that the
        tail can pass it. Returns whether it moved one."""
        if not self._behind:
            return False
        rec = next(iter(self._behind.values()))
        if rec.offset != self._durable_tail:
            return False
        off = self._room(rec.size, runs)
        if off is None:
            return False
        payload = self.payload(rec)
        wseq = self._next_wseq
        self._next_wseq += 1
        header = fmt.encode_record(STATE_RDY, rec.deliveries, rec.id, wseq, rec.timestamp_ms, payload)
        _add_run(runs, off, rec.size, (header, payload, b"\n"))
        del self._behind[rec.id]
        rec.origin = rec.offset
        rec.offset = off
        self._head = off + rec.size
        self._ahead[rec.id] = rec
        self._moves.append((fno, rec))
        if self.metrics is not None:
            self.metrics.compactions += 1
        return True

    def _can_progress(self) -> bool:
        """Whether room will come without new ACKs: a checkpoint yet to be synced will
        release space behind the tail."""
        return self._durable_tail != self._tail() or self._syncing or bool(self._snapshots)

    def _cancel_pending(self, reason: str) -> None:
        while self._pending:
            rec, _, done, _ = self._pending.popleft()
            self.unread -= 1
            self.unread_bytes -= rec.size
            if done is not None:
                done(reason)

    def _write_checkpoint(self, snap: tuple[int, int, int, int]) -> None:
        self._gen += 1
        ckpt = Checkpoint(self._gen, *snap)
        os.pwrite(self.fd, ckpt.encode(), fmt.SLOT_OFFSETS[ckpt.gen % 2])

    # ---------------------------------------------------------------- syncing

    def _want_sync(self) -> None:
        """Sync soon: one loop pass from now when a receipt waits on it (after this
        pass's answers are sent, so the sync thread's wake-up is not in their way), or
        within LAZY_SYNC when nobody waits, so receipt-less traffic shares fsyncs."""
        if self._syncing or self._broken:
            return
        if self._urgent_upto > self._synced_no:
            self._syncing = True
            self._loop.call_soon(self._request_sync, self._unsynced_ops <= INLINE_SYNC_OPS)
        elif (self._written_no > self._synced_no or self._waiters) and self._lazy is None:
            self._lazy = self._loop.call_later(LAZY_SYNC, self._lazy_sync)

    def _lazy_sync(self) -> None:
        self._lazy = None
        if not self._syncing and not self._broken:
            self._syncing = True
            self._request_sync(False)

    def _request_sync(self, inline: bool) -> None:
        """Sync everything written so far. A small batch (a lone producer waiting for
        its receipt) is synced right here: handing it to the thread would cost two
        thread wake-ups, more than the loop loses by waiting for the disk. Big batches
        go to the thread, so the loop gathers the next batch meanwhile."""
        if self._broken:
            return
        self._unsynced_ops = 0
        if not inline:
            self._syncer.request(self._flush_no)
            return
        started = time.monotonic()
        try:
            os.fdatasync(self.fd)
        except OSError as err:
            self._synced(self._flush_no, 0.0, err)
            return
        self._synced(self._flush_no, time.monotonic() - started, None)

    def _synced(self, target: int, seconds: float, err: OSError | None) -> None:
        """Everything written up to flush `target` is on disk: answer its waiters, let a
        checkpoint name it, and let space a synced checkpoint released be reused."""
        self._syncing = False
        if err is not None:
            self._fail(f"fdatasync of {self.path} failed: {err}")
            return
        if self.metrics is not None:
            self.metrics.observe_fsync(seconds)
        self._synced_no = target
        answered = False
        while self._waiters and self._waiters[0][0] <= target:
            self._waiters.popleft()[1](None)
            answered = True
        if answered:
            self.on_answered()
        if self._ckpt_written is not None and self._ckpt_written[0] <= target:
            source, snap = self._ckpt_written[1]
            self._ckpt_written = None
            self._durable_tail = snap[0]
            while self._moves and self._moves[0][0] <= source:
                self._moves.popleft()[1].origin = None
        durable = None
        while self._snapshots and self._snapshots[0][0] <= target:
            durable = self._snapshots.popleft()
        if durable is not None and durable[1] != self._last_snapshot:
            self._ckpt_to_write = durable
            self._last_snapshot = durable[1]
        if self._pending or self._patches or self._untagged:
            self._schedule()
        else:
            self._want_sync()

    def _fail(self, reason: str) -> None:
        """A write or sync failed: what it covered may not be on disk, so stop for good."""
        self._broken = reason
        self._cancel_pending(reason)
        while self._waiters:
            self._waiters.popleft()[1](reason)
        for done in self._untagged:
            done(reason)
        self._untagged.clear()
        self.on_fatal(reason)

    def _busy(self) -> bool:
        return bool(self._pending or self._patches or self._untagged or self._syncing
                    or self._flush_scheduled or self._written_no > self._synced_no)

    async def close(self, timeout: float = 10.0) -> None:
        """Write and sync everything pending, leave a checkpoint naming the final state
        (so the next start-up reads no further than needed), and release the file.
        Appends still without room after `timeout` seconds are refused."""
        deadline = time.monotonic() + timeout
        while not self._broken and self._busy():
            if time.monotonic() > deadline:
                self._cancel_pending("broker stopping: message not stored")
            self._schedule()
            await asyncio.sleep(0.002)
        if not self._broken:
            self._write_checkpoint(self._snapshot())
            os.fdatasync(self.fd)
        if self._syncer is not None:
            self._syncer.stop()
        os.close(self.fd)


class Syncer:
    """The thread that runs fdatasync while the event loop goes on gathering the next
    batch; one request at a time, answered on the loop with (target, seconds, error)."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop, answer: Callable):
        self.fd = fd
        self.loop = loop
        self.answer = answer
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="curb-sync", daemon=True)
        self.thread.start()

    def request(self, target: int) -> None:
        self.requests.put(target)

    def stop(self) -> None:
        self.requests.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (target := self.requests.get()) is not None:
            started = time.monotonic()
            err = None
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                err = exc
            try:
                self.loop.call_soon_threadsafe(self.answer, target, time.monotonic() - started, err)
            except RuntimeError:
                return


ALLOCATE_STEP = 4 << 20
CHECKPOINT_EVERY = 0.05
LAZY_SYNC = 0.01
INLINE_SYNC_OPS = 4


def _add_run(runs: list, off: int, size: int, bufs) -> None:
    """Append `size` bytes of buffers to the write run that ends at `off`, or start a new run."""
    if not runs or runs[-1][1] != off:
        runs.append([off, off, []])
    run = runs[-1]
    run[2] += bufs
    run[1] = off + size


def _pwritev_all(fd: int, bufs: list[bytes], off: int) -> None:
    """Write the buffers back to back at `off`, however many calls it takes."""
    for start in range(0, len(bufs), IOV_MAX):
        batch = bufs[start:start + IOV_MAX]
        want = sum(map(len, batch))
        done = os.pwritev(fd, batch, off)
        if done < want:
            rest = b"".join(batch)
            while done < want:
                done += os.pwrite(fd, rest[done:], off + done)
        off += want


IOV_MAX = 1024


def _open_locked(path: str) -> int:
    """Open (or create) the log and take its exclusive lock, or say clearly why not."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as err:
        raise LogError(f"cannot open log file {path}: {err.strerror}; pick a writable -file") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise LogError(f"log file {path} is in use by another running curb; "
                       f"stop that one or pick another -file") from None
    return fd


def _round_up_mib(n: int) -> str:
    return f"{-(-n // (1 << 20))}MiB"
