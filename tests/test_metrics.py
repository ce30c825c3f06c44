"""Prometheus and JSON views of the broker's counters, and the web front's routes serving them."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from typing import TYPE_CHECKING

import pytest
from conftest import free_port, wait_until
from prometheus_client import parser

from curb import __version__
from curb.broker_config import BrokerConfig
from curb.client import Client
from curb.metrics import TLS_FAILURES, Metrics
from curb.web import exposition
from curb.web.front import WebFront
from curb.web.stats import BrokerFigures

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


GAUGES = {
    "rdy": 12,
    "wip": 3,
    "delayed": 18,
    "dead": 19,
    "connections": 4,
    "subscriptions": 2,
    "log_bytes": 4096,
    "live_bytes": 1500,
    "cap": 1 << 20,
}


def parse(text: str) -> dict[str, Metric]:
    """Families by name; every sample must belong to a family declared with TYPE and HELP."""
    families = {family.name: family for family in parser.text_string_to_metric_families(text)}
    for family in families.values():
        assert family.type != "unknown" and family.type != "untyped", family
        assert family.documentation, family
    return families


def value(families, family: str, sample: str, **labels) -> float:
    [found] = [s.value for s in families[family].samples if s.name == sample and s.labels == labels]
    return found


def test_counters_and_gauges_render_as_typed_prometheus_families():
    metrics = Metrics()
    metrics.sent, metrics.delivered, metrics.acked, metrics.nacked = 10, 8, 6, 1
    metrics.redelivered, metrics.refused_full, metrics.refused_too_large = 2, 3, 4
    metrics.connections_total, metrics.protocol_errors, metrics.compactions = 5, 6, 7
    metrics.access_refused, metrics.connections_refused = 8, 9
    metrics.connect_timeouts, metrics.permissions_refused, metrics.refused_disk_full = 11, 12, 13
    metrics.tls_failures["no_certificate"], metrics.tls_failures["timeout"] = 14, 15
    metrics.ack_timeouts, metrics.late_acks = 16, 17
    metrics.delayed_requeues, metrics.expired, metrics.dead_acked, metrics.redriven = 20, 21, 22, 23
    metrics.dead_lettered["max-deliveries"], metrics.dead_lettered["expired"] = 24, 25
    families = parse(exposition.render(metrics, GAUGES)[0].decode())

    counters = {
        "curb_messages_sent": 10,
        "curb_messages_delivered": 8,
        "curb_messages_acked": 6,
        "curb_messages_nacked": 1,
        "curb_messages_redelivered": 2,
        "curb_connections_accepted": 5,
        "curb_protocol_errors": 6,
        "curb_compaction_moves": 7,
        "curb_access_refused": 8,
        "curb_connections_refused": 9,
        "curb_connect_timeouts": 11,
        "curb_permissions_refused": 12,
        "curb_ack_timeouts": 16,
        "curb_late_acks": 17,
        "curb_delayed_requeues": 20,
        "curb_messages_expired": 21,
        "curb_dead_letters_acked": 22,
        "curb_messages_redriven": 23,
    }
    for name, expected in counters.items():
        assert families[name].type == "counter"
        assert value(families, name, name + "_total") == expected
    assert value(families, "curb_sends_refused", "curb_sends_refused_total", reason="full") == 3
    assert value(families, "curb_sends_refused", "curb_sends_refused_total", reason="too_large") == 4
    assert value(families, "curb_sends_refused", "curb_sends_refused_total", reason="disk_full") == 13
    tls = "curb_tls_handshake_failures"
    assert {s.labels["reason"]: s.value for s in families[tls].samples} == {
        **dict.fromkeys(TLS_FAILURES, 0),
        "no_certificate": 14,
        "timeout": 15,
    }

    assert value(families, "curb_messages", "curb_messages", state="rdy") == 12
    assert value(families, "curb_messages", "curb_messages", state="wip") == 3
    assert value(families, "curb_messages", "curb_messages", state="delayed") == 18
    assert value(families, "curb_messages", "curb_messages", state="dead") == 19
    dead = "curb_dead_lettered"
    assert value(families, dead, dead + "_total", reason="max-deliveries") == 24
    assert value(families, dead, dead + "_total", reason="expired") == 25
    gauges = {
        "curb_connections_open": 4,
        "curb_subscriptions": 2,
        "curb_log_file_bytes": 4096,
        "curb_log_live_bytes": 1500,
        "curb_log_cap_bytes": 1 << 20,
    }
    for name, expected in gauges.items():
        assert families[name].type == "gauge"
        assert value(families, name, name) == expected
    assert value(families, "curb_build_info", "curb_build_info", version=__version__) == 1


def test_fsync_latency_is_a_cumulative_histogram_in_seconds():
    metrics = Metrics()
    for seconds in (0.0003, 0.02, 0.0004, 10.0):
        metrics.observe_fsync(seconds)
    families = parse(exposition.render(metrics, GAUGES)[0].decode())
    name = "curb_fsync_duration_seconds"
    assert families[name].type == "histogram"
    assert value(families, name, name + "_bucket", le="0.0001") == 0
    assert value(families, name, name + "_bucket", le="0.0005") == 2
    assert value(families, name, name + "_bucket", le="0.025") == 3
    assert value(families, name, name + "_bucket", le="2.5") == 3
    assert value(families, name, name + "_bucket", le="+Inf") == 4
    assert value(families, name, name + "_count") == 4
    assert value(families, name, name + "_sum") == pytest.approx(10.0207)
    assert metrics.fsyncs == 4


def test_fsyncs_are_counted_only_through_observe_fsync():
    metrics = Metrics()
    with pytest.raises(AttributeError):
        metrics.fsyncs += 1  # type: ignore[misc]  # the point: fsyncs is read-only


def test_stats_is_one_flat_json_object_of_gauges_and_counters():
    metrics = Metrics()
    metrics.sent = 9
    metrics.observe_fsync(0.5)
    stats = json.loads(json.dumps(metrics.stats(GAUGES)))
    assert stats == {
        "version": __version__,
        **GAUGES,
        "sent": 9,
        "delivered": 0,
        "acked": 0,
        "nacked": 0,
        "bounced": 0,
        "redelivered": 0,
        "refused_full": 0,
        "refused_too_large": 0,
        "refused_disk_full": 0,
        "connections_total": 0,
        "protocol_errors": 0,
        "compactions": 0,
        "access_refused": 0,
        "connections_refused": 0,
        "logins_shed": 0,
        "connect_timeouts": 0,
        "permissions_refused": 0,
        **{f"tls_failures_{reason}": 0 for reason in TLS_FAILURES},
        "ack_timeouts": 0,
        "late_acks": 0,
        "delayed_requeues": 0,
        "expired": 0,
        "dead_acked": 0,
        "redriven": 0,
        "dead_lettered_max_deliveries": 0,
        "dead_lettered_expired": 0,
        "fsyncs": 1,
        "fsync_seconds_sum": 0.5,
    }


class FakeBroker:
    """What the /metrics and /stats routes read of a broker: its -max-frame and its gauges."""

    config = BrokerConfig(max_frame=1 << 20)

    def __init__(self, gauges: dict):
        self._gauges = gauges

    def gauges(self) -> dict[str, int]:
        if self._gauges.get("fail"):
            raise RuntimeError("snapshot failed")
        return dict(self._gauges)


@pytest.fixture
def endpoint():
    """The web front on a loopback port, run by an event loop in a thread; yields (port, metrics, gauges)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    metrics, gauges = Metrics(), dict(GAUGES)
    broker = FakeBroker(gauges)
    front = WebFront(broker, BrokerFigures(broker, metrics))  # type: ignore[arg-type]  # a stand-in for the routes it reads
    asyncio.run_coroutine_threadsafe(front.start("127.0.0.1", 0), loop).result(timeout=10)
    yield front.sockets[0].getsockname()[1], metrics, gauges
    asyncio.run_coroutine_threadsafe(front.stop(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def request(port: int, method: str, path: str) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        return sock.makefile("rb").read()


def test_metrics_endpoint_serves_the_current_values(endpoint):
    port, metrics, gauges = endpoint
    metrics.acked = 7
    response, body = request(port, "GET", "/metrics")
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    families = parse(body.decode())
    assert value(families, "curb_messages_acked", "curb_messages_acked_total") == 7
    assert value(families, "curb_messages", "curb_messages", state="rdy") == 12

    gauges["rdy"] = 0
    metrics.acked = 19
    families = parse(request(port, "GET", "/metrics?x=1")[1].decode())
    assert value(families, "curb_messages", "curb_messages", state="rdy") == 0
    assert value(families, "curb_messages_acked", "curb_messages_acked_total") == 19


def test_stats_endpoint_serves_json(endpoint):
    port, metrics, _ = endpoint
    metrics.sent = 3
    response, body = request(port, "GET", "/stats")
    assert response.status == 200
    assert response.getheader("Content-Type") == "application/json"
    stats = json.loads(body)
    assert stats["sent"] == 3 and stats["rdy"] == 12


def test_head_answers_headers_without_a_body(endpoint):
    port, _, _ = endpoint
    response, body = request(port, "HEAD", "/stats")
    assert response.status == 200
    length = response.getheader("Content-Length")
    assert length is not None and int(length) > 0
    assert body == b""


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nothing", 404),
        ("GET", "/metricsx", 404),
        ("POST", "/metrics", 405),
        ("DELETE", "/stats", 405),
    ],
)
def test_other_paths_and_methods_are_refused(endpoint, method, path, status):
    port, _, _ = endpoint
    response, body = request(port, method, path)
    assert response.status == status
    assert json.loads(body)["code"] == status
    if status == 405:
        assert set(response.getheader("Allow", "").split(",")) == {"GET", "HEAD"}


