"""A loop pass's work, batched: a connection's frames of one read go to the log together,
and every connection's output of the pass leaves in one write.

Invariant: between `before_frames` and `after_frames` (one call of the session that reads
a connection's bytes) the log holds its flush, and no output is scheduled on its own; the
pass writes the log, delivers, then hands each connection its output once (`flush_out`),
so an answer never leaves before the log write it depends on was asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from curb.peer import Peer

Schedule = Callable[[float, Callable[[], None]], object]


class Flushed(Protocol):
    """What the pass needs of the log: its writes held until the frames are handled."""

    hold_flush: bool

    def flush(self) -> None: ...


class LoopPass:
    """Output gathered per loop pass, and the pump that follows it."""

    def __init__(self, log: Flushed, pump: Callable[[], None], schedule: Schedule):
        self.log = log
        self.pump = pump
        self.schedule = schedule
        self._dirty: list[Peer] = []
        self._flushing = False  # in flush_out, which pumps after the sessions' output
        self._in_frames = False  # between before_frames and after_frames: flush_out follows
        self._pump_wanted = False

    def before_frames(self) -> None:
        """A connection's frames are about to be handled, and `after_frames` follows in
        the same call (the session makes sure): until then, what they ask of the log and
        the output they make wait for it, with no loop callback of their own."""
        self._in_frames = True
        self.log.hold_flush = True

    def after_frames(self) -> None:
        """A connection's frames are handled: write them to the log, deliver what can
        be delivered, and send the answers, all in this loop pass."""
        self.log.hold_flush = False
        try:
            self.log.flush()
            self.pump()
        finally:
            self._in_frames = False
        self.flush_out()

    def want_flush(self, session: Peer) -> None:
        """Gather every connection's output of this loop pass into one write each."""
        if not self._dirty and not self._in_frames:
            self.schedule(0, self.flush_out)
        self._dirty.append(session)

    def want_pump(self) -> None:
        """Credit came free (a transport took an auto subscription's messages): pump once
        the pass's output is out, in this pass."""
        if not self._pump_wanted:
            self._pump_wanted = True
            if not self._flushing:  # a transport that drained took it: pump in this pass
                self.schedule(0, self.flush_out)

    def flush_out(self) -> None:
        dirty, self._dirty = self._dirty, []
        self._flushing = True
        try:
            for session in dirty:
                session.output_due()
        finally:
            self._flushing = False
        if self._pump_wanted:
            self._pump_wanted = False
            self.pump()
