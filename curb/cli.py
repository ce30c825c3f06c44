"""The `curb` command: flags, start-up, signals, systemd readiness, and log lines.

SIGINT and SIGTERM stop accepting, finish the owed syncs and receipts, and exit 0. SIGHUP
re-reads the users file and the TLS files; a bad one is logged and the old one kept. A
failure exits with one line on stderr, and its status says whether trying again can help,
which is what a supervisor needs (the systemd unit restarts on 1, not on 2 or 3):

- 2, a usage error: only the operator can fix it. A bad flag, an address that cannot be
  bound (in use, not local, privileged), and a log file that is locked by another curb, is
  not a curb log, is larger than -cap, or cannot be opened as it is: a missing directory, no
  permission (EACCES, EPERM), a read-only file system, a directory, a bad name. The line
  says which flag to change.
- 1, an I/O failure: the disk failed us and may not next time. EIO, a full disk (ENOSPC,
  EDQUOT), too many open files and every other error from the log file while it is opened
  and recovered, and a write or sync of the log that fails while serving. The line names the
  file and the error.

- 3, a damaged log: the file is a curb log but both checkpoint slots are unreadable, so
  start-up cannot tell where the queue is. Move the file away (keep it for `curb inspect`).
  Damage start-up can skip is skipped and reported instead, never an exit.

The log reports what it cannot use as `LogError` with its `exit_status` (2, or 3 for
LogDamaged) and raises plain OSError for what the system refused.
"""

from __future__ import annotations

import asyncio
import difflib
import errno
import gc
import ipaddress
import json
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import click

from curb import __version__, systemd, tls, users
from curb.addr import parse_addr
from curb.broker import ACK_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS, Broker
from curb.durations import Duration, format_seconds
from curb.heartbeat import MAX_MS as MAX_HEARTBEAT_MS
from curb.inspect import inspect_command
from curb.log import Log, LogError, parse_size
from curb.message_limits import MIN_FRAME, RESERVE
from curb.metrics import Metrics, serve_http
from curb.passwd import passwd_command
from curb.ratelimit import LineLimit
from curb.server import Connection, Handshake

DEFAULT_PORT = 61613
DRAIN_SECONDS = 5.0
EXIT_IO = 1
EXIT_USAGE = 2
# Connections asyncio accepts in one loop pass: they hold file descriptors before the
# connection limit can close them, and each costs the pass time (a TLS handshake about a
# millisecond), so a storm of connections is taken in small bites between other clients'
# frames.
ACCEPT_BATCH = 16
# Connections the kernel may queue on a listener: a reconnect storm of thousands must wait
# there, not lose its SYNs (a client resends one only after a second). Linux caps it at
# net.core.somaxconn.
BACKLOG = 4096
# File descriptors -max-connections leaves for one accept batch, the log, the listeners,
# the event loop, -http's connections and a margin.
FD_HEADROOM = 128 + 64
ACCEPT_FAILED_LOG_SECONDS = 10.0
# The TLS handshake's time limit with -connect-timeout 0 (asyncio's default).
TLS_HANDSHAKE_DEFAULT_SECONDS = 60.0
# New container objects between passes of the cyclic garbage collector (Python's
# default: 700); see _settle_memory.
GC_EVERY = 50_000
# What the system says about a log file that it will keep saying until someone changes
# the file, its directory or the flags; any other error may pass (see the module docstring).
OPERATOR_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EWOULDBLOCK,
    }
)


class StartError(Exception):
    """Start-up failed: `line` says why and what to do, `status` is the exit status."""

    def __init__(self, line: str, status: int):
        super().__init__(line)
        self.line = line
        self.status = status


class Events:
    """One line per event on stderr: readable text, or JSON with -log-format json."""

    def __init__(self, fmt: str = "text"):
        self.json = fmt == "json"

    def __call__(self, event: str, text: str, **fields) -> None:
        if self.json:
            line = json.dumps({"ts": round(time.time(), 3), "event": event, "msg": text, **fields})
        else:
            line = f"curb: {text}"
        print(line, file=sys.stderr, flush=True)


