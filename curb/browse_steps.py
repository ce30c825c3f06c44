"""Browses (SUBSCRIBE with browser:true, and of `./dead`) stepped a bounded number of
bytes per loop pass for each session that can take output, so that a browse of any length
holds only its window in memory and respects the session's flow control as deliveries do.

Sessions are served in the order they came (a dict, not a set: the order a pass serves
them in must not depend on where objects live).

Invariant: no browse is stepped once the log failed (`halted`). A failed write leaves the
log's memory naming records that never reached the disk (a copy the index points to, a
head not yet moved past it), so a browse read then could miss live messages and still
send its end marker; it is left open instead, and ends without one when its connection
closes as the broker stops.
"""

from __future__ import annotations

from collections.abc import Callable

from curb.peer import Peer

BROWSE_STEP_BYTES = 256 * 1024  # a browse's output per session per loop pass
Schedule = Callable[[float, Callable[[], None]], object]


class BrowseSteps:
    """The sessions with a browse open, and the loop passes that step them."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.sessions: dict[Peer, None] = {}
        self._scheduled = False
        self.halted = False  # the log failed: no browse is stepped again

    def add(self, session: Peer) -> None:
        self.sessions[session] = None
        self.want()

    def want(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.schedule(0, self._step)

    def _step(self) -> None:
        """One step of every browse whose session can take output; again next loop pass
        while some could go on (those waiting for writes go on from the broker's pump)."""
        self._scheduled = False
        if self.halted:
            return
        again = False
        for session in list(self.sessions):
            if not session.writable:
                continue
            more = session.browse_more(BROWSE_STEP_BYTES)
            if not session.browsing:
                self.sessions.pop(session, None)
            again = again or more
        if again:
            self.want()
