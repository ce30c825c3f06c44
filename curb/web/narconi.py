"""Narconi's WebSocket protocols, as its README specifies them, on GET
/v2/{project}/queues/{queue} and GET .../messages (docs/http-websocket.md: Narconi's WebSocket protocols).

The client picks one with `Sec-WebSocket-Protocol: publish` or `consume`, and logs in
(with -users) on the upgrade request as any HTTP request does.

- publish: each message is up to two WebSocket messages. The first is a JSON object of
  metadata (`Content-Type`, `x-msg-x-NAME`: kept with the message as a STOMP consumer's
  content-type and x-NAME headers), or an empty message for none; the second is the
  payload as it is (a binary message's bytes, a text message's UTF-8). A metadata object
  with a `message` string is the whole message in one. Each message is confirmed with one
  empty WebSocket message once it is fsynced, in the order they came; one the broker
  cannot take gets `{"code", "error"}` in its place, and the socket goes on. At most
  MAX_UNCONFIRMED wait for their confirmation: past that the socket is not read, so a
  fast publisher waits for the disk. Curb's addition: `?encoding=base64|hex` reads text
  payloads (and `message`) in that encoding.
- consume (`?ack`, `?limit=N`, `?encoding=`): each message is a JSON metadata message
  (`Content-Type`, `timestamp`, `redelivered`, with `?ack` `ackId` as a string, the
  `x-msg-NAME` of its headers, Curb's `x-curb-id` and `x-curb-deliveries`), then the
  payload as a binary message; with `?encoding=` (utf-8, base64, hex) the payload is the
  metadata's `message` instead and no second message comes. Without `?ack` a message is
  acknowledged once sent. With `?ack` the client sends `{"ackId": ID}` (that message) or
  `{"ackToId": ID}` (every message of this socket up to that one); until then it is wip,
  at most `limit` (default -narconi-limit) at once, and goes back to the queue when the
  socket closes or its ack deadline (-ack-timeout) passes. An empty message from the
  client stops new deliveries; it then settles what it has and closes.
- Errors are `{"code": N, "error": "..."}`. A message that breaks the protocol (not JSON
  where an object is due, an unknown ack id) closes the socket after its error (1008); a
  WebSocket message larger than -max-frame closes it with 1009.

Bound: a consumer that stops reading holds at most OUTPUT_LIMIT bytes of messages made
for it, as a STOMP session does (curb.session): past that the broker makes none for it
(`set_writable`) until what it holds is sent.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from curb import payload
from curb.backend import Backend
from curb.log import Record
from curb.queue import Subscription
from curb.queue_errors import Late, QueueError
from curb.refused import NotStored, Refused
from curb.session import OUTPUT_LIMIT
from curb.web.access import log_in, peer_of
from curb.web.messages import DEFAULT_TYPE, PREFIX, BadMessage, check_encoding, decode_body, encode_body, headers_in
from curb.web.peers import HttpPeer, refuse
from curb.web.queues import Queues
from curb.web.replies import Refusal, refused
from curb.web.settings import MAX_LIMIT, NarconiSettings

PROTOCOLS = ("publish", "consume")
MAX_UNCONFIRMED = 1000
SUB_ID = "narconi"
# Messages in flight to a consumer without ?ack (each acknowledged once sent): enough to
# keep the socket busy; OUTPUT_LIMIT bounds their bytes.
AUTO_WINDOW = 64


class Api(Protocol):
    """What the WebSocket protocols need of the HTTP API (curb.web.api.Api), which
    serves them at its queue paths."""

    broker: Backend
    queues: Queues
    settings: NarconiSettings

    def stored_headers(self, headers: dict[str, str]) -> dict[str, str]: ...
    def publishing(self, peer: HttpPeer, name: str, headers: dict[str, str], body: bytes) -> asyncio.Future[None]: ...


class _Closed(Exception):
    """The socket is to be closed after an error message (its code and text)."""


async def serve(request: web.Request, api: Api) -> web.StreamResponse:
    wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    protocol = next((p for p in wanted if p in PROTOCOLS), None)
    if protocol is None:
        raise Refusal(
            400,
            "GET on a queue is Narconi's WebSocket: upgrade with Sec-WebSocket-Protocol: publish or consume "
            "(to consume one message over plain HTTP, DELETE .../messages)",
        )
    broker, name = api.broker, api.queues.name(request.match_info["queue"])
    user = await log_in(request, broker, "send" if protocol == "publish" else "consume", name)
    query = request.query
    try:
        encoding = check_encoding(query["encoding"]) if "encoding" in query else None
        limit = int(query.get("limit") or api.settings.limit)
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError
    except BadMessage as err:
        raise Refusal(400, str(err)) from None
    except ValueError:
        raise Refusal(400, f"?limit= must be a whole number from 1 to {MAX_LIMIT}") from None
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=broker.config.max_frame)
    await ws.prepare(request)
    peer = HttpPeer(peer_of(request), None if user is None else user.name)
    api.queues.enter(peer)
    try:
        if protocol == "publish":
            await _Publisher(ws, api, peer, name, encoding).run()
        else:
            await _Consumer(ws, api, peer, encoding, "ack" in query).run(limit, name)
    except _Closed as err:
        code, text = err.args
        if not ws.closed:
            await ws.send_json({"code": code, "error": text})
            await ws.close(code=WSCloseCode.POLICY_VIOLATION)
    return ws


async def _messages(ws: web.WebSocketResponse) -> AsyncIterator[WSMessage]:
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


def _empty(message: Any) -> bool:
    return not message.data


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


def metadata_headers(item: dict[str, Any]) -> dict[str, str]:
    """The STOMP headers of a published message's metadata, read as an HTTP publish's
    headers are (curb.web.messages.headers_in): `Content-Type` is its content-type and
    each `x-msg-NAME` its header NAME (Narconi's x-msg-x-NAME: x-NAME); other properties
    (`message`) are not headers."""
    named = {
        key: value for key, value in item.items() if key.lower() == "content-type" or key.lower().startswith(PREFIX)
    }
    for key, value in named.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise BadMessage(f"metadata {key[:40]!r} must be a string")
    strings = {key: str(value) for key, value in named.items()}
    content_type = next((value for key, value in strings.items() if key.lower() == "content-type"), None)
    return headers_in(strings, content_type)


def _body(message: Any, encoding: str | None) -> bytes:
    """A payload message as bytes: binary as it is, text as UTF-8 (or in `encoding`)."""
    data = message.data
    if isinstance(data, bytes):
        return data
    return decode_body(data, encoding or "utf-8")


class _Publisher:
    """A publishing socket: its messages are stored in the order they come, and each is
    confirmed (an empty message, or its error) in that order by a task of its own; the
    socket is read no further while MAX_UNCONFIRMED wait."""

    def __init__(self, ws: web.WebSocketResponse, api: Api, peer: HttpPeer, name: str, encoding: str | None) -> None:
        self.ws = ws
        self.api = api
        self.peer = peer
        self.name = name
        self.encoding = encoding
        self.pending: collections.deque[asyncio.Future[None] | tuple[int, str]] = collections.deque()
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.finished = False

    async def run(self) -> None:
        confirmer = asyncio.get_running_loop().create_task(self._confirm())
        metadata: dict[str, str] | None = None
        try:
            async for message in _messages(self.ws):
                if metadata is None:
                    headers, body = self._metadata(message)
                    if body is None:  # the payload is the next message
                        metadata = headers
                        continue
                else:
                    headers, metadata = metadata, None
                    body = self._payload(message)
                self.pending.append(self._store(headers, body))
                self.wake.set()
                if len(self.pending) >= MAX_UNCONFIRMED:
                    self.room.clear()
                    await self.room.wait()
        finally:
            self.finished = True
            self.wake.set()
            await confirmer
            self.api.broker.gone(self.peer)

    def _metadata(self, message: Any) -> tuple[dict[str, str], bytes | None]:
        """A metadata message's headers, and the payload in it (None: the next message is)."""
        item = {} if _empty(message) else _json_object(message)
        try:
            headers = metadata_headers(item)
            if "message" not in item:
                return headers, None
            return headers, decode_body(item["message"], self.encoding or "utf-8")
        except BadMessage as err:
            raise _Closed(400, str(err)) from None

    def _payload(self, message: Any) -> bytes:
        """The payload message that follows a metadata message without one."""
        try:
            return _body(message, self.encoding)
        except BadMessage as err:
            raise _Closed(400, str(err)) from None

    def _store(self, headers: dict[str, str], body: bytes) -> asyncio.Future[None] | tuple[int, str]:
        """The broker's future for a message, or the error that takes its place."""
        settings = self.api.settings
        if len(body) > settings.max_message:
            text = f"a message of {len(body)} bytes is over the limit of {settings.max_message} bytes"
            return 413, text + " (-narconi-max-message)"
        try:
            return self.api.publishing(self.peer, self.name, self.api.stored_headers(headers), body)
        except Refusal as err:
            return err.status, err.error
        except Refused as err:
            return refused(err).status, f"{err.message}: {err}"

    async def _confirm(self) -> None:
        """One empty message per message stored, or its error, in the order they came."""
        pending, ws = self.pending, self.ws
        while pending or not self.finished:
            if not pending:
                self.wake.clear()
                await self.wake.wait()
                continue
            stored = pending[0]
            answer: dict[str, object] | None = None
            if isinstance(stored, tuple):
                answer = {"code": stored[0], "error": stored[1]}
            else:
                try:
                    await stored
                except NotStored as err:
                    answer = {"code": 503, "error": f"not stored: {err}; send it again"}
            pending.popleft()
            if len(pending) < MAX_UNCONFIRMED:
                self.room.set()
            if not ws.closed:
                await (ws.send_str("") if answer is None else ws.send_json(answer))


def consumed_metadata(rec: Record, stored: dict[str, str], acks: bool) -> dict[str, object]:
    """The metadata message of a consumed message (Narconi's, and Curb's x-curb-*)."""
    item: dict[str, object] = {
        "Content-Type": stored.get("content-type", DEFAULT_TYPE),
        "timestamp": rec.timestamp_ms,
        "redelivered": rec.deliveries > 1,
    }
    if acks:
        item["ackId"] = str(rec.id)
    for name, value in stored.items():
        if name != "content-type":
            item[PREFIX + name] = value
    item["x-curb-id"] = rec.id
    item["x-curb-deliveries"] = rec.deliveries
    return item


class _Consumer:
    """A consuming socket: each message delivered to its peer is sent as a metadata message
    (with the payload in it, or in a message of its own after it) by a task of its own, in
    order; the client's messages acknowledge them (with ?ack; else each is acknowledged once
    sent). Past OUTPUT_LIMIT bytes not sent yet the peer stops taking deliveries."""

    def __init__(self, ws: web.WebSocketResponse, api: Api, peer: HttpPeer, encoding: str | None, acks: bool) -> None:
        self.ws = ws
        self.broker = api.broker
        self.own_deadlines = api.queues.own_deadlines
        self.peer = peer
        self.encoding = encoding
        self.acks = acks
        self.out: collections.deque[tuple[Record, bytes]] = collections.deque()
        self.held = 0  # bytes in `out`
        self.blocked = False
        self.wake = asyncio.Event()

    async def run(self, limit: int, name: str) -> None:
        broker, peer, acks = self.broker, self.peer, self.acks
        peer.on_deliver = self._delivered
        deadline = None if acks or not self.own_deadlines else 0
        sub = broker.subscribe(peer, SUB_ID, "client-individual", limit if acks else AUTO_WINDOW, deadline, False, name)
        sender = asyncio.get_running_loop().create_task(self._send())
        try:
            broker.pump()
            async for message in _messages(self.ws):
                if _empty(message):  # the client stops: nothing new, what it has it settles
                    if sub.active:
                        broker.unsubscribe(peer, SUB_ID)
                    continue
                item = _json_object(message)
                try:
                    self._acknowledge(sub, item)
                except Late as err:
                    await self.ws.send_json({"code": 410, "error": str(err)})
                except QueueError as err:
                    raise _Closed(400, f"unrecognized acknowledgment ID: {err}") from None
                broker.pump()
        finally:
            sender.cancel()
            broker.gone(peer)
            # The socket, its peer and this consumer hold each other and wait for the
            # garbage collector's full pass, which a broker rarely runs: let go of the
            # messages now (what is not sent went back with `gone`) and of the peer.
            self.out.clear()
            peer.on_deliver = refuse

    def _acknowledge(self, sub: Subscription[Any, Record], item: dict[str, Any]) -> None:
        """{"ackId": ID} acknowledges one message, {"ackToId": ID} every one up to it."""
        broker, peer = self.broker, self.peer
        if "ackId" in item:
            broker.ack(peer, _id(item["ackId"]))
        elif "ackToId" in item:
            upto = _id(item["ackToId"])
            if upto not in sub.unacked:
                raise QueueError(f"{upto} is no message this socket holds", "")
            for msg_id in [i for i in sub.unacked if i <= upto]:
                broker.ack(peer, msg_id)
        else:
            raise _Closed(400, 'send {"ackId": ID} or {"ackToId": ID}, or an empty message to stop')

    def _delivered(self, sub: Subscription[Any, Record], rec: Record, data: bytes | memoryview) -> None:
        self.out.append((rec, bytes(data)))
        self.held += len(data)
        if self.held >= OUTPUT_LIMIT and not self.blocked:
            self.blocked = True
            self.broker.set_writable(self.peer, False)
        self.wake.set()

    async def _send(self) -> None:
        ws, out, broker, peer, encoding, acks = self.ws, self.out, self.broker, self.peer, self.encoding, self.acks
        while not ws.closed:
            if not out:
                self.wake.clear()
                await self.wake.wait()
                continue
            rec, data = out.popleft()
            stored, body = payload.decode(data)
            item = consumed_metadata(rec, stored, acks)
            if encoding is not None:
                try:
                    item["message"] = encode_body(body, encoding)
                except BadMessage:  # a body that is not UTF-8, asked for as utf-8
                    item["message"], item["x-curb-encoding"] = encode_body(body, "base64"), "base64"
                await ws.send_json(item)
            else:
                await ws.send_json(item)
                await ws.send_bytes(bytes(body))
            self.held -= len(data)
            if not acks:
                broker.ack(peer, rec.id)
            if self.blocked and self.held < OUTPUT_LIMIT // 4:
                self.blocked = False
                broker.set_writable(peer, True)
            broker.pump()


def _id(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str) or not str(raw).isdigit():
        raise QueueError(f"ack id {str(raw)[:40]!r} is not a message id (a whole number, as a string)", "")
    return int(raw)
