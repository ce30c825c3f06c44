"""The router's asyncio side: bytes between sockets and `curb.router.core.RouterCore`.

Clients connect to the router's listener; the router keeps one connection (a link) to
each instance of its routes, reconnecting with a growing pause (LINK_RETRY_* seconds)
while it is down. After every event this module writes what the core has for each
endpoint and applies the closes it asks for; a timer calls `tick` every TICK_SECONDS for
heart-beats. Output is written once per loop pass (`flush_soon`), so the frames of many
clients read in one pass reach an instance in one write, and its answers go back so too.
Flow control: while any link's socket buffer is above its high-water mark
(an instance slower than its producers), no client is read, so the router's memory holds
at most that mark per link plus what clients already sent.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from functools import partial
from typing import cast

from curb import users
from curb.router.core import UP, ClientConn, Endpoint, Link, RouterCore
from curb.router.routes import Routes
from curb.server import LINGER_SECONDS, peer_address

TICK_SECONDS = 0.1
FIRST_TRY_SECONDS = 5.0
LINK_RETRY_FIRST = 0.05
LINK_RETRY_MOST = 2.0
LINK_HIGH_WATER = 4 * 1024 * 1024


class Router:
    """One router process's loop side: the core, its transports and link tasks."""

    def __init__(self, core: RouterCore, link_tls: ssl.SSLContext | None = None):
        self.core = core
        self.link_tls = link_tls
        self.loop = asyncio.get_running_loop()
        self.transports: dict[Endpoint, asyncio.Transport] = {}
        self._link_tasks: dict[Link, asyncio.Task[None]] = {}
        self._paused_links: set[Link] = set()
        self._clients: dict[ClientConn, ClientProtocol] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._closing = False
        self._flush_due = False
        self._logins = users.LoginCache()

    async def start(self, within: float = FIRST_TRY_SECONDS) -> None:
        """Connect every link; return once each is up or failed once (at most `within`
        seconds), so that clients of a fresh router find the instances that are there."""
        for link in self.core.links.values():
            self.watch(link)
        self._tick()
        deadline = self.loop.time() + within
        while self.loop.time() < deadline and any(
            link.state is not UP and not link.tried for link in self.core.links.values()
        ):
            await asyncio.sleep(0.01)

    def watch(self, link: Link) -> None:
        """Keep a connection to this link's instance open while the link exists."""
        self._link_tasks[link] = self.loop.create_task(self._keep_link(link))

    def use_users(self, table: dict[str, users.User] | None) -> None:
        """Check logins against this users file (None: no logins); a password is checked
        (scrypt) on a worker thread, once per login and passcode while the file keeps the
        user's line (users.LoginCache)."""
        self.core.users = table
        if table is None:
            self.core.check_login = None
            return
        self._logins.retain(table)
        self.core.check_login = self._check_login

    def _check_login(self, login: str, passcode: str, answer: Callable[[users.User | None], None]) -> None:
        table = self.core.users or {}
        known = self._logins.get(table, login, passcode)
        if known is not None:
            answer(known)
            return

        def checked(done: asyncio.Future[users.User | None]) -> None:
            user = done.result()
            if user is not None:
                self._logins.remember(user, passcode)
            answer(user)
            self.flush()

        self.loop.run_in_executor(None, users.authenticate, table, login, passcode).add_done_callback(checked)

    def add_links(self, links: list[Link]) -> None:
        """Connect links the core made outside a routes change (a spawned instance)."""
        for link in links:
            self.watch(link)
        self.flush()

    def set_routes(self, routes: Routes) -> None:
        for link in self.core.set_routes(routes):
            self.watch(link)
        for link in list(self._link_tasks):
            if link.number not in self.core.links:
                self._link_tasks.pop(link).cancel()
        self.flush()

    async def _keep_link(self, link: Link) -> None:
        pause = LINK_RETRY_FIRST
        while not self._closing and self.core.links.get(link.number) is link:
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
                self.core.link_lost(link, f"cannot connect: {err.strerror or err}")
                self.flush()
                await asyncio.sleep(pause)
                pause = min(LINK_RETRY_MOST, pause * 2)
                continue
            await lost
            if link.epoch:
                pause = LINK_RETRY_FIRST
            await asyncio.sleep(pause)

    def flush_soon(self) -> None:
        """Flush once at the end of this loop pass: what every connection read in the pass
        made goes out in one write per endpoint, not one per frame."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write each endpoint's output; apply its close."""
        self._flush_due = False
        self._logins = users.LoginCache()
        now = self.loop.time()
        for endpoint in self.core.take_dirty(now):
            transport = self.transports.get(endpoint)
            if transport is None or transport.is_closing():
                endpoint.out.clear()
                continue
            if endpoint.out:
                data = b"".join(endpoint.out)
                endpoint.out.clear()
                transport.write(data)
            if endpoint.close_wanted:
                self.transports.pop(endpoint, None)
                if isinstance(endpoint, ClientConn):
                    self._linger(transport)
                else:
                    transport.abort()

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after the output, without a reset that could eat the ERROR (see curb.server)."""
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                transport.abort()
                return
        else:
            transport.close()
        self.loop.call_later(LINGER_SECONDS, transport.abort)

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
            for endpoint, transport in list(self.transports.items()):
                if isinstance(endpoint, ClientConn) and not transport.is_closing():
                    if paused:
                        transport.pause_reading()
                    else:
                        transport.resume_reading()

    @property
    def reading(self) -> bool:
        return not self._paused_links

    async def close(self) -> None:
        """Stop: close clients (their held messages go back) and links."""
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
        for endpoint, transport in list(self.transports.items()):
            if isinstance(endpoint, ClientConn):
                transport.close()
        for task in self._link_tasks.values():
            task.cancel()
        await asyncio.sleep(0)
        for endpoint, transport in list(self.transports.items()):
            if isinstance(endpoint, Link):
                transport.close()


class ClientProtocol(asyncio.Protocol):
    """One client connection, fed to the core."""

    def __init__(self, router: Router):
        self.router = router
        self.client: ClientConn | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        sock = tcp.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        router = self.router
        self.client = router.core.client_opened(peer_address(tcp), router.loop.time())
        router.transports[self.client] = tcp
        if not router.reading:
            tcp.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.client is None or self.client.close_wanted:
            return
        self.router.core.client_data(self.client, data, self.router.loop.time())
        self.router.flush_soon()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client is not None:
            self.router.transports.pop(self.client, None)
            self.router.core.client_lost(self.client)
            self.router.flush()


class LinkProtocol(asyncio.Protocol):
    """One connection to an instance, for its link."""

    def __init__(self, router: Router, link: Link, lost: asyncio.Future[None]):
        self.router = router
        self.link = link
        self.lost = lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        sock = tcp.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tcp.set_write_buffer_limits(high=LINK_HIGH_WATER)
        self.router.transports[self.link] = tcp
        self.router.core.link_connected(self.link, self.router.loop.time())
        self.router.flush()

    def data_received(self, data: bytes) -> None:
        self.link.tried = True
        self.router.core.link_data(self.link, data, self.router.loop.time())
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
        router.core.link_lost(self.link, f"connection lost{f': {exc}' if exc else ''}")
        router.flush()
        if not self.lost.done():
            self.lost.set_result(None)


def client_factory(router: Router) -> Callable[[], ClientProtocol]:
    return lambda: ClientProtocol(router)