@pytest.mark.parametrize(
    "data",
    [
        b"HELLO\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X-Many: yes\r\n" * 200 + b"\r\n",
    ],
)
def test_malformed_requests_get_400_and_the_endpoint_keeps_serving(endpoint, data):
    port, _, _ = endpoint
    answer = raw_exchange(port, data)
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer[:100]
    assert request(port, "GET", "/metrics")[0].status == 200


def test_a_failing_snapshot_is_a_500_not_a_dead_endpoint(endpoint):
    port, _, gauges = endpoint
    gauges["fail"] = True
    assert request(port, "GET", "/metrics")[0].status == 500
    del gauges["fail"]
    assert request(port, "GET", "/metrics")[0].status == 200


def scrape(port: int) -> dict[str, Metric] | None:
    """The broker's /metrics, parsed; None while the endpoint does not answer yet."""
    try:
        response, body = request(port, "GET", "/metrics")
    except OSError:
        return None
    assert response.status == 200
    return parse(body.decode())


def scraped_until(port: int, expected: dict[tuple[str, str, tuple], float]) -> dict:
    """Scrape until every (family, sample, labels) has its expected value; fail showing the last values."""
    last = {}

    def matches() -> bool:
        families = scrape(port)
        if families is None:
            return False
        last.update({key: value(families, key[0], key[1], **dict(key[2])) for key in expected})
        return last == expected

    assert wait_until(matches), f"expected {expected}, scraped {last}"
    return last


