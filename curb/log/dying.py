"""ACKs a crash can still undo, and the room the log must not spend on them.

An ACK is durable once its patch is synced (an ACK out of order, curb.log.core), once a
durable checkpoint counts it (a retired ACK, curb.log.checkpoints rule 6), or once a
durable checkpoint carries its watermark (an ACK up to an id). Until then a crash brings
the message back where it was in the ring, and a consumer may hold it again: the
restarted log must have room to copy it forward (curb.log.placement), or it refuses
every SEND, however empty the ring, until that consumer ACKs.

Invariant: no room is spent on an ACK a crash can undo.
- The size classes (curb.log.sizes), which bound the reserve placements leave free for
  copies, forget an acked record only once its ACK is durable (`synced`): appends never
  take the room its copy needs.
- Compaction copies no record that lies after one whose ACK is not durable (`first`):
  the copies a crash keeps are then of records before it, and the checkpoint after the
  restart releases their originals, all before it. So the restarted log has at least
  the room it had before those copies, under a size bound that counted it: what the
  log could copy before the crash, it can copy after.
"""

from __future__ import annotations

import collections

from curb.log.checkpoints import Snapshot
from curb.log.ring import Ring
from curb.log.sizes import SizeClasses


class Dying:
    """The records whose ACK is not durable yet: where they are, and their sizes, which
    the size classes still count."""

    def __init__(self, classes: SizeClasses) -> None:
        self.classes = classes
        self.acked: list[tuple[int, int]] = []  # (offset, size) of the ACK patches the next flush writes
        self.written: collections.deque[tuple[int, list[tuple[int, int]]]] = collections.deque()  # (flush, ACKs)
        # Sizes of the retired ACKs (the oldest message held acked: the next durable
        # checkpoint retires it), in order.
        self.retired: collections.deque[int] = collections.deque()
        self.retired_counted = 0  # retired ACKs of this run a durable checkpoint counts
        self.upto = 0  # the newest ack-up-to watermark
        self.taken: collections.deque[tuple[int, int, int]] = collections.deque()  # (watermark, offset, size)

    def take_upto(self, offset: int, size: int) -> None:
        """The watermark `upto` took a held or parked record: durable with a checkpoint
        carrying it."""
        self.taken.append((self.upto, offset, size))

    def flushed(self, flush_no: int) -> None:
        """Flush `flush_no` wrote the ACK patches asked since the last one."""
        if self.acked:
            self.written.append((flush_no, self.acked))
            self.acked = []

    def synced(self, target: int, durable: Snapshot) -> None:
        """A sync covered every flush up to `target`, and `durable` is the newest durable
        checkpoint: the sizes of the ACKs durable now are forgotten."""
        remove = self.classes.remove
        written = self.written
        while written and written[0][0] <= target:
            for _, size in written.popleft()[1]:
                remove(size)
        retired = self.retired
        while retired and self.retired_counted < durable.retired:
            remove(retired.popleft())
            self.retired_counted += 1
        taken = self.taken
        while taken and taken[0][0] <= durable.acked_upto:
            remove(taken.popleft()[2])

    def pending(self) -> bool:
        """Whether an ACK is not durable yet (its sync or checkpoint is still to come)."""
        return bool(self.acked or self.written or self.retired or self.taken)

    def first(self, ring: Ring) -> int:
        """Bytes from the ring's durable tail to the nearest record whose ACK is not
        durable (0 for a retired one: it lies at that tail), the ring's capacity when
        there is none. Compaction copies nothing from there on."""
        if self.retired:
            return 0
        tail, distance = ring.tail, ring.distance
        nearest = ring.capacity
        for _, acks in self.written:
            for offset, _ in acks:
                nearest = min(nearest, distance(tail, offset))
        for offset, _ in self.acked:
            nearest = min(nearest, distance(tail, offset))
        for _, offset, _ in self.taken:
            nearest = min(nearest, distance(tail, offset))
        return nearest
