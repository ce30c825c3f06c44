"""The log of a running broker: a LogCore on its locked file, paced by an asyncio loop.

The driver is the core's pacer (curb.log.pacing): a flush the core wants runs as a loop
callback, or in the broker's own call when it holds flushes while handling a
connection's frames (`LogCore.hold_flush`), so a message sent can be delivered in the
same loop pass. fdatasync runs in a thread while the loop gathers the next batch (group
commit), except a small one a lone producer waits for, which is cheaper here.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from curb.log.core import LogCore
from curb.log.disk import Disk, FileDisk, LockedError
from curb.log.events import LogEvents
from curb.log.scan import LogError
from curb.log.upgrade import upgrade

LAZY_SYNC = 0.01


class Log:
    """A LogCore over the file at `path`, opened and locked, paced by the event loop
    given to `start`, telling `events` what happens (curb.log.events). The broker works
    with `core`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        cap: int,
        *,
        max_payload: int = 16 << 20,
        metrics: Any = None,
        events: LogEvents | None = None,
    ):
        self.path = os.fspath(path)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._syncer: Syncer | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._flush_wanted = False  # asked for while hold_flush: the holder flushes
        self._lazy: asyncio.TimerHandle | None = None
        self._syncing = False
        disk = open_disk(self.path)
        try:
            if upgrade(disk, self.path, cap - cap % 4096) is not None:  # a file of the first format
                disk.close()
                disk = open_disk(self.path)
            self.core = LogCore(
                disk, cap, events=events, max_payload=max_payload, metrics=metrics, name=self.path, pacer=self
            )
        except BaseException:
            disk.close()
            raise

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin writing: batches are flushed from this event loop."""
        self._loop = loop
        self._syncer = Syncer(self.core.disk, loop, self._synced)
        self.flush_wanted()

    # ---------------------------------------------------------------- the core's pacer

    def flush_wanted(self) -> None:
        if self.core.hold_flush:
            self._flush_wanted = True
        elif self._flush_handle is None and self._loop is not None:
            self._flush_handle = self._loop.call_soon(self.core.flush)

    def take_flush(self) -> bool:
        """A flush is due when one was wanted: the broker's after its frames (then the
        loop callback is not needed), or the loop callback's own (cancelling it then,
        as it runs, does nothing)."""
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush_handle = None
        elif not self._flush_wanted:
            return False
        self._flush_wanted = False
        return True

    def sync_soon(self, small: bool) -> None:
        """One loop pass from now, after this pass's answers are sent."""
        if self._syncing or self._loop is None:
            return
        self._syncing = True
        self._loop.call_soon(self._request_sync, small)

    def sync_later(self) -> None:
        """Within LAZY_SYNC, so that receipt-less traffic shares fsyncs."""
        if self._syncing or self._loop is None or self._lazy is not None:
            return
        self._lazy = self._loop.call_later(LAZY_SYNC, self._lazy_sync)

    # ---------------------------------------------------------------- syncing

    def _lazy_sync(self) -> None:
        self._lazy = None
        if not self._syncing and not self.core.broken:
            self._syncing = True
            self._request_sync(False)

    def _request_sync(self, inline: bool) -> None:
        """Sync everything written so far. A small batch (a lone producer waiting for
        its receipt) is synced right here: handing it to the thread would cost two
        thread wake-ups, more than the loop loses by waiting for the disk. Big batches
        go to the thread, so the loop gathers the next batch meanwhile."""
        if self.core.broken or self._syncer is None:
            self._syncing = False
            return
        if not inline:
            self._syncer.request(self.core.begin_sync())
            return
        self._syncing = False
        self.core.sync()

    def _synced(self, target: int, seconds: float, err: OSError | None) -> None:
        self._syncing = False
        self.core.end_sync(target, seconds, err)

    @property
    def busy(self) -> bool:
        """Whether a flush or sync is arranged or under way, or the core has work left."""
        return self._syncing or self._flush_handle is not None or self._flush_wanted or self.core.busy

    async def close(self, timeout: float = 10.0) -> None:
        """Write and sync everything pending, leave a checkpoint naming the final state,
        and release the file. Appends still without room after `timeout` seconds are
        refused."""
        core = self.core
        deadline = time.monotonic() + timeout
        while not core.broken and self.busy:
            if time.monotonic() > deadline:
                core.cancel_pending("broker stopping: message not stored")
            self.flush_wanted()
            await asyncio.sleep(0.002)
        if self._syncer is not None:
            self._syncer.stop()
        self._loop = None
        try:
            core.final_checkpoint()
        except OSError as err:
            core.fail(f"cannot write {core.name}: {err.strerror or err}")
        core.disk.close()


class Syncer:
    """The thread that runs fdatasync while the event loop goes on gathering the next
    batch; one request at a time, answered on the loop with (target, seconds, error)."""

    def __init__(
        self, disk: Disk, loop: asyncio.AbstractEventLoop, answer: Callable[[int, float, OSError | None], None]
    ):
        self.disk = disk
        self.loop = loop
        self.answer = answer
        self.requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
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
                self.disk.sync()
            except OSError as exc:
                err = exc
            try:
                self.loop.call_soon_threadsafe(self.answer, target, time.monotonic() - started, err)
            except RuntimeError:
                return


def open_disk(path: str) -> FileDisk:
    """Open (or create) the log and take its exclusive lock, or say clearly why not."""
    try:
        return FileDisk(path)
    except LockedError:
        raise LogError(
            f"log file {path} is in use by another running curb; stop that one or pick another -file"
        ) from None
    except IsADirectoryError:
        raise LogError(f"cannot open log file {path}: it is a directory; pick a file for -file") from None
    except PermissionError as err:
        raise LogError(f"cannot open log file {path}: {err.strerror}; pick a writable -file") from None