def counter(name: str, number: float) -> tuple[tuple[str, str, tuple], float]:
    return (name, name + "_total", ()), number


def messages(state: str, number: float) -> tuple[tuple[str, str, tuple], float]:
    return ("curb_messages", "curb_messages", (("state", state),)), number


def test_counters_and_gauges_move_as_messages_flow_through_a_real_broker(curb_broker):
    http_port = free_port()
    broker = curb_broker(extra_args=("-http", f"127.0.0.1:{http_port}"))
    # The start-up line named only /metrics.
    assert f"metrics on http://127.0.0.1:{http_port}/metrics (Prometheus) and /stats (JSON)" in broker.stderr_text()
    scraped_until(http_port, dict([counter("curb_messages_sent", 0), messages("rdy", 0)]))

    with Client("127.0.0.1", broker.port) as client:
        for i in range(3):
            client.send(b"m%d" % i, receipt=f"r{i}")
        client.wait_receipt("r2")
        scraped_until(
            http_port,
            dict(
                [
                    counter("curb_messages_sent", 3),
                    messages("rdy", 3),
                    messages("wip", 0),
                    (("curb_connections_open", "curb_connections_open", ()), 1),
                    counter("curb_connections_accepted", 1),
                ]
            ),
        )
        families = scrape(http_port)
        assert value(families, "curb_fsync_duration_seconds", "curb_fsync_duration_seconds_count") >= 1
        assert value(families, "curb_log_live_bytes", "curb_log_live_bytes") > 0
        assert value(families, "curb_log_file_bytes", "curb_log_file_bytes") > 0

        client.subscribe(prefetch=3)
        first, second, third = (client.receive(timeout=10) for _ in range(3))
        assert first is not None and second is not None and third is not None
        scraped_until(
            http_port,
            dict(
                [
                    counter("curb_messages_delivered", 3),
                    messages("rdy", 0),
                    messages("wip", 3),
                    (("curb_subscriptions", "curb_subscriptions", ()), 1),
                ]
            ),
        )
        client.ack(first.headers["ack"])
        client.ack(second.headers["ack"])
        client.nack(third.headers["ack"], receipt="nacked")
        early = [f for f in client.wait_receipt("nacked") if f.command == "MESSAGE"]
        again = early[0] if early else client.receive(timeout=10)
        assert again is not None and again.headers["redelivered"] == "true"
        client.ack(again.headers["ack"], receipt="done")
        client.wait_receipt("done")

    scraped_until(
        http_port,
        dict(
            [
                counter("curb_messages_sent", 3),
                counter("curb_messages_delivered", 4),
                counter("curb_messages_acked", 3),
                counter("curb_messages_nacked", 1),
                counter("curb_messages_redelivered", 1),
                messages("rdy", 0),
                messages("wip", 0),
                (("curb_connections_open", "curb_connections_open", ()), 0),
            ]
        ),
    )
    stats = json.loads(request(http_port, "GET", "/stats")[1])
    assert (stats["sent"], stats["acked"], stats["rdy"]) == (3, 3, 0)
