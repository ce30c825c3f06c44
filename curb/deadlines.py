"""A connection's deadlines, as data: when its session must next be looked at
(`next_deadline`), and what is done then (`tick`). No clock of its own: times are given.

- A connection that has not sent CONNECT by `broker.config.connect_timeout` seconds after it
  opened is answered with an ERROR and closed (not while a login check holds its frames).
- A failed login is answered "access refused" at the time curb.access set
  (`Session.refusing_at`), the same delay after CONNECT for every failure.
- Once connected, heart-beats as negotiated at CONNECT (curb.heartbeat): our beat goes a
  little before it is due (BEAT_EARLY), so it is never late, and a peer silent past its
  tolerance is dropped (an abort: its messages are redelivered).

Bytes in and out only ever move a deadline later; it can come sooner only when
`Session.deadlines` changes (heart-beats agreed, a refusal due), so a transport re-reads
it then, and after each `tick`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from curb import access, heartbeat
from curb.access import NEW
from curb.frame import encode

if TYPE_CHECKING:
    from curb.session import Session

BEAT_EARLY = 0.9


def next_deadline(session: Session) -> float | None:
    """When `tick` has something to check, or None while there is nothing to time."""
    if session.refusing_at is not None:
        return session.refusing_at
    if session.state is NEW:
        timeout = session.broker.config.connect_timeout
        return session.opened_at + timeout if timeout else None
    deadline = None
    if session.send_every:
        deadline = session.last_send + session.send_every * BEAT_EARLY
    if session.expect_every:
        silent = session.last_recv + heartbeat.tolerance(session.expect_every)
        deadline = silent if deadline is None else min(deadline, silent)
    return deadline


def tick(session: Session, now: float) -> None:
    """A deadline came: refuse a failed CONNECT, drop a peer that never sent CONNECT or
    fell silent, or send a beat."""
    broker = session.broker
    if session.refusing_at is not None:
        if now >= session.refusing_at:
            session.refusing_at = None
            session.say_and_close(access.ACCESS_REFUSED)
        return
    if session.state is NEW:
        timeout = broker.config.connect_timeout
        if session.held is None and timeout and now >= session.opened_at + timeout:
            broker.refusals.connect_timed_out(session, timeout, now)
            session.end_with(
                encode(
                    "ERROR",
                    {"message": "CONNECT timeout", "content-type": "text/plain"},
                    f"Send CONNECT within {timeout:g} s of connecting.\n".encode(),
                )
            )
        return
    if session.expect_every and now - session.last_recv > heartbeat.tolerance(session.expect_every):
        broker.refusals.events("heartbeat_timeout", f"no heart-beat from {session.peer}; closing", peer=session.peer)
        session.abort()
        return
    if session.send_every and now - session.last_send >= session.send_every * BEAT_EARLY:
        session.last_send = now
        session.write(b"\n")
