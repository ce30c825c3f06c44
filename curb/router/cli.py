"""`curb router`: flags, routes (from -route and a routes file re-read on SIGHUP), start-up.

Exit statuses as the broker's: 2 for what only the operator can fix (a bad flag or
route, an address that cannot be bound), 0 after SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from curb import systemd, tls
from curb.durations import Duration
from curb.flags import (
    ack_timeout_option,
    addr_option,
    heartbeat_option,
    http_open_option,
    http_option,
    http_origin_option,
    log_format_option,
    max_frame_option,
    prefetch_option,
    size_flag,
    tls_options,
    users_option,
)
from curb.heartbeat import MAX_MS as MAX_HEARTBEAT_MS
from curb.instance import (
    EXIT_USAGE,
    Addr,
    Events,
    StartError,
    addr_text,
    is_loopback,
    listen,
    load_users,
    sockname,
)
from curb.router import routes as routing
from curb.router.config import RouterConfig, WebConfig
from curb.router.core import RouterCore
from curb.router.glue import Router, loop_core
from curb.router.spawner import Spawner

DEFAULT_PORT = 61614


def _checked_size(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A size flag passed on to instances as given, once it parses."""
    size_flag(ctx, param, value)
    return value


def load_routes(route_flags: tuple[str, ...], routes_file: str | None) -> routing.Routes:
    """The routes of the flags and the file together; RouteError or OSError otherwise."""
    texts = list(route_flags)
    if routes_file is not None:
        with open(routes_file, encoding="utf-8") as f:
            texts += routing.parse_file(f.read())
    return routing.build(texts)


