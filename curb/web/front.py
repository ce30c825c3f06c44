"""The -http listener: one aiohttp server on the broker's event loop, its routes and its limits.

`WebFront.start` binds [HOST]:PORT (with an SSL context: https and wss), `stop` closes
it. A request body is refused with 413 past the broker's -max-frame, before it is read.
Bounds against hostile clients: a connection that has not sent a whole request within
KEEPALIVE_SECONDS of opening (a slowloris) or of its last answer is closed (aiohttp's
keep-alive timer); request lines and headers are at most MAX_LINE_BYTES each and
MAX_HEADERS in all (400); and past -max-connections open web connections a new one is
closed at once, as a STOMP connection is (counted, and logged at most once a
LIMIT_LOG_SECONDS), but for MONITOR_HEADROOM more that may ask only for MONITORING
paths: a broker at its limit is the one its monitoring most needs to see.
The routes come from the modules that serve them (`stats`, ...), each given what it uses.
It serves any `curb.backend.Backend`: `broker_front` is the broker's (its figures, the
HTTP API over its one queue, the console); a router builds its own (curb.router.web).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import cast

from aiohttp import web

from curb.backend import Backend
from curb.broker import Broker
from curb.metrics import Metrics
from curb.web import stats, stomp_ws
from curb.web.access import origin_check, own_names, peer_of
from curb.web.api import Api
from curb.web.console import BrokerFeed, Console
from curb.web.queues import OneQueue
from curb.web.replies import Handler, Refusal, json_errors
from curb.web.settings import SEED, NarconiSettings
from curb.web.stats import BrokerFigures, Figures

# The most bytes of one header line (a request line, a header) aiohttp reads.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 100
# An idle keep-alive connection is closed after this many seconds.
KEEPALIVE_SECONDS = 15.0
# Connections past -max-connections let in for monitoring only (MONITORING paths; others 503).
MONITOR_HEADROOM = 4
MONITORING = frozenset({"/metrics", "/stats", "/ping"})
# Connections the kernel may queue on the listener.
BACKLOG = 1024
# At shutdown, requests still running get this long to finish before they are cancelled.
SHUTDOWN_SECONDS = 2.0
# aiohttp logs each request it cannot parse with a traceback; its 400 answer says why,
# and a client's bad bytes are no event of the broker's.
_QUIET = logging.getLogger("curb.web.requests")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class _Refuse(asyncio.Protocol):
    """A connection past -max-connections: closed at once, before it costs a request handler."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


def broker_front(
    broker: Broker,
    metrics: Metrics,
    events: Callable[..., None] = lambda *a, **k: None,
    origins: Iterable[str] = (),
    listen_host: str | None = None,
    narconi: NarconiSettings = SEED,
) -> WebFront:
    """The broker's web front: its figures, the HTTP API over its one queue, the console."""
    front = WebFront(
        broker,
        BrokerFigures(broker, metrics),
        Api(broker, OneQueue(broker), narconi),
        events,
        origins,
        listen_host,
        broker.config.max_connections,
    )
    Console(broker, BrokerFeed(broker, metrics)).add_routes(front.app)
    return front


class WebFront:
    """What every route of the web front uses: the backend /ws sessions and the API
    reach, and the figures of /metrics and /stats."""

    def __init__(
        self,
        backend: Backend,
        figures: Figures,
        api: Api | None = None,
        events: Callable[..., None] = lambda *a, **k: None,
        origins: Iterable[str] = (),
        listen_host: str | None = None,
        max_connections: int | None = None,
    ):
        self.backend = backend
        self.events = events
        self.max_connections = max_connections
        self.app = web.Application(
            client_max_size=backend.config.max_frame,
            middlewares=[json_errors, self._headroom, origin_check(origins, own_names(listen_host))],
        )
        self._open: Callable[[], int] = lambda: 0  # web connections open now (set by `start`)
        stats.add_routes(self.app, figures)
        self.api = api
        if api is not None:
            api.add_routes(self.app)
        self.app.router.add_get("/ws", self._stomp)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.sockets: list[socket.socket] = []

    async def start(self, host: str | None, port: int, context: ssl.SSLContext | None = None) -> None:
        """Listen on host:port (None: every interface); OSError if it cannot be bound."""
        runner = web.AppRunner(
            self.app,
            handle_signals=False,
            handler_cancellation=True,  # a client that leaves cancels its request: nothing waits on for it
            access_log=None,
            logger=_QUIET,
            keepalive_timeout=KEEPALIVE_SECONDS,
            shutdown_timeout=SHUTDOWN_SECONDS,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
        )
        await runner.setup()
        handlers = runner.server
        assert handlers is not None
        limit, backend = self.max_connections, self.backend
        self._open = lambda: len(handlers.connections)

        def protocol() -> asyncio.BaseProtocol:
            if limit is not None and len(handlers.connections) >= limit + MONITOR_HEADROOM:
                backend.refusals.web_connection_refused(limit)
                return _Refuse()
            return handlers()

        try:
            listener = await asyncio.get_running_loop().create_server(
                protocol, host, port, ssl=context, reuse_address=True, backlog=BACKLOG
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._listener = runner, listener
        self.sockets = list(listener.sockets)

    @web.middleware
    async def _headroom(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A connection let in past -max-connections may ask for MONITORING paths only."""
        limit = self.max_connections
        if limit is not None and self._open() > limit and request.path not in MONITORING:
            self.backend.refusals.web_connection_refused(limit)
            raise Refusal(
                503,
                f"{limit} web connections are open (-max-connections): only {', '.join(sorted(MONITORING))} "
                "are served past it; try again later",
                {"Connection": "close", "Retry-After": "1"},
            )
        return await handler(request)

    async def _stomp(self, request: web.Request) -> web.StreamResponse:
        return await stomp_ws.serve(request, self.backend, peer_of(request))

    async def stop(self) -> None:
        if self.api is not None:
            self.api.takers.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
