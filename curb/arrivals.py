"""TLS connections waiting for their handshake ("arrivals"), and how many handshakes run
at once.

A TLS handshake is the costliest step of a new connection: its key exchange and
signature, and asyncio's set-up of the TLS transport, take the loop half a millisecond
or more. In a storm (2,000 TLS clients at once) every one of them became readable in the
same few loop passes, each pass held hundreds of them, and a client already connected
waited that long for its answers. `Arrivals` lets at most `most` handshakes run at a
time; the connections behind them are accepted but wait, reading nothing (their bytes
stay in the kernel), in order of arrival, and start when a handshake ends (done, failed,
or the peer gone). So a pass holds at most `most` of those steps, and the storm is
spread over the passes after. What follows a handshake (CONNECT and its login) has its
own bounds (curb.logins), fair between addresses.

A waiting connection has no timer: its handshake timeout starts when it starts. So that
clients which never send a byte cannot hold every place until their timeouts and shut
new clients out, one more starts each `every` seconds while any wait, places or not.

Sans I/O: `arrive`, `settled` and `tick` return the starts to run, which the caller runs;
the clock is given.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

MOST_ARRIVING = 32  # TLS handshakes under way at once
TRICKLE_SECONDS = 0.05  # while any wait, one more starts this often, places or not

Start = Callable[[], None]


class Arrival:
    """One connection's place: waiting, started, or settled (its handshake over)."""

    __slots__ = ("start", "state")

    def __init__(self, start: Start):
        self.start = start
        self.state = "waiting"


class Arrivals:
    """The TLS connections arriving at one process's listeners."""

    def __init__(self, most: int = MOST_ARRIVING, every: float = TRICKLE_SECONDS):
        self.most = most
        self.every = every
        self.started = 0  # arrivals started and not settled
        self.waiting: collections.deque[Arrival] = collections.deque()
        self._next_trickle = 0.0

    def arrive(self, start: Start, now: float) -> tuple[Arrival, list[Start]]:
        """A new connection: its place, and what to start now (itself, or nothing)."""
        arrival = Arrival(start)
        self.waiting.append(arrival)
        if len(self.waiting) == 1:
            self._next_trickle = now + self.every
        return arrival, self._fill()

    def settled(self, arrival: Arrival) -> list[Start]:
        """Its handshake is over (done, failed, or the peer gone, at any step): its place is free."""
        if arrival.state == "started":
            self.started -= 1
        elif arrival.state == "waiting":
            self.waiting.remove(arrival)
        arrival.state = "settled"
        return self._fill()

    def tick(self, now: float) -> list[Start]:
        """While any wait: one more starts each `every` seconds (see the docstring)."""
        if not self.waiting or now < self._next_trickle:
            return []
        self._next_trickle = now + self.every
        return [self._begin(self.waiting.popleft())]

    @property
    def next_tick(self) -> float | None:
        """When `tick` has something to do, if anything waits."""
        return self._next_trickle if self.waiting else None

    def _fill(self) -> list[Start]:
        starts = []
        while self.waiting and self.started < self.most:
            starts.append(self._begin(self.waiting.popleft()))
        return starts

    def _begin(self, arrival: Arrival) -> Start:
        arrival.state = "started"
        self.started += 1
        return arrival.start
