"""The HTTP API in Narconi's shape against an in-process broker: publish, batch, consume,
claims, create and purge, errors, logins, permissions, Origin and discovery; and headers
that round-trip between HTTP and STOMP."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from webrig import basic, http, running, users_file

from curb.client import Client
from curb.log.reasons import MaybeStored
from curb.redelivery import Redelivery
from curb.refused import NotStored
from curb.web.replies import not_stored

Q = "/v2/shop/queues/orders"

AT_ONCE = Redelivery(delay_ms=0)  # -redelivery-delay 0: a message given back is rdy again at once


def test_a_message_published_over_http_reaches_stomp_with_its_type_and_headers(tmp_path):
    with running(tmp_path) as web:
        answer = http(
            "POST",
            web.base + Q + "/messages",
            b"\x00\xffbinary",
            {"Content-Type": "application/x-thing", "x-msg-x-trace": "7", "X-Msg-Priority": "high"},
        )
        assert (answer.status, answer.body) == (201, b"")  # Narconi: an empty 201
        with Client("127.0.0.1", web.stomp_port) as client:
            client.subscribe()
            frame = client.receive(timeout=10)
        assert frame is not None and frame.body == b"\x00\xffbinary"
        assert frame.headers["content-type"] == "application/x-thing"
        assert frame.headers["x-trace"] == "7" and frame.headers["priority"] == "high"
        assert frame.headers["curb-ttl"] == "3600000"  # Narconi's TTL, an hour by default


def test_a_message_sent_over_stomp_is_consumed_over_http_with_its_headers(tmp_path):
    with running(tmp_path) as web:
        with Client("127.0.0.1", web.stomp_port) as client:
            client.send(b"from stomp", {"content-type": "text/plain", "x-trace": "9"}, receipt="r")
            client.wait_receipt("r", timeout=10)
        answer = http("DELETE", web.base + Q + "/messages")
        assert answer.status == 200 and answer.body == b"from stomp"
        assert answer.headers["Content-Type"] == "text/plain"
        assert answer.headers["x-msg-x-trace"] == "9" and answer.headers["x-curb-id"] == "1"
        assert answer.headers["x-msg-redelivered"] == "false"
        assert abs(int(answer.headers["x-msg-timestamp"]) - time.time() * 1000) < 60_000
        assert web.gauges()["rdy"] == 0 and web.gauges()["wip"] == 0  # ACKed at once
        assert http("DELETE", web.base + Q + "/messages").status == 204


def test_201_comes_after_the_fsync_and_concurrent_publishes_share_fsyncs(tmp_path):
    with running(tmp_path) as web:
        log = web.instance.broker.log
        answer = http("POST", web.base + Q + "/messages", b"one")
        assert answer.status == 201
        assert web.call(lambda: log.durable_id) >= 1  # on disk before the 201 left
        before = web.instance.metrics.fsyncs
        with ThreadPoolExecutor(32) as pool:
            statuses = list(pool.map(lambda i: http("POST", web.base + Q + "/messages", b"m%d" % i).status, range(64)))
        assert statuses == [201] * 64
        assert web.call(lambda: log.durable_id) == 65
        assert web.instance.metrics.fsyncs - before < 64


def test_a_batch_answers_once_for_all_and_a_bad_line_stores_nothing(tmp_path):
    with running(tmp_path) as web:
        lines = b'{"message": "YQ=="}\n\n{"message": "Yg==", "headers": {"k": "v"}}\n'
        answer = http("POST", web.base + Q + "/messages/batch?encoding=base64", lines)
        assert (answer.status, answer.json) == (201, {"messages": 2})
        bad = http("POST", web.base + Q + "/messages/batch", b'{"message": "x"}\nnot json\n')
        assert bad.status == 400 and bad.json["code"] == 400 and "line 2" in bad.json["error"]
        assert web.gauges()["rdy"] == 2
        first, second = (http("DELETE", web.base + Q + "/messages") for _ in range(2))
        assert (first.body, second.body, second.headers["x-msg-k"]) == (b"a", b"b", "v")


def test_consume_waits_for_a_message_up_to_wait(tmp_path):
    with running(tmp_path) as web:
        started = time.monotonic()
        assert http("DELETE", web.base + Q + "/messages?wait=0.3").status == 204
        assert time.monotonic() - started >= 0.3
        threading.Timer(0.3, lambda: http("POST", web.base + Q + "/messages", b"late")).start()
        answer = http("DELETE", web.base + Q + "/messages?wait=10")
        assert answer.status == 200 and answer.body == b"late"
        too_long = http("DELETE", web.base + Q + "/messages?wait=31")
        assert too_long.status == 400 and "from 0 to 30" in too_long.json["error"]


def test_a_claim_is_acked_or_nacked_by_later_requests(tmp_path):
    with running(tmp_path, redelivery=AT_ONCE) as web:
        for body in (b"a", b"b"):
            http("POST", web.base + Q + "/messages", body)
        claim = http("POST", web.base + Q + "/claims")
        assert claim.status == 201 and claim.body == b"a" and claim.headers["Location"] == Q + "/claims/1"
        assert web.gauges()["wip"] == 1
        assert http("DELETE", web.base + claim.headers["Location"]).status == 204
        assert http("DELETE", web.base + claim.headers["Location"]).status == 404  # done already
        second = http("POST", web.base + Q + "/claims")
        assert http("POST", web.base + second.headers["Location"] + "/nack").status == 204
        again = http("POST", web.base + Q + "/claims")
        assert again.body == b"b" and again.headers["x-curb-deliveries"] == "2"
        assert http("PATCH", web.base + again.headers["Location"] + "?ttl=60").status == 204
        assert http("PATCH", web.base + again.headers["Location"]).status == 400
        assert http("DELETE", web.base + Q + "/claims/99").status == 404
        assert http("DELETE", web.base + Q + "/claims/x").status == 400


def test_a_claim_past_its_ttl_goes_back_and_a_late_ack_is_410(tmp_path):
    with running(tmp_path, redelivery=AT_ONCE) as web:
        http("POST", web.base + Q + "/messages", b"slow")
        claim = http("POST", web.base + Q + "/claims?ttl=0.2")
        time.sleep(0.5)
        late = http("DELETE", web.base + claim.headers["Location"])
        assert late.status == 410 and "deadline" in late.json["error"]
        assert web.gauges()["rdy"] == 1
        assert web.instance.metrics.late_acks == 1


def test_a_message_a_claim_holds_is_redelivered_if_the_broker_restarts(tmp_path):
    """At-least-once: a claimed message not ACKed survives the broker."""
    with running(tmp_path) as web:
        http("POST", web.base + Q + "/messages", b"kept")
        assert http("POST", web.base + Q + "/claims").status == 201
    with running(tmp_path) as web:
        assert http("DELETE", web.base + Q + "/messages").body == b"kept"


def test_put_creates_and_delete_purges(tmp_path):
    with running(tmp_path) as web:
        created = http("PUT", web.base + Q)
        assert (created.status, created.body) == (201, b"")
        for body in (b"a", b"b", b"c"):
            http("POST", web.base + Q + "/messages", body)
        assert http("POST", web.base + Q + "/claims").status == 201
        assert http("DELETE", web.base + Q).status == 204
        assert web.gauges()["rdy"] == 0 and web.gauges()["wip"] == 0
        assert http("DELETE", web.base + Q + "/messages").status == 204


def test_too_large_is_413_and_full_is_503_with_retry_after(tmp_path):
    with running(tmp_path, cap=64 << 10, max_frame=16 << 10) as web:
        big = http("POST", web.base + Q + "/messages", b"x" * (17 << 10))
        assert big.status == 413 and big.json["code"] == 413
        statuses = [http("POST", web.base + Q + "/messages", b"y" * 2000).status for _ in range(40)]
        assert 503 in statuses
        full = http("POST", web.base + Q + "/messages", b"y" * 2000)
        assert full.status == 503 and full.headers["Retry-After"] == "1" and "full" in full.json["error"]


def test_logins_and_permissions_under_users(tmp_path):
    path = users_file(tmp_path, alice="send,consume", bob="consume", root="purge")
    with running(tmp_path, users_path=path) as web:
        anonymous = http("POST", web.base + Q + "/messages", b"x")
        assert anonymous.status == 401 and anonymous.headers["WWW-Authenticate"].startswith("Basic")
        wrong = http("POST", web.base + Q + "/messages", b"x", basic("alice", "nope"))
        assert wrong.status == 401 and "access refused" in wrong.json["error"]
        assert http("POST", web.base + Q + "/messages", b"x", basic("alice")).status == 201
        refused = http("POST", web.base + Q + "/messages", b"x", basic("bob"))
        assert refused.status == 403 and "'send' permission" in refused.json["error"]
        assert http("DELETE", web.base + Q, headers=basic("alice")).status == 403
        assert http("DELETE", web.base + Q + "/messages", headers=basic("bob")).body == b"x"
        assert http("DELETE", web.base + Q, headers=basic("root")).status == 204
        assert web.instance.metrics.access_refused == 1
        assert web.instance.metrics.permissions_refused == 2


def test_a_page_from_another_origin_is_refused(tmp_path):
    with running(tmp_path, http_origins=("https://app.example",)) as web:
        own = f"http://127.0.0.1:{web.http_port}"
        assert http("POST", web.base + Q + "/messages", b"a", {"Origin": own}).status == 201
        assert http("POST", web.base + Q + "/messages", b"b", {"Origin": "https://app.example"}).status == 201
        evil = http("POST", web.base + Q + "/messages", b"c", {"Origin": "https://evil.example"})
        assert evil.status == 403 and "https://evil.example" in evil.json["error"]
        assert http("DELETE", web.base + Q + "/messages", headers={"Origin": "https://evil.example"}).status == 403
        assert web.gauges()["rdy"] == 2
        allowed = {"Origin": "https://app.example"}
        taken = http("DELETE", web.base + Q + "/messages", headers=allowed)
        assert taken.headers["Access-Control-Allow-Origin"] == "https://app.example"  # its scripts may read it
        assert taken.headers["Access-Control-Allow-Credentials"] == "true"
        preflight = http(
            "OPTIONS",
            web.base + Q + "/messages",
            headers={**allowed, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-msg-k"},
        )
        assert preflight.status == 204 and "POST" in preflight.headers["Access-Control-Allow-Methods"]
        assert preflight.headers["Access-Control-Allow-Headers"] == "x-msg-k"
        assert "Access-Control-Allow-Origin" not in http("GET", web.base + "/stats").headers


@pytest.mark.parametrize(
    "host, allowed",
    [("127.0.0.1", True), ("localhost", True), ("rebound.example", False), ("[::1]", True)],
)
def test_the_brokers_own_origin_is_its_address_not_what_host_says(tmp_path, host, allowed):
    """DNS rebinding: a page on a name its owner points at 127.0.0.1 sends a Host that
    matches its Origin; that name is not the broker's, so the page is another site."""
    with running(tmp_path) as web:
        where = f"{host}:{web.http_port}"
        headers = {"Host": where, "Origin": f"http://{where}"}
        got = http("POST", web.base + Q + "/messages", b"a", headers)
        assert got.status == (201 if allowed else 403), got
        assert web.gauges()["rdy"] == (1 if allowed else 0)