@click.command("router", context_settings={"help_option_names": ["-h", "--help"]})
@addr_option(
    f":{DEFAULT_PORT}", "Where clients connect, [HOST]:PORT; an empty host means every interface.", may_be_off=False
)
@click.option(
    "-route",
    "--route",
    "route_flags",
    multiple=True,
    help="NAME=HOST:PORT, or NAME=HOST:PORT,HOST:PORT,... for a partitioned destination (repeatable).",
)
@click.option(
    "-routes",
    "--routes",
    "routes_file",
    default=None,
    help="A file of routes, one NAME=HOST:PORT[,HOST:PORT...] a line (# comments); re-read on SIGHUP.",
)
@prefetch_option("Unacked messages a client subscription may hold when SUBSCRIBE names no prefetch-count.")
@max_frame_option("Largest frame a client may send; the instances' -max-frame must be at least this.")
@heartbeat_option(
    "Heart-beat interval offered to clients (a plain number is seconds, or 500ms, 10s, 1m; 0: none; at most 24h)."
)
@ack_timeout_option(
    "How long a message delivered through the router waits for its ACK or NACK before it goes back to its "
    "instance (a plain number is seconds, or 500ms, 30m, 2h; 0: no deadline; at most 24h). SUBSCRIBE may set "
    "its own (curb-ack-timeout). The router keeps the deadline: the instances' -ack-timeout does not apply."
)
@click.option(
    "-link-heartbeat",
    "--link-heartbeat",
    default="2s",
    show_default=True,
    type=Duration(MAX_HEARTBEAT_MS / 1000, zero="no heart-beats"),
    help="Heart-beat interval asked of instances: a silent one is taken as down after about twice this "
    "(a plain number is seconds, or 500ms, 2s; 0: none; at most 24h).",
)
@click.option(
    "-link-wait",
    "--link-wait",
    default="5s",
    show_default=True,
    type=Duration(MAX_HEARTBEAT_MS / 1000, zero="refuse at once"),
    help="How long a SEND waits for an instance of its destination to be up before it is refused "
    "(a plain number is seconds, or 500ms, 5s, 1m; 0: refuse at once; at most 24h).",
)
@users_option(
    "The users file (see `curb passwd`): CONNECT must log in as one of them; permissions may name "
    "destinations (send@orders). Re-read on SIGHUP. Default: no logins."
)
@tls_options
@click.option(
    "-instance-credentials",
    "--instance-credentials",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="A file whose first line is LOGIN:PASSCODE, for the router's CONNECT to instances with -users.",
)
@click.option(
    "-instance-tls-ca",
    "--instance-tls-ca",
    default=None,
    help="Reach instances over TLS, trusting the CAs in this PEM file (routes then name their -tls-addr).",
)
@click.option(
    "-instance-tls-cert",
    "--instance-tls-cert",
    default=None,
    help="A client certificate (PEM chain) for instances that require one (-tls-ca); with -instance-tls-key.",
)
@click.option("-instance-tls-key", "--instance-tls-key", default=None, help="The key of -instance-tls-cert (PEM).")
@click.option(
    "-spawn",
    "--spawn",
    "spawn_dir",
    default=None,
    type=click.Path(file_okay=False, exists=True, writable=True),
    help="Run a Curb instance of its own for each destination no route names, its log in this directory.",
)
@click.option(
    "-spawn-cap",
    "--spawn-cap",
    default="1GiB",
    show_default=True,
    callback=_checked_size,
    help="The -cap of each spawned instance.",
)
@click.option(
    "-spawn-max",
    "--spawn-max",
    default=64,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Most instances -spawn runs; a new destination past that is refused.",
)
@click.option(
    "-spawn-arg",
    "--spawn-arg",
    "spawn_args",
    multiple=True,
    metavar="ARG",
    help="An extra flag for every spawned instance, e.g. -spawn-arg=-users=FILE (repeatable).",
)
@http_option(
    "Serve the router's web front on [HOST]:PORT: /metrics (Prometheus) and /stats (JSON) per destination "
    "and instance, STOMP over WebSocket at /ws and the HTTP API under /v2 with {queue} the routed "
    "destination. Off by default."
)
@http_open_option(
    "Serve -http on an address the network reaches although there is no -users (anyone may publish and "
    "consume); without it, such a router refuses to start."
)
@http_origin_option
@log_format_option
def router_command(
    addr: Addr,
    route_flags: tuple[str, ...],
    routes_file: str | None,
    prefetch: int,
    max_frame: int,
    heartbeat: float,
    ack_timeout: float,
    link_heartbeat: float,
    link_wait: float,
    spawn_dir: str | None,
    spawn_cap: str,
    spawn_max: int,
    spawn_args: tuple[str, ...],
    users_path: str | None,
    tls_addr: Addr | None,
    tls_cert: str | None,
    tls_key: str | None,
    instance_credentials: str | None,
    instance_tls_ca: str | None,
    instance_tls_cert: str | None,
    instance_tls_key: str | None,
    http: Addr | None,
    http_open: bool,
    http_origins: tuple[str, ...],
    log_format: str,
) -> None:
    """A STOMP router in front of Curb instances: destinations, partitions and transactions.

    Run `curb router -addr :61614 -route orders=127.0.0.1:61613` and send to /queue/orders."""
    events = Events(log_format)
    try:
        table = load_routes(route_flags, routes_file)
    except (routing.RouteError, OSError, UnicodeDecodeError) as err:
        click.echo(f"curb: {err}; fix -route or -routes", err=True)
        sys.exit(EXIT_USAGE)
    if not table.table and spawn_dir is None:
        click.echo("curb: no routes: give -route NAME=HOST:PORT (repeatable), -routes FILE or -spawn DIR", err=True)
        sys.exit(EXIT_USAGE)
    login = passcode = None
    if instance_credentials is not None:
        login, passcode = _credentials(instance_credentials)
    try:
        server_tls = None
        if tls_addr is not None or tls_cert or tls_key:
            if tls_addr is None or not tls_cert or not tls_key:
                raise click.UsageError("-tls-addr, -tls-cert and -tls-key go together")
            server_tls = tls.load(tls.TlsFiles(tls_cert, tls_key))
        link_tls = None
        if instance_tls_ca is not None:
            if bool(instance_tls_cert) != bool(instance_tls_key):
                raise click.UsageError("-instance-tls-cert and -instance-tls-key go together")
            link_tls = tls.client_context(instance_tls_ca, instance_tls_cert, instance_tls_key)
        elif instance_tls_cert or instance_tls_key:
            raise click.UsageError("-instance-tls-cert and -instance-tls-key need -instance-tls-ca")
    except tls.TlsError as err:
        click.echo(f"curb: TLS: {err}; fix the -tls or -instance-tls flags", err=True)
        sys.exit(EXIT_USAGE)
    config = RouterConfig(
        prefetch=prefetch,
        max_frame=max_frame,
        heartbeat_ms=round(heartbeat * 1000),
        ack_timeout=ack_timeout,
        link_heartbeat_ms=round(link_heartbeat * 1000),
        link_wait=link_wait,
        login=login,
        passcode=passcode,
    )
    try:
        spawning = None if spawn_dir is None else (Path(spawn_dir).resolve(), spawn_cap, spawn_max, tuple(spawn_args))
        web = WebConfig(http, http_open, tuple(http_origins)) if http is not None else None
        listeners = Listeners(addr, tls_addr, server_tls, link_tls, users_path, web)
        code = asyncio.run(serve(table, config, listeners, route_flags, routes_file, events, spawning))
    except StartError as err:
        click.echo(f"curb: {err.line}", err=True)
        sys.exit(err.status)
    sys.exit(code)


@dataclass(frozen=True)
class Listeners:
    """Where clients connect (plain and TLS), and the TLS context for links, if any."""

    addr: tuple[str | None, int]
    tls_addr: tuple[str | None, int] | None
    server_tls: ssl.SSLContext | None
    link_tls: ssl.SSLContext | None
    users_path: str | None = None
    web: WebConfig | None = None


def _credentials(path: str) -> tuple[str, str]:
    """LOGIN:PASSCODE from the first line of a file; a usage error otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError) as err:
        click.echo(f"curb: cannot read -instance-credentials {path}: {err}", err=True)
        sys.exit(EXIT_USAGE)
    login, sep, passcode = line.partition(":")
    if not sep or not login:
        click.echo(f"curb: -instance-credentials {path}: write LOGIN:PASSCODE on its first line", err=True)
        sys.exit(EXIT_USAGE)
    return login, passcode


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
