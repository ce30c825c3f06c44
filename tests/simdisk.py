"""An in-memory Disk (see curb/log/disk.py) that can crash the way real storage does.

It keeps two images of the file: the durable one (as of the last completed sync) and the
visible one (what `pread` returns: durable plus every write since). Writes since the last
sync are also kept in order, so that `crash(mode)` can decide what of them survives:

- "kill" (kill -9): the page cache outlives the process, so every completed write stays
  visible. They are still not durable: the new disk keeps them as unsynced writes, and a
  later power loss may drop them unless something syncs first (fdatasync flushes the
  file's dirty pages whoever wrote them).
- "power": each unsynced write survives or not, independently; one that spans several
  512-byte sectors may survive in part, each of its sectors kept or dropped on its own.
  Survivors land in write order, so a sector shows the durable bytes or the bytes of any
  one write to it. Unsynced allocations (metadata, journaled on the file system's own
  schedule) each survive or not as well.

Size: the file is as long as its longest surviving extent: the durable size, surviving
allocations and surviving write pieces; a gap between them reads as zeros. Nothing ever
shrinks the file (the Disk protocol has no truncate).

Faults: `allocate` past `free_bytes` raises ENOSPC, as does a write that would grow the
file past it (a real file system's answer; the contract says a log that allocates first
never sees it there). With `write_eio`, a write may raise EIO after a random whole-sector
prefix of it was written; with `sync_eio`, a sync may raise EIO, making nothing durable.

A crash can also strike in the middle of the log's work: `arm_crash(n)` lets n more
writes, allocations or syncs happen and raises `Crashed` instead of the next one (before
it does anything), so a batch is cut between two of its writes, or recovery between its
write and its sync. `Crashed` is a BaseException, so no `except OSError` or `except
Exception` in the code under test mistakes it for an error it could handle.

Every choice comes from the `random.Random` given, so a seeded run replays exactly.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Sequence

SECTOR = 512
CRASH_MODES = ("kill", "power")


class Crashed(BaseException):
    """The simulated process died here: the disk call raising it did nothing."""


class SimDisk:
    """The Disk protocol over memory, with crashes and faults drawn from `rng`."""

    def __init__(
        self,
        rng: random.Random,
        *,
        free_bytes: int | None = None,
        sync_eio: float = 0.0,
        write_eio: float = 0.0,
        image: bytes = b"",
    ):
        self.rng = rng
        self.free_bytes = free_bytes
        self.sync_eio = sync_eio
        self.write_eio = write_eio
        self._durable = bytearray(image)
        self._visible = bytearray(image)
        self._writes: list[tuple[int, bytes]] = []
        self._allocs: list[int] = []
        self.closed = False
        self.crash_in: int | None = None
        self.writes = 0
        self.syncs = 0
        self.faults = 0

    # ------------------------------------------------------------ the Disk protocol

    def pread(self, size: int, offset: int) -> bytes:
        self._check_open()
        _check_range(size, offset)
        return bytes(self._visible[offset : offset + size])

    def pwrite(self, data: bytes, offset: int) -> None:
        self._check_open()
        self._tick()
        _check_range(len(data), offset)
        data = bytes(data)
        end = offset + len(data)
        if end > len(self._visible) and self.free_bytes is not None and end > self.free_bytes:
            self.faults += 1
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        if self.write_eio and self.rng.random() < self.write_eio:
            self.faults += 1
            self._apply_write(offset, data[: SECTOR * self.rng.randrange(len(data) // SECTOR + 1)])
            raise OSError(errno.EIO, "Input/output error (simulated write)")
        self._apply_write(offset, data)

    def pwritev(self, bufs: Sequence[bytes], offset: int) -> None:
        """One system call's worth of writing: it survives a power loss as one write."""
        self.pwrite(b"".join(bufs), offset)

    def sync(self) -> None:
        self._check_open()
        self._tick()
        self.syncs += 1
        if self.sync_eio and self.rng.random() < self.sync_eio:
            self.faults += 1
            raise OSError(errno.EIO, "Input/output error (simulated fdatasync)")
        self._durable = bytearray(self._visible)
        self._writes.clear()
        self._allocs.clear()

    def size(self) -> int:
        self._check_open()
        return len(self._visible)

    def allocate(self, upto: int) -> None:
        self._check_open()
        self._tick()
        if upto <= len(self._visible):
            return
        if self.free_bytes is not None and upto > self.free_bytes:
            self.faults += 1
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        self._visible.extend(bytes(upto - len(self._visible)))
        self._allocs.append(upto)

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------ crashes

    def arm_crash(self, ops: int | None) -> None:
        """Raise Crashed instead of the write, allocation or sync after the next `ops`
        of them; None disarms."""
        self.crash_in = ops

    def _tick(self) -> None:
        if self.crash_in is None:
            return
        if self.crash_in <= 0:
            self.crash_in = None
            raise Crashed()
        self.crash_in -= 1

    def crash(self, mode: str) -> SimDisk:
        """A new disk holding what survives a crash of this kind; this one is left as it
        was (the crashed process never touches it again)."""
        if mode == "kill":
            return self._successor(self._durable, self._visible, self._writes, self._allocs)
        if mode == "power":
            image = self._power_loss_image()
            return self._successor(image, image, [], [])
        raise ValueError(f"crash mode must be one of {CRASH_MODES}, not {mode!r}")

    def _successor(
        self, durable: bytearray, visible: bytearray, writes: list[tuple[int, bytes]], allocs: list[int]
    ) -> SimDisk:
        disk = SimDisk(self.rng, free_bytes=self.free_bytes, sync_eio=self.sync_eio, write_eio=self.write_eio)
        disk._durable = bytearray(durable)
        disk._visible = bytearray(visible)
        disk._writes = list(writes)
        disk._allocs = list(allocs)
        return disk

    def power_loss_without(self, offsets: set[int]) -> SimDisk:
        """A power loss that keeps every unsynced write and allocation but the writes
        made at `offsets`: one of the outcomes `crash("power")` may draw, taken on
        purpose (a test that needs one patch lost and the batch beside it kept)."""
        image = bytearray(self._durable)
        for upto in self._allocs:
            if upto > len(image):
                image.extend(bytes(upto - len(image)))
        for offset, data in self._writes:
            if offset not in offsets:
                _put(image, offset, data)
        return self._successor(image, image, [], [])

    def _power_loss_image(self) -> bytearray:
        """The durable image plus a random selection of the unsynced writes (in part, by
        sector) and allocations. A survival odds is drawn per crash, so that some crashes
        keep nearly everything and some nearly nothing."""
        rng = self.rng
        odds = rng.choice((0.0, 0.2, 0.5, 0.8, 1.0))
        image = bytearray(self._durable)
        for upto in self._allocs:
            if rng.random() < odds and upto > len(image):
                image.extend(bytes(upto - len(image)))
        for offset, data in self._writes:
            if rng.random() >= odds:
                continue
            whole = rng.random() < 0.5
            for start, piece in _sector_pieces(offset, data):
                if whole or rng.random() < 0.5:
                    _put(image, start, piece)
        return image

    # ------------------------------------------------------------ damage, for tests

    def flip_bit(self, offset: int, bit: int = 0) -> None:
        """Flip one bit of the medium (durable and visible alike): bit rot."""
        for image in (self._durable, self._visible):
            if offset < len(image):
                image[offset] ^= 1 << bit

    def zero_sector(self, sector: int) -> None:
        """Zero one whole sector of the medium: a lost or unreadable block."""
        start = sector * SECTOR
        for image in (self._durable, self._visible):
            end = min(len(image), start + SECTOR)
            if start < end:
                image[start:end] = bytes(end - start)

    # ------------------------------------------------------------ inspection, for tests

    def durable_image(self) -> bytes:
        return bytes(self._durable)

    def visible_image(self) -> bytes:
        return bytes(self._visible)

    def unsynced_writes(self) -> int:
        return len(self._writes)

    def _apply_write(self, offset: int, data: bytes) -> None:
        if not data:
            return
        _put(self._visible, offset, data)
        self._writes.append((offset, data))
        self.writes += 1

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O on a closed SimDisk")


def _check_range(size: int, offset: int) -> None:
    """Negative sizes and offsets are the caller's bug: say so, as the OS would."""
    if size < 0 or offset < 0:
        raise OSError(errno.EINVAL, f"Invalid argument (size {size}, offset {offset})")


def _put(image: bytearray, offset: int, data: bytes) -> None:
    """Write `data` into `image` at `offset`, growing it with zeros if it is shorter."""
    if offset > len(image):
        image.extend(bytes(offset - len(image)))
    image[offset : offset + len(data)] = data


def _sector_pieces(offset: int, data: bytes) -> list[tuple[int, bytes]]:
    """`data` written at `offset`, cut at sector boundaries of the file."""
    pieces = []
    pos = 0
    while pos < len(data):
        start = offset + pos
        take = min(len(data) - pos, SECTOR - start % SECTOR)
        pieces.append((start, data[pos : pos + take]))
        pos += take
    return pieces
