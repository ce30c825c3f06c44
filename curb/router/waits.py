"""One client's frames forwarded with the router's receipts, and the RECEIPTs that wait
for them: a router session's `durability` (curb.backend).

Invariant: a waiter registered after the frames numbered up to N were forwarded is
answered only once each of them is answered by its instance, in the order the waiters
came; with `Unconfirmed` (a RECEIPT with `curb-unconfirmed:true`, which promises
nothing) when one of them was lost with its link before its answer, so whether it took
effect cannot be known; with a `Refusal` (an ERROR in the waiter's place, no RECEIPT)
when one of them failed, a SEND refused or never stored: a RECEIPT promises every
earlier SEND of its connection, so none may leave after one failed. A SEND lost with its link is neither: it
is forwarded again (curb.router.core) and stays open until an instance answers it or it
is refused.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from curb.outcomes import Refusal, Unconfirmed
from curb.receipts import Done

_EARLIER = (
    "A frame this connection sent before this one failed ({why}), so this RECEIPT, which would promise "
    "it, is not given: reconnect, and send again what was not confirmed."
)


@dataclass(slots=True)
class _Waiter:
    upto: int  # it waits for the frames numbered up to this
    done: Done
    lost: str | None = None  # why one of them was lost, if one was
    failed: str | None = None  # why one of them failed, if one did
    minds_lost: bool = True  # False: a SEND's RECEIPT, which promises only the SENDs before it


class Waits:
    """Open forwarded frames by number, and the waiters behind them."""

    __slots__ = ("_failed", "_low", "_open", "_waiters", "seq")

    def __init__(self) -> None:
        self.seq = 0  # frames forwarded so far
        self._open: set[int] = set()  # their numbers that wait for an answer
        self._low = 1  # no number below it is open
        self._waiters: list[_Waiter] = []  # by `upto`
        self._failed: tuple[int, str] | None = None  # the first frame that failed, and why

    def forwarded(self) -> int:
        """A frame is forwarded with a receipt: its number."""
        self.seq += 1
        self._open.add(self.seq)
        return self.seq

    def answered(self, number: int, lost: str | None = None, failed: str | None = None) -> None:
        """Its instance answered it, or (`lost`, why) can no longer answer, or it failed
        (`failed`, why)."""
        self._open.discard(number)
        if failed is not None and (self._failed is None or number < self._failed[0]):
            self._failed = (number, failed)
        if lost is not None or failed is not None:
            for waiter in self._waiters:
                if number <= waiter.upto:
                    waiter.lost = waiter.lost or lost
                    waiter.failed = waiter.failed or failed
        self._fire()

    def wait(self, done: Done) -> None:
        """done(None) once every frame forwarded so far is answered (see the docstring)."""
        self.wait_upto(self.seq, done)

    def wait_upto(self, number: int, done: Done, minds_lost: bool = True) -> None:
        """done(None) once every frame numbered up to `number` is answered: a SEND's
        RECEIPT promises the SENDs of its connection before it too. A SEND lost with its
        link is placed again, never lost here, so a SEND's RECEIPT (`minds_lost` False)
        does not mind an ACK or NACK lost before it."""
        failed = self._failed
        # The common case: all of them answered, in order, and none failed.
        if (failed is None or failed[0] > number) and self._advance() > number:
            done(None)
            return
        waiter = _Waiter(number, done, minds_lost=minds_lost)
        if failed is not None and failed[0] <= number:
            waiter.failed = failed[1]  # it can only fail: the session is ending
        bisect.insort(self._waiters, waiter, key=lambda each: each.upto)
        self._fire()

    def _advance(self) -> int:
        """The lowest number still open (seq + 1 when none is), found from the last one."""
        low, open_, seq = self._low, self._open, self.seq
        while low <= seq and low not in open_:
            low += 1
        self._low = low
        return low

    def _fire(self) -> None:
        waiters = self._waiters
        if not waiters:
            return
        first = self._advance()
        while waiters and waiters[0].upto < first:
            waiter = waiters.pop(0)
            if waiter.failed is not None:
                waiter.done(Refusal("an earlier frame failed", _EARLIER.format(why=waiter.failed)))
            else:
                lost = waiter.lost if waiter.minds_lost else None
                waiter.done(None if lost is None else Unconfirmed(lost))
