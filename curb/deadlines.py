"""A connection's deadlines, as data: when its session must next be looked at
(`next_deadline`), and what is done then (`tick`). No clock of its own: times are given.

- A connection that has not sent CONNECT by `broker.config.connect_timeout` seconds after it
  opened is answered with an ERROR and closed (not while a login check holds its frames).
- A failed login is answered "access refused" at the time curb.access set
  (`Login.refusing_at`), the same delay after CONNECT for every failure.
- Once connected, heart-beats as negotiated at CONNECT (curb.heartbeat): our beat goes a
  little before it is due (BEAT_EARLY), so it is never late, and a peer silent past its
  tolerance is dropped (an abort: its messages are redelivered).

Bytes in and out only ever move a deadline later; it can come sooner only when
`Conn.deadlines` changes (heart-beats agreed, a refusal due), so a transport re-reads
it then, and after each `tick`.
"""

from __future__ import annotations

from curb import access, heartbeat
from curb.conn import NEW, Conn
from curb.frame import encode

BEAT_EARLY = 0.9


def next_deadline(session: Conn) -> float | None:
    """When `tick` has something to check, or None while there is nothing to time."""
    if session.login.refusing_at is not None:
        return session.login.refusing_at
    if session.state is NEW:
        timeout = session.broker.config.connect_timeout
        return session.opened_at + timeout if timeout else None
    deadline = None
    if session.beats.send_every:
        deadline = session.beats.last_send + session.beats.send_every * BEAT_EARLY
    if session.beats.expect_every:
        silent = session.beats.last_recv + heartbeat.tolerance(session.beats.expect_every)
        deadline = silent if deadline is None else min(deadline, silent)
    return deadline


def tick(session: Conn, now: float) -> None:
    """A deadline came: refuse a failed CONNECT, drop a peer that never sent CONNECT or
    fell silent, or send a beat."""
    broker = session.broker
    if session.login.refusing_at is not None:
        if now >= session.login.refusing_at:
            session.login.refusing_at = None
            session.say_and_close(access.ACCESS_REFUSED)
        return
    if session.state is NEW:
        timeout = broker.config.connect_timeout
        if session.login.held is None and timeout and now >= session.opened_at + timeout:
            broker.refusals.connect_timed_out(session, timeout, now)
            session.end_with(
                encode(
                    "ERROR",
                    {"message": "CONNECT timeout", "content-type": "text/plain"},
                    f"Send CONNECT within {timeout:g} s of connecting.\n".encode(),
                )
            )
        return
    if session.beats.expect_every and now - session.beats.last_recv > heartbeat.tolerance(session.beats.expect_every):
        broker.refusals.events("heartbeat_timeout", f"no heart-beat from {session.peer}; closing", peer=session.peer)
        session.abort()
        return
    if session.beats.send_every and now - session.beats.last_send >= session.beats.send_every * BEAT_EARLY:
        session.beats.last_send = now
        session.write(b"\n")
