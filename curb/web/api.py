"""Narconi's HTTP API under /v2/{project}/queues/{queue}, as its README specifies it
(docs/http-websocket.md: The HTTP API), with Curb's additions, which a Narconi client never needs to know.

One Curb instance serves one queue, so the project and queue names are accepted and
ignored, as a STOMP destination is; through `curb router` the queue name is the routed
destination (curb.web.queues: what differs between the two backends). Paths (Q stands for /v2/{project}/queues/{queue}):

- Narconi's: `PUT Q`: an empty 201 (the queue exists). `DELETE Q`: purge, every message
  ACKed (needs the `purge` permission); an empty 204 once that is on disk.
  `POST Q/messages`: publish the body (at most -narconi-max-message bytes; it lives
  -narconi-ttl), `Content-Type` and `x-msg-x-NAME` headers kept with it; an empty 201
  once it is fsynced, the promise of a SEND's RECEIPT (concurrent requests share
  fsyncs). `DELETE Q/messages`: consume one, ACKed at once: 200 with the message
  (`Content-Type`, `x-msg-redelivered`, `x-msg-timestamp`, `x-msg-x-NAME`) once the ACK
  is on disk, 204 when there is none. `OPTIONS Q`: 200 with the queue's WebSocket
  endpoint in `Location` (ws:// or wss://). `GET Q` and `GET Q/messages` with a
  WebSocket upgrade: the publish and consume protocols (curb.web.narconi).
- Curb's: `?wait=S` on a consume: 204 only when none came within S seconds (at most
  MAX_WAIT_SECONDS). `POST Q/messages/batch`: JSON lines, one message each, all stored
  before the one 201.
- `POST Q/claims[?wait=S&ttl=S]`: at-least-once: 201 with the message and its claim's
  `Location`, Q/claims/ID; it stays wip until `DELETE Q/claims/ID` (ACK),
  `POST Q/claims/ID/nack` (NACK: back to the queue) or its deadline (`ttl`, else
  -ack-timeout); `PATCH Q/claims/ID?ttl=S` moves the deadline. Late: 410; unknown: 404.
  The answer to `OPTIONS` also lists every path in its JSON body.

Errors are JSON objects with Narconi's `message` (curb.web.replies): 400 a bad request,
401/403 logins and permissions (curb.web.access), 413 too large, 503 with Retry-After
when the queue is full.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from curb import payload
from curb.backend import Backend
from curb.broker import publish
from curb.heartbeat import MAX_MS
from curb.queue_errors import Late
from curb.refused import NotStored, Refused
from curb.users import User
from curb.web import narconi
from curb.web.access import log_in, peer_of
from curb.web.messages import BadMessage, check_encoding, decode_body, headers_in, headers_out, json_headers
from curb.web.peers import HttpPeer
from curb.web.queues import Queues
from curb.web.replies import Handler, Refusal, json_reply, not_stored, refused
from curb.web.settings import SEED, NarconiSettings
from curb.web.takers import Taken, Takers, answer

QUEUE = "/v2/{project}/queues/{queue}"
BODY_SECONDS = 15.0  # a request's body must have come by then (docs/http-websocket.md: Hostile web clients)
MAX_WAIT_SECONDS = 30.0  # the longest ?wait a consume or claim may ask for
MAX_TTL_SECONDS = MAX_MS / 1000  # a claim's deadline, at most a day, as curb-ack-timeout


def seconds(request: web.Request, name: str, least: float, most: float, default: float | None) -> float | None:
    """The query parameter `name` as seconds from `least` to `most`; 400 otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
        if not least <= value <= most:
            raise ValueError
    except ValueError:
        raise Refusal(400, f"?{name}= must be seconds from {least:g} to {most:g}, got {raw[:40]!r}") from None
    return value


