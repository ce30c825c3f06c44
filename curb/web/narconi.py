"""Narconi's WebSocket protocols on GET /v2/{project}/queues/{queue}/messages (README: HTTP API).

The client picks one with `Sec-WebSocket-Protocol: publish` or `consume`, and logs in
(with -users) on the upgrade request as any HTTP request does. Query: `?encoding=`
utf-8 (default), base64 or hex for bodies in JSON; for consume, `?ack` (the client
acknowledges) and `?limit=N` (at most N messages unacknowledged at once; default the
broker's -prefetch).

- publish: each message is one JSON text message `{"message": BODY, "headers": {...}}`,
  or a JSON object of headers (metadata) followed by the payload as the next WebSocket
  message (binary: the bytes as they are; text: in the encoding). Each message gets a
  confirmation `{"confirmed": N}` (N counts this socket's messages from 1), in order,
  once it is fsynced. A message the broker refuses gets `{"code", "error", "seq": N}`
  instead, and the socket goes on. At most MAX_UNCONFIRMED messages wait for their
  confirmation: past that the socket is not read, so a fast publisher waits for the disk.
- consume: each message is one JSON text message `{"message", "encoding", "headers",
  "ackId", "deliveries"}`. Without `?ack` a message is acknowledged once it is sent.
  With `?ack` the client sends `{"ackId": ID}` (that message) or `{"ackToId": ID}` (every
  message of this socket up to that id); until then the message is wip, and goes back to
  the queue when the socket closes or its ack deadline (-ack-timeout) passes.
- Errors are `{"code": N, "error": "..."}`. A message that is not valid JSON, or an
  unknown protocol, closes the socket after its error (1008); a message larger than
  -max-frame closes it with 1009.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import TYPE_CHECKING, Any

from aiohttp import WSCloseCode, WSMsgType, web

from curb.broker import NotStored, Refused
from curb.log import Record
from curb.queue import Late, QueueError, Subscription
from curb.web.access import log_in, peer_of
from curb.web.messages import BadMessage, as_json, check_encoding, decode_body, json_headers
from curb.web.peers import HttpPeer
from curb.web.replies import Refusal

if TYPE_CHECKING:
    from curb.web.api import Api

PROTOCOLS = ("publish", "consume")
MAX_UNCONFIRMED = 1000
SUB_ID = "narconi"


class _Closed(Exception):
    """The socket is to be closed after an error message (its code and text)."""


async def serve(request: web.Request, api: Api) -> web.StreamResponse:
    wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    protocol = next((p for p in wanted if p in PROTOCOLS), None)
    if protocol is None:
        raise Refusal(
            400,
            "GET .../messages is Narconi's WebSocket: upgrade with Sec-WebSocket-Protocol: publish or consume "
            "(to consume one message over plain HTTP, DELETE .../messages)",
        )
    broker = api.broker
    user = await log_in(request, broker, "send" if protocol == "publish" else "consume")
    try:
        encoding = check_encoding(request.query.get("encoding", "utf-8"))
        limit = int(request.query.get("limit", "0") or 0)
        if not 0 <= limit <= 10000:
            raise ValueError
    except BadMessage as err:
        raise Refusal(400, str(err)) from None
    except ValueError:
        raise Refusal(400, "?limit= must be a whole number from 1 to 10000") from None
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=broker.max_frame)
    await ws.prepare(request)
    peer = HttpPeer(peer_of(request), None if user is None else user.name)
    try:
        if protocol == "publish":
            await _publish(ws, api, encoding)
        else:
            await _consume(ws, api, peer, encoding, "ack" in request.query, limit or None)
    except _Closed as err:
        code, text = err.args
        if not ws.closed:
            await ws.send_json({"code": code, "error": text})
            await ws.close(code=WSCloseCode.POLICY_VIOLATION)
    return ws


async def _messages(ws: web.WebSocketResponse):
    """The client's messages, until it closes; a too-large one ends the socket (1009)."""
    while True:
        message = await ws.receive()
        if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            yield message
        elif message.type is WSMsgType.ERROR:
            if not ws.closed:
                await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG)
            return
        else:
            return


