"""The router's asyncio side: clients through curb.server, links to instances, the tick.

Clients connect to the router's listeners as they would to an instance: each is a
`curb.server.Connection` (TLS: `Handshake`), so a `curb.session.Session` on a
`curb.driver.Driver`, with the core as its backend. The router keeps one connection (a
link) to each instance of its routes, reconnecting with a growing pause (LINK_RETRY_*
seconds) while it is down. The links' output is written once per loop pass (the core's
`flush_links`, called by its loop pass or `flush_soon`), so the frames of many clients
read in one pass reach an instance in one write. A timer calls `tick` every TICK_SECONDS
for link heart-beats and parked SENDs.

Flow control: while any link's socket buffer is above its high-water mark (an instance
slower than its producers), no client is read, so the router's memory holds at most that
mark per link plus what clients already sent.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar, cast

from curb.router.core import RouterCore
from curb.router.links import DOWN, UP, Link
from curb.router.routes import Routes
from curb.server import Connection, Handshake

T = TypeVar("T")
TICK_SECONDS = 0.1
FIRST_TRY_SECONDS = 5.0
LINK_RETRY_FIRST = 0.05
LINK_RETRY_MOST = 2.0
LINK_HIGH_WATER = 4 * 1024 * 1024
TLS_HANDSHAKE_SECONDS = 10.0


def loop_core(routes: Routes, **settings: object) -> RouterCore:
    """A core on the running loop: its timers, its clock, its password checks (on one
    worker thread, off the loop)."""
    loop = asyncio.get_running_loop()
    checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="curb-login")

    def offload(work: Callable[[], T], then: Callable[[T], None]) -> None:
        loop.run_in_executor(checks, work).add_done_callback(lambda done: then(done.result()))

    def schedule(delay: float, callback: Callable[[], None]) -> object:
        return loop.call_later(delay, callback) if delay > 0 else loop.call_soon(callback)

    return RouterCore(routes, schedule=schedule, clock=loop.time, offload=offload, **settings)  # type: ignore[arg-type]


class Router:
    """One router process's loop side: the core, its link transports and tasks."""

    def __init__(self, core: RouterCore, link_tls: ssl.SSLContext | None = None):
        self.core = core
        self.link_tls = link_tls
        self.loop = asyncio.get_running_loop()
        self.transports: dict[Link, asyncio.Transport] = {}
        self._link_tasks: dict[Link, asyncio.Task[None]] = {}
        self._paused_links: set[Link] = set()
        self.clients: set[_Client] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self._closing = False
        self._flush_due = False
        core.flush_links = self.flush
        core.new_links = self.add_links
        self._held: set[Link] = set()  # links whose reading is paused for their browse

    async def start(self, within: float = FIRST_TRY_SECONDS) -> None:
        """Connect every link; return once each is up or failed once (at most `within`
        seconds), so that clients of a fresh router find the instances that are there."""
        for link in self.core.links.by_number.values():
            self.watch(link)
        self._tick()
        deadline = self.loop.time() + within
        while self.loop.time() < deadline and any(
            link.state is not UP and not link.tried for link in self.core.links.by_number.values()
        ):
            await asyncio.sleep(0.01)

    def client(self) -> Connection:
        return _Client(self)

    def tls_client(self, context: ssl.SSLContext) -> Handshake:
        return _TlsClient(self, context)

    def watch(self, link: Link) -> None:
        """Keep a connection to this link's instance open while the link exists."""
        self._link_tasks[link] = self.loop.create_task(self._keep_link(link))

    def add_links(self, links: list[Link]) -> None:
        """Connect links the core made outside a routes change (a spawned instance)."""
        for link in links:
            self.watch(link)
        self.flush()

    def set_routes(self, routes: Routes) -> None:
        for link in self.core.set_routes(routes):
            self.watch(link)
        for link in list(self._link_tasks):
            if link.number not in self.core.links.by_number:
                self._link_tasks.pop(link).cancel()
        self.flush()

    async def _keep_link(self, link: Link) -> None:
        pause = LINK_RETRY_FIRST
        while not self._closing and self.core.links.by_number.get(link.number) is link:
            lost: asyncio.Future[None] = self.loop.create_future()
            host, port = link.address
            try:
                await self.loop.create_connection(
                    partial(LinkProtocol, self, link, lost),
                    host,
                    port,
                    ssl=self.link_tls,
                    server_hostname=host if self.link_tls else None,
                )
            except OSError as err:
                link.tried = True
                self.core.links.lost(link, f"cannot connect: {err.strerror or err}")
                self.flush()
                await asyncio.sleep(pause)
                pause = min(LINK_RETRY_MOST, pause * 2)
                continue
            await lost
            if link.epoch:
                pause = LINK_RETRY_FIRST
            await asyncio.sleep(pause)
        self._link_tasks.pop(link, None)

    def flush_soon(self) -> None:
        """Flush once at the end of this loop pass: what every link read in the pass made
        goes out in one write per link."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write each link's output; apply its close."""
        self._flush_due = False
        for link in self.core.links.take_dirty(self.loop.time()):
            transport = self.transports.get(link)
            if transport is None or transport.is_closing():
                link.out.clear()
                continue
            if link.out:
                data = b"".join(link.out)
                link.out.clear()
                transport.write(data)
            if link.close_wanted:
                self.transports.pop(link, None)
                self._held.discard(link)
                transport.abort()
            elif link.hold != (link in self._held):
                self._hold(link, transport)
        for link in [link for link in self._held if not link.hold]:
            transport = self.transports.get(link)
            if transport is not None:
                self._hold(link, transport)

    def _hold(self, link: Link, transport: asyncio.Transport) -> None:
        """Apply a link's `hold`: a browse that holds enough reads no more for now."""
        if link.hold:
            self._held.add(link)
            transport.pause_reading()
        else:
            self._held.discard(link)
            transport.resume_reading()

    def _tick(self) -> None:
        self.core.tick(self.loop.time())
        self.flush()
        self._ticker = self.loop.call_later(TICK_SECONDS, self._tick)

    def link_paused(self, link: Link, paused: bool) -> None:
        """Back-pressure from an instance: read no client while any link is full."""
        was = bool(self._paused_links)
        if paused:
            self._paused_links.add(link)
        else:
            self._paused_links.discard(link)
        if was != bool(self._paused_links):
            for client in list(self.clients):
                if not client.is_closing():
                    client.hold_reading(paused)

    @property
    def reading(self) -> bool:
        return not self._paused_links

    async def close(self) -> None:
        """Stop: close clients (their held messages go back) and links."""
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
        for session in list(self.core.sessions):
            session.stop_reading()
            session.close()
        for task in self._link_tasks.values():
            task.cancel()
        await asyncio.sleep(0)
        for transport in list(self.transports.values()):
            transport.close()


