"""WebSockets on the web front, with the `websockets` client: logins and permissions on
Narconi's protocols (the protocols themselves: tests/test_narconi.py), and STOMP at /ws
(the same session as over TCP)."""

from __future__ import annotations

import json

import pytest
from webrig import basic, running, users_file
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from curb.frame import Frame, FrameParser

Q = "/v2/shop/queues/orders"


def ws_url(web, path: str) -> str:
    return f"ws://127.0.0.1:{web.http_port}{path}"


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
            assert ws.recv(timeout=10) == ""  # confirmed (the protocol: tests/test_narconi.py)


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
