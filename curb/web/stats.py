"""GET /metrics (Prometheus, rendered by prometheus_client), /stats (JSON) and /ping.

The gauges are read from the broker at each request, so they never drift from its state.
prometheus_client's own aiohttp handler is not used: it serves its newest text format
(version 1.0.0) to a scraper that asks for nothing in particular, which older
Prometheus servers refuse; `curb.web.exposition.render` answers 0.0.4 unless OpenMetrics is asked for.
"""

from __future__ import annotations

import json

from aiohttp import web

from curb.broker import Broker
from curb.metrics import Metrics
from curb.web import exposition


def add_routes(app: web.Application, broker: Broker, metrics: Metrics) -> None:
    async def prometheus(request: web.Request) -> web.Response:
        body, content_type = exposition.render(metrics, broker.gauges(), request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(metrics.stats(broker.gauges())).encode(), content_type="application/json")

    async def ping(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/stats", stats)
    app.router.add_get("/ping", ping)
