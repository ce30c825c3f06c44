"""The composition root: one broker instance made from one frozen `Config`.

`Instance(config)` owns everything one queue needs at run time: the users table, the TLS
listener's context, the listeners (plain TCP, TLS, the HTTP side), the log and the
broker. `start()` opens them in the order the operator's errors must come in (listeners
first, so a taken port is refused before a long recovery; then the log; then the HTTP
side, which needs the broker), and `stop()` drains them: no more accepting, every wip
message rdy again, the owed fsyncs and receipts finished, then the connections closed.

Whatever is the whole process's, not one instance's, happens only with `process=True`
(the `curb` command): raising the open-file limit, taking systemd's listening sockets,
routing accept() failures to rate-limited lines, tuning the garbage collector and telling
systemd it is ready. So an in-process test, or a router over many instances, is a few
lines on top of this module:

    async with Instance(Config(path="q.log", addr=("127.0.0.1", 0))) as curb:
        host, port = curb.addresses[0]
        ...

Start-up failures are `StartError` (a line for the operator and the exit status, see
curb.cli), `LogError` or OSError; whatever was opened before the failure is closed again.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import json
import os
import resource
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from curb import heap, systemd, tls, users
from curb.broker import Broker, BrokerEvents
from curb.broker_config import ACK_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS, BrokerConfig
from curb.log import Log
from curb.log.events import LogEvents
from curb.metrics import Metrics
from curb.ratelimit import LineLimit
from curb.redelivery import Redelivery
from curb.server import Connection, Handshake
from curb.web.settings import NarconiSettings

if TYPE_CHECKING:
    from curb.web.front import WebFront

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
# the file, its directory or the flags; any other error may pass (see curb.cli).
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

Addr = tuple[str | None, int]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting of one instance, as the flags give it (docs/guide.md: Flags). An address
    of None is a listener that is off; `max_connections` None is the fd limit less
    FD_HEADROOM."""

    path: str = "curb.log"
    cap: int = 1 << 30
    addr: Addr | None = ("", DEFAULT_PORT)
    tls_addr: Addr | None = None
    tls_files: tls.TlsFiles | None = None
    users_path: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS  # seconds; 0: no limit
    max_connections: int | None = None
    prefetch: int = 100
    max_frame: int = 16 << 20
    heartbeat_ms: int = 10_000
    ack_timeout: float = ACK_TIMEOUT_SECONDS  # seconds; 0: no deadline
    # -redelivery-delay, -redelivery-multiplier, -redelivery-max-delay, -max-deliveries
    redelivery: Redelivery = field(default_factory=Redelivery)
    drop_expired: bool = False  # -expired drop
    http: Addr | None = None
    http_tls: bool = False  # -http serves https and wss with tls_files
    http_open: bool = False  # -http may serve the network without -users (else a refusal at start-up)
    http_origins: tuple[str, ...] = ()  # web page origins allowed besides the broker's own
    narconi: NarconiSettings = field(default_factory=NarconiSettings)  # -narconi-max-message, -ttl, -limit


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

    def __call__(self, event: str, text: str, **fields: object) -> None:
        if self.json:
            line = json.dumps({"ts": round(time.time(), 3), "event": event, "msg": text, **fields})
        else:
            line = f"curb: {text}"
        print(line, file=sys.stderr, flush=True)


def _quiet(event: str, text: str, **fields: object) -> None:
    """The events of an instance nobody reads (tests)."""


class _LogEvents(BrokerEvents):
    """The log's events in a running instance: the broker's, and damage and a fatal
    error as event lines (a fatal one stops the instance)."""

    def __init__(self, events: Callable[..., None], stop: Callable[[str], None]) -> None:
        self.events = events
        self.stop = stop

    def fatal(self, reason: str) -> None:
        super().fatal(reason)
        self.stop(reason)

    def damage(self, text: str) -> None:
        self.events("damage", text)


