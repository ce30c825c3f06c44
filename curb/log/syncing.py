"""Group commit: which flushes a sync covers, and what a finished sync makes durable.

Each flush of the log (curb.log.core) is numbered; a sync started after flush N covers
every write up to it (`begin` returns N), and once it is done (`synced`) the callers
waiting for those writes are answered (curb.log.waiters), the ids written by then are
durable, and a checkpoint written by then is durable too, which lets the ring reuse
the space behind its tail. It is a unit of its own because it is the one place that
decides when something written counts as on disk.

Invariants kept here:
- Space is reused only once a synced checkpoint no longer names it (curb.log.checkpoints,
  curb.log.ring): the ring's tail moves to the tail of the newest *durable* checkpoint
  only, so the head never passes it.
- `durable_id` only rises, and every message with an id up to it is fsynced or will
  never exist: appends are written in id order, and a sync covers every write before it.
- A sync is asked for soon while someone waits for it (a receipt, an append waiting
  for room: `urgent_upto`), else whenever the pacer likes, so receipt-less traffic
  shares fsyncs.
"""

from __future__ import annotations

import collections
from typing import Any

from curb.log.browses import Browses
from curb.log.checkpoints import Checkpoints
from curb.log.events import LogEvents
from curb.log.pacing import Pacer
from curb.log.parked import Parked
from curb.log.ring import Ring
from curb.log.waiters import Waiters

INLINE_SYNC_OPS = 4  # a sync of at most this many writes is small (Pacer.sync_soon)
# ... and of at most this many bytes: syncing more takes the disk long enough that the
# loop had better go on reading the next SENDs meanwhile, so they share the next sync.
INLINE_SYNC_BYTES = 32 << 10


class Syncs:
    """The flushes written and synced, and what their syncs answer."""

    def __init__(
        self,
        pacer: Pacer,
        ring: Ring,
        parked: Parked,
        browses: Browses,
        checkpoints: Checkpoints,
        waiters: Waiters,
        events: LogEvents,
        metrics: Any,
        durable_id: int,
    ):
        self.pacer = pacer
        self.ring = ring
        self.parked = parked
        self.browses = browses
        self.checkpoints = checkpoints
        self.waiters = waiters
        self.events = events
        self.metrics = metrics
        self.flush_no = 0  # the last flush begun
        self.written_no = 0  # the last flush that wrote anything
        self.synced_no = 0  # the last flush a finished sync covered
        self.urgent_upto = 0  # the last flush someone waits to see synced
        self.unsynced_ops = 0  # writes since the last sync began
        self.unsynced_bytes = 0  # bytes of appends written since the last sync began
        self.written_ids: collections.deque[tuple[int, int]] = collections.deque()  # (flush, its last id)
        self.durable_id = durable_id

    def want_sync(self) -> None:
        """Something written may wait for a sync: soon when a receipt (or an append
        waiting for room) waits on it, else whenever the pacer likes."""
        if self.urgent_upto > self.synced_no:
            self.pacer.sync_soon(self.unsynced_ops <= INLINE_SYNC_OPS and self.unsynced_bytes <= INLINE_SYNC_BYTES)
        elif self.written_no > self.synced_no or self.waiters.synced:
            self.pacer.sync_later()

    def begin(self) -> int:
        """The flush a sync starting now covers."""
        self.unsynced_ops = self.unsynced_bytes = 0
        return self.flush_no

    def synced(self, target: int, seconds: float) -> None:
        """Everything written up to flush `target` is on disk: answer its waiters, and
        let a checkpoint it covers be durable."""
        if self.metrics is not None:
            self.metrics.observe_fsync(seconds)
        self.synced_no = max(self.synced_no, target)
        written_ids = self.written_ids
        while written_ids and written_ids[0][0] <= target:
            self.durable_id = written_ids.popleft()[1]
        waiters = self.waiters
        if waiters.synced_upto(target):
            self.events.answered()
        durable = self.checkpoints.synced(target)
        if durable is None:
            return
        # A checkpoint is durable: space behind its tail may be reused, and ACKs up to its
        # watermark, and those its tail retired, are answered.
        ring = self.ring
        old, ring.tail = ring.tail, durable.tail
        if old != durable.tail:
            self.browses.freed(old, durable.tail)
            self.parked.freed(ring.distance, old, durable.tail)
        if waiters.checkpoint_synced(durable):
            self.events.answered()
