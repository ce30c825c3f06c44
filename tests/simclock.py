"""A clock that tests move by hand, with the `time` and `call_at` of an event loop
(curb.broker.Loop): timers fire, in time order, only when `fire_due` is called at or
after their time. It is a wall clock too (`wall_ms`, for the log's due and expiry
times): WALL_START_MS at time 0, moving with it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class SimTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback = when, callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


WALL_START_MS = 1_800_000_000_000


class SimClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self._timers: list[tuple[float, int, SimTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        """The same time as a wall clock in epoch milliseconds (the log's send stamps, due
        and expiry times): WALL_START_MS at time 0."""
        return WALL_START_MS + round(self.now * 1000)

    def call_at(self, when: float, callback: Callable[[], None]) -> SimTimer:
        timer = SimTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def cancel_all(self) -> None:
        """Every timer armed so far is gone: the process that armed them died."""
        for _, _, timer in self._timers:
            timer.cancel()
        self._timers.clear()

    @property
    def armed(self) -> list[float]:
        """When the timers not yet fired or cancelled are due, soonest first."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)

    def fire_due(self, limit: int | None = None) -> int:
        """Run every timer due by now (and those they arm that are due too), or at most
        `limit` of them (so that a timer re-arming itself for now cannot spin the caller
        forever); how many ran."""
        ran = 0
        while self._timers and self._timers[0][0] <= self.now and (limit is None or ran < limit):
            timer = heapq.heappop(self._timers)[2]
            if not timer.cancelled:
                timer.callback()
                ran += 1
        return ran
