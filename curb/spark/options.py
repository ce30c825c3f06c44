"""Options of the `curb` Spark format, parsed and checked before any connection is made.

Spark hands options over as a case-insensitive map of strings. Every mistake becomes an
`OptionError` whose message names the option, so a query fails at start with a reason a
user can act on instead of a connection error later.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from curb.addr import parse_addr

DEFAULT_BATCH_SIZE = 1000
DEFAULT_POLL_MS = 100
DEFAULT_WINDOW = 1000
DEFAULT_TIMEOUT_S = 30.0


class OptionError(ValueError):
    """A `curb` format option is missing or malformed; the message names the option."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One Curb broker: `label` is the HOST:PORT text as the user wrote it (the `endpoint` column)."""

    host: str
    port: int
    label: str


@dataclass(frozen=True, slots=True)
class Connection:
    """What every STOMP connection of the connector needs, besides the endpoint."""

    login: str | None
    passcode: str | None
    heartbeat_ms: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class SourceOptions:
    endpoints: tuple[Endpoint, ...]
    connection: Connection
    batch_size: int
    prefetch: int
    poll_ms: int


@dataclass(frozen=True, slots=True)
class SinkOptions:
    endpoints: tuple[Endpoint, ...]
    connection: Connection
    window: int
    key: str | None


def parse_endpoint(text: str) -> Endpoint:
    """`HOST:PORT` or `[IPV6]:PORT` (as the broker's -addr reads it, but with a host and a
    port above 0) -> Endpoint; OptionError naming `endpoints` otherwise."""
    item = text.strip()
    try:
        host, port = parse_addr(item)
    except ValueError as err:
        raise OptionError(f"curb option 'endpoints': {item!r} is not HOST:PORT ({err})") from None
    if host is None or port == 0:
        raise OptionError(
            f"curb option 'endpoints': {item!r} is not HOST:PORT (a client needs a host and a "
            "port from 1 to 65535, for example 127.0.0.1:61613)"
        )
    return Endpoint(host, port, item)


def parse_endpoints(options: Mapping[str, str]) -> tuple[Endpoint, ...]:
    text = _lowered(options).get("endpoints", "")
    if not text.strip():
        raise OptionError(
            "curb option 'endpoints' is required: a comma-separated list of HOST:PORT, "
            "for example .option('endpoints', 'host1:61613,host2:61613')"
        )
    endpoints = tuple(parse_endpoint(item) for item in text.split(","))
    labels = [endpoint.label for endpoint in endpoints]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise OptionError(f"curb option 'endpoints': {', '.join(repeated)} listed more than once")
    return endpoints


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    lowered = _lowered(options)
    batch_size = _positive_int(lowered, "batchSize", DEFAULT_BATCH_SIZE)
    prefetch = _positive_int(lowered, "prefetch", 2 * batch_size)
    if prefetch < 2 * batch_size:
        raise OptionError(
            f"curb option 'prefetch' ({prefetch}) must be at least twice 'batchSize' ({batch_size}): "
            "the broker must be able to deliver the next batch while the current one awaits its commit"
        )
    return SourceOptions(
        parse_endpoints(options),
        _connection(lowered),
        batch_size,
        prefetch,
        _positive_int(lowered, "pollMs", DEFAULT_POLL_MS),
    )


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    lowered = _lowered(options)
    key = lowered.get("key") or None
    return SinkOptions(
        parse_endpoints(options), _connection(lowered), _positive_int(lowered, "window", DEFAULT_WINDOW), key
    )


def parse_paths(options: Mapping[str, str]) -> list[str]:
    """The log files given to `load(path)` or `load([path, ...])` (Spark passes the list as JSON)."""
    lowered = _lowered(options)
    if "paths" in lowered:
        paths = json.loads(lowered["paths"])
    elif lowered.get("path"):
        paths = [lowered["path"]]
    else:
        paths = []
    if not paths:
        raise OptionError(
            "curb: a batch read needs log files: spark.read.format('curb').load('path/to/curb.log'); "
            "to consume a live queue use spark.readStream with option 'endpoints'"
        )
    return paths


def _connection(lowered: Mapping[str, str]) -> Connection:
    heartbeat = _int(lowered, "heartbeat", 0)
    if heartbeat < 0:
        raise OptionError(f"curb option 'heartbeat' must be 0 (off) or a number of milliseconds, got {heartbeat}")
    timeout = _int(lowered, "timeout", int(DEFAULT_TIMEOUT_S))
    if timeout <= 0:
        raise OptionError(f"curb option 'timeout' must be a positive number of seconds, got {timeout}")
    return Connection(lowered.get("login"), lowered.get("passcode"), heartbeat, float(timeout))


def _positive_int(lowered: Mapping[str, str], name: str, default: int) -> int:
    value = _int(lowered, name, default)
    if value <= 0:
        raise OptionError(f"curb option '{name}' must be a positive integer, got {value}")
    return value


def _int(lowered: Mapping[str, str], name: str, default: int) -> int:
    text = lowered.get(name.lower())
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"curb option '{name}' must be an integer, got {text!r}") from None


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in options.items()}
