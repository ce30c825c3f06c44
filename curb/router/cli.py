"""`curb router`: its flags, turned into the values its composition root
(curb.router.instance) starts from.

Exit statuses as the broker's: 2 for what only the operator can fix (a bad flag or
route, an address that cannot be bound), 0 after SIGINT or SIGTERM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from curb import event_loop, tls
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
)
from curb.router import routes as routing
from curb.router.config import RouterConfig, WebConfig
from curb.router.instance import Listeners, load_routes, serve

DEFAULT_PORT = 61614


def _checked_size(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A size flag passed on to instances as given, once it parses."""
    size_flag(ctx, param, value)
    return value


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
        code = event_loop.run(serve(table, config, listeners, route_flags, routes_file, events, spawning))
    except StartError as err:
        click.echo(f"curb: {err.line}", err=True)
        sys.exit(err.status)
    sys.exit(code)


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