def _size(ctx, param, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _max_frame(ctx, param, value: str) -> int:
    size = _size(ctx, param, value)
    if size < MIN_FRAME:
        raise click.BadParameter(
            f"{value!r} is too small: at least {MIN_FRAME} bytes (4KiB), so that a CONNECT and a MESSAGE "
            f"(the broker adds up to {RESERVE} bytes of headers) fit"
        )
    return size


def _addr(ctx, param, value: str | None):
    if value is None or value == "off":
        return None
    try:
        return parse_addr(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def default_file() -> str:
    state = os.environ.get("STATE_DIRECTORY")
    return os.path.join(state.split(":")[0], "curb.log") if state else "curb.log"


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-cap",
    "--cap",
    default="1GiB",
    show_default=True,
    callback=_size,
    help="Most bytes the log file may ever take on disk (B, KiB, MiB, GiB).",
)
@click.option(
    "-addr",
    "--addr",
    default=f":{DEFAULT_PORT}",
    show_default=True,
    callback=_addr,
    help="Where to listen, [HOST]:PORT; an empty host means every interface (IPv4 and IPv6); off: no plain TCP.",
)
@click.option("-tls-addr", "--tls-addr", default=None, callback=_addr, help="Serve STOMP over TLS on [HOST]:PORT.")
@click.option("-tls-cert", "--tls-cert", default=None, help="The TLS certificate chain (PEM), for -tls-addr.")
@click.option("-tls-key", "--tls-key", default=None, help="The TLS certificate's private key (PEM), for -tls-addr.")
@click.option(
    "-tls-ca",
    "--tls-ca",
    default=None,
    help="Require client certificates signed by these CAs (PEM); a certificate's CN can stand in for the login.",
)
@click.option(
    "-users",
    "--users",
    "users_path",
    default=None,
    help="The users file (see `curb passwd`): CONNECT must log in as one of them. Default: no logins.",
)
@click.option(
    "-connect-timeout",
    "--connect-timeout",
    default=f"{CONNECT_TIMEOUT_SECONDS:g}s",
    show_default=True,
    type=Duration("s", MAX_HEARTBEAT_MS / 1000, zero="no limit"),
    help="How long a connection has to send CONNECT before it is closed (a plain number is seconds; 0: no limit).",
)
@click.option(
    "-max-connections",
    "--max-connections",
    default=None,
    type=click.IntRange(1),
    help=f"Most client connections open at once; more are closed at once. Default: the fd limit less {FD_HEADROOM}.",
)
@click.option(
    "-file",
    "--file",
    "path",
    default=None,
    help="The log file. Default: $STATE_DIRECTORY/curb.log under systemd, else ./curb.log.",
)
@click.option(
    "-prefetch",
    "--prefetch",
    default=100,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Unacked messages a subscription may hold when SUBSCRIBE names no prefetch-count.",
)
@click.option(
    "-max-frame",
    "--max-frame",
    default="16MiB",
    show_default=True,
    callback=_max_frame,
    help="Largest frame a client may send (at least 4KiB); larger ones get an ERROR.",
)
@click.option(
    "-heartbeat",
    "--heartbeat",
    default="10s",
    show_default=True,
    type=Duration("ms", MAX_HEARTBEAT_MS / 1000, zero="no heart-beats"),
    help="Heart-beat interval offered (a plain number is ms; 0: none; at most 24h); silent peers are dropped.",
)
@click.option(
    "-ack-timeout",
    "--ack-timeout",
    default=format_seconds(ACK_TIMEOUT_SECONDS),
    show_default=True,
    type=Duration("s", MAX_HEARTBEAT_MS / 1000, zero="no deadline"),
    help="How long a delivered message waits for its ACK or NACK before it goes back to the queue "
    "(a plain number is seconds; 0: no deadline; at most 24h). SUBSCRIBE may set its own (curb-ack-timeout).",
)
@click.option(
    "-http",
    "--http",
    default=None,
    callback=_addr,
    help="Serve GET /metrics (Prometheus) and GET /stats (JSON) on [HOST]:PORT. Off by default.",
)
@click.option(
    "-log-format",
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines on stderr as text or as one JSON object each.",
)
@click.version_option(__version__, "-version", "--version", prog_name="curb")
@click.pass_context
def command(
    ctx,
    cap,
    addr,
    tls_addr,
    tls_cert,
    tls_key,
    tls_ca,
    users_path,
    connect_timeout,
    max_connections,
    path,
    prefetch,
    max_frame,
    heartbeat,
    ack_timeout,
    http,
    log_format,
):
    """Curb: one durable work queue behind a STOMP 1.2 port, kept in one capped log file.

    Run `curb -cap 10MiB -addr :61613` to serve; `curb inspect FILE` reads a log offline."""
    if ctx.invoked_subcommand is not None:
        return
    events = Events(log_format)
    tls_files = _tls_files(tls_addr, tls_cert, tls_key, tls_ca)
    try:
        code = asyncio.run(
            serve(
                cap=cap,
                addr=addr,
                tls_addr=tls_addr,
                tls_files=tls_files,
                users_path=users_path,
                connect_timeout=connect_timeout,
                max_connections=max_connections,
                path=path or default_file(),
                prefetch=prefetch,
                max_frame=max_frame,
                heartbeat=round(heartbeat * 1000),
                ack_timeout=ack_timeout,
                http=http,
                events=events,
            )
        )
    except StartError as err:
        click.echo(f"curb: {err.line}", err=True)
        sys.exit(err.status)
    except LogError as err:
        click.echo(f"curb: {err}", err=True)
        sys.exit(err.exit_status)
    except OSError as err:
        click.echo(f"curb: {_describe(err)}", err=True)
        sys.exit(EXIT_IO)
    sys.exit(code)


command.add_command(inspect_command)
command.add_command(passwd_command)


def _tls_files(tls_addr, cert: str | None, key: str | None, ca: str | None) -> tls.TlsFiles | None:
    """The TLS flags, checked together: -tls-addr needs -tls-cert and -tls-key, and they need it."""
    if tls_addr is None:
        if cert or key or ca:
            raise click.UsageError("-tls-cert, -tls-key and -tls-ca need -tls-addr [HOST]:PORT")
        return None
    if not cert or not key:
        raise click.UsageError("-tls-addr needs -tls-cert FILE and -tls-key FILE (PEM)")
    return tls.TlsFiles(cert, key, ca)


def main(argv: list[str] | None = None) -> None:
    """The console script: click's command, with usage errors as one line, exit 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = command.main(args=args, prog_name="curb", standalone_mode=False)
    except click.NoSuchOption as err:
        click.echo(f"curb: {_unknown_option(err, args)}", err=True)
        sys.exit(2)
    except click.UsageError as err:
        click.echo(f"curb: {err.format_message()}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"curb: {err.format_message()}", err=True)
        sys.exit(err.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(code or 0)


def _unknown_option(err: click.NoSuchOption, args: list[str]) -> str:
    """Name the flag as typed, with the nearest real ones. Click splits an unknown
    single-dash flag into short options, so `-caps` alone would be reported as '-c'."""
    ctx = err.ctx
    known: dict[str, str] = {}  # name -> the flag as --help shows it first (-cap, not --cap)
    for param in ctx.command.get_params(ctx) if ctx is not None else []:
        for flag in param.opts:
            known.setdefault(flag.lstrip("-"), flag)
    commands = [command, *command.commands.values()]
    every = {flag for cmd in commands for param in cmd.params for flag in param.opts} | {"-h", "--help"}
    typed = err.option_name
    if not typed.startswith("--"):
        unknown = [
            name
            for name in (arg.split("=", 1)[0] for arg in args)
            if name.startswith("-") and name not in every and typed[1:] in name[1:]
        ]
        typed = unknown[0] if unknown else typed
    near = difflib.get_close_matches(typed.lstrip("-"), list(known), n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(known[name] for name in near)}?" if near else ""
    where = ctx.command_path if ctx is not None else "curb"
    return f"no such option {typed}{hint} (`{where} --help` lists them)"


async def serve(
    *,
    cap: int,
    addr,
    path: str,
    prefetch: int,
    max_frame: int,
    heartbeat: int,
    http,
    events: Events,
    tls_addr=None,
    tls_files: tls.TlsFiles | None = None,
    users_path: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    max_connections: int | None = None,
    ack_timeout: float = ACK_TIMEOUT_SECONDS,
) -> int:
    """Recover the log, listen, serve until SIGINT/SIGTERM, then drain. Returns the exit code."""
    loop = asyncio.get_running_loop()
    metrics = Metrics()
    broker: Broker | None = None
    user_table = _load_users(users_path) if users_path is not None else None
    tls_listener = _load_tls(tls_files) if tls_files is not None else None
    fd_limit = _raise_fd_limit()
    loop.set_exception_handler(_accept_failures_as_lines(events))
    if max_connections is None:
        max_connections = max(1, fd_limit - FD_HEADROOM)

    def new_session() -> Connection:
        # The servers are created before the log is recovered, but they start serving
        # (and so call this) only after the broker below is in place.
        assert broker is not None, "a connection was accepted before the broker existed"
        return Connection(broker)

    def new_tls_session() -> Handshake:
        assert broker is not None and tls_listener is not None, "a TLS connection came before the broker"
        return Handshake(broker, tls_listener.context, connect_timeout or TLS_HANDSHAKE_DEFAULT_SECONDS)

    inherited = systemd.listen_sockets()
    servers: list[asyncio.Server] = []
    if inherited:
        servers = [await loop.create_server(new_session, sock=s, start_serving=False) for s in inherited]
        names = ", ".join(_sockname(s) for s in inherited)
        where = f"listening on {names} (socket passed by systemd; -addr ignored)"
    elif addr is not None:
        servers = [
            await _listen(
                "-addr",
                addr,
                lambda: loop.create_server(
                    new_session, addr[0], addr[1], reuse_address=True, backlog=ACCEPT_BATCH, start_serving=False
                ),
            )
        ]
        names = ", ".join(_sockname(s) for s in servers[0].sockets)
        where = f"listening on {names}, log {path}, cap {cap} bytes"
    elif tls_addr is None:
        raise StartError("-addr off needs -tls-addr [HOST]:PORT, or nothing would listen", EXIT_USAGE)
    else:
        names = where = ""
    if tls_listener is not None:
        tls_server = await _listen(
            "-tls-addr",
            tls_addr,
            lambda: loop.create_server(
                new_tls_session,
                tls_addr[0],
                tls_addr[1],
                reuse_address=True,
                backlog=ACCEPT_BATCH,
                start_serving=False,
            ),
        )
        servers.append(tls_server)
        tls_names = ", ".join(_sockname(s) for s in tls_server.sockets)
        mutual = ", client certificates required" if tls_files and tls_files.ca else ""
        if where:
            where += f"; TLS on {tls_names}{mutual}"
        else:
            names = tls_names
            where = f"listening on {tls_names} (TLS{mutual}), log {path}, cap {cap} bytes"
    try:
        log = _open_log(path, cap, max_frame, metrics)
    except BaseException:
        for server in servers:
            server.close()
        raise
    rec = log.recovery
    _warn_if_disk_is_short(events, path, cap, log.file_bytes)
    events(
        "recovered",
        f"recovered {rec.messages} messages ({rec.live_bytes} bytes) from {path} "
        f"in {rec.seconds:.3f}s"
        + (f"; {rec.torn}" if rec.torn else "")
        + (f" ({rec.skipped_bytes} bytes in all, never delivered)" if rec.skipped_bytes else ""),
        file=path,
        messages=rec.messages,
        bytes=rec.live_bytes,
        torn=rec.torn,
        skipped_bytes=rec.skipped_bytes,
        seconds=round(rec.seconds, 3),
    )
    checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="curb-login")  # a core at most

    def offload(work, then) -> None:
        loop.run_in_executor(checks, work).add_done_callback(lambda done: then(done.result()))

    broker = Broker(
        log,
        offload=offload,
        prefetch=prefetch,
        max_frame=max_frame,
        heartbeat_ms=heartbeat,
        users=user_table,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        ack_timeout=ack_timeout,
        metrics=metrics,
        events=events,
    )
    stop = loop.create_future()
    fatal: list[str] = []

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    def on_reload() -> None:
        if users_path is not None:
            try:
                broker.users = _load_users(users_path)
                events("reloaded", f"reloaded {len(broker.users)} users from {users_path}", file=users_path)
            except StartError as err:
                events("reload_failed", f"{err.line}; kept the {len(broker.users or {})} users read before")
        if tls_listener is not None:
            try:
                tls_listener.reload()
                events("reloaded", "reloaded the TLS certificate, key and CA for new connections")
            except tls.TlsError as err:
                events("reload_failed", f"cannot reload TLS: {err}; new connections keep the old certificate")

    # Before the `listening` line: whoever starts curb may signal it as soon as it reads it.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, on_reload)

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        events("fatal", f"stopping: {reason}", reason=reason)
        if not stop.done():
            stop.set_result(None)

    log.on_fatal = on_fatal
    log.on_damage = lambda text: events("damage", text)
    log.start(loop)
    stomp_servers = list(servers)
    try:
        if http is not None:
            web = await _listen("-http", http, lambda: serve_http(http[0] or "", http[1], metrics, broker.gauges))
            servers.append(web)
            web_addr = _sockname(web.sockets[0])
            events("http", f"metrics on http://{web_addr}/metrics (Prometheus) and /stats (JSON)", addr=web_addr)
    except BaseException:
        for server in servers:
            server.close()
        await log.close()
        raise
    for server in servers:
        await server.start_serving()
        _widen_backlog(server)
    _settle_memory()
    # Before the `listening` line, which tells the tests and Spark the broker is ready.
    _say_who_may_connect(events, stomp_servers, user_table, users_path, max_connections, fd_limit)
    events("listening", where, addr=names, file=path, cap=cap)
    systemd.notify("READY=1", f"STATUS=serving {rec.messages} recovered messages")
    await stop
    systemd.notify("STOPPING=1")
    events("stopping", "stopping: draining syncs and receipts")
    for server in servers:
        server.close()
    broker.stop_delivering()
    await log.close()
    broker.close_sessions()
    deadline = loop.time() + DRAIN_SECONDS
    while broker.sessions and loop.time() < deadline:
        await asyncio.sleep(0.01)
    checks.shutdown(wait=False, cancel_futures=True)
    events("stopped", "stopped")
    return EXIT_IO if fatal else 0


def _widen_backlog(server: asyncio.Server) -> None:
    """asyncio listens with the backlog it accepts in one go (ACCEPT_BATCH): listen again,
    on the same sockets, with a kernel queue that holds a reconnect storm (BACKLOG)."""
    for listening in server.sockets:
        sock = socket.socket(fileno=listening.fileno())
        try:
            sock.listen(BACKLOG)
        finally:
            sock.detach()


def _load_users(path: str) -> dict[str, users.User]:
    """The users file; a file without users is refused like a broken one: it would let
    the broker start, and then refuse every CONNECT."""
    try:
        with open(path, encoding="utf-8") as f:
            table = users.parse(f.read())
    except (OSError, UnicodeDecodeError, users.UsersError) as err:
        reason = _reason(err) if isinstance(err, OSError) else str(err)
        raise StartError(
            f"cannot use users file {path}: {reason}; fix it (curb passwd) or -users", EXIT_USAGE
        ) from None
    if not table:
        raise StartError(
            f"users file {path} has no users, so every CONNECT would be refused; "
            f"add one with `curb passwd {path} NAME --perm send --perm consume`",
            EXIT_USAGE,
        )
    return table


def _warn_if_disk_is_short(events: Callable[..., None], path: str, cap: int, file_bytes: int) -> None:
    """A -cap the log's file system cannot hold is a queue that refuses SENDs as 'disk
    full' long before it is full: say so at start-up, while the operator is looking."""
    where = os.path.dirname(os.path.abspath(path))
    space = os.statvfs(where)
    free = space.f_bavail * space.f_frsize
    if cap - file_bytes > free:
        mib = 1 << 20
        events(
            "disk_space",
            f"WARNING: -cap is {cap / mib:.1f} MiB and the log takes {file_bytes / mib:.1f} MiB, but {where} "
            f"has only {free / mib:.1f} MiB free: SENDs will be refused as 'disk full' before the queue is "
            "full; free space there or lower -cap",
            level="warning",
            cap=cap,
            file_bytes=file_bytes,
            free=free,
        )


def _load_tls(files: tls.TlsFiles) -> tls.Listener:
    try:
        return tls.Listener(files)
    except tls.TlsError as err:
        raise StartError(f"TLS: {err}; fix -tls-cert, -tls-key or -tls-ca", EXIT_USAGE) from None


def _raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one (systemd may forbid it: then
    keep what we have). Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft


def _accept_failures_as_lines(events: Callable[..., None]):
    """The loop's exception handler: accept() failing at the fd limit (asyncio retries it a
    second later) is one line per ACCEPT_FAILED_LOG_SECONDS, not a traceback per try."""
    lines = LineLimit(ACCEPT_FAILED_LOG_SECONDS)

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        err = context.get("exception")
        if context.get("message") != "socket.accept() out of system resource" or not isinstance(err, OSError):
            loop.default_exception_handler(context)
            return
        failures = lines.hit(loop.time())
        if failures:
            events(
                "accept_failed",
                f"cannot accept connections: {_reason(err)}, {failures} times; retrying each second "
                f"(raise the fd limit, LimitNOFILE=, or lower -max-connections)",
                reason=_reason(err),
                failures=failures,
            )

    return handle


def _settle_memory() -> None:
    """Tune the cyclic garbage collector for serving. A message's objects (its record,
    frame, receipt callback) are freed by reference counting as soon as it is done; the
    collector only has to find the rare cycle, such as a closed connection's session and
    protocol. With Python's default it ran every 700 new objects, hundreds of times a
    second under load, each time walking the thousands of messages in flight: about 5%
    of the broker's time per SEND. Run it every GC_EVERY new objects, and never again over
    what start-up made (modules, the recovered state), which lives as long as the broker."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_EVERY, 20, 10)


def _say_who_may_connect(events: Events, servers, table, users_path, max_connections: int, fd_limit: int) -> None:
    """One line on access: the users file, or a warning that anyone may do anything."""
    limits = f"at most {max_connections} connections (fd limit {fd_limit})"
    if table is not None:
        events("access", f"{len(table)} users from {users_path}; {limits}", users=len(table), file=users_path)
        return
    exposed = [_sockname(sock) for server in servers for sock in server.sockets if not _is_loopback(sock)]
    if exposed:
        events(
            "access",
            f"WARNING: no -users, so any client that reaches {', '.join(exposed)} may send, consume and count; "
            f"add -users FILE (see curb passwd) or listen on 127.0.0.1; {limits}",
            level="warning",
        )
    else:
        events("access", f"no -users: any local client may send, consume and count; {limits}", level="info")


def _is_loopback(sock) -> bool:
    name = sock.getsockname()
    if not isinstance(name, tuple):
        return True  # a Unix socket: only this machine
    try:
        return ipaddress.ip_address(name[0]).is_loopback
    except ValueError:
        return False


async def _listen(
    flag: str, addr: tuple[str | None, int], open_server: Callable[[], Awaitable[asyncio.Server]]
) -> asyncio.Server:
    """The server `open_server` makes; an address it cannot bind is the operator's to change."""
    try:
        return await open_server()
    except OSError as err:
        # asyncio wraps a bind error in a long text of its own; a name lookup's errno is < 0.
        reason = os.strerror(err.errno) if err.errno and err.errno > 0 else err.strerror or str(err)
        raise StartError(f"cannot listen on {_addr_text(addr)}: {reason}; pick another {flag}", EXIT_USAGE) from None


def _open_log(path: str, cap: int, max_frame: int, metrics: Metrics) -> Log:
    """Open and recover the log. An OSError here is about the log file, so the line names it,
    and its errno decides whether the operator must act (2) or a retry may do (1)."""
    try:
        return Log(path, cap, max_payload=max_frame, metrics=metrics)
    except OSError as err:
        if err.errno in OPERATOR_ERRNOS:
            raise StartError(
                f"cannot use log file {path}: {_reason(err)}; fix that or pick another -file", EXIT_USAGE
            ) from None
        raise StartError(f"cannot use log file {path}: {_reason(err)}", EXIT_IO) from None


def _reason(err: OSError) -> str:
    """The errno's text and name, 'Input/output error (EIO)', for operators and for grep."""
    if not err.errno:
        return str(err)
    return f"{err.strerror or os.strerror(err.errno)} ({errno.errorcode.get(err.errno, err.errno)})"


def _describe(err: OSError) -> str:
    """An OSError from outside start-up's known steps, with the file it names if any."""
    where = f" ({err.filename})" if err.filename else ""
    return f"{_reason(err)}{where}"


def _addr_text(addr: tuple[str | None, int]) -> str:
    host, port = addr
    if host and ":" in host:
        host = f"[{host}]"
    return f"{host or ''}:{port}"


def _sockname(sock) -> str:
    name = sock.getsockname()
    if isinstance(name, tuple):
        host = f"[{name[0]}]" if ":" in name[0] else name[0]
        return f"{host}:{name[1]}"
    return str(name)
