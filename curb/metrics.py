"""The broker's counters, and their rendering as JSON.

The broker increments plain int attributes of one `Metrics` object; gauges (queue
depth, connections, log size) are not stored here but read from a snapshot at scrape
time, so they can never drift from the broker's own state. The web front (curb.web)
serves them on -http, as JSON and (curb.web.exposition) for Prometheus; this module
imports no library of the web front's, so a broker without -http never loads them.
"""

import bisect

from curb import __version__

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAUGE_KEYS = ("rdy", "wip", "delayed", "dead", "connections", "subscriptions", "log_bytes", "live_bytes", "cap")
COUNTER_NAMES = (
    "sent",
    "delivered",
    "acked",
    "nacked",
    "bounced",
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
# The counters of STOMP sessions (logins, refusals), which a router keeps too.
SESSION_COUNTERS = (
    "connections_total",
    "protocol_errors",
    "access_refused",
    "connections_refused",
    "logins_shed",
    "connect_timeouts",
    "permissions_refused",
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
    bounced: int
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

    @property
    def fsync_seconds(self) -> float:
        """The seconds all fsyncs took together."""
        return self._fsync_seconds

    def fsync_buckets(self) -> list[tuple[str, int]]:
        """The fsync latency histogram: (upper bound, fsyncs at most that long), cumulative, +Inf last."""
        cumulative = 0
        buckets = []
        for bound, count in zip((*FSYNC_BUCKETS, "+Inf"), self._fsync_counts, strict=True):
            cumulative += count
            buckets.append((str(bound), cumulative))
        return buckets

    def session_stats(self) -> dict[str, int]:
        """The counters of SESSION_COUNTERS and the TLS failures, as `stats` names them."""
        return {
            **{name: getattr(self, name) for name in SESSION_COUNTERS},
            **{f"tls_failures_{reason}": count for reason, count in self.tls_failures.items()},
        }

    def stats(self, gauges: dict[str, int]) -> dict[str, object]:
        """One flat JSON-able object: version, gauges, counters, fsync count and total seconds."""
        return {
            "version": __version__,
            **{key: gauges[key] for key in GAUGE_KEYS},
            **{name: getattr(self, name) for name in COUNTER_NAMES},
            **{f"tls_failures_{reason}": count for reason, count in self.tls_failures.items()},
            **{f"dead_lettered_{reason.replace('-', '_')}": count for reason, count in self.dead_lettered.items()},
            "fsyncs": self.fsyncs,
            "fsync_seconds_sum": self.fsync_seconds,
        }
