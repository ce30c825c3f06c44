"""Where records go in the ring: pure arithmetic over offsets, no I/O.

The ring is the file from RING_START to `end`. Records are written at `head` and the
live region runs from `tail` (the oldest byte the last *synced* checkpoint still names)
forward to `head`, wrapping at the end of the file. A lap ends with a pad record, so a
record never straddles the end; the bytes after a pad are unused until the next lap.

Invariants kept here:
- head == tail means the region is empty; a placement never makes the head meet the
  tail, so a full ring is never mistaken for an empty one.
- head + PAD_SIZE <= end always, so there is room for the pad that ends a lap.
- Bytes in [tail, head) are never handed out for writing: space is reused only once a
  synced checkpoint has moved `tail` past it (the log moves `tail`, nobody else).
- Copies need contiguous room: free bytes split between the end of a lap and the start of
  the next may hold no copy of a large record. `clears` answers, without writing, whether
  copying the records that pin the region (held and parked: curb.log.cursor's
  `pinning`, the order compaction copies in) one by one can free a given number of
  bytes at all.
- A copy goes only where `copy_spot` says: compaction and admission's walk (`clears`)
  ask the same rule, so admission never counts on a copy that compaction would not make.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from curb.log.record import PAD_SIZE, RING_START


@dataclass(slots=True)
class Ring:
    """The ring's extent and its durable region [tail, head)."""

    end: int
    head: int
    tail: int

    @property
    def capacity(self) -> int:
        return self.end - RING_START

    def distance(self, a: int, b: int) -> int:
        """Bytes from offset a forward to offset b, wrapping at the end."""
        return b - a if b >= a else (self.end - a) + (b - RING_START)

    def free(self) -> int:
        """Bytes not in the durable region (some may be unusable, after a pad)."""
        head, tail = self.head, self.tail
        return tail - head if head < tail else self.end - RING_START - (head - tail)

    def place(self, size: int) -> tuple[int, bool] | None:
        """(offset, wraps) for a record of `size` bytes at the head, or None while the
        durable region leaves no room. `wraps` means a pad must be written at the current
        head first and the record goes to RING_START."""
        head, tail = self.head, self.tail
        if head >= tail:
            if head + size + PAD_SIZE <= self.end:
                return head, False
            if RING_START + size < tail:
                return RING_START, True
            return None
        if head + size < tail:
            return head, False
        return None

    def copy_spot(self, size: int, keep: int = 0) -> tuple[int, bool] | None:
        """Where compaction may copy a held record of `size` bytes now (as `place`), if
        that leaves `keep` free bytes and a pad's worth besides; None otherwise."""
        spot = self.place(size)
        if spot is None or self.free() - size - PAD_SIZE < keep:
            return None
        return spot

    def clears(self, held: Iterable[tuple[int, int]], rest: int, want: int) -> bool:
        """Whether compaction can free `want` bytes: `held` are the (offset, size) of the
        held records that pin the region, oldest first, and `rest` is where the region
        would start with none of them. Each copy goes to the head, after a checkpoint has
        released every byte before the record it copies; a copy with no contiguous room
        ends the walk."""
        ring = Ring(self.end, self.head, self.tail)
        for offset, size in held:
            ring.tail = offset
            if ring.free() >= want:
                return True
            spot = ring.copy_spot(size)
            if spot is None:
                return False
            ring.head = spot[0] + size
        ring.tail = rest
        return ring.free() >= want
