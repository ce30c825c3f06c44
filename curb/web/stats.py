"""GET /metrics (Prometheus, rendered by prometheus_client), /stats (JSON) and /ping.

The routes serve a `Figures`: whatever the front serves says what it counts. The
broker's (`BrokerFigures`) reads its gauges at each request, so they never drift from
its state; a router has its own (curb.router.web).
prometheus_client's own aiohttp handler is not used: it serves its newest text format
(version 1.0.0) to a scraper that asks for nothing in particular, which older
Prometheus servers refuse; `curb.web.exposition.rendered` answers 0.0.4 unless OpenMetrics is asked for.
"""

from __future__ import annotations

import json
from typing import Protocol

from aiohttp import web

from curb.broker import Broker
from curb.metrics import Metrics
from curb.web import exposition


class Figures(Protocol):
    """What /metrics and /stats serve: one moment's figures, in both forms."""

    def prometheus(self, accept: str) -> tuple[bytes, str]:
        """(body, content type) in the exposition format the Accept header `accept` asks for."""

    def stats(self) -> dict[str, object]: ...


class BrokerFigures:
    """A broker's counters (`metrics`) and its gauges."""

    def __init__(self, broker: Broker, metrics: Metrics):
        self.broker = broker
        self.metrics = metrics

    def prometheus(self, accept: str) -> tuple[bytes, str]:
        return exposition.render(self.metrics, self.broker.gauges(), accept)

    def stats(self) -> dict[str, object]:
        return self.metrics.stats(self.broker.gauges())


def add_routes(app: web.Application, figures: Figures) -> None:
    async def prometheus(request: web.Request) -> web.Response:
        body, content_type = figures.prometheus(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(figures.stats()).encode(), content_type="application/json")

    async def ping(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/stats", stats)
    app.router.add_get("/ping", ping)
