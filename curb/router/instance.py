"""`curb router`'s composition root: the core on the running loop, its listeners, links,
web front and spawner wired together, SIGHUP's reload, and the lines that say what
listens and who may connect. The command line (curb.router.cli) only turns flags into
the values given here, as curb.cli does for curb.instance.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from curb import heap, systemd
from curb.instance import Events, StartError, addr_text, is_loopback, listen, load_users, sockname
from curb.router import routes as routing
from curb.router.config import RouterConfig, WebConfig
from curb.router.core import RouterCore
from curb.router.glue import Router, loop_core
from curb.router.spawner import Spawner


def load_routes(route_flags: tuple[str, ...], routes_file: str | None) -> routing.Routes:
    """The routes of the flags and the file together; RouteError or OSError otherwise."""
    texts = list(route_flags)
    if routes_file is not None:
        with open(routes_file, encoding="utf-8") as f:
            texts += routing.parse_file(f.read())
    return routing.build(texts)


@dataclass(frozen=True)
class Listeners:
    """Where clients connect (plain and TLS), and the TLS context for links, if any."""

    addr: tuple[str | None, int]
    tls_addr: tuple[str | None, int] | None
    server_tls: ssl.SSLContext | None
    link_tls: ssl.SSLContext | None
    users_path: str | None = None
    web: WebConfig | None = None


async def serve(
    table: routing.Routes,
    config: RouterConfig,
    listeners: Listeners,
    route_flags: tuple[str, ...],
    routes_file: str | None,
    events: Events,
    spawning: tuple[Path, str, int, tuple[str, ...]] | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    heap.install(loop)  # large messages reuse the heap's pages, as in an instance
    core = loop_core(table, config=config, events=events)
    router = Router(core, listeners.link_tls)
    users_path = listeners.users_path
    if users_path is not None:
        core.users = load_users(users_path)
    spawner = None if spawning is None else _spawner(core, router, spawning, events)
    servers = await _listen(loop, router, listeners)
    front = None
    if listeners.web is not None:  # before the links: a StartError leaves only listeners, which exit closes
        from curb.router.web import start_web  # aiohttp loads only when -http asks for it

        front = await start_web(core, listeners.web, users_path, events)
    stop = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, _reload, router, users_path, route_flags, routes_file, events)
    await router.start()
    if spawner is not None:
        spawner.start()
        for name in spawner.children:  # the logs already in DIR: destinations at once
            core.placement.spawn_pending(name)
    names = ", ".join(sockname(s) for s in servers[0].sockets)
    tls_names = "".join(f"; TLS on {sockname(s)}" for server in servers[1:] for s in server.sockets)
    _say_who_may_connect(core, users_path, events, servers, front.sockets if front is not None else [])
    events(
        "listening",
        f"listening on {names} (router; routes: {_describe(core_routes(core))}){tls_names}",
        addr=names,
    )
    systemd.notify("READY=1", f"STATUS=routing {len(core.placement.dests)} destinations")
    await stop
    systemd.notify("STOPPING=1")
    events("stopping", "stopping: closing clients and links")
    for server in servers:
        server.close()
    if front is not None:
        await front.stop()
    await router.close()
    if spawner is not None:
        spawner.stop()
    events("stopped", "stopped")
    return 0


def _spawner(
    core: RouterCore, router: Router, spawning: tuple[Path, str, int, tuple[str, ...]], events: Events
) -> Spawner:
    """-spawn: the spawner of instances for destinations no route names, known to the core."""
    directory, cap, most, extra = spawning
    spawner = Spawner(
        directory,
        cap,
        most,
        extra,
        lambda name, port: router.add_links(core.spawned_instance(name, ("127.0.0.1", port))),
        events,
    )
    core.placement.spawn = spawner.want
    return spawner


async def _listen(loop: asyncio.AbstractEventLoop, router: Router, listeners: Listeners) -> list[asyncio.Server]:
    """The client listeners, -addr and then -tls-addr if given (serving at once)."""
    addr = listeners.addr
    servers = [
        await listen("-addr", addr, lambda: loop.create_server(router.client, addr[0], addr[1], reuse_address=True))
    ]
    tls_addr, server_tls = listeners.tls_addr, listeners.server_tls
    if tls_addr is not None and server_tls is not None:
        servers.append(
            await listen(
                "-tls-addr",
                tls_addr,
                lambda: loop.create_server(
                    lambda: router.tls_client(server_tls), tls_addr[0], tls_addr[1], reuse_address=True
                ),
            )
        )
    return servers


def _reload(
    router: Router, users_path: str | None, route_flags: tuple[str, ...], routes_file: str | None, events: Events
) -> None:
    """SIGHUP: read the users file and the routes again; one that fails is logged and the
    one read before kept."""
    core = router.core
    if users_path is not None:
        try:
            core.users = load_users(users_path)
            events("reloaded", f"reloaded {len(core.users or {})} users from {users_path}")
        except StartError as err:
            events("reload_failed", f"{err.line}; kept the users read before")
    try:
        table = load_routes(route_flags, routes_file)
    except (routing.RouteError, OSError, UnicodeDecodeError) as err:
        events("reload_failed", f"cannot reload routes: {err}; kept the routes read before")
        return
    router.set_routes(table)
    events("reloaded", f"reloaded routes: {_describe(table)}")


def _say_who_may_connect(
    core: RouterCore,
    users_path: str | None,
    events: Events,
    servers: list[asyncio.Server],
    web_sockets: list[socket.socket],
) -> None:
    """One line on access: the users file, or who may do what without one, naming every
    listener that the network reaches (STOMP's and the web front's)."""
    if users_path is not None:
        events("access", f"{len(core.users or {})} users from {users_path}", users=len(core.users or {}))
        return
    exposed = [sockname(sock) for server in servers for sock in server.sockets if not is_loopback(sock)]
    exposed += [f"{sockname(sock)} (HTTP, -http-open)" for sock in web_sockets if not is_loopback(sock)]
    if exposed:
        events(
            "access",
            f"WARNING: no -users, so any client that reaches {', '.join(exposed)} may send to, consume from and "
            "count every destination it routes; add -users FILE (see curb passwd) or listen on 127.0.0.1",
            level="warning",
        )
    else:
        events("access", "no -users: any local client may send to, consume from and count every destination")


def core_routes(core: RouterCore) -> routing.Routes:
    return routing.Routes({name: tuple(link.address for link in links) for name, links in core.placement.dests.items()})


def _describe(table: routing.Routes) -> str:
    return "; ".join(
        f"{name}={','.join(addr_text(address) for address in addresses)}" for name, addresses in table.table.items()
    )
