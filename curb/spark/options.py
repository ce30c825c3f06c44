"""Options of the `curb` Spark format, parsed and checked before any connection is made.

Spark hands options over as a case-insensitive map of strings, with names lower-cased. Every
mistake becomes an `OptionError` whose one-line message names the option (as docs/spark.md
spells it, when it is one Curb knows) and what it accepts, so a query fails at `load()` (or
when the writer is made) instead of with a connection error later. An option the chosen mode
does not know is a mistake too: a typo must not run with defaults, and an option of an older
source names what took its place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from curb.addr import parse_addr
from curb.users import DESTINATION_NAME

DEFAULT_WINDOW = 1000
DEFAULT_TIMEOUT_S = 30
DEFAULT_RECONNECT_TIMEOUT_S = 60
DEFAULT_ROWS_PER_PARTITION = 25_000
MAX_ROWS_NONE = 0  # maxRowsPerBatch 0: each micro-batch takes everything available

# Names as docs/spark.md's option table spells them; Spark matches them case-insensitively.
CONNECTION_OPTIONS = ("endpoints", "router", "destination", "login", "passcode", "heartbeat", "timeout")
SOURCE_OPTIONS = (*CONNECTION_OPTIONS, "reconnectTimeout", "maxRowsPerBatch", "rowsPerPartition")
SINK_OPTIONS = (*CONNECTION_OPTIONS, "window", "key")
# What Spark itself may add to a data source's options.
SPARK_OPTIONS = ("path", "paths", "checkpointLocation")
# Options of the source before it read by browse, lower-cased: how they were spelled, and what now.
REMOVED_SOURCE_OPTIONS = {
    "batchsize": ("batchSize", "use 'maxRowsPerBatch' instead (the most rows a micro-batch takes from each endpoint)"),
    "prefetch": ("prefetch", "remove it: the source reads by browse and holds no messages ahead"),
    "pollms": ("pollMs", "remove it: the query's trigger sets how often it asks (trigger(processingTime=...))"),
}
# Spark passes names lower-cased; errors spell them as docs/spark.md does.
SPELLINGS = {name.lower(): name for name in (*SOURCE_OPTIONS, *SINK_OPTIONS, *SPARK_OPTIONS)} | {
    key: spelling for key, (spelling, _) in REMOVED_SOURCE_OPTIONS.items()
}


class OptionError(ValueError):
    """A `curb` format option is missing or malformed; the one-line message names the option."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One Curb broker: `label` is the HOST:PORT text as the user wrote it (the `endpoint` column)."""

    host: str
    port: int
    label: str


@dataclass(frozen=True, slots=True)
class Routed:
    """A destination of a `curb router`: its instances become the endpoints (curb.spark.routed)."""

    router: Endpoint
    destination: str  # the NAME of /queue/NAME


@dataclass(frozen=True, slots=True)
class Connection:
    """What every STOMP connection of the connector needs, besides the endpoint."""

    login: str | None
    passcode: str | None
    heartbeat_ms: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class SourceOptions:
    endpoints: tuple[Endpoint, ...]  # empty until curb.spark.routed resolves `routed`
    routed: Routed | None
    connection: Connection
    reconnect_timeout_s: float  # how long an endpoint may be unreachable before the query fails
    max_rows_per_batch: int  # per endpoint and micro-batch; MAX_ROWS_NONE for no limit
    rows_per_partition: int  # the id span one Spark task reads


@dataclass(frozen=True, slots=True)
class SinkOptions:
    endpoints: tuple[Endpoint, ...]  # empty until curb.spark.routed resolves `routed`
    routed: Routed | None
    connection: Connection
    window: int
    key: str | None


def parse_endpoint(text: str, option: str = "endpoints") -> Endpoint:
    """`HOST:PORT` or `[IPV6]:PORT` (as the broker's -addr reads it, but with a host and a
    port above 0) -> Endpoint; OptionError naming `option` otherwise."""
    item = text.strip()
    try:
        host, port = parse_addr(item)
    except ValueError as err:
        raise OptionError(f"curb option {option!r}: {item!r} is not HOST:PORT ({err})") from None
    if host is None or port == 0:
        raise OptionError(
            f"curb option {option!r}: {item!r} is not HOST:PORT (a client needs a host and a "
            "port from 1 to 65535, for example 127.0.0.1:61613)"
        )
    return Endpoint(host, port, item)


