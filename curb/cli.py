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
import importlib
import os
import signal
import sys

import click

from curb import __version__, event_loop, systemd, tls
from curb.broker_config import CONNECT_TIMEOUT_SECONDS
from curb.compiled import build
from curb.durations import Duration, format_seconds
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
from curb.instance import DEFAULT_PORT, EXIT_IO, FD_HEADROOM, Addr, Config, Events, Instance, StartError, reason_of
from curb.log import LogError
from curb.redelivery import MAX_DELAY_MS, MAX_MULTIPLIER, Redelivery
from curb.web.settings import LIMIT, MAX_LIMIT, NarconiSettings

MAX_NARCONI_TTL = 366 * 86400.0  # a year: a TTL longer than that is a mistake

DEFAULT_POLICY = Redelivery()  # the redelivery flags' defaults (curb.redelivery says why)


def default_file() -> str:
    state = os.environ.get("STATE_DIRECTORY")
    return os.path.join(state.split(":")[0], "curb.log") if state else "curb.log"


# The subcommands, each imported only when it is asked for (or listed by --help): the
# broker itself never needs their modules, and an idle broker's memory pays for each one.
SUBCOMMANDS = {
    "inspect": ("curb.inspect", "inspect_command"),
    "passwd": ("curb.passwd", "passwd_command"),
    "router": ("curb.router.cli", "router_command"),
}


class _Commands(click.Group):
    """The broker's command, with SUBCOMMANDS loaded on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = SUBCOMMANDS.get(cmd_name)
        if where is None:
            return None
        found: click.Command = getattr(importlib.import_module(where[0]), where[1])
        return found


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`curb --version`: the version and the build in use (curb.compiled), looked up only
    when asked, since it walks the package's files."""
    if value and not ctx.resilient_parsing:
        click.echo(f"curb {__version__} ({build()})")
        ctx.exit()


