"""The checkpoint pipeline: which snapshot of the ring may be written to a slot, and when.

A checkpoint names the live region [tail, head) and the next message id and write
sequence. Recovery trusts it, so it may only name what is already on disk:

1. A snapshot is taken at the end of every flush that wrote something and becomes
   *writable* once a sync covering that flush has completed: every record in its
   region, every copy that let its tail pass an original, is then durable. When nothing
   written is unsynced, the current state is writable at once.
2. At most one checkpoint write is unsynced at a time. The two slots alternate, so the
   slot being overwritten never holds the newest *durable* checkpoint: a crash tearing
   the write in progress leaves the other slot intact and durable.
3. Only a checkpoint whose write has been synced moves the ring's durable tail, so space
   is reused only once a synced checkpoint no longer names it.
4. The ack-up-to watermark names no bytes: every checkpoint written carries the newest
   one, whichever snapshot it writes, so an ACK up to an id is durable (and its RECEIPT
   may leave) once the checkpoint after it is synced. It never goes down.
5. Message ids are never reused, also after a crash lost messages written (or only
   accepted) after the last checkpoint: a checkpoint's next id is a *reservation*, the
   snapshot's next id plus `reserve`, and the log assigns no id at or above the
   reservation of the newest durable checkpoint (`id_limit`). Only the final checkpoint
   of a clean stop reserves nothing, so ids go on without a gap after it.
6. An ACK of the oldest message in flight writes nothing: the next checkpoint's tail
   passes the message, and that retires it. A snapshot counts such ACKs (`retired`, in
   memory only), so the log knows which of them a durable checkpoint covers.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

from curb.log import record as fmt
from curb.log.disk import Disk


class Snapshot(NamedTuple):
    """What a checkpoint records: the live region, the next id and write sequence, and
    the ack-up-to watermark; and how many ACKs its tail retired in this run (rule 6).
    A tuple: one is taken at every flush that writes, and compared with the last."""

    tail: int
    head: int
    next_id: int
    next_wseq: int
    acked_upto: int = 0
    retired: int = 0


class Checkpoints:
    """Snapshots waiting for their sync, the one checkpoint write in flight, and the
    newest durable checkpoint."""

    def __init__(self, disk: Disk, gen: int, durable: Snapshot):
        self.disk = disk
        self.gen = gen
        self.durable = durable
        self.id_limit = durable.next_id  # ids below it may be assigned (rule 5)
        self.writing: tuple[int, Snapshot] | None = None
        self._writing_limit = 0
        self._taken: collections.deque[tuple[int, Snapshot]] = collections.deque()

    def taken(self, flush_no: int, snap: Snapshot) -> None:
        """The state after flush `flush_no`, which wrote something."""
        if not self._taken or self._taken[-1][1] != snap:
            self._taken.append((flush_no, snap))

    def writable(self, synced_no: int, written_no: int, current: Snapshot) -> Snapshot | None:
        """The newest snapshot that names only durable bytes, with the current watermark
        (rule 4), if it differs from what is durable already and a checkpoint may be
        written now (rule 2)."""
        if self.writing is not None:
            return None
        best = None
        if written_no <= synced_no:
            best = current
            self._taken.clear()
        else:
            while self._taken and self._taken[0][0] <= synced_no:
                best = self._taken.popleft()[1]
        if best is None:
            best = self.durable
        best = best._replace(acked_upto=current.acked_upto)
        if best == self.durable:
            return None
        return best

    def write(self, snap: Snapshot, flush_no: int, reserve: int) -> None:
        """Write `snap`, reserving the next `reserve` ids, to the slot that does not hold
        the newest checkpoint."""
        self.gen += 1
        self._writing_limit = snap.next_id + reserve
        ckpt = fmt.Checkpoint(self.gen, snap.tail, snap.head, self._writing_limit, snap.next_wseq, snap.acked_upto)
        self.disk.pwrite(ckpt.encode(), fmt.SLOT_OFFSETS[self.gen % 2])
        self.writing = (flush_no, snap)

    def synced(self, synced_no: int) -> Snapshot | None:
        """After a sync covering flush `synced_no`: the checkpoint that just became
        durable, if any (its tail is where space may now be reused from)."""
        if self.writing is None or self.writing[0] > synced_no:
            return None
        self.durable = self.writing[1]
        self.id_limit = self._writing_limit
        self.writing = None
        return self.durable
