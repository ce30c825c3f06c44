"""A set of message ids in sorted arrays, 8 bytes an id where a Python set or dict costs
60 to 100: recovery remembers every copy it meets (curb.log.scan), and a log can hold a
million of them.

The ids are kept in at most RUNS sorted runs (`array('q')`) and a `loose` set. `add`
appends an id to the run whose last id is the highest below it, so ids that come in
rising order, or as a few interleaved rising streams (what burials and compaction write),
cost an append each. An id below the last of every run starts a new run while there are
fewer than RUNS, else goes to `loose`; once `loose` holds more than a quarter of the ids
(and at least LOOSE), everything is merged into one run, streaming (no list of every id
at once). The merges grow geometrically, so n ids in the worst order cost O(n log n) and
at most about 23 bytes each.

Invariants:
- Every run is sorted ascending, and the runs are ordered by their last ids, strictly
  ascending: an id joins the run with the highest last below it, which therefore stays
  below the next run's last.
- Every id of `loose` is below the last id of every run (it went there for that reason,
  and last ids only rise), so an id above the last run's last is new.
- Each id is held once: `add` looks before it adds.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left

RUNS = 8
LOOSE = 4096


class IdSet:
    """Message ids, added one at a time and asked about (no removal)."""

    __slots__ = ("loose", "runs", "size")

    def __init__(self) -> None:
        self.runs: list[array[int]] = []
        self.loose: set[int] = set()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, mid: int) -> bool:
        if mid in self.loose:
            return True
        # (Runs interleave: more than one run's span may hold `mid`.)
        return any(run[0] <= mid <= run[-1] and run[bisect_left(run, mid)] == mid for run in self.runs)

    @property
    def high(self) -> int:
        """The highest id held (0 if none): every id of `loose` is below it."""
        return self.runs[-1][-1] if self.runs else 0

    def extend_above(self, ids: list[int]) -> None:
        """Add ids that rise and lie above every id held (`high`), in one go."""
        if not ids:
            return
        if self.runs:
            self.runs[-1].extend(ids)
        else:
            self.runs.append(array("q", ids))
        self.size += len(ids)

    def add(self, mid: int) -> bool:
        """Add `mid`; False if it was there already."""
        runs = self.runs
        if runs and mid > runs[-1][-1]:
            runs[-1].append(mid)  # the common case: above every id so far
        elif not runs:
            runs.append(array("q", [mid]))
        elif mid in self:
            return False
        else:
            at = len(runs) - 1
            while at >= 0 and runs[at][-1] > mid:
                at -= 1
            if at >= 0:
                runs[at].append(mid)
            elif len(runs) < RUNS:
                runs.insert(0, array("q", [mid]))
            else:
                self.loose.add(mid)
                if len(self.loose) > max(LOOSE, self.size // 4):
                    self._merge()
        self.size += 1
        return True

    def _merge(self) -> None:
        """One run of every id (the loose ones sorted first: they are the fewer)."""
        merged = array("q", heapq.merge(*self.runs, sorted(self.loose)))
        self.runs = [merged]
        self.loose = set()
