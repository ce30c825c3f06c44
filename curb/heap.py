"""The broker process's C heap (glibc's malloc): where large buffers go, and when its
free pages go back to the system. Elsewhere than glibc nothing is set.

The mmap threshold is fixed at MMAP_THRESHOLD. By default glibc raises it as large blocks
are freed: the parked index's arrays grow by reallocation to several MiB for a million
entries, so the next ones would land on the heap and their predecessors leave holes it
keeps, 2-3 MiB of RSS that a fixed threshold gives back (a million dead letters took
56.8 to 57.1 MiB live at 128 KiB, 58.1 at 2 MiB, 58-61 by default). Below it, the
buffers of large messages (received pieces, bodies, stored payloads, records read back)
are on the heap: in a mapping of their own each faulted in fresh pages, about 0.7 ms
per MiB here.

The trim threshold: glibc gives the top of its heap back once more than 128 KiB of it
is free. A large message's buffers are freed when it is done, the top goes back, and
the next message faults the same pages in again, zeroed by the kernel: about 250 faults
and a third of the broker's CPU for a 1 MiB SEND. So while large messages move,
`Keeper` raises the trim threshold to KEEP_BYTES and the next message reuses the pages.
Once nothing large has moved for QUIET_SECONDS, it puts the threshold back and calls
malloc_trim, which returns the kept top and the whole free pages inside the heap: an
idle broker, or one holding a million small messages, keeps no more than before (a
threshold of 4 MiB kept for good took a million dead letters to 60.5 MiB live and 62.4
after a restart).

"Large" is one read or one write of LARGE_BYTES or more on a connection: curb.server
tests each one's length and calls `moved`. The thresholds are the process's, so one
Keeper serves it, made by `install` when a broker or a router runs as the process, and
`keeper(loop)` gives it only to that process's loop.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from typing import Protocol, cast

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 2 << 20
TRIM_BYTES = 128 * 1024  # glibc's default trim threshold
KEEP_BYTES = 4 << 20  # free at the top kept while large messages move: a few messages' buffers
LARGE_BYTES = 64 * 1024
QUIET_SECONDS = 0.25  # a stream of large messages reads every few ms; an RSS read soon after one finds the pages back


class Libc(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...
    def malloc_trim(self, pad: int) -> int: ...


class Handle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """What Keeper needs of the event loop (a test's fake clock is one too)."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], object]) -> Handle: ...


class Keeper:
    """Keeps the heap's freed top for reuse while large messages move (see the module)."""

    def __init__(self, loop: Timers, libc: Libc, quiet: float = QUIET_SECONDS):
        self.loop = loop
        self._libc = libc
        self._quiet = quiet
        self._last = 0.0  # loop time of the last large read or write
        self._timer: Handle | None = None  # set while keeping

    @property
    def keeping(self) -> bool:
        return self._timer is not None

    def moved(self) -> None:
        """A read or write of LARGE_BYTES or more happened now."""
        self._last = self.loop.time()
        if self._timer is None:
            self._libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
            self._timer = self.loop.call_at(self._last + self._quiet, self._check)

    def _check(self) -> None:
        due = self._last + self._quiet
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check)
            return
        self.release()

    def trim(self) -> None:
        """Give the heap's free pages back now (after start-up's recovery)."""
        self._libc.malloc_trim(0)

    def release(self) -> None:
        """Give the kept pages back now (when quiet, and when the broker stops)."""
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        self._libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)
        self._libc.malloc_trim(0)


_keeper: Keeper | None = None


def install(loop: asyncio.AbstractEventLoop) -> Keeper | None:
    """Fix the mmap threshold and make the process's Keeper, on this loop; None where
    there is no glibc."""
    global _keeper
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):  # not glibc
        return None
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _keeper = Keeper(loop, cast(Libc, libc))
    return _keeper


def keeper(loop: asyncio.AbstractEventLoop) -> Keeper | None:
    """The process's Keeper, once `install` made one on this loop. Only there: a loop
    that is gone (a broker run inside a test's process and stopped) leaves its Keeper
    behind, whose timers would fail on any other loop."""
    found = _keeper
    return found if found is not None and found.loop is loop else None