def parse_endpoints(options: Mapping[str, str]) -> tuple[Endpoint, ...]:
    text = _lowered(options).get("endpoints", "")
    if not text.strip():
        raise OptionError(
            "curb option 'endpoints' is required (or 'router' and 'destination'): a comma-separated list "
            "of HOST:PORT, for example .option('endpoints', 'host1:61613,host2:61613')"
        )
    endpoints = tuple(parse_endpoint(item) for item in text.split(","))
    labels = [endpoint.label for endpoint in endpoints]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise OptionError(f"curb option 'endpoints': {', '.join(repeated)} listed more than once")
    return endpoints


def parse_where(options: Mapping[str, str]) -> tuple[tuple[Endpoint, ...], Routed | None]:
    """The endpoints, or the router and destination whose instances will be the endpoints."""
    lowered = _lowered(options)
    if "router" not in lowered and "destination" not in lowered:
        return parse_endpoints(options), None
    if "endpoints" in lowered:
        raise OptionError(
            "curb options 'endpoints' and 'router' exclude each other: give the brokers' addresses, "
            "or a router's address and a destination"
        )
    if not lowered.get("router", "").strip():
        raise OptionError("curb option 'destination' needs 'router': the HOST:PORT of a curb router")
    text = lowered.get("destination", "").strip()
    name = text.removeprefix("/queue/") if text.startswith("/queue/") else text.removeprefix("./")
    if not DESTINATION_NAME.fullmatch(name):
        raise OptionError(
            f"curb option 'destination' must name one of the router's destinations (NAME or /queue/NAME, "
            f"1 to 200 letters, digits, '-', '_' or '.'), got {text!r}"
        )
    return (), Routed(parse_endpoint(lowered["router"], "router"), name)


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    lowered = _known(options, SOURCE_OPTIONS, "a streaming read (spark.readStream)", REMOVED_SOURCE_OPTIONS)
    max_rows = _int(lowered, "maxRowsPerBatch", MAX_ROWS_NONE)
    if max_rows < 0:
        raise OptionError(
            f"curb option 'maxRowsPerBatch' must be 0 (no limit) or a positive number of rows, got {max_rows}"
        )
    return SourceOptions(
        *parse_where(options),
        _connection(lowered),
        float(_positive_int(lowered, "reconnectTimeout", DEFAULT_RECONNECT_TIMEOUT_S, "seconds")),
        max_rows,
        _positive_int(lowered, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION, "message ids"),
    )


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    lowered = _known(options, SINK_OPTIONS, "a write (df.write or df.writeStream)")
    key = lowered.get("key") or None
    return SinkOptions(
        *parse_where(options),
        _connection(lowered),
        _positive_int(lowered, "window", DEFAULT_WINDOW, "receipts"),
        key,
    )


def parse_paths(options: Mapping[str, str]) -> list[str]:
    """The log files given to `load(path)` or `load([path, ...])` (Spark passes the list as JSON)."""
    lowered = _lowered(options)
    paths: list[str]
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
    _known(options, (), "a batch read of log files (spark.read.load(path))")
    return paths


def _known(
    options: Mapping[str, str], names: tuple[str, ...], mode: str, removed: Mapping[str, tuple[str, str]] = {}
) -> dict[str, str]:
    """The options lower-cased, once every name is one `mode` knows; OptionError naming the first
    stranger, and for one in `removed` what to do instead."""
    lowered = _lowered(options)
    allowed = {name.lower() for name in (*names, *SPARK_OPTIONS)}
    for name in options:
        key = name.lower()
        if key in allowed:
            continue
        if key in removed:
            spelling, instead = removed[key]
            raise OptionError(f"curb option {spelling!r} was removed: {instead}")
        listed = ", ".join(names) if names else "none but the path"
        raise OptionError(f"curb option {SPELLINGS.get(key, name)!r} is unknown for {mode}; the options are: {listed}")
    return lowered


def _connection(lowered: Mapping[str, str]) -> Connection:
    heartbeat = _int(lowered, "heartbeat", 0)
    if heartbeat < 0:
        raise OptionError(f"curb option 'heartbeat' must be 0 (off) or a number of milliseconds, got {heartbeat}")
    timeout = _positive_int(lowered, "timeout", DEFAULT_TIMEOUT_S, "seconds")
    return Connection(lowered.get("login"), lowered.get("passcode"), heartbeat, float(timeout))


def _positive_int(lowered: Mapping[str, str], name: str, default: int, unit: str) -> int:
    value = _int(lowered, name, default)
    if value <= 0:
        raise OptionError(f"curb option '{name}' must be a positive number of {unit}, got {value}")
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