class _Client(Connection):
    """A client's connection, held while the instances cannot take more."""

    def __init__(self, router: Router, admitted: bool = False):
        super().__init__(router.core, admitted)
        self.router = router
        self._held = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.router.clients.add(self)
        if not self.router.reading:
            self.hold_reading(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.router.clients.discard(self)
        super().connection_lost(exc)

    def hold_reading(self, held: bool) -> None:
        self._held = held
        if held:
            self.transport.pause_reading()
        elif self.session.reading:
            self.transport.resume_reading()

    def resume_reading(self) -> None:
        if not self._held:
            super().resume_reading()


class _TlsClient(Handshake):
    """A client's TLS handshake, handing over to a client connection."""

    def __init__(self, router: Router, context: ssl.SSLContext):
        super().__init__(router.core, context, TLS_HANDSHAKE_SECONDS)
        self.router = router

    def connection(self) -> Connection:
        return _Client(self.router, admitted=True)


class LinkProtocol(asyncio.Protocol):
    """One connection to an instance, for its link."""

    def __init__(self, router: Router, link: Link, lost: asyncio.Future[None]):
        self.router = router
        self.link = link
        self.lost = lost
        self._more_due = False  # a call of _handle_more is scheduled

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        sock = tcp.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tcp.set_write_buffer_limits(high=LINK_HIGH_WATER)
        self.router.transports[self.link] = tcp
        self.router.core.links.connected(self.link, self.router.loop.time())
        self.router.flush()

    def data_received(self, data: bytes) -> None:
        self.link.tried = True
        if self.router.core.links.data(self.link, data, self.router.loop.time()):
            self._more_later()
        self.router.flush_soon()

    def _more_later(self) -> None:
        if not self._more_due:
            self._more_due = True
            self.router.loop.call_soon(self._handle_more)

    def _handle_more(self) -> None:
        """More of what the link read, in a loop pass of its own (curb.router.links)."""
        self._more_due = False
        if self.router.core.links.handle(self.link):
            self._more_later()
        self.router.flush_soon()

    def pause_writing(self) -> None:
        self.router.link_paused(self.link, True)

    def resume_writing(self) -> None:
        self.router.link_paused(self.link, False)

    def connection_lost(self, exc: Exception | None) -> None:
        router = self.router
        if router.transports.get(self.link) is not None:
            router.transports.pop(self.link, None)
        router.link_paused(self.link, False)
        if self.link.state is not DOWN:
            router.core.links.lost(self.link, f"connection lost{f': {exc}' if exc else ''}")
        router.flush()
        if not self.lost.done():
            self.lost.set_result(None)
