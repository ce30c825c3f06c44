"""The broker's counters, rendered for Prometheus (by prometheus_client) and as JSON.

The broker increments plain int attributes of one `Metrics` object; gauges (queue
depth, connections, log size) are not stored here but read from a snapshot at scrape
time, so they can never drift from the broker's own state. The web front
(curb.web) serves both renderings on -http.
"""

import bisect
from collections.abc import Iterator

from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from curb import __version__

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAUGE_KEYS = ("rdy", "wip", "delayed", "dead", "connections", "subscriptions", "log_bytes", "live_bytes", "cap")
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
    "delayed_requeues",
    "expired",
    "dead_acked",
    "redriven",
)
# Why a message became a dead letter: the label values of curb_dead_lettered_total.
DEAD_REASONS = ("max-deliveries", "expired")
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

    __slots__ = (*COUNTER_NAMES, "tls_failures", "dead_lettered", "_fsync_counts", "_fsync_seconds")
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
    delayed_requeues: int
    expired: int
    dead_acked: int
    redriven: int
    dead_lettered: dict[str, int]

    def __init__(self) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, 0)
        self.tls_failures = dict.fromkeys(TLS_FAILURES, 0)  # failed TLS handshakes by reason
        self.dead_lettered = dict.fromkeys(DEAD_REASONS, 0)  # messages made dead letters, by reason
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

    def prometheus(self, gauges: dict[str, int], accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of every counter, the histogram and `gauges`, in the
        exposition format `accept` (an HTTP Accept header) asks for: Prometheus text 0.0.4
        by default, OpenMetrics when asked."""
        encoder, content_type = exposition.choose_encoder(accept)
        return encoder(_Snapshot(self, gauges)), content_type

    def stats(self, gauges: dict[str, int]) -> dict:
        """One flat JSON-able object: version, gauges, counters, fsync count and total seconds."""
        return {
            "version": __version__,
            **{key: gauges[key] for key in GAUGE_KEYS},
            **{name: getattr(self, name) for name in COUNTER_NAMES},
            **{f"tls_failures_{reason}": count for reason, count in self.tls_failures.items()},
            **{f"dead_lettered_{reason.replace('-', '_')}": count for reason, count in self.dead_lettered.items()},
            "fsyncs": self.fsyncs,
            "fsync_seconds_sum": self._fsync_seconds,
        }


class _Snapshot:
    """A prometheus_client collector over one moment's counters and gauges."""

    def __init__(self, metrics: Metrics, gauges: dict[str, int]):
        self.metrics = metrics
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        m, g = self.metrics, self.gauges
        for name, attribute, help in _COUNTERS:
            yield CounterMetricFamily(name, help, value=getattr(m, attribute))
        yield _by_reason(
            "curb_sends_refused",
            "SEND frames refused: full (no room now), too_large (can never fit under -cap) "
            "or disk_full (the file system had no room to grow the log).",
            {"full": m.refused_full, "too_large": m.refused_too_large, "disk_full": m.refused_disk_full},
        )
        yield _by_reason(
            "curb_tls_handshake_failures",
            "TLS connections closed before their handshake was done, by reason.",
            m.tls_failures,
        )
        yield _by_reason(
            "curb_dead_lettered",
            "Messages made dead letters, by reason: max-deliveries (past -max-deliveries) or expired.",
            m.dead_lettered,
        )
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*FSYNC_BUCKETS, "+Inf"), list(m._fsync_counts), strict=True):
            cumulative += count
            buckets.append((str(bound), cumulative))
        yield HistogramMetricFamily(
            "curb_fsync_duration_seconds",
            "Time each fsync of the log took.",
            buckets=buckets,
            sum_value=m._fsync_seconds,
        )
        states = GaugeMetricFamily(
            "curb_messages",
            "Messages by state: rdy waits for a consumer, wip awaits ACK or NACK, delayed waits for its due "
            "time, dead is a dead letter.",
            labels=["state"],
        )
        for state in ("rdy", "wip", "delayed", "dead"):
            states.add_metric([state], g[state])
        yield states
        for name, key, help in _GAUGES:
            yield GaugeMetricFamily(name, help, value=g[key])
        info = GaugeMetricFamily(
            "curb_build_info", "Always 1; the version label says which Curb runs.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info


def _by_reason(name: str, help: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter family with one sample per reason."""
    family = CounterMetricFamily(name, help, labels=["reason"])
    for reason, count in counts.items():
        family.add_metric([reason], count)
    return family


# (family name without _total, Metrics attribute, help)
_COUNTERS = (
    ("curb_messages_sent", "sent", "Messages stored from SEND frames."),
    ("curb_messages_delivered", "delivered", "MESSAGE frames sent to consumers, redeliveries included."),
    ("curb_messages_acked", "acked", "Messages removed by ACK."),
    ("curb_messages_nacked", "nacked", "Messages made ready again by NACK."),
    ("curb_messages_redelivered", "redelivered", "Deliveries of messages that had been delivered before."),
    ("curb_connections_accepted", "connections_total", "Client connections accepted."),
    ("curb_protocol_errors", "protocol_errors", "Client frames answered with ERROR because they broke the protocol."),
    ("curb_access_refused", "access_refused", "CONNECT frames refused: unknown user or wrong passcode."),
    (
        "curb_connections_refused",
        "connections_refused",
        "Connections closed at once because -max-connections were open.",
    ),
    (
        "curb_logins_shed",
        "logins_shed",
        "CONNECTs answered server busy, unchecked, because too many password checks were waiting.",
    ),
    (
        "curb_connect_timeouts",
        "connect_timeouts",
        "Connections closed because they sent no CONNECT within -connect-timeout.",
    ),
    (
        "curb_permissions_refused",
        "permissions_refused",
        "Frames refused (and their connection closed) because the user lacks the permission.",
    ),
    (
        "curb_ack_timeouts",
        "ack_timeouts",
        "Deliveries not ACKed or NACKed by their ack deadline: the message went back to the queue "
        "(a dead letter to the dead letters).",
    ),
    (
        "curb_late_acks",
        "late_acks",
        "ACK, NACK or touch frames that came after their message's ack deadline; they changed nothing.",
    ),
    (
        "curb_delayed_requeues",
        "delayed_requeues",
        "Messages that came back and were put back with a delay (a NACK's curb-delay or -redelivery-delay).",
    ),
    (
        "curb_messages_expired",
        "expired",
        "Messages found past their expiry (expires, curb-ttl) and never delivered: dead letters, or dropped "
        "with -expired drop.",
    ),
    ("curb_dead_letters_acked", "dead_acked", "Dead letters deleted by an ACK on ./dead."),
    ("curb_messages_redriven", "redriven", "Dead letters moved back to the queue by ./redrive."),
    ("curb_compaction_moves", "compactions", "Live records copied forward by compaction."),
)
# (family name, key of the gauges snapshot, help); curb_messages{state} and
# curb_subscriptions are the older names of the first three, kept for existing dashboards.
_GAUGES = (
    ("curb_messages_ready", "rdy", "Messages waiting for a consumer (rdy)."),
    ("curb_messages_unacked", "wip", "Messages delivered and awaiting ACK or NACK (wip)."),
    ("curb_consumers", "subscriptions", "Subscriptions to the queue that take messages."),
    ("curb_connections_open", "connections", "Open client connections."),
    ("curb_subscriptions", "subscriptions", "Subscriptions to the queue (also curb_consumers)."),
    ("curb_log_file_bytes", "log_bytes", "Size of the log file on disk."),
    ("curb_log_live_bytes", "live_bytes", "Bytes of the log holding records not yet reclaimed."),
    ("curb_log_cap_bytes", "cap", "The most bytes the log may occupy (-cap)."),
)
