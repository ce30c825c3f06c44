"""`curb router -http`: the broker's web front (curb.web) with the router's core as its
backend. The one module of the router that names curb.web (tests/test_layout.py), as
curb.instance is the broker's; `curb router` imports it only with -http, so a router
without it never loads aiohttp or prometheus_client.

- /ws: STOMP over WebSocket (curb.web.stomp_ws), each socket a session of the core as a
  TCP client is.
- /metrics and /stats: the figures of curb.router.figures, per destination and instance.
- The HTTP API (curb.web.api) with `{queue}` the routed destination (`RoutedQueues`):
  publish, consume, claims and Narconi's WebSocket protocols go through the core as a
  client's frames do. A purge is refused (405): it needs the instance's own queue.
- The console page at / (curb.web.console, the broker's page and live feed) over the
  router's feed (curb.router.console): its destinations with their instances, its
  clients, and a destination picker for the page's browses and publish box.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from curb.backend import Done
from curb.instance import EXIT_USAGE, Events, StartError, is_loopback, listen, sockname
from curb.queue_errors import QueueError
from curb.router import figures
from curb.router.config import WebConfig
from curb.router.console import RouterFeed
from curb.router.core import RouterCore
from curb.router.counts import COUNTED
from curb.router.links import CONSUMES, SENDS, UP
from curb.web import exposition
from curb.web.api import Api
from curb.web.console import Console
from curb.web.front import WebFront
from curb.web.peers import HttpPeer
from curb.web.replies import Refusal

# (family name without _total, the key of an instance's figures, help)
_INSTANCE_COUNTERS = (
    ("curb_router_sends_forwarded", "forwarded", "SEND frames forwarded to the instance (again after a lost link)."),
    ("curb_router_messages_delivered", "delivered", "MESSAGEs of the instance handed to a client."),
    ("curb_router_messages_acked", "acked", "ACKs sent to the instance."),
    ("curb_router_messages_nacked", "nacked", "NACKs sent to the instance (a client's, or for a client gone)."),
    (
        "curb_router_messages_bounced",
        "bounced",
        "MESSAGEs handed back to the instance undelivered (NACK curb-undelivered:true): no client had credit.",
    ),
    ("curb_router_instance_errors", "refused", "Frames the instance answered with ERROR (queue full, say)."),
)
_DEST_COUNTERS = (
    ("curb_router_sends_parked", "parked", "SENDs that waited for an instance of their destination to be up."),
    ("curb_router_sends_not_stored", "not_stored", "SENDs refused: no instance of their destination was up in time."),
)


class RouterFigures:
    """The router's /metrics and /stats."""

    def __init__(self, core: RouterCore):
        self.core = core

    def prometheus(self, accept: str) -> tuple[bytes, str]:
        return exposition.rendered(_Collector(self.core), accept)

    def stats(self) -> dict[str, object]:
        return figures.snapshot(self.core)