class Instance:
    """One queue: its log, broker, listeners and HTTP side, from `start` to `stop`."""

    def __init__(self, config: Config, events: Callable[..., None] = _quiet, process: bool = False):
        self.config = config
        self.events = events
        self.process = process  # the whole process is this instance (see the module docstring)
        self.metrics = Metrics()
        self.broker: Broker
        self.log: Log
        self.users: dict[str, users.User] | None = None
        self.addresses: list[tuple[str, int]] = []  # the plain STOMP listeners' bound addresses
        self.tls_addresses: list[tuple[str, int]] = []
        self.http_address: tuple[str, int] | None = None
        self.web: WebFront | None = None
        self._tls: tls.Listener | None = None
        self._servers: list[asyncio.Server] = []
        self._checks: ThreadPoolExecutor | None = None
        self._heap: heap.Keeper | None = None  # the process's, when it runs as one (curb.heap)
        self._stop = asyncio.Event()
        self._fatal: list[str] = []
        self._stopped = False

    # ---------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Recover the log and serve; raises (StartError, LogError, OSError) with nothing
        left open when a step fails."""
        config, events = self.config, self.events
        loop = asyncio.get_running_loop()
        self.users = load_users(config.users_path) if config.users_path is not None else None
        self._tls = _load_tls(config.tls_files) if config.tls_files is not None else None
        if self.process:
            self._heap = heap.install(loop)
            fd_limit = _raise_fd_limit()
            loop.set_exception_handler(_accept_failures_as_lines(events))
        else:
            fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        max_connections = config.max_connections or max(1, fd_limit - FD_HEADROOM)
        names, where = await self._listen_stomp(loop)
        try:
            log_events = _LogEvents(events, self._on_fatal)
            self.log = _open_log(config.path, config.cap, config.max_frame, self.metrics, log_events)
        except BaseException:
            self._close_servers()
            raise
        core = self.log.core
        rec = core.recovery
        _warn_if_disk_is_short(events, config.path, config.cap, core.file_bytes)
        # Every state a message can be recovered in: the log counts each (rdy, delayed, dead).
        rdy, delayed, dead = core.unread, core.delayed, core.dead
        messages = rdy + delayed + dead
        events(
            "recovered",
            f"recovered {messages} messages ({rdy} rdy, {delayed} delayed, {dead} dead; {core.live_bytes} bytes) "
            f"from {config.path} in {rec.seconds:.3f}s"
            + (f"; {rec.torn}" if rec.torn else "")
            + (f" ({rec.skipped_bytes} bytes in all, never delivered)" if rec.skipped_bytes else ""),
            file=config.path,
            messages=messages,
            rdy=rdy,
            delayed=delayed,
            dead=dead,
            bytes=core.live_bytes,
            torn=rec.torn,
            skipped_bytes=rec.skipped_bytes,
            seconds=round(rec.seconds, 3),
        )
        checks = self._checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="curb-login")  # a core at most

        def offload(work: Callable[[], T], then: Callable[[T], None]) -> None:
            loop.run_in_executor(checks, work).add_done_callback(lambda done: then(done.result()))

        self.broker = Broker(
            self.log.core,
            BrokerConfig(
                prefetch=config.prefetch,
                max_frame=config.max_frame,
                heartbeat_ms=config.heartbeat_ms,
                connect_timeout=config.connect_timeout,
                max_connections=max_connections,
                ack_timeout=config.ack_timeout,
                redelivery=config.redelivery,
                drop_expired=config.drop_expired,
            ),
            offload=offload,
            users=self.users,
            metrics=self.metrics,
            events=events,
        )
        log_events.broker = self.broker
        self.log.start(loop)
        stomp_servers = list(self._servers)
        try:
            await self._start_http()
        except BaseException:
            self._close_servers()
            await self.log.close()
            raise
        for server in self._servers:
            await server.start_serving()
            _widen_backlog(server)
        if self.process:
            _settle_memory()
            if self._heap is not None:
                self._heap.trim()  # what recovery freed goes back before serving
        # Before the `listening` line, which tells the tests and Spark the broker is ready.
        web_sockets = self.web.sockets if self.web is not None else []
        _say_who_may_connect(
            events, stomp_servers, web_sockets, self.users, config.users_path, max_connections, fd_limit
        )
        events("listening", where, addr=names, file=config.path, cap=config.cap)
        if self.process:
            systemd.notify("READY=1", f"STATUS=serving {messages} recovered messages")

    async def _listen_stomp(self, loop: asyncio.AbstractEventLoop) -> tuple[str, str]:
        """Open the STOMP listeners (not serving yet): (their names, the `listening` line)."""
        config = self.config
        addr, tls_addr = config.addr, config.tls_addr

        def new_session() -> Connection:
            # The servers start serving (and so call this) only once the broker is in place.
            return Connection(self.broker)

        def new_tls_session() -> Handshake:
            assert self._tls is not None
            return Handshake(self.broker, self._tls.context, config.connect_timeout or TLS_HANDSHAKE_DEFAULT_SECONDS)

        inherited = systemd.listen_sockets() if self.process else []
        if inherited:
            self._servers = [await loop.create_server(new_session, sock=s, start_serving=False) for s in inherited]
            names = ", ".join(sockname(s) for s in inherited)
            where = f"listening on {names} (socket passed by systemd; -addr ignored)"
        elif addr is not None:
            self._servers = [await listen("-addr", addr, _stomp_server(loop, new_session, addr))]
            names = ", ".join(sockname(s) for s in self._servers[0].sockets)
            where = f"listening on {names}, log {config.path}, cap {config.cap} bytes"
        elif tls_addr is None:
            raise StartError("-addr off needs -tls-addr [HOST]:PORT, or nothing would listen", EXIT_USAGE)
        else:
            names = where = ""
        self.addresses = [s.getsockname()[:2] for server in self._servers for s in server.sockets]
        if self._tls is not None and tls_addr is not None:
            try:
                tls_server = await listen("-tls-addr", tls_addr, _stomp_server(loop, new_tls_session, tls_addr))
            except BaseException:
                self._close_servers()
                raise
            self._servers.append(tls_server)
            self.tls_addresses = [s.getsockname()[:2] for s in tls_server.sockets]
            tls_names = ", ".join(sockname(s) for s in tls_server.sockets)
            mutual = ", client certificates required" if config.tls_files and config.tls_files.ca else ""
            if where:
                where += f"; TLS on {tls_names}{mutual}"
            else:
                names = tls_names
                where = f"listening on {tls_names} (TLS{mutual}), log {config.path}, cap {config.cap} bytes"
        return names, where

    async def _start_http(self) -> None:
        """The web front (-http, curb.web), over TLS with -http-tls."""
        http = self.config.http
        if http is None:
            return
        from curb.web.front import broker_front  # aiohttp loads only when -http asks for it

        web = self.web = broker_front(
            self.broker, self.metrics, self.events, self.config.http_origins, http[0], self.config.narconi
        )
        context = self._tls.context if self.config.http_tls and self._tls is not None else None
        await listen("-http", http, lambda: web.start(http[0], http[1], context))
        exposed = [sockname(sock) for sock in web.sockets if not is_loopback(sock)]
        if exposed and self.users is None and not self.config.http_open:
            await web.stop()
            self.web = None
            raise StartError(
                f"-http {', '.join(exposed)} is reachable from the network and there is no -users: any client "
                "that reaches it could publish, consume and purge; add -users FILE (see curb passwd), listen on "
                "127.0.0.1, or add -http-open if that is what you mean",
                2,
            )
        self.http_address = web.sockets[0].getsockname()[:2]
        web_addr = sockname(web.sockets[0])
        scheme = "https" if context is not None else "http"
        self.events(
            "http",
            f"web front on {scheme}://{web_addr}: the console at /, the HTTP API under /v2, STOMP over WebSocket "
            f"at /ws, metrics on {scheme}://{web_addr}/metrics (Prometheus) and /stats (JSON)",
            addr=web_addr,
        )

    def request_stop(self) -> None:
        """Ask `wait` to return (SIGINT, SIGTERM, a test); `stop` does the stopping."""
        self._stop.set()

    async def wait(self) -> None:
        """Until `request_stop`, or the log failed for good."""
        await self._stop.wait()

    async def stop(self) -> int:
        """Stop accepting, make every wip message rdy, finish the owed fsyncs and receipts,
        close the connections (waiting up to DRAIN_SECONDS for them). Returns the exit
        status: EXIT_IO when the log failed while serving, else 0. Once stopped, stopping
        again only returns the status."""
        if self._stopped:
            return EXIT_IO if self._fatal else 0
        self._stopped = True
        loop = asyncio.get_running_loop()
        self.events("stopping", "stopping: draining syncs and receipts")
        self._close_servers()
        if self.web is not None:
            await self.web.stop()
        broker = self.broker
        broker.stop_delivering()
        await self.log.close()
        broker.close_sessions()
        deadline = loop.time() + DRAIN_SECONDS
        while broker.sessions and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self._checks is not None:
            self._checks.shutdown(wait=False, cancel_futures=True)
        if self._heap is not None:
            self._heap.release()
        self.events("stopped", "stopped")
        return EXIT_IO if self._fatal else 0

    async def __aenter__(self) -> Instance:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def reload(self) -> None:
        """Re-read the users file and the TLS files (SIGHUP); a broken one is logged and
        the old one kept."""
        events, path = self.events, self.config.users_path
        if not hasattr(self, "broker"):  # a SIGHUP during start-up: it reads the files anyway
            return
        if path is not None:
            try:
                self.users = self.broker.users = load_users(path)
                events("reloaded", f"reloaded {len(self.users)} users from {path}", file=path)
            except StartError as err:
                events("reload_failed", f"{err.line}; kept the {len(self.broker.users or {})} users read before")
        if self._tls is not None:
            try:
                self._tls.reload()
                events("reloaded", "reloaded the TLS certificate, key and CA for new connections")
            except tls.TlsError as err:
                events("reload_failed", f"cannot reload TLS: {err}; new connections keep the old certificate")

    def _on_fatal(self, reason: str) -> None:
        self._fatal.append(reason)
        self.events("fatal", f"stopping: {reason}", reason=reason)
        self._stop.set()

    def _close_servers(self) -> None:
        for server in self._servers:
            server.close()


def _stomp_server(
    loop: asyncio.AbstractEventLoop, protocol: Callable[[], asyncio.Protocol], addr: Addr
) -> Callable[[], Awaitable[asyncio.Server]]:
    return lambda: loop.create_server(
        protocol, addr[0], addr[1], reuse_address=True, backlog=ACCEPT_BATCH, start_serving=False
    )


def _widen_backlog(server: asyncio.Server) -> None:
    """asyncio listens with the backlog it accepts in one go (ACCEPT_BATCH): listen again,
    on the same sockets, with a kernel queue that holds a reconnect storm (BACKLOG)."""
    for listening in server.sockets:
        sock = socket.socket(fileno=listening.fileno())
        try:
            sock.listen(BACKLOG)
        finally:
            sock.detach()


def load_users(path: str) -> dict[str, users.User]:
    """The users file; a file without users is refused like a broken one: it would let
    the broker start, and then refuse every CONNECT."""
    try:
        with open(path, encoding="utf-8") as f:
            table = users.parse(f.read())
    except (OSError, UnicodeDecodeError, users.UsersError) as err:
        reason = reason_of(err) if isinstance(err, OSError) else str(err)
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


def _accept_failures_as_lines(
    events: Callable[..., None],
) -> Callable[[asyncio.AbstractEventLoop, dict[str, object]], None]:
    """The loop's exception handler: accept() failing at the fd limit (asyncio retries it a
    second later) is one line per ACCEPT_FAILED_LOG_SECONDS, not a traceback per try."""
    lines = LineLimit(ACCEPT_FAILED_LOG_SECONDS)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        err = context.get("exception")
        if context.get("message") != "socket.accept() out of system resource" or not isinstance(err, OSError):
            loop.default_exception_handler(context)
            return
        failures = lines.hit(loop.time())
        if failures:
            events(
                "accept_failed",
                f"cannot accept connections: {reason_of(err)}, {failures} times; retrying each second "
                f"(raise the fd limit, LimitNOFILE=, or lower -max-connections)",
                reason=reason_of(err),
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


def _say_who_may_connect(
    events: Callable[..., None],
    servers: Sequence[asyncio.Server],
    web_sockets: Sequence[socket.socket],
    table: dict[str, users.User] | None,
    users_path: str | None,
    max_connections: int,
    fd_limit: int,
) -> None:
    """One line on access: the users file, or who may do what without one, naming every
    listener that the network reaches (STOMP's and the web front's)."""
    limits = f"at most {max_connections} connections (fd limit {fd_limit})"
    if table is not None:
        events("access", f"{len(table)} users from {users_path}; {limits}", users=len(table), file=users_path)
        return
    stomp = [sockname(sock) for server in servers for sock in server.sockets if not is_loopback(sock)]
    web = [sockname(sock) for sock in web_sockets if not is_loopback(sock)]
    exposed = [f"{addr} (STOMP)" for addr in stomp] + [f"{addr} (HTTP, -http-open)" for addr in web]
    if exposed:
        events(
            "access",
            f"WARNING: no -users, so any client that reaches {', '.join(exposed)} may send, consume and count"
            + (", and over HTTP purge" if web else "")
            + f"; add -users FILE (see curb passwd) or listen on 127.0.0.1; {limits}",
            level="warning",
        )
    else:
        events("access", f"no -users: any local client may send, consume and count; {limits}", level="info")


def is_loopback(sock: socket.socket) -> bool:
    name = sock.getsockname()
    if not isinstance(name, tuple):
        return True  # a Unix socket: only this machine
    try:
        return ipaddress.ip_address(name[0]).is_loopback
    except ValueError:
        return False


async def listen(flag: str, addr: Addr, open_server: Callable[[], Awaitable[T]]) -> T:
    """The server `open_server` makes; an address it cannot bind is the operator's to change."""
    try:
        return await open_server()
    except OSError as err:
        # asyncio wraps a bind error in a long text of its own; a name lookup's errno is < 0.
        reason = os.strerror(err.errno) if err.errno and err.errno > 0 else err.strerror or str(err)
        raise StartError(f"cannot listen on {addr_text(addr)}: {reason}; pick another {flag}", EXIT_USAGE) from None