@click.group(cls=_Commands, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-cap",
    "--cap",
    default="1GiB",
    show_default=True,
    callback=size_flag,
    help="Most bytes the log file may ever take on disk (B, KiB, MiB, GiB).",
)
@addr_option(
    f":{DEFAULT_PORT}",
    "Where to listen, [HOST]:PORT; an empty host means every interface (IPv4 and IPv6); off: no plain TCP.",
    may_be_off=True,
)
@tls_options
@click.option(
    "-tls-ca",
    "--tls-ca",
    default=None,
    help="Require client certificates signed by these CAs (PEM); a certificate's CN can stand in for the login.",
)
@users_option("The users file (see `curb passwd`): CONNECT must log in as one of them. Default: no logins.")
@click.option(
    "-connect-timeout",
    "--connect-timeout",
    default=f"{CONNECT_TIMEOUT_SECONDS:g}s",
    show_default=True,
    type=Duration(MAX_HEARTBEAT_MS / 1000, zero="no limit"),
    help="How long a connection has to send CONNECT before it is closed (a plain number is seconds, or 500ms, "
    "30s, 5m; 0: no limit; at most 24h).",
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
@prefetch_option("Unacked messages a subscription may hold when SUBSCRIBE names no prefetch-count.")
@max_frame_option("Largest frame a client may send (at least 4KiB); larger ones get an ERROR.")
@heartbeat_option(
    "Heart-beat interval offered (a plain number is seconds, or 500ms, 10s, 1m; 0: none; at most 24h); "
    "silent peers are dropped."
)
@ack_timeout_option(
    "How long a delivered message waits for its ACK or NACK before it goes back to the queue "
    "(a plain number is seconds, or 500ms, 30m, 2h; 0: no deadline; at most 24h). SUBSCRIBE may set its own "
    "(curb-ack-timeout)."
)
@click.option(
    "-redelivery-delay",
    "--redelivery-delay",
    default=format_seconds(DEFAULT_POLICY.delay_ms / 1000),
    show_default=True,
    type=Duration(MAX_DELAY_MS / 1000, zero="at once"),
    help="How long a message that came back without an asked delay (NACK, ack deadline, disconnect) waits "
    "before it is rdy again, the first time (a plain number is seconds, or 500ms, 1s, 5m; 0: at once; "
    "at most 30 days).",
)
@click.option(
    "-redelivery-multiplier",
    "--redelivery-multiplier",
    default=DEFAULT_POLICY.multiplier,
    show_default=True,
    type=click.FloatRange(1.0, MAX_MULTIPLIER),
    help="The redelivery delay is multiplied by this for each delivery before (1: the same every time).",
)
@click.option(
    "-redelivery-max-delay",
    "--redelivery-max-delay",
    default=format_seconds(DEFAULT_POLICY.max_delay_ms / 1000),
    show_default=True,
    type=Duration(MAX_DELAY_MS / 1000),
    help="The most the growing redelivery delay becomes (a plain number is seconds, or 500ms, 5m, 1h; "
    "at most 30 days).",
)
@click.option(
    "-max-deliveries",
    "--max-deliveries",
    default=DEFAULT_POLICY.max_deliveries,
    show_default=True,
    type=click.IntRange(0),
    help="A message delivered this many times that comes back once more becomes a dead letter (./dead); 0: no limit.",
)
@click.option(
    "-expired",
    "--expired",
    type=click.Choice(["dead", "drop"]),
    default="dead",
    show_default=True,
    help="What becomes of an expired message (expires, curb-ttl): a dead letter, or dropped.",
)
@http_option(
    "Serve the web front on [HOST]:PORT: /metrics (Prometheus), /stats (JSON), the console at /, "
    "STOMP over WebSocket at /ws and the HTTP API under /v2. Off by default."
)
@click.option(
    "-http-tls",
    "--http-tls",
    is_flag=True,
    default=False,
    help="Serve -http as https (and wss) with -tls-cert and -tls-key (and -tls-ca: client certificates required).",
)
@http_open_option(
    "Serve -http on an address the network reaches although there is no -users (anyone may publish, "
    "consume and purge); without it, such a broker refuses to start."
)
@click.option(
    "-narconi-max-message",
    "--narconi-max-message",
    default="64KiB",
    show_default=True,
    callback=size_flag,
    help="The largest message published over the HTTP API and its WebSocket (Narconi's NARCONI_MAX_MESSAGE_SIZE).",
)
@click.option(
    "-narconi-ttl",
    "--narconi-ttl",
    default="1h",
    show_default=True,
    type=Duration(MAX_NARCONI_TTL, zero="messages live until consumed"),
    help="How long a message published over the HTTP API lives before it expires (Narconi's "
    "NARCONI_MAX_MESSAGE_TTL; a plain number is seconds; 0: until consumed). A longer curb-ttl is refused.",
)
@click.option(
    "-narconi-limit",
    "--narconi-limit",
    default=LIMIT,
    show_default=True,
    type=click.IntRange(1, MAX_LIMIT),
    help="Unacknowledged messages a WebSocket consumer of the HTTP API gets at once when it names no ?limit "
    "(Narconi's NARCONI_DEFAULT_LIMIT).",
)
@http_origin_option
@log_format_option
@click.option(
    "-version",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=print_version,
    help="Show the version, and which build (compiled with mypyc, or pure Python), and exit.",
)
@click.pass_context
def command(
    ctx: click.Context,
    cap: int,
    addr: Addr | None,
    tls_addr: Addr | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    users_path: str | None,
    connect_timeout: float,
    max_connections: int | None,
    path: str | None,
    prefetch: int,
    max_frame: int,
    heartbeat: float,
    ack_timeout: float,
    redelivery_delay: float,
    redelivery_multiplier: float,
    redelivery_max_delay: float,
    max_deliveries: int,
    expired: str,
    http: Addr | None,
    http_tls: bool,
    http_open: bool,
    narconi_max_message: int,
    narconi_ttl: float,
    narconi_limit: int,
    http_origins: tuple[str, ...],
    log_format: str,
) -> None:
    """Curb: one durable work queue behind a STOMP 1.2 port, kept in one capped log file.

    Run `curb -cap 10MiB -addr :61613` to serve; `curb inspect FILE` reads a log offline."""
    if ctx.invoked_subcommand is not None:
        return
    if http_tls and http is None:
        raise click.UsageError("-http-tls needs -http [HOST]:PORT")
    config = Config(
        path=path or default_file(),
        cap=cap,
        addr=addr,
        tls_addr=tls_addr,
        tls_files=_tls_files(tls_addr, tls_cert, tls_key, tls_ca, http_tls=http_tls),
        users_path=users_path,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        prefetch=prefetch,
        max_frame=max_frame,
        heartbeat_ms=round(heartbeat * 1000),
        ack_timeout=ack_timeout,
        redelivery=Redelivery(
            round(redelivery_delay * 1000), redelivery_multiplier, round(redelivery_max_delay * 1000), max_deliveries
        ),
        drop_expired=expired == "drop",
        http=http,
        http_tls=http_tls,
        http_open=http_open,
        http_origins=tuple(http_origins),
        narconi=NarconiSettings(narconi_max_message, narconi_ttl, narconi_limit),
    )
    try:
        code = event_loop.run(serve(config, Events(log_format)))
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


def _tls_files(
    tls_addr: Addr | None, cert: str | None, key: str | None, ca: str | None, http_tls: bool = False
) -> tls.TlsFiles | None:
    """The TLS flags, checked together: -tls-addr and -http-tls need -tls-cert and -tls-key,
    and they need one of them."""
    if tls_addr is None and not http_tls:
        if cert or key or ca:
            raise click.UsageError("-tls-cert, -tls-key and -tls-ca need -tls-addr [HOST]:PORT or -http-tls")
        return None
    if not cert or not key:
        flag = "-tls-addr" if tls_addr is not None else "-http-tls"
        raise click.UsageError(f"{flag} needs -tls-cert FILE and -tls-key FILE (PEM)")
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
    typed = err.option_name
    if not typed.startswith("--"):
        ours = set(known.values()) | {f"-{name}" for name in known} | {"-h", "--help"}
        unknown = [
            name
            for name in (arg.split("=", 1)[0] for arg in _args_of(ctx, args))
            if name.startswith("-") and name not in ours and typed[1:] in name[1:]
        ]
        typed = unknown[0] if unknown else typed
    import difflib  # only for this message: an idle broker need not hold it

    near = difflib.get_close_matches(typed.lstrip("-"), list(known), n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(known[name] for name in near)}?" if near else ""
    where = ctx.command_path if ctx is not None else "curb"
    return f"no such option {typed}{hint} (`{where} --help` lists them)"


def _args_of(ctx: click.Context | None, args: list[str]) -> list[str]:
    """The arguments the command of `ctx` parsed: a subcommand's come after its name, the
    top command's before the first subcommand's name."""
    names = set(command.list_commands(ctx)) if ctx is not None else set()
    at = next((i for i, arg in enumerate(args) if arg in names), len(args))
    return args[at + 1 :] if ctx is not None and ctx.parent is not None else args[:at]


async def serve(config: Config, events: Events) -> int:
    """Run one instance as this whole process until SIGINT/SIGTERM, then drain. Returns the
    exit code. The signal handlers come first: whoever starts curb may signal it as soon
    as it reads the `listening` line."""
    loop = asyncio.get_running_loop()
    instance = Instance(config, events, process=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, instance.request_stop)
    loop.add_signal_handler(signal.SIGHUP, instance.reload)
    await instance.start()
    await instance.wait()
    systemd.notify("STOPPING=1")
    return await instance.stop()


def _describe(err: OSError) -> str:
    """An OSError from outside start-up's known steps, with the file it names if any."""
    where = f" ({err.filename})" if err.filename else ""
    return f"{reason_of(err)}{where}"
