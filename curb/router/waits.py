"""One client's frames forwarded with the router's receipts, and the RECEIPTs that wait
for them: a router session's `durability` (curb.backend).

Invariant: a waiter registered after the frames numbered up to N were forwarded is
answered only once each of them is answered by its instance, in the order the waiters
came; with `Unconfirmed` (a RECEIPT with `curb-late:true`, which promises nothing) when
one of them was lost with its link before its answer, so whether it took effect cannot
be known. A SEND lost so is no such frame: it is forwarded again (curb.router.core) and
stays open until an instance answers it or it is refused.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from curb.receipts import Done, Unconfirmed


@dataclass(slots=True)
class _Waiter:
    upto: int  # it waits for the frames numbered up to this
    done: Done
    lost: str | None = None  # why one of them was lost, if one was


class Waits:
    """Open forwarded frames by number, and the waiters behind them."""

    __slots__ = ("_low", "_open", "_waiters", "seq")

    def __init__(self) -> None:
        self.seq = 0  # frames forwarded so far
        self._open: set[int] = set()  # their numbers that wait for an answer
        self._low = 1  # no number below it is open
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def forwarded(self) -> int:
        """A frame is forwarded with a receipt: its number."""
        self.seq += 1
        self._open.add(self.seq)
        return self.seq

    def answered(self, number: int, lost: str | None = None) -> None:
        """Its instance answered it, or (`lost`, why) can no longer answer."""
        self._open.discard(number)
        if lost is not None:
            for waiter in self._waiters:
                if number <= waiter.upto and waiter.lost is None:
                    waiter.lost = lost
        self._fire()

    def wait(self, done: Done) -> None:
        """done(None) once every frame forwarded so far is answered (see the docstring)."""
        if not self._open and not self._waiters:
            done(None)
            return
        self._waiters.append(_Waiter(self.seq, done))
        self._fire()

    def _fire(self) -> None:
        waiters = self._waiters
        if not waiters:
            return
        first, open_ = self._low, self._open
        while first <= self.seq and first not in open_:
            first += 1
        self._low = first
        while waiters and waiters[0].upto < first:
            waiter = waiters.popleft()
            waiter.done(None if waiter.lost is None else Unconfirmed(waiter.lost))
