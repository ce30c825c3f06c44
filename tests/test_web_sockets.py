"""WebSockets on the web front, with the `websockets` client: Narconi's publish and consume
protocols on .../messages, and STOMP at /ws (the same session as over TCP)."""

from __future__ import annotations

import json

import pytest
from webrig import basic, http, running, users_file
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from curb.client import Client
from curb.frame import Frame, FrameParser

Q = "/v2/shop/queues/orders"


def ws_url(web, path: str) -> str:
    return f"ws://127.0.0.1:{web.http_port}{path}"


def test_narconi_publish_confirms_each_message_in_order_in_both_forms(tmp_path):
    with running(tmp_path) as web:
        with connect(ws_url(web, Q + "/messages?encoding=hex"), subprotocols=[Subprotocol("publish")]) as ws:
            assert ws.subprotocol == "publish"
            ws.send(json.dumps({"message": "6869", "headers": {"content-type": "text/plain"}}))
            ws.send(json.dumps({"x-kind": "raw"}))  # metadata, then the payload as it is
            ws.send(b"\x00\x01\xff")
            ws.send(json.dumps({"message": "zz"}))  # not hex: an error, and the socket closes
            answers = [json.loads(ws.recv(timeout=10)) for _ in range(3)]
            assert answers[:2] == [{"confirmed": 1}, {"confirmed": 2}]
            assert answers[2]["code"] == 400 and "hex" in answers[2]["error"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
        with Client("127.0.0.1", web.stomp_port) as client:
            client.subscribe()
            first, second = client.receive(timeout=10), client.receive(timeout=10)
        assert first is not None and first.body == b"hi" and first.headers["content-type"] == "text/plain"
        assert second is not None and second.body == b"\x00\x01\xff" and second.headers["x-kind"] == "raw"


def test_narconi_consume_without_ack_takes_messages_as_they_are_sent(tmp_path):
    with running(tmp_path) as web:
        for body in (b"a", b"\xff"):
            http("POST", web.base + Q + "/messages", body, {"x-msg-n": body.hex()})
        with connect(ws_url(web, Q + "/messages"), subprotocols=[Subprotocol("consume")]) as ws:
            first, second = json.loads(ws.recv(timeout=10)), json.loads(ws.recv(timeout=10))
        assert first["message"] == "a" and first["encoding"] == "utf-8" and first["headers"]["n"] == "61"
        assert second["message"] == "/w==" and second["encoding"] == "base64"  # not UTF-8: base64 says so
        assert web.gauges()["rdy"] == 0 and web.gauges()["wip"] == 0


def test_narconi_consume_with_ack_holds_messages_until_ack_id_or_ack_to_id(tmp_path):
    with running(tmp_path) as web:
        for i in range(5):
            http("POST", web.base + Q + "/messages", b"m%d" % i)
        with connect(
            ws_url(web, Q + "/messages?ack&limit=3&encoding=base64"), subprotocols=[Subprotocol("consume")]
        ) as ws:
            got = [json.loads(ws.recv(timeout=10)) for _ in range(3)]
            assert [g["ackId"] for g in got] == [1, 2, 3]
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.3)  # limit=3: no fourth before an ack
            ws.send(json.dumps({"ackId": 2}))
            assert json.loads(ws.recv(timeout=10))["ackId"] == 4
            ws.send(json.dumps({"ackToId": 4}))
            assert json.loads(ws.recv(timeout=10))["ackId"] == 5
            ws.send(json.dumps({"ackId": 99}))
            error = json.loads(ws.recv(timeout=10))
            assert error["code"] == 400 and "99" in error["error"]
        # 5 was never acked: back in the queue once the socket closed
        assert http("DELETE", web.base + Q + "/messages?wait=5").body == b"m4"


