"""The broker's counters, rendered for Prometheus and as JSON, and a tiny HTTP endpoint for them.

The broker increments plain int attributes of one `Metrics` object; gauges (queue
depth, connections, log size) are not stored here but read from a snapshot
callable at scrape time, so they can never drift from the broker's own state.
The endpoint is a few dozen lines of asyncio rather than a dependency: it only
ever answers two GETs.
"""

import asyncio
import bisect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from curb import __version__

log = logging.getLogger(__name__)

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAUGE_KEYS = ("rdy", "wip", "connections", "subscriptions", "log_bytes", "live_bytes", "cap")
COUNTER_NAMES = (
    "sent",
    "delivered",
    "acked",
    "nacked",
    "redelivered",
    "refused_full",
    "refused_too_large",
    "refused_disk_full",
    "connections_total",
    "protocol_errors",
    "compactions",
    "access_refused",
    "connections_refused",
    "logins_shed",
    "connect_timeouts",
    "permissions_refused",
    "ack_timeouts",
    "late_acks",
)
# Why a TLS handshake failed, as counted: the label values of curb_tls_handshake_failures_total
# (curb.tls.handshake_failure sorts an error into one of them).
TLS_FAILURES = (
    "no_certificate",
    "untrusted_certificate",
    "old_version",
    "certificate_rejected",
    "not_tls",
    "timeout",
    "closed",
    "other",
)


class Metrics:
    """Counters the broker bumps directly (`metrics.sent += 1`), plus the fsync latency histogram.

    `fsyncs` is derived from the histogram: call `observe_fsync` once per fsync.
    """

    __slots__ = (*COUNTER_NAMES, "tls_failures", "_fsync_counts", "_fsync_seconds")
    # the counters of COUNTER_NAMES, each 0 at first
    sent: int
    delivered: int
    acked: int
    nacked: int
    redelivered: int
    refused_full: int
    refused_too_large: int
    refused_disk_full: int
    connections_total: int
    protocol_errors: int
    compactions: int
    access_refused: int
    connections_refused: int
    logins_shed: int
    connect_timeouts: int
    permissions_refused: int
    tls_failures: dict[str, int]
    ack_timeouts: int
    late_acks: int

    def __init__(self) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, 0)
        self.tls_failures = dict.fromkeys(TLS_FAILURES, 0)  # failed TLS handshakes by reason
        self._fsync_counts = [0] * (len(FSYNC_BUCKETS) + 1)
        self._fsync_seconds = 0.0

    def observe_fsync(self, seconds: float) -> None:
        """Record one fsync of the log and how long it took."""
        bucket = bisect.bisect_left(FSYNC_BUCKETS, seconds)
        self._fsync_counts[bucket] += 1
        self._fsync_seconds += seconds

    @property
    def fsyncs(self) -> int:
        return sum(self._fsync_counts)

    def prometheus(self, gauges: dict[str, int]) -> str:
        """The text exposition format 0.0.4 of every counter, the histogram and `gauges`."""
        lines: list[str] = []
        for family in _families(self, gauges):
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.type}")
            for suffix, labels, number in family.samples:
                label_text = ",".join(f'{key}="{val}"' for key, val in labels)
                lines.append(
                    f"{family.name}{suffix}{{{label_text}}} {number}" if labels else f"{family.name}{suffix} {number}"
                )
        return "\n".join(lines) + "\n"

    def stats(self, gauges: dict[str, int]) -> dict:
        """One flat JSON-able object: version, gauges, counters, fsync count and total seconds."""
        return {
            "version": __version__,
            **{key: gauges[key] for key in GAUGE_KEYS},
            **{name: getattr(self, name) for name in COUNTER_NAMES},
            **{f"tls_failures_{reason}": count for reason, count in self.tls_failures.items()},
            "fsyncs": self.fsyncs,
            "fsync_seconds_sum": self._fsync_seconds,
        }


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    type: str
    help: str
    samples: list[tuple[str, tuple[tuple[str, str], ...], int | float]]  # (name suffix, labels, value)


