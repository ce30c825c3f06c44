"""The asyncio side of the broker for TCP and TLS: bytes between sockets and sessions.

Each accepted connection gets a `curb.session.Session`, which holds every rule; this
module only feeds it the bytes received, writes what it has to send (once per loop pass,
when the Broker gathers the output), applies what it asks of the transport (close, stop
reading) and arms its timer (CONNECT timeout, refusal delay, heart-beats). Over TLS the
transport is asyncio's, and a verified client certificate's CN is the session's identity.

Connection limit: past `broker.max_connections` open sessions a new connection is closed
at once (Broker.admit says so, rate-limited), before it costs a session.

Flow control: the transport's unsent output has a high-water mark. Above it, asyncio
calls `pause_writing`; the session then stops making output for the peer and the peer's
bytes are no longer read, since their answers could not be written either. So a client
that does not read costs the broker at most about the mark plus one pass's output.
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from curb.broker import Broker
from curb.session import Session
from curb.tls import peer_name

__all__ = ["WRITE_HIGH_WATER", "Broker", "Connection"]

WRITE_HIGH_WATER = 256 * 1024


class Connection(asyncio.Protocol):
    """One TCP connection: its transport and its session."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.session: Session  # set by connection_made, before any other call
        self.transport: asyncio.Transport
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._reading = True
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server (create_server) hands its protocols a Transport.
        self.transport = cast(asyncio.Transport, transport)
        if not self.broker.admit(self._loop.time()):
            self._refused = True
            self.transport.abort()
            return
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "local")
        identity = peer_name(transport.get_extra_info("peercert"))
        self.session = Session(self.broker, self._loop.time(), name, identity)
        self.session.on_output = self._output
        self._arm()

    def data_received(self, data: bytes) -> None:
        session = self.session
        session.receive_data(data, self._loop.time())
        deadline = session.next_deadline
        # A timer that fires early only checks and re-arms; one armed too late is re-armed.
        if deadline is not None and (self._timer is None or deadline < self._timer.when()):
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.session.connection_lost()

    def pause_writing(self) -> None:
        self.session.set_writable(False)
        self._apply_reading()

    def resume_writing(self) -> None:
        self.session.set_writable(True)
        self._apply_reading()

    def _output(self) -> None:
        """The session has output or an event: write, then do what it asks."""
        session, transport = self.session, self.transport
        if transport.is_closing():
            session.discard_output()
            return
        data = session.data_to_send(self._loop.time())
        if data:
            transport.write(data)
        if session.close_wanted is not None:
            if session.close_wanted == "abort":
                transport.abort()
            else:
                transport.close()
            return
        if session.reading != self._reading:
            self._apply_reading()

    def _apply_reading(self) -> None:
        reading = self.session.reading
        if reading != self._reading and not self.transport.is_closing():
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadline = self.session.next_deadline
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.session.tick(self._loop.time())
        if not self.transport.is_closing():
            self._arm()