def _open_log(path: str, cap: int, max_frame: int, metrics: Metrics, events: LogEvents) -> Log:
    """Open and recover the log. An OSError here is about the log file, so the line names it,
    and its errno decides whether the operator must act (2) or a retry may do (1)."""
    try:
        return Log(path, cap, max_payload=max_frame, metrics=metrics, events=events)
    except OSError as err:
        if err.errno in OPERATOR_ERRNOS:
            raise StartError(
                f"cannot use log file {path}: {reason_of(err)}; fix that or pick another -file", EXIT_USAGE
            ) from None
        raise StartError(f"cannot use log file {path}: {reason_of(err)}", EXIT_IO) from None


def reason_of(err: OSError) -> str:
    """The errno's text and name, 'Input/output error (EIO)', for operators and for grep."""
    if not err.errno:
        return str(err)
    return f"{err.strerror or os.strerror(err.errno)} ({errno.errorcode.get(err.errno, err.errno)})"


def addr_text(addr: Addr) -> str:
    host, port = addr
    if host and ":" in host:
        host = f"[{host}]"
    return f"{host or ''}:{port}"


def sockname(sock: socket.socket) -> str:
    name = sock.getsockname()
    if isinstance(name, tuple):
        host = f"[{name[0]}]" if ":" in name[0] else name[0]
        return f"{host}:{name[1]}"
    return str(name)
