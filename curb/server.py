"""TCP and TLS: asyncio's transports as short adapters (Links) of curb.driver.Driver.

The driver holds what is the same for every front (the session's timer, flow control,
when to close); a `Connection` only moves bytes between its transport and the driver,
and knows how a TCP connection ends. Over TLS the transport is asyncio's, and a verified
client certificate's CN is the session's identity.

TLS: the listener accepts plain TCP and `Handshake` runs the server's handshake itself
(`loop.start_tls`), because asyncio tells no one of a failed one (it is an OSError, which
its loop does not log, and a listener's protocol only ever hears of a handshake that
succeeded). So every failure is one `Broker.tls_failed` call naming the peer and why;
on success the TLS transport, and the bytes that came with the handshake's last flight,
go to a Connection.

Closing after an ERROR (or a DISCONNECT), `Connection.finish`: the socket is shut for
writing once the output is written and the peer's further bytes are read and dropped for
up to LINGER_SECONDS (over TLS: close_notify, and the TCP connection aborted after
LINGER_SECONDS). A plain close with unread input would send a TCP reset, and the peer's
system may then discard the ERROR before the client reads it (a producer still sending,
for example). The session asks for the close only once its ERROR (or a DISCONNECT's
RECEIPT) is in its output, after the receipts it owes (curb.session), so the close never
overtakes them.

Connection limit: past `broker.config.max_connections` open sessions (and TLS handshakes under
way) a new connection is closed at once (Broker.admit says so, rate-limited), before it
costs a session or a handshake.

Arrivals (curb.arrivals): at most MOST_ARRIVING TLS handshakes run at once; the
connections behind them wait, reading nothing, with no timer running, until one of
those ends (done, failed or gone). One `Gate` a loop holds them, for every TLS listener
of the process.

Flow control: the transport's high-water mark is 0, so asyncio calls `pause_writing` as
soon as a write leaves bytes the socket did not take, and `resume_writing` once they are
all sent: the driver's "cannot take all of it" and "sent everything". The transport
therefore copies at most the unsent rest of one piece, and never moves a backlog around.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import socket
import ssl
import weakref
from typing import cast

from curb import heap
from curb.arrivals import Arrival, Arrivals, Start
from curb.backend import Backend
from curb.driver import Driver
from curb.output import Piece
from curb.session import Session
from curb.tls import handshake_failure, peer_name

__all__ = ["Connection", "Handshake"]

LINGER_SECONDS = 1.0
# The read buffer asyncio gives each TLS connection for its whole life (256 KiB by
# default): 2,000 TLS clients held 512 MiB, and above the broker's fixed mmap threshold
# (curb.instance) each one was a fresh mapping, faulted in page by page while the loop
# waited, 0.7 ms a connection in a storm of them. Two TLS records' worth is enough.
TLS_READ_BUFFER = 32 * 1024
asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


class Gate:
    """One loop's `Arrivals`, and the timer of its trickle."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.arrivals = Arrivals()
        self._timer: asyncio.TimerHandle | None = None

    def arrive(self, start: Start) -> Arrival:
        arrival, starts = self.arrivals.arrive(start, self.loop.time())
        self._run(starts)
        return arrival

    def settled(self, arrival: Arrival) -> None:
        if arrival.state != "settled":
            self._run(self.arrivals.settled(arrival))

    def _run(self, starts: list[Start]) -> None:
        for start in starts:
            start()
        due = self.arrivals.next_tick
        if due is None and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        elif due is not None and self._timer is None:
            self._timer = self.loop.call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._run(self.arrivals.tick(self.loop.time()))


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gate] = weakref.WeakKeyDictionary()


def gate() -> Gate:
    """The running loop's gate."""
    loop = asyncio.get_running_loop()
    found = _gates.get(loop)
    if found is None:
        found = _gates[loop] = Gate(loop)
    return found


