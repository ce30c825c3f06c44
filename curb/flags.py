"""Click callbacks for the size flags `curb` and `curb router` share, so that neither command
module imports the other."""

import click

from curb.log import parse_size
from curb.message_limits import MIN_FRAME, RESERVE


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
