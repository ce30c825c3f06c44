"""The log's only way to the file: a small interface that a simulated disk can replace.

Everything the log does to its file goes through a `Disk`: positional reads and writes,
fdatasync, the size, and growing the file. `FileDisk` is the real one, an ordinary file
opened with an exclusive lock. The crash simulator in the tests stands in its own disk,
which keeps unsynced writes apart and loses or tears them at a simulated crash.

Contract of every Disk (the log's durability argument rests on it):
- `pwrite`/`pwritev` write every byte given or raise OSError; what they wrote is visible
  to `pread` at once, and survives a crash of the process (kill -9), but a power loss
  only once a later `sync` has returned.
- `sync` makes every write that returned before it was called durable, or raises.
- `allocate(upto)` makes the file at least `upto` bytes long with its blocks reserved,
  so that a full file system shows as OSError(ENOSPC) here and never in a later write.
- `pread` returns fewer bytes than asked only at the end of the file.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence
from typing import Protocol

IOV_MAX = 1024


class Disk(Protocol):
    """The file under a log; see the module docstring for the contract."""

    def pread(self, size: int, offset: int) -> bytes: ...

    def pwrite(self, data: bytes, offset: int) -> None: ...

    def pwritev(self, bufs: Sequence[bytes], offset: int) -> None: ...

    def sync(self) -> None: ...

    def size(self) -> int: ...

    def allocate(self, upto: int) -> None: ...

    def close(self) -> None: ...


class LockedError(OSError):
    """Another process holds the file's lock."""


class FileDisk:
    """A real file, opened read-write (created if missing) and locked exclusively, or
    opened read-only without a lock for offline readers."""

    def __init__(self, path: str, *, readonly: bool = False):
        self.path = path
        if readonly:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(self.fd)
            raise LockedError(errno.EWOULDBLOCK, "locked by another process", path) from err

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def pwrite(self, data: bytes, offset: int) -> None:
        done = os.pwrite(self.fd, data, offset)
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], offset + done)

    def pwritev(self, bufs: Sequence[bytes], offset: int) -> None:
        """Write the buffers back to back, in as many calls as the system needs."""
        for start in range(0, len(bufs), IOV_MAX):
            batch = bufs[start : start + IOV_MAX]
            want = sum(map(len, batch))
            done = os.pwritev(self.fd, batch, offset)
            if done < want:
                self.pwrite(b"".join(batch)[done:], offset + done)
            offset += want

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def allocate(self, upto: int) -> None:
        have = self.size()
        if upto > have:
            os.posix_fallocate(self.fd, have, upto - have)

    def close(self) -> None:
        os.close(self.fd)
