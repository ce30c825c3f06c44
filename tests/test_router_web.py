"""`curb router -http` for real: a router process in front of real instances, its
/metrics and /stats followed as messages flow and a link goes down, and the HTTP API's
`{queue}` as a routed destination."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

from curb.client import Client

WEB = ("-http", "127.0.0.1:0", "-link-heartbeat", "500ms")


def http_port(router) -> int:
    found = re.search(r"web front on http://127\.0\.0\.1:(\d+)", router.stderr_text())
    assert found, router.stderr_text()
    return int(found.group(1))


def fetch(port: int, path: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def instance_stats(port: int, dest: str) -> dict:
    [figures] = json.loads(fetch(port, "/stats")[2])["destinations"][dest]["instances"].values()
    return figures


def sample(port: int, family: str, **labels: str) -> float:
    """One sample of /metrics, by family and labels."""
    text = fetch(port, "/metrics")[2].decode()
    wanted = ",".join(f'{name}="{value}"' for name, value in labels.items())
    line = f"{family}{{{wanted}}} " if labels else f"{family} "
    [value] = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
    return float(value)


def until(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_the_counters_follow_messages_through_the_router(curb_broker, curb_router):
    instance = curb_broker(extra_args=("-heartbeat", "1s"))
    router = curb_router([f"orders=127.0.0.1:{instance.port}"], extra_args=WEB)
    port, where = http_port(router), {"destination": "orders", "instance": f"127.0.0.1:{instance.port}"}
    assert sample(port, "curb_router_link_up", **where, role="sends") == 1
    with Client("127.0.0.1", router.port) as producer:
        for n in range(5):
            producer.send(b"%d" % n, receipt=f"r{n}", destination="/queue/orders")
        producer.wait_receipt("r4")
        assert json.loads(fetch(port, "/stats")[2])["connections"] == 1
    assert sample(port, "curb_router_sends_forwarded_total", **where) == 5
    assert until(lambda: instance_stats(port, "orders")["rdy"] == 5), instance_stats(port, "orders")
    with Client("127.0.0.1", router.port) as consumer:
        consumer.subscribe("s", destination="/queue/orders", prefetch=10)
        for n in range(5):
            frame = consumer.receive(10)
            assert frame is not None and frame.command == "MESSAGE"
            consumer.ack(frame.headers["ack"], receipt=f"a{n}" if n == 4 else None)
        consumer.wait_receipt("a4")
        figures = instance_stats(port, "orders")
        assert (figures["forwarded"], figures["delivered"], figures["acked"], figures["nacked"]) == (5, 5, 5, 0)
        assert json.loads(fetch(port, "/stats")[2])["destinations"]["orders"]["subscriptions"] == 1
    assert sample(port, "curb_router_messages_acked_total", **where) == 5
    assert until(lambda: instance_stats(port, "orders")["rdy"] == 0)
    assert sample(port, "curb_connections_accepted_total") == 2


def test_a_lost_instance_shows_as_down_and_its_sends_as_parked(curb_broker, curb_router):
    instance = curb_broker(extra_args=("-heartbeat", "1s"))
    router = curb_router([f"orders=127.0.0.1:{instance.port}"], extra_args=(*WEB, "-link-wait", "200ms"))
    port = http_port(router)
    instance.kill()
    assert until(lambda: instance_stats(port, "orders")["sends_link"] == "down"), instance_stats(port, "orders")
    where = {"destination": "orders", "instance": f"127.0.0.1:{instance.port}"}
    assert sample(port, "curb_router_link_up", **where, role="sends") == 0
    status, _, body = fetch(port, "/v2/p/queues/orders/messages", "POST", b"lost")
    assert status == 503, body
    figures = json.loads(fetch(port, "/stats")[2])["destinations"]["orders"]
    assert (figures["parked"], figures["not_stored"], figures["parked_now"]) == (1, 1, 0)


def test_the_http_api_publishes_and_takes_through_the_router(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"orders=127.0.0.1:{instance.port}"], extra_args=WEB)
    port = http_port(router)
    status, _, _ = fetch(port, "/v2/shop/queues/orders/messages", "POST", b"from http")
    assert status == 201
    with Client("127.0.0.1", instance.port) as direct:  # it landed on the instance
        assert [frame.body for frame in direct.browse()] == [b"from http"]
    status, headers, body = fetch(port, "/v2/shop/queues/orders/messages?wait=5", "DELETE")
    assert (status, body) == (200, b"from http")
    assert fetch(port, "/v2/shop/queues/orders/messages", "POST", b"claimed")[0] == 201
    status, headers, body = fetch(port, "/v2/shop/queues/orders/claims?wait=5&ttl=30", "POST")
    assert (status, body) == (201, b"claimed")
    assert fetch(port, headers["Location"], "DELETE")[0] == 204
    with Client("127.0.0.1", instance.port) as direct:
        assert list(direct.browse()) == []
    assert instance_stats(port, "orders")["acked"] == 2
    status, _, body = fetch(port, "/v2/shop/queues/nope/messages", "POST", b"x")
    assert status == 404 and b"this router routes: /queue/orders" in body
    status, _, body = fetch(port, "/v2/shop/queues/orders", "DELETE")
    assert status == 405 and b"a purge is not routed" in body


def test_the_router_logs_json_lines_with_their_time_as_the_broker_does(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"orders=127.0.0.1:{instance.port}"], extra_args=("-log-format", "json"))
    lines = [json.loads(line) for line in router.stderr_text().splitlines()]
    assert lines and all(abs(line["ts"] - time.time()) < 60 for line in lines)
    assert "listening" in {line["event"] for line in lines}
