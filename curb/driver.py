"""One STOMP connection on the event loop, whatever carries its bytes: TCP, TLS or WebSocket.

The session (curb.session) holds every rule and no I/O; a front is a short adapter that
owns the socket or the WebSocket. Between them, this driver does what is the same for
every front: it feeds the session the bytes received, hands the adapter the output while
the adapter can take it, turns the session's wishes into the adapter's reading on or off
and its close, and arms the session's one timer (CONNECT timeout, refusal delay,
heart-beats) on the loop.

An adapter (a `Link`) gives the driver five things and calls it back at four points:

- bytes in: `Driver.received(data)` for whatever came (any split: the session's parser
  reassembles frames);
- bytes out: the driver calls `link.write(piece)`. When the link cannot send all of it at
  once it calls `Driver.pause_writing()` (from inside `write` or later), and
  `Driver.resume_writing()` once everything is sent. The driver writes only while the
  link is not paused, so a link holds at most one piece besides what it is sending;
- reading: `link.pause_reading()` / `link.resume_reading()`, while the session's unsent
  output is past its bound or it waits for a login check;
- closing: once the session's last bytes (an ERROR, a DISCONNECT's RECEIPT) are written,
  `link.finish()`: close gracefully (TCP: half-close and linger, so the peer reads the
  ERROR; WebSocket: a close frame); `link.abort()` for a lost heart-beat or refusal;
  and `link.is_closing()`. The link calls `Driver.lost()` once the connection is gone.

With `framed=True` (WebSocket: one STOMP frame per message, as Web-STOMP sends) each
`write` is one whole frame, heart-beats included; otherwise pieces are cut and joined
for the socket (curb.output.PIECE_BYTES).

Deadlines: bytes in and out only move the session's deadline later, so after them the
timer is re-armed only when `session.deadlines` says a sooner one may have come; a timer
that fires early just checks and re-arms.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from curb.backend import Backend
from curb.output import Piece
from curb.session import Session


class Link(Protocol):
    """What a front gives the driver (see the module docstring)."""

    def write(self, data: Piece) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def finish(self) -> None: ...
    def abort(self) -> None: ...
    def is_closing(self) -> bool: ...


class Driver:
    """One connection's session, its timer and its flow control, for one Link."""

    def __init__(
        self,
        broker: Backend,
        link: Link,
        peer: str,
        identity: str | None = None,
        framed: bool = False,
    ):
        self.link = link
        self._loop = asyncio.get_running_loop()
        self._framed = framed
        self._timer: asyncio.TimerHandle | None = None
        self._deadlines = 0  # the session's `deadlines` when the timer was last armed
        self._reading = True
        self._can_write = True  # the link has sent everything it was given
        self._done = False  # the link is finishing or gone: nothing more in or out
        self.session = Session(broker, self._loop.time(), peer, identity, framed=framed)
        self.session.on_output = self._output
        self._arm()

    # ---------------------------------------------------------------- the link's calls

    def received(self, data: bytes) -> None:
        if self._done:
            return
        session = self.session
        session.receive_data(data, self._loop.time())
        if session.deadlines != self._deadlines:
            self._arm_if_sooner()

    def lost(self) -> None:
        """The connection is gone (the peer, an abort, or the end of a finish)."""
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.session.connection_lost()

    def pause_writing(self) -> None:
        self._can_write = False
        self.session.set_writable(False)

    def resume_writing(self) -> None:
        self._can_write = True
        self.session.set_writable(True)
        self._output()

    # ---------------------------------------------------------------- the session's wishes

    def _output(self) -> None:
        """The session has output or an event: write, then do what it asks."""
        session, link = self.session, self.link
        if self._done or link.is_closing():
            session.discard_output()
            return
        if session.close_wanted == "abort":
            link.abort()
            return
        now = self._loop.time()
        take = session.next_frame if self._framed else session.next_output
        if session.close_wanted is not None:
            while (piece := take(now)) is not None:  # bounded by the session's output limit
                link.write(piece)
            self._finish()
            return
        while self._can_write and (piece := take(now)) is not None:
            link.write(piece)  # pause_writing runs in here if the link took less
        if session.reading != self._reading:
            self._apply_reading()
        if session.deadlines != self._deadlines:
            self._arm_if_sooner()

    def _finish(self) -> None:
        """What ends the connection is written: done with STOMP (its wip is rdy again now,
        not after the link's goodbye), and the link closes gracefully."""
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.session.connection_lost()
        self.link.finish()

    def _apply_reading(self) -> None:
        reading = self.session.reading
        if reading != self._reading and not self.link.is_closing():
            self._reading = reading
            if reading:
                self.link.resume_reading()
            else:
                self.link.pause_reading()

    def _arm_if_sooner(self) -> None:
        """A timer that fires early only checks and re-arms; one armed too late is re-armed."""
        self._deadlines = self.session.deadlines
        deadline = self.session.next_deadline
        if deadline is not None and (self._timer is None or deadline < self._timer.when()):
            self._arm()

    def _arm(self) -> None:
        if self._done:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._deadlines = self.session.deadlines
        deadline = self.session.next_deadline
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.session.tick(self._loop.time())
        if not self.link.is_closing():
            self._arm()
