"""Durations on the command line: a number with a unit, `250ms`, `10s`, `30m`, `2h`.

A plain number is seconds, for every duration flag of `curb` and `curb router` alike
(as systemd reads a time span), so that `5` never means five seconds to one flag and
five milliseconds to the next. Every duration is finite, at least 0 and at most a flag's
bound; a bad one is a usage error that names the units, never a traceback. Durations in
STOMP headers are milliseconds and are not parsed here.
"""

from __future__ import annotations

import math
import re

import click

SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", re.ASCII)


def parse(text: str) -> float:
    """Seconds in `text`; a number without a unit is seconds. ValueError, saying what is
    allowed, for anything else."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: use a number with a unit, e.g. 500ms, 10s, 30m or 2h "
            "(a plain number is seconds)"
        )
    number, unit = found.groups()
    seconds = float(number) * SECONDS_PER_UNIT[unit or "s"]
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def format_seconds(seconds: float) -> str:
    """A duration as a person writes it: the largest unit that shows it exactly."""
    for unit in ("h", "m", "s"):
        amount = seconds / SECONDS_PER_UNIT[unit]
        if amount >= 1 and amount == int(amount):
            return f"{int(amount)}{unit}"
    return f"{round(seconds * 1000, 3):g}ms"


class Duration(click.ParamType[float, str | float]):
    """A click type for a duration flag: seconds as a float, between 0 and `most` seconds."""

    name = "duration"

    def __init__(self, most: float, zero: str | None = None):
        self.most = most
        self.zero = f"; 0 for {zero}" if zero else ""  # what 0 means, said with every error

    def convert(self, value: str | float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse(str(value))
        except ValueError as err:
            self.fail(f"{err}{self.zero}", param, ctx)
        if seconds > self.most:
            self.fail(f"{value!r} is longer than the most allowed, {format_seconds(self.most)}{self.zero}", param, ctx)
        return seconds