def test_options_discovers_the_paths_and_the_queue(tmp_path):
    with running(tmp_path) as web:
        answer = http("OPTIONS", web.base + Q)
        assert answer.status == 200 and answer.headers["Location"] == f"ws://127.0.0.1:{web.http_port}{Q}"
        assert Q + "/claims" in answer.json["paths"]
        assert http("OPTIONS", web.base + "/").headers["Location"].startswith(f"ws://127.0.0.1:{web.http_port}/v2/")


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/nothing", 404), ("POST", "/stats", 405), ("PUT", Q + "/messages", 405)],
)
def test_unknown_paths_and_methods_are_json_errors(tmp_path, method, path, status):
    with running(tmp_path) as web:
        answer = http(method, web.base + path, b"" if method != "GET" else None)
        assert answer.status == status and answer.json["code"] == status and answer.json["error"]
        assert json.loads(answer.body)["code"] == status


@pytest.mark.parametrize(
    "reason,says",
    [
        (MaybeStored("cannot write curb.log: Input/output error"), "may not be stored: "),
        ("disk full (No space left on device): message not stored", "not stored: "),
    ],
)
def test_a_publish_the_log_failed_answers_503_saying_whether_it_may_be_stored(reason, says):
    """The log failed after writing the message (MaybeStored): it may be delivered, and the
    client must know that before sending it again; before writing it: it will not be."""
    refusal = not_stored(NotStored(reason))
    assert refusal.status == 503 and refusal.error.startswith(says), refusal.error
