"""The console page at / and the live feed it shows, pushed over the WebSocket /console/live.

The page (curb/web/static: HTML, CSS and a small script of our own, no build step and
nothing fetched from another site) shows the queue's counts and rates, each connection
with its prefetch and messages in flight, the first messages of the queue (a browse) and
a publish box. Browse and publish go through STOMP over /ws, as any page's would; the
counts, rates and connections come from /console/live:

- the page sends one JSON object first: `{"login", "passcode"}` under -users (the user
  needs the `count` permission, as for ./count), `{}` without;
- the broker then pushes a snapshot (`snapshot`) whenever the counts change (it watches
  them as a ./count subscriber does, so at most every 50 ms) and at least every
  REFRESH_SECONDS, for the rates; it never waits for the page to ask. A page that stops
  reading gets nothing more until its socket drains (one snapshot in flight at most).
- a refusal is `{"code", "error"}` and the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

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


def snapshot(broker: Broker, metrics: Metrics, last: dict[str, float]) -> dict[str, Any]:
    """The counts, the rates since the `last` snapshot (updated in place), and the clients."""
    now = time.monotonic()
    counts = broker.counts()
    totals = {name: getattr(metrics, name) for name in RATES}
    elapsed = now - last.get("at", now)
    rates = {name: (totals[name] - last.get(name, totals[name])) / elapsed if elapsed > 0 else 0.0 for name in RATES}
    last.update(totals, at=now)
    clients = []
    for peer in list(broker.sessions)[:MAX_CLIENTS_SHOWN]:
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
        **counts,
        "live_bytes": gauges["live_bytes"],
        "log_bytes": gauges["log_bytes"],
        "cap": gauges["cap"],
        "connections": len(broker.sessions),
        "rates": {name: round(value, 1) for name, value in rates.items()},
        "totals": totals,
        "clients": clients,
    }


class Console:
    """The page and its live feed over one broker."""

    def __init__(self, broker: Broker, metrics: Metrics):
        self.broker = broker
        self.metrics = metrics

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
        broker = self.broker
        broker.count_watch.watch(watcher, True)
        reader = asyncio.get_running_loop().create_task(_drain(ws))
        last: dict[str, float] = {}
        try:
            while not ws.closed and not reader.done():
                await ws.send_json(snapshot(broker, self.metrics, last))
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), REFRESH_SECONDS)
        except ConnectionError:
            pass
        finally:
            broker.count_watch.watch(watcher, False)
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
        if self.broker.users is None:
            return
        login, passcode = hello.get("login"), hello.get("passcode")
        if not isinstance(login, str) or not isinstance(passcode, str):
            raise Refusal(401, 'log in: the broker has users; send {"login": ..., "passcode": ...}')
        user = permitted(self.broker, await authenticate(self.broker, watcher, login, passcode), "count")
        watcher.user = user.name


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and drop) what the page sends, so that its close is seen."""
    async for _ in ws:
        pass