def _counter(name: str, help: str, number: int, labels: tuple[tuple[str, str], ...] = ()) -> _Family:
    return _Family(name, "counter", help, [("", labels, number)])


def _gauge(name: str, help: str, number: int) -> _Family:
    return _Family(name, "gauge", help, [("", (), number)])


def _families(m: Metrics, g: dict[str, int]) -> list[_Family]:
    cumulative = 0
    buckets: list[tuple[str, tuple[tuple[str, str], ...], int | float]] = []
    for bound, count in zip((*FSYNC_BUCKETS, "+Inf"), list(m._fsync_counts), strict=True):
        cumulative += count
        buckets.append(("_bucket", (("le", str(bound)),), cumulative))
    return [
        _counter("curb_messages_sent_total", "Messages stored from SEND frames.", m.sent),
        _counter(
            "curb_messages_delivered_total", "MESSAGE frames sent to consumers, redeliveries included.", m.delivered
        ),
        _counter("curb_messages_acked_total", "Messages removed by ACK.", m.acked),
        _counter("curb_messages_nacked_total", "Messages made ready again by NACK.", m.nacked),
        _counter(
            "curb_messages_redelivered_total", "Deliveries of messages that had been delivered before.", m.redelivered
        ),
        _Family(
            "curb_sends_refused_total",
            "counter",
            "SEND frames refused: full (no room now), too_large (can never fit under -cap) "
            "or disk_full (the file system had no room to grow the log).",
            [
                ("", (("reason", "full"),), m.refused_full),
                ("", (("reason", "too_large"),), m.refused_too_large),
                ("", (("reason", "disk_full"),), m.refused_disk_full),
            ],
        ),
        _counter("curb_connections_accepted_total", "Client connections accepted.", m.connections_total),
        _counter(
            "curb_protocol_errors_total",
            "Client frames answered with ERROR because they broke the protocol.",
            m.protocol_errors,
        ),
        _counter(
            "curb_access_refused_total", "CONNECT frames refused: unknown user or wrong passcode.", m.access_refused
        ),
        _counter(
            "curb_connections_refused_total",
            "Connections closed at once because -max-connections were open.",
            m.connections_refused,
        ),
        _counter(
            "curb_logins_shed_total",
            "CONNECTs answered server busy, unchecked, because too many password checks were waiting.",
            m.logins_shed,
        ),
        _counter(
            "curb_connect_timeouts_total",
            "Connections closed because they sent no CONNECT within -connect-timeout.",
            m.connect_timeouts,
        ),
        _counter(
            "curb_permissions_refused_total",
            "Frames refused (and their connection closed) because the user lacks the permission.",
            m.permissions_refused,
        ),
        _Family(
            "curb_tls_handshake_failures_total",
            "counter",
            "TLS connections closed before their handshake was done, by reason.",
            [("", (("reason", reason),), count) for reason, count in m.tls_failures.items()],
        ),
        _counter(
            "curb_ack_timeouts_total",
            "Deliveries not ACKed or NACKed by their ack deadline: the message went back to the queue.",
            m.ack_timeouts,
        ),
        _counter(
            "curb_late_acks_total",
            "ACK, NACK or touch frames that came after their message's ack deadline; they changed nothing.",
            m.late_acks,
        ),
        _counter("curb_compaction_moves_total", "Live records copied forward by compaction.", m.compactions),
        _Family(
            "curb_fsync_duration_seconds",
            "histogram",
            "Time each fsync of the log took.",
            [*buckets, ("_sum", (), m._fsync_seconds), ("_count", (), cumulative)],
        ),
        _Family(
            "curb_messages",
            "gauge",
            "Messages by state: rdy waits for a consumer, wip awaits ACK or NACK.",
            [
                ("", (("state", "rdy"),), g["rdy"]),
                ("", (("state", "wip"),), g["wip"]),
            ],
        ),
        _gauge("curb_connections_open", "Open client connections.", g["connections"]),
        _gauge("curb_subscriptions", "Subscriptions to the queue.", g["subscriptions"]),
        _gauge("curb_log_file_bytes", "Size of the log file on disk.", g["log_bytes"]),
        _gauge("curb_log_live_bytes", "Bytes of the log holding records not yet reclaimed.", g["live_bytes"]),
        _gauge("curb_log_cap_bytes", "The most bytes the log may occupy (-cap).", g["cap"]),
        _Family(
            "curb_build_info",
            "gauge",
            "Always 1; the version label says which Curb runs.",
            [("", (("version", __version__),), 1)],
        ),
    ]