def _json_object(message: Any) -> dict[str, Any]:
    if message.type is not WSMsgType.TEXT:
        raise _Closed(400, "expected a JSON object as a text message")
    try:
        item = json.loads(message.data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        raise _Closed(400, "a message is not valid JSON (or is nested too deep)") from None
    if not isinstance(item, dict):
        raise _Closed(400, "expected a JSON object")
    return item


async def _publish(ws: web.WebSocketResponse, api: Api, encoding: str) -> None:
    broker = api.broker
    pending: collections.deque[tuple[int, asyncio.Future[None] | None, str | None]] = collections.deque()
    wake = asyncio.Event()
    room = asyncio.Event()
    room.set()
    finished = False

    async def confirm() -> None:
        """Confirmations (or refusals) in the order of the messages."""
        while pending or not finished:
            if not pending:
                wake.clear()
                await wake.wait()
                continue
            seq, stored, refusal = pending[0]
            if stored is not None:
                try:
                    await stored
                    answer: dict[str, object] = {"confirmed": seq}
                except NotStored as err:
                    answer = {"code": 503, "error": f"not stored: {err}; send it again", "seq": seq}
            else:
                answer = {"code": 400, "error": refusal, "seq": seq}
            pending.popleft()
            if len(pending) < MAX_UNCONFIRMED:
                room.set()
            if not ws.closed:
                await ws.send_json(answer)

    confirmer = asyncio.get_running_loop().create_task(confirm())
    seq = 0
    metadata: dict[str, str] | None = None
    try:
        async for message in _messages(ws):
            if metadata is None:
                item = _json_object(message)
                if "message" not in item:
                    try:
                        metadata = json_headers(item)
                    except BadMessage as err:
                        raise _Closed(400, str(err)) from None
                    continue
                try:
                    headers, body = json_headers(item.get("headers")), decode_body(item["message"], encoding)
                except BadMessage as err:
                    raise _Closed(400, str(err)) from None
            else:
                headers, metadata = metadata, None
                data = message.data
                try:
                    body = data if isinstance(data, bytes) else decode_body(data, encoding)
                except BadMessage as err:
                    raise _Closed(400, str(err)) from None
            seq += 1
            try:
                pending.append((seq, broker.publish(headers, body), None))
            except Refused as err:
                pending.append((seq, None, f"{err.message}: {err}"))
            wake.set()
            if len(pending) >= MAX_UNCONFIRMED:
                room.clear()
                await room.wait()
    finally:
        finished = True
        wake.set()
        await confirmer


async def _consume(
    ws: web.WebSocketResponse, api: Api, peer: HttpPeer, encoding: str, acks: bool, limit: int | None
) -> None:
    broker = api.broker
    out: collections.deque[tuple[Record, bytes]] = collections.deque()
    wake = asyncio.Event()

    def delivered(sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
        out.append((rec, bytes(data)))
        wake.set()

    async def send() -> None:
        while not ws.closed:
            if not out:
                wake.clear()
                await wake.wait()
                continue
            rec, data = out.popleft()
            item = as_json(data, encoding)
            item["ackId"] = rec.id
            item["deliveries"] = rec.deliveries
            await ws.send_json(item)
            if not acks:
                broker.ack(peer, rec.id)
                broker.pump()

    peer.on_deliver = delivered
    sub = broker.subscribe(peer, SUB_ID, "client-individual", limit, None if acks else 0)
    sender = asyncio.get_running_loop().create_task(send())
    try:
        broker.pump()
        async for message in _messages(ws):
            item = _json_object(message)
            try:
                if "ackId" in item:
                    broker.ack(peer, _id(item["ackId"]))
                elif "ackToId" in item:
                    upto = _id(item["ackToId"])
                    for msg_id in [i for i in sub.unacked if i <= upto]:
                        broker.ack(peer, msg_id)
                else:
                    raise QueueError('send {"ackId": ID} or {"ackToId": ID}', "")
            except Late as err:
                await ws.send_json({"code": 410, "error": str(err)})
            except QueueError as err:
                await ws.send_json({"code": 400, "error": str(err)})
            broker.pump()
    finally:
        sender.cancel()
        broker.gone(peer)


def _id(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str) or not str(raw).isdigit():
        raise QueueError(f"ack id {str(raw)[:40]!r} is not a message id (a whole number)", "")
    return int(raw)