def test_narconi_needs_a_protocol_and_a_login_under_users(tmp_path):
    path = users_file(tmp_path, alice="send")
    with running(tmp_path, users_path=path) as web:
        with pytest.raises(InvalidStatus) as refused:
            connect(
                ws_url(web, Q + "/messages"), subprotocols=[Subprotocol("consume")], additional_headers=basic("alice")
            )
        assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus) as anonymous:
            connect(ws_url(web, Q + "/messages"), subprotocols=[Subprotocol("publish")])
        assert anonymous.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as nothing:
            connect(ws_url(web, Q + "/messages"), additional_headers=basic("alice"))
        assert nothing.value.response.status_code == 400
        with connect(
            ws_url(web, Q + "/messages"), subprotocols=[Subprotocol("publish")], additional_headers=basic("alice")
        ) as ws:
            ws.send(json.dumps({"message": "ok"}))
            assert json.loads(ws.recv(timeout=10)) == {"confirmed": 1}


def frames(data: str | bytes) -> list[Frame]:
    return FrameParser().feed(data.encode() if isinstance(data, str) else data)


def received(ws: ClientConnection) -> list[Frame]:
    """The frames of the next WebSocket message."""
    return frames(ws.recv(timeout=10))


@pytest.mark.parametrize(
    "subprotocols", [[Subprotocol("v12.stomp")], [Subprotocol("v10.stomp"), Subprotocol("v11.stomp")], None]
)
def test_stomp_over_websocket_splits_merges_and_keeps_binary_bodies(tmp_path, subprotocols):
    with running(tmp_path) as web:
        with connect(ws_url(web, "/ws"), subprotocols=subprotocols) as ws:
            if subprotocols:
                assert ws.subprotocol in subprotocols
            ws.send("CONNECT\naccept-version:1.2\nheart-beat:0,0\n\n\x00")
            [connected] = received(ws)
            assert connected.command == "CONNECTED"
            ws.send("SEND\ndestination:/queue/a\nreceipt:r1\n\nhel")  # split across messages
            ws.send(b"lo\x00SEND\ndestination:/queue/a\ncontent-length:3\nreceipt:r2\n\n\xff\x00\x01\x00")  # merged
            receipts = [received(ws)[0].headers["receipt-id"] for _ in range(2)]
            assert receipts == ["r1", "r2"]
            ws.send("SUBSCRIBE\nid:1\ndestination:/queue/a\n\n\x00")
            text, binary = ws.recv(timeout=10), ws.recv(timeout=10)
            assert isinstance(text, str) and frames(text)[0].body == b"hello"  # one frame per message
            assert isinstance(binary, bytes) and frames(binary)[0].body == b"\xff\x00\x01"
            ws.send("DISCONNECT\nreceipt:bye\n\n\x00")
            assert received(ws)[0].headers["receipt-id"] == "bye"
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)


def test_stomp_over_websocket_is_the_same_session_rules_users_and_heart_beats(tmp_path):
    path = users_file(tmp_path, alice="consume")
    with running(tmp_path, users_path=path, heartbeat_ms=200) as web:
        with connect(ws_url(web, "/ws"), subprotocols=[Subprotocol("v12.stomp")]) as ws:
            ws.send("SEND\ndestination:/queue/a\n\nx\x00")
            [error] = received(ws)
            assert error.command == "ERROR" and "not allowed before CONNECT" in error.headers["message"]
        with connect(ws_url(web, "/ws"), subprotocols=[Subprotocol("v12.stomp")]) as ws:
            ws.send("CONNECT\naccept-version:1.2\nlogin:alice\npasscode:correct horse\nheart-beat:0,200\n\n\x00")
            [connected] = received(ws)
            assert connected.command == "CONNECTED" and connected.headers["heart-beat"].startswith("200,")
            assert ws.recv(timeout=10) == "\n"  # a heart-beat is a message of one LF
            ws.send("SEND\ndestination:/queue/a\n\nx\x00")
            [error] = received(ws)
            assert error.command == "ERROR" and error.headers["message"] == "send permission needed"
