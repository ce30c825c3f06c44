"""Narconi conformance: the HTTP and WebSocket protocol as Narconi's README specifies it,
section by section, against the real `curb` process with a plain HTTP client (urllib)
and a plain WebSocket client (websockets). Each test names the section it checks; what
the README says Curb does beyond it (batches, ?wait, claims, x-curb-*) is tested
elsewhere (test_web_api.py)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import wait_until
from webrig import http
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from curb.client import Client

Q = "/v2/myproject/queues/myqueue"


@pytest.fixture
def narconi(curb_broker, free_port):
    """A broker with its web front: (base URL, STOMP port), started with extra flags."""

    def start(*flags: str):
        port = free_port()
        broker = curb_broker(extra_args=("-http", f"127.0.0.1:{port}", *flags))
        return f"http://127.0.0.1:{port}", broker.port

    return start


def ws(base: str, path: str, protocol: str) -> ClientConnection:
    return connect(base.replace("http://", "ws://") + path, subprotocols=[Subprotocol(protocol)])


# ---------------------------------------------------------------- Queue APIs


def test_ensure_a_queue_exists_is_an_empty_201_and_delete_queue_an_empty_204_that_deletes_its_messages(narconi):
    base, _ = narconi()
    created = http("PUT", base + Q)
    assert (created.status, created.body) == (201, b"")
    assert http("POST", base + Q + "/messages", b"Hello, world").status == 201
    deleted = http("DELETE", base + Q)
    assert (deleted.status, deleted.body) == (204, b"")
    assert http("DELETE", base + Q + "/messages").status == 204


def test_discovery_options_answers_200_with_the_websocket_endpoint_in_location(narconi):
    base, _ = narconi()
    answer = http("OPTIONS", base + Q)
    assert answer.status == 200
    endpoint = answer.headers["Location"]
    assert endpoint == base.replace("http://", "ws://") + Q
    with connect(endpoint, subprotocols=[Subprotocol("publish")]) as socket:  # the endpoint serves both protocols
        socket.send("")
        socket.send(b"via discovery")
        assert socket.recv(timeout=10) == ""


# ---------------------------------------------------------------- Errors


def test_an_error_is_an_http_status_with_a_json_object_whose_message_is_a_string(narconi):
    base, _ = narconi()
    too_large = http("POST", base + Q + "/messages", b"x" * (64 * 1024 + 1))
    assert too_large.status == 413
    assert isinstance(too_large.json["message"], str) and "65536" in too_large.json["message"]


# ---------------------------------------------------------------- Publish APIs


def test_publish_single_message_keeps_content_type_and_x_msg_x_metadata_and_answers_an_empty_201(narconi):
    base, _ = narconi()
    answer = http(
        "POST",
        base + Q + "/messages",
        b"Hello, world",
        {"Content-Type": "text/plain", "x-msg-x-name1": "foo", "x-msg-x-name2": "bar"},
    )
    assert (answer.status, answer.body) == (201, b"")
    consumed = http("DELETE", base + Q + "/messages")
    assert consumed.body == b"Hello, world" and consumed.headers["Content-Type"] == "text/plain"
    assert consumed.headers["x-msg-x-name1"] == "foo" and consumed.headers["x-msg-x-name2"] == "bar"


def test_publish_multiple_messages_metadata_then_payload_each_confirmed_by_one_empty_message_in_order(narconi):
    base, stomp_port = narconi()
    with ws(base, Q + "/messages", "publish") as socket:
        assert socket.subprotocol == "publish"
        socket.send(json.dumps({"Content-Type": "text/plain", "x-msg-x-name1": "foo"}))
        socket.send("first")  # the payload as it is
        socket.send("")  # no metadata: an empty message stands for {}
        socket.send(b"\x00\x01\xff")
        socket.send(json.dumps({"Content-Type": "application/json", "message": '{"n": 3}'}))  # both in one
        assert [socket.recv(timeout=10) for _ in range(3)] == ["", "", ""]
    with Client("127.0.0.1", stomp_port) as client:
        client.subscribe()
        got = [client.receive(timeout=10) for _ in range(3)]
    assert [frame.body for frame in got if frame is not None] == [b"first", b"\x00\x01\xff", b'{"n": 3}']
    assert got[0] is not None and got[0].headers["content-type"] == "text/plain" and got[0].headers["x-name1"] == "foo"
    assert got[1] is not None and "content-type" not in got[1].headers  # application/octet-stream, as consumed
    assert got[2] is not None and got[2].headers["content-type"] == "application/json"


def test_publish_multiple_a_message_the_server_cannot_accept_gets_an_error_object_in_its_place(narconi):
    base, _ = narconi("-narconi-max-message", "1KiB")
    with ws(base, Q + "/messages", "publish") as socket:
        socket.send("")
        socket.send(b"x" * 1025)
        socket.send("")
        socket.send(b"fits")
        refused = json.loads(socket.recv(timeout=10))
        assert refused["code"] == 413 and isinstance(refused["error"], str)
        assert socket.recv(timeout=10) == ""  # the socket goes on, confirmations in order
    assert http("DELETE", base + Q + "/messages").body == b"fits"


# ---------------------------------------------------------------- Consume APIs


def test_consume_single_message_has_redelivered_timestamp_and_metadata_headers_and_204_when_none(narconi):
    base, _ = narconi()
    assert http("DELETE", base + Q + "/messages").status == 204
    sent = time.time() * 1000
    http("POST", base + Q + "/messages", b"This is a sample message.", {"Content-Type": "text/plain", "x-msg-x-a": "1"})
    answer = http("DELETE", base + Q + "/messages")
    assert answer.status == 200 and answer.body == b"This is a sample message."
    assert answer.headers["Content-Type"] == "text/plain" and answer.headers["x-msg-x-a"] == "1"
    assert answer.headers["x-msg-redelivered"] == "false"
    assert abs(int(answer.headers["x-msg-timestamp"]) - sent) < 60_000
    assert http("DELETE", base + Q + "/messages").status == 204  # acknowledged at once: gone


def test_consume_multiple_without_ack_each_message_is_metadata_then_the_payload_in_its_native_format(narconi):
    base, _ = narconi()
    http("POST", base + Q + "/messages", b"\x00binary\xff", {"Content-Type": "application/x-thing", "x-msg-x-k": "v"})
    with ws(base, Q + "/messages", "consume") as socket:
        assert socket.subprotocol == "consume"
        metadata = json.loads(socket.recv(timeout=10))
        payload = socket.recv(timeout=10)
    assert metadata["Content-Type"] == "application/x-thing" and metadata["x-msg-x-k"] == "v"
    assert metadata["redelivered"] is False and isinstance(metadata["timestamp"], int)
    assert "ackId" not in metadata and "message" not in metadata
    assert payload == b"\x00binary\xff"
    assert http("DELETE", base + Q + "/messages").status == 204  # acknowledged as sent


def test_consume_multiple_with_ack_and_limit_holds_messages_until_ack_id_or_ack_to_id(narconi):
    base, _ = narconi()
    for i in range(5):
        http("POST", base + Q + "/messages", b"m%d" % i)
    with ws(base, Q + "/messages?ack&limit=3&encoding=utf-8", "consume") as socket:
        got = [json.loads(socket.recv(timeout=10)) for _ in range(3)]
        assert [g["message"] for g in got] == ["m0", "m1", "m2"]  # encoding: the payload inside, no second message
        ids = [g["ackId"] for g in got]
        assert all(isinstance(i, str) for i in ids)
        with pytest.raises(TimeoutError):
            socket.recv(timeout=0.3)  # limit=3: no fourth before an acknowledgement
        socket.send(json.dumps({"ackId": ids[1]}))
        fourth = json.loads(socket.recv(timeout=10))
        assert fourth["message"] == "m3"
        socket.send(json.dumps({"ackToId": fourth["ackId"]}))  # ids[0], ids[2] and the fourth
        fifth = json.loads(socket.recv(timeout=10))
        assert fifth["message"] == "m4"
    # the fifth was never acknowledged: back in the queue once the socket closed, redelivered
    # (after the broker's redelivery delay: ?wait, Curb's, waits for it)
    again = http("DELETE", base + Q + "/messages?wait=10")
    assert again.body == b"m4" and again.headers["x-msg-redelivered"] == "true"


def test_consume_multiple_limit_defaults_to_10(narconi):
    base, _ = narconi()
    for i in range(12):
        http("POST", base + Q + "/messages", b"%d" % i)
    with ws(base, Q + "/messages?ack&encoding=utf-8", "consume") as socket:
        got = [json.loads(socket.recv(timeout=10)) for _ in range(10)]
        with pytest.raises(TimeoutError):
            socket.recv(timeout=0.3)
        assert [g["message"] for g in got] == [str(i) for i in range(10)]


@pytest.mark.parametrize(
    "body, encoding, text, said",
    [
        (b"hi", "base64", "aGk=", None),
        (b"hi", "hex", "6869", None),
        (b"hi", "utf-8", "hi", None),
        (b"\xff", "utf-8", "/w==", "base64"),  # not UTF-8: Curb's x-curb-encoding says how it came
    ],
)
def test_consume_multiple_encoding_puts_the_payload_in_message(narconi, body, encoding, text, said):
    base, _ = narconi()
    http("POST", base + Q + "/messages", body)
    with ws(base, Q + f"/messages?encoding={encoding}", "consume") as socket:
        metadata = json.loads(socket.recv(timeout=10))
    assert metadata["message"] == text and metadata.get("x-curb-encoding") == said


def test_consume_multiple_an_empty_message_stops_new_deliveries(narconi):
    base, _ = narconi()
    http("POST", base + Q + "/messages", b"one")
    with ws(base, Q + "/messages?ack&encoding=utf-8", "consume") as socket:
        first = json.loads(socket.recv(timeout=10))
        socket.send("")  # 1. stop
        socket.send("")  # (once is enough; again changes nothing)
        http("POST", base + Q + "/messages", b"two")
        with pytest.raises(TimeoutError):
            socket.recv(timeout=0.5)  # nothing new comes
        socket.send(json.dumps({"ackId": first["ackId"]}))  # 2. confirm what was sent; 3. close
    answer = http("DELETE", base + Q + "/messages")
    assert answer.body == b"two" and answer.headers["x-msg-redelivered"] == "false"
    assert http("DELETE", base + Q + "/messages").status == 204  # "one" was confirmed


def test_consume_multiple_an_unrecognized_acknowledgment_id_is_an_error_object_and_the_socket_closes(narconi):
    base, _ = narconi()
    with ws(base, Q + "/messages?ack", "consume") as socket:
        socket.send(json.dumps({"ackId": "99"}))
        error = json.loads(socket.recv(timeout=10))
        assert isinstance(error["code"], int) and "99" in error["error"]
        with pytest.raises(ConnectionClosed):
            socket.recv(timeout=10)


# ---------------------------------------------------------------- Configuration


def test_a_published_message_lives_the_ttl_then_is_a_dead_letter(narconi):
    base, stomp_port = narconi("-narconi-ttl", "1")
    http("POST", base + Q + "/messages", b"short-lived")
    time.sleep(1.2)
    assert http("DELETE", base + Q + "/messages").status == 204
    with Client("127.0.0.1", stomp_port) as client:
        client.subscribe(destination="./dead")
        frame = client.receive(timeout=10)
    assert frame is not None and frame.body == b"short-lived" and frame.headers["curb-dead-reason"] == "expired"


def test_a_curb_ttl_past_the_narconi_ttl_is_refused(narconi):
    base, _ = narconi()
    refused = http("POST", base + Q + "/messages", b"x", {"x-msg-curb-ttl": str(2 * 3600 * 1000)})
    assert refused.status == 400 and "TTL value too large" in refused.json["message"]
    assert wait_until(lambda: http("POST", base + Q + "/messages", b"y", {"x-msg-curb-ttl": "5000"}).status == 201)