class Connection(asyncio.Protocol):
    """One TCP or TLS connection: asyncio's transport as the Link of a curb.driver.Driver."""

    def __init__(self, broker: Backend, admitted: bool = False):
        self.broker = broker
        self._admitted = admitted  # by the Handshake before it: not asked again
        self.driver: Driver  # set by connection_made, before any other call
        self.transport: asyncio.Transport
        self._loop = asyncio.get_running_loop()
        self._refused = False
        self._lingering = False
        self._linger: asyncio.TimerHandle | None = None
        self._heap = heap.keeper(self._loop)  # told of large reads and writes (curb.heap)

    @property
    def session(self) -> Session:
        return self.driver.session

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
        self.driver = Driver(self.broker, self, name, peer_name(transport.get_extra_info("peercert")))

    def data_received(self, data: bytes) -> None:
        if len(data) >= heap.LARGE_BYTES and self._heap is not None:
            self._heap.moved()
        if not self._lingering:
            self.driver.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        if self._linger is not None:
            self._linger.cancel()
        self.driver.lost()

    def pause_writing(self) -> None:
        self.driver.pause_writing()

    def resume_writing(self) -> None:
        self.driver.resume_writing()

    # ---------------------------------------------------------------- the driver's Link

    def write(self, data: Piece) -> None:
        if len(data) >= heap.LARGE_BYTES and self._heap is not None:
            self._heap.moved()
        self.transport.write(data)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def abort(self) -> None:
        self.transport.abort()

    def is_closing(self) -> bool:
        return self._lingering or self.transport.is_closing()

    def finish(self) -> None:
        """Send FIN after the output, drop what the peer still sends, close at its EOF
        (asyncio does) or after LINGER_SECONDS. TLS has no half-close: its close sends
        close_notify, which many clients never answer, so the linger bounds that wait too."""
        transport = self.transport
        self._lingering = True
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the peer is gone already (reset): nothing to linger for
                transport.abort()
                return
            transport.resume_reading()  # to drop what comes (a no-op when it was not paused)
        else:
            transport.close()
        self._linger = self._loop.call_later(LINGER_SECONDS, transport.abort)


class Handshake(asyncio.Protocol):
    """A TLS connection until its handshake is done (see the module docstring)."""

    def __init__(self, broker: Backend, context: ssl.SSLContext, timeout: float):
        self.broker = broker
        self.context = context
        self.timeout = timeout  # seconds
        self._loop = asyncio.get_running_loop()
        self._early: list[bytes] = []  # application bytes that came with the handshake's end
        self._lost: list[Exception | None] = []  # the connection ended before the hand-over
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self._arrival: Arrival | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        tcp.pause_reading()  # start_tls reads the ClientHello; not a byte may come here first
        peer = peer_address(tcp)
        if not self.broker.admit(self._loop.time(), peer):
            tcp.abort()
            return
        self.broker.handshaking += 1
        self._arrival = gate().arrive(lambda: self._start(tcp, peer))

    def _start(self, tcp: asyncio.Transport, peer: str) -> None:
        """Its turn among the arrivals: the handshake, with its timeout, starts now."""
        if tcp.is_closing():  # aborted while it waited (the broker stopping, say)
            self.broker.handshaking -= 1
            if self._arrival is not None:
                gate().settled(self._arrival)
            return
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
            if self._arrival is not None:
                gate().settled(self._arrival)
        if tls is None:
            reason, why = handshake_failure(failure, self.timeout)
            self.broker.refusals.tls_failed(peer, reason, why, self._loop.time())
            return
        connection = self.connection()
        tls.set_protocol(connection)
        connection.connection_made(tls)
        for data in self._early:
            connection.data_received(data)
        for exc in self._lost:
            connection.connection_lost(exc)

    def connection(self) -> Connection:
        """The connection the handshake hands over to (admitted already)."""
        return Connection(self.broker, admitted=True)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is None and self._arrival is not None:  # gone while it waited its turn
            self.broker.handshaking -= 1
            gate().settled(self._arrival)
            return
        self._lost.append(exc)


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The peer as HOST:PORT for log lines ('local' for a Unix socket's unnamed peer)."""
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "local")
