"""Durations on the command line: a number with a unit, `250ms`, `10s`, `30m`, `2h`.

A plain number keeps the unit its flag always had (milliseconds for `-heartbeat`,
seconds for `-connect-timeout`), so existing command lines mean what they meant. Every
duration is finite, at least 0 and at most a flag's bound; a bad one is a usage error
that names the units, never a traceback. Durations in STOMP headers are milliseconds and
are not parsed here.
"""

from __future__ import annotations

import math
import re

import click

SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", re.ASCII)


def parse(text: str, plain_unit: str) -> float:
    """Seconds in `text`; a number without a unit is in `plain_unit`. ValueError, saying
    what is allowed, for anything else."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: use a number with a unit, e.g. 500ms, 10s, 30m or 2h "
            f"(a plain number is in {_unit_name(plain_unit)})"
        )
    number, unit = found.groups()
    seconds = float(number) * SECONDS_PER_UNIT[unit or plain_unit]
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def _unit_name(unit: str) -> str:
    return {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours"}[unit]


def format_seconds(seconds: float) -> str:
    """A duration as a person writes it: the largest unit that shows it exactly."""
    for unit in ("h", "m", "s"):
        amount = seconds / SECONDS_PER_UNIT[unit]
        if amount >= 1 and amount == int(amount):
            return f"{int(amount)}{unit}"
    return f"{round(seconds * 1000, 3):g}ms"


class Duration(click.ParamType):
    """A click type for a duration flag: seconds as a float, between 0 and `most` seconds."""

    name = "duration"

    def __init__(self, plain_unit: str, most: float, zero: str | None = None):
        self.plain_unit = plain_unit
        self.most = most
        self.zero = f"; 0 for {zero}" if zero else ""  # what 0 means, said with every error

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse(str(value), self.plain_unit)
        except ValueError as err:
            self.fail(f"{err}{self.zero}", param, ctx)
        if seconds > self.most:
            self.fail(f"{value!r} is longer than the most allowed, {format_seconds(self.most)}{self.zero}", param, ctx)
        return seconds
