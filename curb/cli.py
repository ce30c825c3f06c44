"""The `curb` command: flags, start-up, signals, systemd readiness, and log lines.

Usage errors (bad size or address, a port in use, a log file that cannot be used) exit
with status 2 and one line that says what to fix. SIGINT and SIGTERM stop accepting,
finish the owed syncs and receipts, and exit 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import click

from curb import __version__, systemd
from curb.inspect import inspect_command
from curb.log import Log, LogError, parse_size
from curb.metrics import Metrics, serve_http
from curb.server import Broker, Session

DEFAULT_PORT = 61613
DRAIN_SECONDS = 5.0


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


def parse_addr(text: str) -> tuple[str | None, int]:
    """(host or None for every interface, port) from '[HOST]:PORT', ':PORT' or '[::1]:PORT'."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"bad address {text!r}: use [HOST]:PORT, e.g. :61613 or 127.0.0.1:61613")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bad address {text!r}: put an IPv6 host in brackets, e.g. [::1]:61613")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}: use a number from 0 to 65535, e.g. :61613")
    return (host or None), int(port)


def _size(ctx, param, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _addr(ctx, param, value: str | None):
    if value is None:
        return None
    try:
        return parse_addr(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def default_file() -> str:
    state = os.environ.get("STATE_DIRECTORY")
    return os.path.join(state.split(":")[0], "curb.log") if state else "curb.log"


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-cap", "--cap", default="1GiB", show_default=True, callback=_size,
              help="Most bytes the log file may ever take on disk (B, KiB, MiB, GiB).")
@click.option("-addr", "--addr", default=f":{DEFAULT_PORT}", show_default=True, callback=_addr,
              help="Where to listen, [HOST]:PORT; an empty host means every interface (IPv4 and IPv6).")
@click.option("-file", "--file", "path", default=None,
              help="The log file. Default: $STATE_DIRECTORY/curb.log under systemd, else ./curb.log.")
@click.option("-prefetch", "--prefetch", default=100, show_default=True, type=click.IntRange(1, 10000),
              help="Unacked messages a subscription may hold when SUBSCRIBE names no prefetch-count.")
@click.option("-max-frame", "--max-frame", default="16MiB", show_default=True, callback=_size,
              help="Largest frame a client may send; larger ones get an ERROR.")
@click.option("-heartbeat", "--heartbeat", default=10000, show_default=True, type=click.IntRange(0),
              help="Heart-beat interval offered to clients, in ms (0: none). Silent peers are dropped.")
@click.option("-http", "--http", default=None, callback=_addr,
              help="Serve GET /metrics (Prometheus) and GET /stats (JSON) on [HOST]:PORT. Off by default.")
@click.option("-log-format", "--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Log lines on stderr as text or as one JSON object each.")
@click.version_option(__version__, "-version", "--version", prog_name="curb")
@click.pass_context
def command(ctx, cap, addr, path, prefetch, max_frame, heartbeat, http, log_format):
    """Curb: one durable work queue behind a STOMP 1.2 port, kept in one capped log file.

    Run `curb -cap 10MiB -addr :61613` to serve; `curb inspect FILE` reads a log offline."""
    if ctx.invoked_subcommand is not None:
        return
    events = Events(log_format)
    try:
        code = asyncio.run(serve(cap=cap, addr=addr, path=path or default_file(), prefetch=prefetch,
                                 max_frame=max_frame, heartbeat=heartbeat, http=http, events=events))
    except LogError as err:
        click.echo(f"curb: {err}", err=True)
        sys.exit(2)
    except OSError as err:
        click.echo(f"curb: cannot listen: {err.strerror or err}; pick another -addr", err=True)
        sys.exit(2)
    sys.exit(code)


command.add_command(inspect_command)


def main(argv: list[str] | None = None) -> None:
    """The console script: click's command, with usage errors as one line, exit 2."""
    try:
        code = command.main(args=argv, prog_name="curb", standalone_mode=False)
    except click.UsageError as err:
        click.echo(f"curb: {err.format_message()}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"curb: {err.format_message()}", err=True)
        sys.exit(err.exit_code)
    except click.Abort:
        sys.exit(130)
    sys.exit(code or 0)


async def serve(*, cap: int, addr, path: str, prefetch: int, max_frame: int, heartbeat: int,
                http, events: Events) -> int:
    """Recover the log, listen, serve until SIGINT/SIGTERM, then drain. Returns the exit code."""
    loop = asyncio.get_running_loop()
    metrics = Metrics()
    broker: Broker | None = None
    inherited = systemd.listen_sockets()
    if inherited:
        servers = [await loop.create_server(lambda: Session(broker), sock=s, start_serving=False)
                   for s in inherited]
        names = ", ".join(_sockname(s) for s in inherited)
        where = f"listening on {names} (socket passed by systemd; -addr ignored)"
    else:
        host, port = addr
        servers = [await loop.create_server(lambda: Session(broker), host, port, reuse_address=True,
                                            start_serving=False)]
        names = ", ".join(_sockname(s) for s in servers[0].sockets)
        where = f"listening on {names}, log {path}, cap {cap} bytes"
    try:
        log = Log(path, cap, max_payload=max_frame, metrics=metrics)
    except BaseException:
        for server in servers:
            server.close()
        raise
    rec = log.recovery
    events("recovered", f"recovered {rec.messages} messages ({rec.live_bytes} bytes) from {path} "
           f"in {rec.seconds:.3f}s" + (f"; {rec.torn}" if rec.torn else ""),
           file=path, messages=rec.messages, bytes=rec.live_bytes, torn=rec.torn, seconds=round(rec.seconds, 3))
    broker = Broker(log, prefetch=prefetch, max_frame=max_frame, heartbeat_ms=heartbeat,
                    metrics=metrics, events=events)
    stop = loop.create_future()
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        events("fatal", f"stopping: {reason}", reason=reason)
        if not stop.done():
            stop.set_result(None)

    log.on_fatal = on_fatal
    log.start(loop)
    try:
        if http is not None:
            web = await serve_http(http[0] or "", http[1], metrics, broker.gauges)
            servers.append(web)
            events("http", "metrics on http://%s/metrics" % _sockname(web.sockets[0]),
                   addr=_sockname(web.sockets[0]))
    except BaseException:
        for server in servers:
            server.close()
        await log.close()
        raise
    for server in servers:
        await server.start_serving()
    events("listening", where, addr=names, file=path, cap=cap)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    systemd.notify("READY=1", f"STATUS=serving {rec.messages} recovered messages")
    await stop
    systemd.notify("STOPPING=1")
    events("stopping", "stopping: draining syncs and receipts")
    for server in servers:
        server.close()
    for session in list(broker.sessions):
        session.transport.pause_reading()
        broker.requeue(broker.queue.close(session))
    await log.close()
    for session in list(broker.sessions):
        session.close_transport()
    deadline = loop.time() + DRAIN_SECONDS
    while broker.sessions and loop.time() < deadline:
        await asyncio.sleep(0.01)
    events("stopped", "stopped")
    return 1 if fatal else 0


def _sockname(sock) -> str:
    name = sock.getsockname()
    if isinstance(name, tuple):
        host = f"[{name[0]}]" if ":" in name[0] else name[0]
        return f"{host}:{name[1]}"
    return str(name)