class _Collector:
    def __init__(self, core: RouterCore):
        self.core = core

    def collect(self) -> Iterator[Metric]:
        snap = figures.snapshot(self.core)
        dests: dict[str, Any] = snap["destinations"]
        where = ["destination", "instance"]
        links = GaugeMetricFamily(
            "curb_router_link_up", "1 while the router's link to the instance is up, per role.", labels=[*where, "role"]
        )
        messages = GaugeMetricFamily(
            "curb_router_instance_messages",
            "The instance's messages by state, as its ./count last said (0 while its link is down).",
            labels=[*where, "state"],
        )
        counters = [CounterMetricFamily(name, help, labels=where) for name, _, help in _INSTANCE_COUNTERS]
        for dest, figures_of in dests.items():
            for instance, seen in figures_of["instances"].items():
                for role in (SENDS, CONSUMES):
                    links.add_metric([dest, instance, role], 1 if seen[f"{role}_link"] == UP else 0)
                for state in COUNTED:
                    messages.add_metric([dest, instance, state], seen[state])
                for family, (_, key, _) in zip(counters, _INSTANCE_COUNTERS, strict=True):
                    family.add_metric([dest, instance], seen[key])
        yield links
        yield messages
        yield from counters
        for name, key, help in _DEST_COUNTERS:
            family = CounterMetricFamily(name, help, labels=["destination"])
            for dest, figures_of in dests.items():
                family.add_metric([dest], figures_of[key])
            yield family
        for name, key, help in (
            ("curb_router_sends_parked_now", "parked_now", "SENDs waiting now for an instance to be up."),
            ("curb_router_subscriptions", "subscriptions", "Client subscriptions to the destination."),
        ):
            gauge = GaugeMetricFamily(name, help, labels=["destination"])
            for dest, figures_of in dests.items():
                gauge.add_metric([dest], figures_of[key])
            yield gauge
        for name, key, help in (
            (
                "curb_connections_open",
                "connections",
                "Open client connections (HTTP clients while they publish or take).",
            ),
            ("curb_router_transaction_frames", "transaction_frames", "Frames held in open transactions until COMMIT."),
            ("curb_router_transaction_bytes", "transaction_bytes", "Bytes held in open transactions until COMMIT."),
        ):
            yield GaugeMetricFamily(name, help, value=snap[key])
        yield from exposition.session_families(self.core.refusals.metrics)


class RoutedQueues:
    """The HTTP API's `{queue}` through the router: a routed destination."""

    own_deadlines = False  # the instances' -ack-timeout applies; a claim's ttl is a touch

    def __init__(self, core: RouterCore):
        self.core = core

    def name(self, queue: str) -> str:
        try:
            return self.core.placement.route(f"/queue/{queue}", "HTTP")
        except QueueError as err:
            raise Refusal(404, f"{err}: {err.advice}") from None

    def enter(self, peer: HttpPeer) -> None:
        """The core keeps what a client sent until an instance answers it, and resends a
        SEND a lost instance did not answer, for clients it knows: this one, until gone."""
        self.core.sessions[peer] = None

    def purge(self, done: Done) -> None:
        raise Refusal(
            405,
            "a purge is not routed: DELETE /v2/P/queues/Q on the web front (-http) of each of the destination's "
            "instances, or ACK with curb-upto on each instance",
            {"Allow": "GET, PUT"},
        )

    def give_back(self, peer: HttpPeer) -> None:
        for msg_id in list(self.core.deliveries.holding.get(peer, {})):
            self.core.bounce(peer, msg_id)


def router_front(
    core: RouterCore, events: Any, origins: Iterable[str] = (), listen_host: str | None = None
) -> WebFront:
    """The router's web front: /ws, /metrics, /stats, the HTTP API over its destinations
    and the console."""
    front = WebFront(core, RouterFigures(core), Api(core, RoutedQueues(core)), events, origins, listen_host)
    Console(core, RouterFeed(core)).add_routes(front.app)
    return front


async def start_web(core: RouterCore, web: WebConfig, users_path: str | None, events: Events) -> WebFront:
    """The web front (-http); a StartError when it cannot listen, or when
    the network reaches it and there is no -users (nor -http-open)."""
    host, port = web.addr
    front = router_front(core, events, web.origins, host)
    await listen("-http", web.addr, lambda: front.start(host, port))
    exposed = [sockname(sock) for sock in front.sockets if not is_loopback(sock)]
    if exposed and users_path is None and not web.open:
        await front.stop()
        raise StartError(
            f"-http {', '.join(exposed)} is reachable from the network and there is no -users: any client that "
            "reaches it could publish and consume; add -users FILE (see curb passwd), listen on 127.0.0.1, or add "
            "-http-open if that is what you mean",
            EXIT_USAGE,
        )
    where = sockname(front.sockets[0])
    events(
        "http",
        f"web front on http://{where}: the console at /, STOMP over WebSocket at /ws, the HTTP API under /v2 "
        f"(a routed destination as its queue), metrics on http://{where}/metrics (Prometheus) and /stats (JSON)",
        addr=where,
    )
    return front
