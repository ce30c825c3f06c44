"""At most one log line per interval for an event that can repeat thousands of times a
second (connections refused at the limit, accept failing at the fd limit), with a count of
how many the line stands for. Pure: the caller passes the time."""

from __future__ import annotations


class LineLimit:
    """`hit(now, times)` counts `times` occurrences (one by default); it returns how many
    occurred since the last line when a line is due (the first one at once, then one per
    `seconds`), else 0."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._last: float | None = None
        self._pending = 0

    def hit(self, now: float, times: int = 1) -> int:
        self._pending += times
        if self._last is not None and now - self._last < self.seconds:
            return 0
        self._last = now
        count, self._pending = self._pending, 0
        return count
