"""A bounded queue of work from many sources, served in turn across the sources.

Password checks wait here (curb.logins) by source address, so that one address sending
logins by the hundred delays another's by one check at most, and cannot fill the queue.

Invariants:
- `take` serves the sources round-robin: a source is served again only after every source
  that had items waiting at its turn was served once; within a source, oldest first.
- At most `per_source` items of one source and `total` in all. `put` past a bound sheds
  one item and returns it: the new one when its source is at `per_source`, or when the
  queue is full and no source holds at least two more than the new item's; otherwise the
  newest item of the source that holds the most, so a full queue is shared out evenly.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, per_source: int, total: int):
        self.per_source = per_source
        self.total = total
        # Sources with items waiting, in the order of their turns.
        self._turns: collections.OrderedDict[str, collections.deque[T]] = collections.OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def held(self, source: str) -> int:
        """How many items of `source` wait."""
        waiting = self._turns.get(source)
        return len(waiting) if waiting is not None else 0

    def put(self, source: str, item: T) -> T | None:
        """Queue `item` for `source`; returns the item shed to keep the bounds, or None."""
        held = self.held(source)
        if held >= self.per_source:
            return item
        shed: T | None = None
        if self._size >= self.total:
            fullest = max(self._turns.values(), key=len)
            if len(fullest) < held + 2:
                return item
            shed = fullest.pop()
            self._size -= 1
        self._turns.setdefault(source, collections.deque()).append(item)
        self._size += 1
        return shed

    def take(self) -> T | None:
        """The next item: the oldest of the source whose turn it is; None when empty."""
        if not self._turns:
            return None
        source, waiting = self._turns.popitem(last=False)
        item = waiting.popleft()
        self._size -= 1
        if waiting:
            self._turns[source] = waiting  # to the back of the line
        return item

    def remove(self, source: str, item: T) -> bool:
        """Take `item` out of the queue (no one waits for it any more); False if not there."""
        waiting = self._turns.get(source)
        if waiting is None or item not in waiting:
            return False
        waiting.remove(item)
        self._size -= 1
        if not waiting:
            del self._turns[source]
        return True