MAX_LINE_BYTES = 8192
MAX_HEADERS = 100
REQUEST_TIMEOUT_SECONDS = 10.0
LINGER_SECONDS = 1.0
ALLOWED_METHODS = ("GET", "HEAD")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


class _BadRequest(Exception):
    """The client sent something that is not an HTTP/1.x request we can read."""


async def serve_http(
    host: str, port: int, metrics: Metrics, gauges: Callable[[], dict[str, int]]
) -> asyncio.base_events.Server:
    """Serve GET /metrics (Prometheus text) and GET /stats (JSON) on host:port ("" = every interface).

    One request per connection. Nothing a client sends, and no failure of
    `gauges()`, escapes this endpoint: bad requests get 400, failures 500.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                method, path = await asyncio.wait_for(_read_request(reader), REQUEST_TIMEOUT_SECONDS)
            except _BadRequest as error:
                await _send(writer, 400, "text/plain; charset=utf-8", f"{error}\n".encode())
            else:
                status, content_type, body, extra = _answer(method, path, metrics, gauges)
                await _send(writer, status, content_type, body, extra, with_body=method != "HEAD")
            await asyncio.wait_for(_discard_until_eof(reader), LINGER_SECONDS)
        except (OSError, EOFError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_LINE_BYTES)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of the request; its headers are read and ignored."""
    try:
        request_line = (await reader.readline()).decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest("expected a request line like: GET /metrics HTTP/1.1")
        for _ in range(MAX_HEADERS + 1):
            if (await reader.readline()).strip() == b"":
                return parts[0], parts[1].partition("?")[0]
    except ValueError:
        raise _BadRequest(f"request line or header longer than {MAX_LINE_BYTES} bytes") from None
    raise _BadRequest(f"more than {MAX_HEADERS} headers")


def _answer(
    method: str, path: str, metrics: Metrics, gauges: Callable[[], dict[str, int]]
) -> tuple[int, str, bytes, dict[str, str]]:
    """(status, content type, body, extra headers) for a well-formed request."""
    text = "text/plain; charset=utf-8"
    if path not in ("/metrics", "/stats"):
        return 404, text, b"try /metrics or /stats\n", {}
    if method not in ALLOWED_METHODS:
        return 405, text, b"only GET and HEAD\n", {"Allow": ", ".join(ALLOWED_METHODS)}
    try:
        snapshot = gauges()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", metrics.prometheus(snapshot).encode(), {}
        return 200, "application/json", json.dumps(metrics.stats(snapshot)).encode(), {}
    except Exception:
        log.exception("metrics endpoint could not render %s", path)
        return 500, text, b"could not read the broker's state; see its log\n", {}


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: str,
    body: bytes,
    extra: dict[str, str] | None = None,
    *,
    with_body: bool = True,
) -> None:
    """Write one response and end our side of the connection."""
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close", **(extra or {})}
    head = f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode("latin-1") + b"\r\n" + (body if with_body else b""))
    await writer.drain()
    writer.write_eof()


async def _discard_until_eof(reader: asyncio.StreamReader) -> None:
    """Read what the client still sends, so closing does not reset the connection before it read the answer."""
    while await reader.read(65536):
        pass
