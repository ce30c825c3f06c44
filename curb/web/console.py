"""The console page at / and the live feed it shows, pushed over the WebSocket /console/live.

The page (curb/web/static: HTML, CSS and a small script of our own, no build step and
nothing fetched from another site) shows the counts and rates, each connection with its
prefetch and messages in flight, the first messages of a queue (a browse) and a publish
box. Browse and publish go through STOMP over /ws, as any page's would; the counts, rates
and connections come from /console/live, whose snapshots a `Feed` makes: the broker's
(`BrokerFeed`, its one queue) or a router's (curb.router.console: its destinations and
their instances too, which the page shows as a table with a destination picker). The
feed, the logins and the page are this module's either way:

- the page sends one JSON object first: `{"login", "passcode"}` under -users (the user
  needs the `count` permission, as for ./count), `{}` without;
- the server then pushes a snapshot (`snapshot`) whenever the counts change (it watches
  them as a ./count subscriber does, so at most every 50 ms on a broker) and at least every
  REFRESH_SECONDS, with the rates since the page's snapshot before (`Rates`); it never
  waits for the page to ask. A page that stops reading gets nothing more until its socket
  drains (one snapshot in flight at most).
- a refusal is `{"code", "error"}` and the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from curb.backend import Backend
from curb.broker import Broker
from curb.metrics import Metrics
from curb.web.access import authenticate, peer_of, permitted
from curb.web.peers import HttpPeer
from curb.web.replies import Refusal

STATIC = Path(__file__).parent / "static"
REFRESH_SECONDS = 1.0
MAX_CLIENTS_SHOWN = 200
FIRST_MESSAGE_SECONDS = 10.0  # the page must say who it is by then
RATES = ("sent", "delivered", "acked", "nacked")


class Feed(Protocol):
    """What a console shows of its backend: the broker's (`BrokerFeed`), or a router's
    (curb.router.console), which this module never names."""

    def names(self) -> Iterable[str]:
        """The destinations whose counts the feed watches: a change pushes a snapshot."""

    def snapshot(self, most_clients: int) -> dict[str, Any]:
        """The counts, `totals` (the counters of RATES), `clients` (at most `most_clients`,
        each `{"peer", "user", "prefetch", "inflight"}`, a router's with the `destination`
        of its subscription) and, for a router, `destinations`, each with its own counts,
        `totals` and `instances`."""


class BrokerFeed:
    """The broker's one queue: its counts, the log's size against -cap, its connections."""

    def __init__(self, broker: Broker, metrics: Metrics):
        self.broker = broker
        self.metrics = metrics

    def names(self) -> Iterable[str]:
        return ("",)  # the broker's ./count is its one queue's, whatever the name

    def snapshot(self, most_clients: int) -> dict[str, Any]:
        broker = self.broker
        clients = []
        for peer in list(broker.sessions)[:most_clients]:
            sub = broker.queue.subscription(peer)
            clients.append(
                {
                    "peer": peer.peer,
                    "user": peer.user,
                    "prefetch": None if sub is None else sub.prefetch,
                    "inflight": 0 if sub is None else len(sub.unacked),
                }
            )
        gauges = broker.gauges()
        return {
            **broker.counts(),
            "live_bytes": gauges["live_bytes"],
            "log_bytes": gauges["log_bytes"],
            "cap": gauges["cap"],
            "connections": len(broker.sessions),
            "totals": {name: getattr(self.metrics, name) for name in RATES},
            "clients": clients,
        }


class Rates:
    """One page's rates: each `totals` of a snapshot (the whole backend's, and each
    destination's) against the same one of the page's snapshot before, per second, added
    beside it as `rates`."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.last: dict[str, dict[str, int]] = {}

    def add(self, snap: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        elapsed = 0.0 if self.at is None else now - self.at
        self.at = now
        parts = [("", snap), *((f"/{name}", part) for name, part in snap.get("destinations", {}).items())]
        for key, part in parts:
            totals = part["totals"]
            before = self.last.get(key, totals)
            part["rates"] = {
                name: round((totals[name] - before.get(name, totals[name])) / elapsed, 1) if elapsed > 0 else 0.0
                for name in RATES
            }
            self.last[key] = totals
        return snap


class Console:
    """The page and its live feed over one backend, whose logins it checks."""

    def __init__(self, backend: Backend, feed: Feed):
        self.backend = backend
        self.feed = feed

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.page)
        app.router.add_get("/console/live", self.live)
        app.router.add_static("/console/", STATIC, append_version=False)

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "console.html", headers={"Cache-Control": "no-cache"})

    async def live(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=4096)
        await ws.prepare(request)
        watcher = HttpPeer(peer_of(request))
        try:
            await self._log_in(ws, watcher)
        except Refusal as err:
            await ws.send_json({"code": err.status, "error": err.error})
            await ws.close()
            return ws
        changed = asyncio.Event()
        watcher.send_counts = lambda counts: changed.set()  # type: ignore[method-assign]
        backend, feed = self.backend, self.feed
        watched = list(feed.names())
        for name in watched:
            backend.watch_counts(watcher, name, True)
        reader = asyncio.get_running_loop().create_task(_drain(ws))
        rates = Rates()
        try:
            while not ws.closed and not reader.done():
                await ws.send_json(rates.add(feed.snapshot(MAX_CLIENTS_SHOWN)))
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), REFRESH_SECONDS)
        except ConnectionError:
            pass
        finally:
            for name in watched:
                backend.watch_counts(watcher, name, False)
            reader.cancel()
        return ws

    async def _log_in(self, ws: web.WebSocketResponse, watcher: HttpPeer) -> None:
        try:
            first = await asyncio.wait_for(ws.receive(), FIRST_MESSAGE_SECONDS)
        except TimeoutError:
            raise Refusal(408, 'send {} (or {"login", "passcode"} under -users) first') from None
        try:
            hello = json.loads(first.data) if first.type is WSMsgType.TEXT else None
        except (ValueError, RecursionError):
            hello = None
        if not isinstance(hello, dict):
            raise Refusal(400, 'the first message must be a JSON object: {} or {"login": ..., "passcode": ...}')
        if self.backend.users is None:
            return
        login, passcode = hello.get("login"), hello.get("passcode")
        if not isinstance(login, str) or not isinstance(passcode, str):
            raise Refusal(401, 'log in: there are users (-users); send {"login": ..., "passcode": ...}')
        user = permitted(self.backend, await authenticate(self.backend, watcher, login, passcode), "count")
        watcher.user = user.name


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and drop) what the page sends, so that its close is seen."""
    async for _ in ws:
        pass
