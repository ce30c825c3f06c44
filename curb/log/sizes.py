"""How large the largest live record may be, without an index of the records.

Compaction must be able to copy any record that a consumer may come to hold, so the
log needs a bound on the largest live record at every append. Counting records by
size class (bit length and the two bits below the top one) gives a bound at most a
quarter above the truth in constant memory; the highest non-empty class and its bound
are tracked as counts change, so asking costs nothing on the hot path.
"""

from __future__ import annotations

CLASSES = 4 * 64 + 4


def size_class(size: int) -> int:
    """A record size's class; `class_bound` of it is at most a quarter above the size."""
    bits = size.bit_length()
    if bits < 3:
        return bits
    return bits << 2 | (size >> (bits - 3)) & 3


def class_bound(cls: int) -> int:
    """The largest size in a class."""
    if cls < 3:
        return (1 << cls) - 1
    bits, sub = cls >> 2, cls & 3
    return ((5 + sub) << (bits - 3)) - 1


class SizeClasses:
    """Counts of records by size class, the highest class in use and `largest`, an
    upper bound of the largest size counted (0 when none is)."""

    __slots__ = ("counts", "largest", "top", "total")

    def __init__(self) -> None:
        self.counts = [0] * CLASSES
        self.top = 0
        self.total = 0
        self.largest = 0

    def add(self, size: int, n: int = 1) -> None:
        cls = size_class(size)
        self.counts[cls] += n
        self.total += n
        if cls > self.top:
            self.top = cls
            self.largest = class_bound(cls)

    def remove(self, size: int) -> None:
        """Forget one record of `size` (never below zero: a count that damage made
        wrong only ever errs high). The highest class in use is found again only when
        its last record goes, and at once when none is left (a queue kept empty)."""
        cls = size_class(size)
        counts = self.counts
        if counts[cls] > 0:
            counts[cls] -= 1
            self.total -= 1
        if not self.total:
            self.top = self.largest = 0
            return
        if counts[self.top]:
            return
        while self.top and counts[self.top] == 0:
            self.top -= 1
        self.largest = class_bound(self.top) if counts[self.top] else 0

    def clear(self) -> None:
        self.counts = [0] * CLASSES
        self.top = self.largest = 0
        self.total = 0