async def read_body(request: web.Request, limit: int, flag: str = "-max-frame") -> bytes:
    """The request's body; 413 at once when its Content-Length is over `limit` (the
    front's, -max-frame), or as soon as a body without one (chunked) grows past it, so
    that no more than `limit` bytes are ever held for it; 408, closing the connection,
    when it has not all come within BODY_SECONDS (a body that trickles in)."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(f"a body of {request.content_length} bytes", limit, flag)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_SECONDS):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise _too_large("the body", limit, flag)
                chunks.append(chunk)
    except TimeoutError:
        raise Refusal(
            408, f"the body did not come within {BODY_SECONDS:g} s: send it at once", {"Connection": "close"}
        ) from None
    return b"".join(chunks)


def _too_large(what: str, limit: int, flag: str = "-max-frame") -> Refusal:
    return Refusal(
        413,
        f"{what} is over the limit of {limit} bytes: send a smaller one, or ask the operator for a larger {flag}",
        {"Connection": "close"},
    )


def message_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not raw.isdigit():
        raise Refusal(400, f"claim id {raw[:40]!r} is not a message id (a decimal number)")
    return int(raw)


def message_response(taken: Taken, status: int = 200, location: str | None = None) -> web.Response:
    stored, body = payload.decode(taken.payload)
    headers = headers_out(stored, taken.id, taken.deliveries, taken.timestamp_ms)
    if location is not None:
        headers["Location"] = location
    return web.Response(status=status, body=body, headers=headers)


class Api:
    """The routes of the HTTP API over one backend and the queues it serves."""

    def __init__(self, backend: Backend, queues: Queues, settings: NarconiSettings = SEED):
        self.broker = backend
        self.queues = queues
        self.settings = settings
        self.takers = Takers(backend, queues)

    def add_routes(self, app: web.Application) -> None:
        router = app.router
        router.add_put(QUEUE, self.create)
        router.add_delete(QUEUE, self.purge)
        router.add_post(QUEUE + "/messages", self.publish)
        router.add_post(QUEUE + "/messages/batch", self.publish_batch)
        router.add_delete(QUEUE + "/messages", self.consume)
        router.add_get(QUEUE, self.websocket)
        router.add_get(QUEUE + "/messages", self.websocket)
        router.add_post(QUEUE + "/claims", self.claim)
        router.add_delete(QUEUE + "/claims/{id}", self.ack)
        router.add_post(QUEUE + "/claims/{id}/nack", self.nack)
        router.add_patch(QUEUE + "/claims/{id}", self.touch)
        app.middlewares.append(self.discovery)

    async def _peer(self, request: web.Request, permission: str | None) -> tuple[HttpPeer, str]:
        """The request's client, once logged in with `permission` on the destination its
        path names, and that destination."""
        name = self.queues.name(request.match_info["queue"])
        user: User | None = await log_in(request, self.broker, permission, name)
        return HttpPeer(peer_of(request), None if user is None else user.name), name

    async def create(self, request: web.Request) -> web.Response:
        await self._peer(request, None)
        return web.Response(status=201)

    async def purge(self, request: web.Request) -> web.Response:
        await self._peer(request, "purge")
        purged, done = answer()
        self.queues.purge(done)
        err = await purged
        if err is not None:
            raise Refusal(503, f"the purge is not on disk: {err}; purge again")
        return web.Response(status=204)

    async def publish(self, request: web.Request) -> web.Response:
        peer, name = await self._peer(request, "send")
        body = await read_body(request, self.settings.max_message, "-narconi-max-message")
        headers = self.stored_headers(headers_in(request.headers, request.headers.get("Content-Type")))
        await self._stored(peer, name, [(headers, body)], batch=False)
        return web.Response(status=201)

    def publishing(self, peer: HttpPeer, name: str, headers: dict[str, str], body: bytes) -> asyncio.Future[None]:
        """Publish one message of `peer` (entered) to destination `name`: a future done
        once it is on disk; Refused at once."""
        if name:
            headers["destination"] = f"/queue/{name}"
        return publish(self.broker, headers, body, peer)

    async def _stored(
        self, peer: HttpPeer, name: str, messages: list[tuple[dict[str, str], bytes]], batch: bool = True
    ) -> None:
        """Publish `messages` in order and wait until all are on disk; a batch's refusal
        part-way says how many of the first lines were stored."""
        futures: list[asyncio.Future[None]] = []
        refusal: Refusal | None = None
        self.queues.enter(peer)
        try:
            for headers, body in messages:
                try:
                    futures.append(self.publishing(peer, name, headers, body))
                except Refused as err:
                    refusal = refused(err, {"stored": len(futures)} if batch else None)
                    break
            try:
                await asyncio.gather(*futures)
            except NotStored as err:
                raise not_stored(err) from None
        finally:
            self.broker.gone(peer)
        if refusal is not None:
            raise refusal

    def stored_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """A message's headers as published over /v2, with its TTL (-narconi-ttl) as its
        `curb-ttl`: one asked for that is longer is refused (Narconi: "TTL value too large")."""
        ttl_ms = round(self.settings.ttl * 1000)
        if ttl_ms:
            asked = headers.get("curb-ttl")
            if asked is not None and (not asked.isdigit() or int(asked) == 0 or int(asked) > ttl_ms):
                raise Refusal(400, f"TTL value too large: curb-ttl must be from 1 to {ttl_ms} ms (-narconi-ttl)")
            headers.setdefault("curb-ttl", str(ttl_ms))
        return headers

    async def publish_batch(self, request: web.Request) -> web.Response:
        """JSON lines, each {"message": BODY, "headers": {...}}: all stored, then one 201.
        A refusal part-way says how many of the first lines were stored (and are on disk)."""
        peer, name = await self._peer(request, "send")
        encoding = _encoding(request)
        messages = []
        for number, line in enumerate((await read_body(request, self.broker.config.max_frame)).splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict) or "message" not in item:
                    raise BadMessage('each line must be a JSON object with "message"')
                body = decode_body(item["message"], encoding)
                if len(body) > self.settings.max_message:
                    raise _too_large(
                        f"line {number}'s message of {len(body)} bytes",
                        self.settings.max_message,
                        "-narconi-max-message",
                    )
                messages.append((self.stored_headers(json_headers(item.get("headers"))), body))
            except (BadMessage, ValueError) as err:
                raise Refusal(400, f"line {number}: {err}; nothing was stored") from None
            except RecursionError:
                raise Refusal(400, f"line {number}: JSON nested too deep; nothing was stored") from None
        if not messages:
            raise Refusal(400, 'no messages: send JSON lines, each {"message": "..."}')
        await self._stored(peer, name, messages)
        return json_reply({"messages": len(messages)}, 201)

    async def consume(self, request: web.Request) -> web.Response:
        peer, name = await self._peer(request, "consume")
        wait = seconds(request, "wait", 0, MAX_WAIT_SECONDS, 0.0) or 0.0
        taken = await self.takers.take(peer, wait, ack_timeout=0, name=name)
        if taken is None:
            return web.Response(status=204)
        response = message_response(taken)  # built (and so checked) before the ACK
        if _gone(request):  # the client left while it waited: the message goes back
            self.broker.gone(peer)
            return response
        try:
            await self.takers.ack_now(peer, taken)
        except NotStored as err:
            raise Refusal(503, f"the ACK is not on disk: {err}; the message may be delivered again") from None
        return response

    async def claim(self, request: web.Request) -> web.Response:
        peer, name = await self._peer(request, "consume")
        wait = seconds(request, "wait", 0, MAX_WAIT_SECONDS, 0.0) or 0.0
        ttl = seconds(request, "ttl", 0.001, MAX_TTL_SECONDS, None)
        taken = await self.takers.take(peer, wait, ack_timeout=ttl, name=name)
        if taken is None:
            return web.Response(status=204)
        response = message_response(taken, 201, location=f"{request.rel_url.raw_path}/{taken.id}")
        if _gone(request):  # the client left while it waited: nobody knows of a claim
            self.broker.gone(peer)
            return response
        self.takers.claim(peer, taken)
        return response

    async def ack(self, request: web.Request) -> web.Response:
        await self._settle(request, self.takers.ack)
        return web.Response(status=204)

    async def nack(self, request: web.Request) -> web.Response:
        await self._settle(request, self.takers.release)
        return web.Response(status=204)

    async def _settle(self, request: web.Request, settle: Callable[[int], Awaitable[None]]) -> None:
        await self._peer(request, "consume")
        msg_id = message_id(request)
        try:
            await settle(msg_id)
        except KeyError:
            raise _unclaimed(msg_id) from None
        except Late:
            raise _late(msg_id) from None
        except NotStored as err:
            raise Refusal(503, f"not on disk: {err}; try again") from None

    async def touch(self, request: web.Request) -> web.Response:
        await self._peer(request, "consume")
        msg_id = message_id(request)
        ttl = seconds(request, "ttl", 0.001, MAX_TTL_SECONDS, None)
        if ttl is None:
            raise Refusal(400, "PATCH a claim with ?ttl=SECONDS: its new deadline, from now")
        try:
            self.takers.touch(msg_id, ttl)
        except KeyError:
            raise _unclaimed(msg_id) from None
        except Late:
            raise _late(msg_id) from None
        return web.Response(status=204)

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        return await narconi.serve(request, self)

    @web.middleware
    async def discovery(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """OPTIONS on any path: what may be done where, and the queue's WebSocket endpoint
        in `Location` (Narconi's discovery: this broker serves it itself)."""
        if request.method != "OPTIONS":
            return await handler(request)
        parts = request.rel_url.raw_path.strip("/").split("/")
        project, queue = (parts[1], parts[3]) if len(parts) >= 4 and parts[0] == "v2" else ("curb", "curb")
        base = f"/v2/{project}/queues/{queue}"
        paths = {
            base: ["PUT", "DELETE", "GET (WebSocket: publish, consume)"],
            f"{base}/messages": ["POST", "DELETE", "GET (WebSocket: publish, consume)"],
            f"{base}/messages/batch": ["POST"],
            f"{base}/claims": ["POST"],
            f"{base}/claims/{{id}}": ["DELETE (ACK)", "PATCH (?ttl)"],
            f"{base}/claims/{{id}}/nack": ["POST"],
            "/ws": ["GET (STOMP over WebSocket)"],
            "/metrics": ["GET"],
            "/stats": ["GET"],
        }
        allow = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
        ws = "wss" if request.secure else "ws"
        location = f"{ws}://{request.host}{base}"  # Narconi: the queue's WebSocket endpoint
        return json_reply({"paths": paths}, 200, {"Location": location, "Allow": ", ".join(sorted(allow))})


def _gone(request: web.Request) -> bool:
    """Whether the client of `request` has closed its connection (a request it gave up
    on: the handler is cancelled then, but only at its next wait)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _unclaimed(msg_id: int) -> Refusal:
    return Refusal(
        404,
        f"message {msg_id} is not claimed over HTTP: claim one with POST .../claims; an id ACKed or NACKed "
        "already, or whose claim passed its deadline a while ago, is unknown",
    )


def _late(msg_id: int) -> Refusal:
    return Refusal(
        410,
        f"the claim on message {msg_id} passed its deadline and the message went back to the queue: this "
        "changed nothing; settle claims within their ttl, or extend it with PATCH ?ttl=",
    )


def _encoding(request: web.Request) -> str:
    try:
        return check_encoding(request.query.get("encoding", "utf-8"))
    except BadMessage as err:
        raise Refusal(400, str(err)) from None
