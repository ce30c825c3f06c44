"""The broker's metrics in Prometheus's exposition formats, rendered by prometheus_client.

`session_families` are the counters every STOMP front keeps (connections, logins,
refusals, TLS handshakes), which a router's /metrics shares with the broker's; `render`
serves any collector. Only the web front's /metrics imports this module, so a broker
without -http never loads prometheus_client.
"""

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from curb import __version__
from curb.metrics import Metrics


class Collector(Protocol):
    def collect(self) -> Iterator[Metric]: ...


def render(metrics: Metrics, gauges: dict[str, int], accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of a broker's counters, histogram and `gauges` (see `rendered`)."""
    return rendered(_Snapshot(metrics, gauges), accept)


def rendered(collector: Collector, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of what `collector` yields, in the exposition format `accept`
    (an HTTP Accept header) asks for: Prometheus text 0.0.4 by default, OpenMetrics when asked."""
    encoder, content_type = exposition.choose_encoder(accept)
    return encoder(collector), content_type


def session_families(metrics: Metrics) -> Iterator[Metric]:
    """The counters of a front's STOMP sessions, the TLS failures and the build's info."""
    for name, attribute, help in SESSION_COUNTERS:
        yield CounterMetricFamily(name, help, value=getattr(metrics, attribute))
    yield _by_reason(
        "curb_tls_handshake_failures",
        "TLS connections closed before their handshake was done, by reason.",
        metrics.tls_failures,
    )
    info = GaugeMetricFamily("curb_build_info", "Always 1; the version label says which Curb runs.", labels=["version"])
    info.add_metric([__version__], 1)
    yield info


class _Snapshot:
    """A prometheus_client collector over one moment's counters and gauges."""

    def __init__(self, metrics: Metrics, gauges: dict[str, int]):
        self.metrics = metrics
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        m, g = self.metrics, self.gauges
        for name, attribute, help in _COUNTERS:
            yield CounterMetricFamily(name, help, value=getattr(m, attribute))
        yield from session_families(m)
        yield _by_reason(
            "curb_sends_refused",
            "SEND frames refused: full (no room now), too_large (can never fit under -cap) "
            "or disk_full (the file system had no room to grow the log).",
            {"full": m.refused_full, "too_large": m.refused_too_large, "disk_full": m.refused_disk_full},
        )
        yield _by_reason(
            "curb_dead_lettered",
            "Messages made dead letters, by reason: max-deliveries (past -max-deliveries) or expired.",
            m.dead_lettered,
        )
        yield HistogramMetricFamily(
            "curb_fsync_duration_seconds",
            "Time each fsync of the log took.",
            buckets=m.fsync_buckets(),
            sum_value=m.fsync_seconds,
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


def _by_reason(name: str, help: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter family with one sample per reason."""
    family = CounterMetricFamily(name, help, labels=["reason"])
    for reason, count in counts.items():
        family.add_metric([reason], count)
    return family


# (family name without _total, Metrics attribute, help): the queue's counters
_COUNTERS = (
    ("curb_messages_sent", "sent", "Messages stored from SEND frames."),
    ("curb_messages_delivered", "delivered", "MESSAGE frames sent to consumers, redeliveries included."),
    ("curb_messages_acked", "acked", "Messages removed by ACK."),
    ("curb_messages_nacked", "nacked", "Messages made ready again by NACK."),
    (
        "curb_messages_bounced",
        "bounced",
        "Messages a router handed back undelivered (NACK curb-undelivered:true): ready again, uncounted.",
    ),
    ("curb_messages_redelivered", "redelivered", "Deliveries of messages that had been delivered before."),
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
# The same for the counters of STOMP sessions, which every front keeps
SESSION_COUNTERS = (
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
