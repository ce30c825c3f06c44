"""The flags `curb` and `curb router` share, declared once: their click options and the
callbacks that check them, so that the two commands say and check them alike and neither
command module imports the other."""

from __future__ import annotations

from collections.abc import Callable

import click
from click.decorators import FC

from curb.addr import parse_addr
from curb.broker_config import ACK_TIMEOUT_SECONDS
from curb.durations import Duration, format_seconds
from curb.heartbeat import MAX_MS as MAX_HEARTBEAT_MS
from curb.log import parse_size
from curb.message_limits import MIN_FRAME, RESERVE

Addr = tuple[str | None, int]


def size_flag(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A size such as 10MiB, in bytes."""
    try:
        return parse_size(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def max_frame_flag(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """-max-frame: a size large enough for a CONNECT and a MESSAGE with the broker's headers."""
    size = size_flag(ctx, param, value)
    if size < MIN_FRAME:
        raise click.BadParameter(
            f"{value!r} is too small: at least {MIN_FRAME} bytes (4KiB), so that a CONNECT and a MESSAGE "
            f"(the broker adds up to {RESERVE} bytes of headers) fit"
        )
    return size


def addr_flag(ctx: click.Context, param: click.Parameter, value: str | None) -> Addr | None:
    """[HOST]:PORT; None when not given, or given as `off`."""
    if value is None or value == "off":
        return None
    return required_addr_flag(ctx, param, value)


def required_addr_flag(ctx: click.Context, param: click.Parameter, value: str) -> Addr:
    """[HOST]:PORT, for a listener that cannot be off."""
    try:
        return parse_addr(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def addr_option(default: str, help: str, *, may_be_off: bool) -> Callable[[FC], FC]:
    """-addr: where clients connect (`off` too, where it may be)."""
    callback = addr_flag if may_be_off else required_addr_flag
    return click.option("-addr", "--addr", default=default, show_default=True, callback=callback, help=help)


def http_option(help: str) -> Callable[[FC], FC]:
    """-http: where the web front listens."""
    return click.option("-http", "--http", default=None, callback=addr_flag, help=help)


def http_open_option(help: str) -> Callable[[FC], FC]:
    """-http-open: serve -http to the network without -users."""
    return click.option("-http-open", "--http-open", is_flag=True, default=False, help=help)


def http_origin_option(command: FC) -> FC:
    """-http-origin: web page origins allowed besides the front's own."""
    return click.option(
        "-http-origin",
        "--http-origin",
        "http_origins",
        multiple=True,
        help="A web page origin (https://host[:port]) allowed to use -http besides the front's own pages; "
        "repeat for more; * allows every origin.",
    )(command)


def tls_options(command: FC) -> FC:
    """-tls-addr, -tls-cert and -tls-key: STOMP over TLS."""
    for option in (
        click.option(
            "-tls-key", "--tls-key", default=None, help="The TLS certificate's private key (PEM), for -tls-addr."
        ),
        click.option("-tls-cert", "--tls-cert", default=None, help="The TLS certificate chain (PEM), for -tls-addr."),
        click.option(
            "-tls-addr", "--tls-addr", default=None, callback=addr_flag, help="Serve STOMP over TLS on [HOST]:PORT."
        ),
    ):
        command = option(command)
    return command


def users_option(help: str) -> Callable[[FC], FC]:
    """-users: the users file CONNECT logs in against."""
    return click.option("-users", "--users", "users_path", default=None, help=help)


def prefetch_option(help: str) -> Callable[[FC], FC]:
    return click.option(
        "-prefetch", "--prefetch", default=100, show_default=True, type=click.IntRange(1, 10000), help=help
    )


def max_frame_option(help: str) -> Callable[[FC], FC]:
    return click.option(
        "-max-frame", "--max-frame", default="16MiB", show_default=True, callback=max_frame_flag, help=help
    )


def heartbeat_option(help: str) -> Callable[[FC], FC]:
    """-heartbeat: the interval offered to clients."""
    return click.option(
        "-heartbeat",
        "--heartbeat",
        default="10s",
        show_default=True,
        type=Duration(MAX_HEARTBEAT_MS / 1000, zero="no heart-beats"),
        help=help,
    )


def ack_timeout_option(help: str) -> Callable[[FC], FC]:
    """-ack-timeout: how long a delivered message waits for its ACK or NACK."""
    return click.option(
        "-ack-timeout",
        "--ack-timeout",
        default=format_seconds(ACK_TIMEOUT_SECONDS),
        show_default=True,
        type=Duration(MAX_HEARTBEAT_MS / 1000, zero="no deadline"),
        help=help,
    )


def log_format_option(command: FC) -> FC:
    """-log-format: the log lines on stderr as text or JSON."""
    return click.option(
        "-log-format",
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="Log lines on stderr as text or as one JSON object each.",
    )(command)
