"""The asyncio side of the broker for TCP and TLS: bytes between sockets and sessions.

Each accepted connection gets a `curb.session.Session`, which holds every rule; this
module only feeds it the bytes received, writes what it has to send (once per loop pass,
when the Broker gathers the output), applies what it asks of the transport (close, stop
reading) and arms its timer (CONNECT timeout, refusal delay, heart-beats). Over TLS the
transport is asyncio's, and a verified client certificate's CN is the session's identity.

TLS: the listener accepts plain TCP and `Handshake` runs the server's handshake itself
(`loop.start_tls`), because asyncio tells no one of a failed one (it is an OSError, which
its loop does not log, and a listener's protocol only ever hears of a handshake that
succeeded). So every failure is one `Broker.tls_failed` call naming the peer and why;
on success the TLS transport, and the bytes that came with the handshake's last flight,
go to a Connection.

Closing after an ERROR (or a DISCONNECT): the socket is shut for writing once the output
is written and the peer's further bytes are read and dropped for up to LINGER_SECONDS
(over TLS: close_notify, and the TCP connection aborted after LINGER_SECONDS). A
plain close with unread input would send a TCP reset, and the peer's system may then
discard the ERROR before the client reads it (a producer still sending, for example).
The session asks for the close only once its ERROR (or a DISCONNECT's RECEIPT) is in
its output, after the receipts it owes (curb.session), so the close never overtakes them.

Connection limit: past `broker.max_connections` open sessions (and TLS handshakes under
way) a new connection is closed at once (Broker.admit says so, rate-limited), before it
costs a session or a handshake.

Flow control: the session holds the output (curb.session bounds it by bytes) and this
module hands it to the transport piece by piece, only while the transport's own buffer
is empty: its high-water mark is 0, so asyncio calls `pause_writing` as soon as a write
leaves bytes the socket did not take, and `resume_writing` once they are all sent. The
transport therefore copies at most the unsent rest of one piece, and never moves a
backlog around; the session stops making messages for a paused transport, and stops
reading the peer once its own unsent output passes its bound. A session that closes
hands its remaining output over at once (bounded by the same limit), then lingers.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import cast

from curb.broker import Broker
from curb.session import Session
from curb.tls import handshake_failure, peer_name

__all__ = ["Broker", "Connection", "Handshake"]

LINGER_SECONDS = 1.0


class Connection(asyncio.Protocol):
    """One TCP connection: its transport and its session."""

    def __init__(self, broker: Broker, admitted: bool = False):
        self.broker = broker
        self._admitted = admitted  # by the Handshake before it: not asked again
        self.session: Session  # set by connection_made, before any other call
        self.transport: asyncio.Transport
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._deadlines = 0  # the session's `deadlines` when the timer was last armed
        self._reading = True
        self._can_write = True  # the transport's buffer is empty
        self._refused = False
        self._lingering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server (create_server) hands its protocols a Transport.
        self.transport = cast(asyncio.Transport, transport)
        name = peer_address(transport)
        if not self._admitted and not self.broker.admit(self._loop.time(), name):
            self._refused = True
            self.transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Pause as soon as anything is left unsent: asyncio's TCP transport pauses above
        # its mark, its TLS transport at or above it.
        tls = transport.get_extra_info("ssl_object") is not None
        self.transport.set_write_buffer_limits(high=1 if tls else 0)
        identity = peer_name(transport.get_extra_info("peercert"))
        self.session = Session(self.broker, self._loop.time(), name, identity)
        self.session.on_output = self._output
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        session = self.session
        session.receive_data(data, self._loop.time())
        if session.deadlines != self._deadlines:
            self._arm_if_sooner()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
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

    def _output(self) -> None:
        """The session has output or an event: write, then do what it asks."""
        session, transport = self.session, self.transport
        if transport.is_closing() or self._lingering:
            session.discard_output()
            return
        if session.close_wanted == "abort":
            transport.abort()
            return
        now = self._loop.time()
        if session.close_wanted is not None:
            data = session.data_to_send(now)
            if data:
                transport.write(data)
            self._linger()
            return
        while self._can_write and (piece := session.next_output(now)) is not None:
            transport.write(piece)  # pause_writing runs in here if the socket took less
        if session.reading != self._reading:
            self._apply_reading()
        if session.deadlines != self._deadlines:
            self._arm_if_sooner()

    def _arm_if_sooner(self) -> None:
        """A timer that fires early only checks and re-arms; one armed too late is re-armed."""
        self._deadlines = self.session.deadlines
        deadline = self.session.next_deadline
        if deadline is not None and (self._timer is None or deadline < self._timer.when()):
            self._arm()

    def _linger(self) -> None:
        """Send FIN after the output, drop what the peer still sends, close at its EOF
        (asyncio does) or after LINGER_SECONDS. TLS has no half-close: its close sends
        close_notify, which many clients never answer, so the linger bounds that wait too."""
        transport = self.transport
        self._lingering = True
        self.session.connection_lost()  # done with STOMP: its wip is rdy again now, not after the linger
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the peer is gone already (reset): nothing to linger for
                transport.abort()
                return
            if not self._reading:
                self._reading = True
                transport.resume_reading()
        else:
            transport.close()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(LINGER_SECONDS, transport.abort)

    def _apply_reading(self) -> None:
        reading = self.session.reading
        if reading != self._reading and not self.transport.is_closing() and not self._lingering:
            self._reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _arm(self) -> None:
        if self._lingering:  # the timer is the linger's now
            return
        if self._timer is not None:
            self._timer.cancel()
        self._deadlines = self.session.deadlines
        deadline = self.session.next_deadline
        self._timer = None if deadline is None else self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.session.tick(self._loop.time())
        if not self.transport.is_closing():
            self._arm()


class Handshake(asyncio.Protocol):
    """A TLS connection until its handshake is done (see the module docstring)."""

    def __init__(self, broker: Broker, context: ssl.SSLContext, timeout: float):
        self.broker = broker
        self.context = context
        self.timeout = timeout  # seconds
        self._loop = asyncio.get_running_loop()
        self._early: list[bytes] = []  # application bytes that came with the handshake's end
        self._lost: list[Exception | None] = []  # the connection ended before the hand-over
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        tcp.pause_reading()  # start_tls reads the ClientHello; not a byte may come here first
        peer = peer_address(tcp)
        if not self.broker.admit(self._loop.time(), peer):
            tcp.abort()
            return
        self.broker.handshaking += 1
        self._task = self._loop.create_task(self._handshake(tcp, peer))

    async def _handshake(self, tcp: asyncio.Transport, peer: str) -> None:
        failure: OSError | None = None
        try:
            tls = await self._loop.start_tls(
                tcp, self, self.context, server_side=True, ssl_handshake_timeout=self.timeout
            )
        except OSError as err:  # ssl.SSLError, a reset, the timeout (start_tls closed the socket)
            tls, failure = None, err
        finally:
            self.broker.handshaking -= 1
        if tls is None:
            reason, why = handshake_failure(failure, self.timeout)
            self.broker.tls_failed(peer, reason, why, self._loop.time())
            return
        connection = Connection(self.broker, admitted=True)
        tls.set_protocol(connection)
        connection.connection_made(tls)
        for data in self._early:
            connection.data_received(data)
        for exc in self._lost:
            connection.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost.append(exc)


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The peer as HOST:PORT for log lines ('local' for a Unix socket's unnamed peer)."""
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "local")
