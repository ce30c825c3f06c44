"""What the console page (curb.web.console, wired by curb.router.web) shows of a router:
its feed's snapshot, built from what the router already keeps.

Per destination: its counts as a `./NAME/count` watcher gets them (the instances that are
up, summed: curb.router.counts), the counters behind its rates summed over its
instances (`sent` is SENDs forwarded), and each instance as /stats shows it
(curb.router.figures: its links' states per role, its own counts). For the whole router:
those counts and counters summed, the connections, and each client's subscriptions with
their prefetch and the messages they hold (a row per subscription; a client without one
has a row of its own). It names no web module: the console takes it as any `Feed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from curb.router import figures
from curb.router.core import RouterCore
from curb.router.counts import COUNTED

# The console's rates and the instance counters they are read from.
RATE_COUNTERS = {"sent": "forwarded", "delivered": "delivered", "acked": "acked", "nacked": "nacked"}
# What the console shows of an instance (its counters are in the destination's totals).
INSTANCE_SHOWN = ("sends_link", "consumes_link", *COUNTED)


class RouterFeed:
    """The console's snapshots of one router."""

    def __init__(self, core: RouterCore):
        self.core = core

    def names(self) -> Iterable[str]:
        return list(self.core.placement.dests)

    def snapshot(self, most_clients: int) -> dict[str, Any]:
        core = self.core
        destinations: dict[str, Any] = {}
        for name, seen in figures.snapshot(core)["destinations"].items():
            instances = seen["instances"].values()
            destinations[name] = {
                **core.counts.of(name),  # its `instances`, a number there, is the map below here
                "totals": {rate: sum(each[key] for each in instances) for rate, key in RATE_COUNTERS.items()},
                "instances": {
                    where: {key: each[key] for key in INSTANCE_SHOWN} for where, each in seen["instances"].items()
                },
            }
        summed = (*COUNTED, "subscriptions")
        return {
            **{key: sum(dest[key] for dest in destinations.values()) for key in summed},
            "connections": len(core.sessions),
            "totals": {rate: sum(dest["totals"][rate] for dest in destinations.values()) for rate in RATE_COUNTERS},
            "clients": self._clients(most_clients),
            "destinations": destinations,
        }

    def _clients(self, most: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for peer in list(self.core.sessions):
            subs = self.core.deliveries.subs.get(peer, {}).values()
            if not subs:
                rows.append({"peer": peer.peer, "user": peer.user, "prefetch": None, "inflight": 0})
            rows += [
                {
                    "peer": peer.peer,
                    "user": peer.user,
                    "destination": sub.line,
                    "prefetch": sub.prefetch,
                    "inflight": len(sub.unacked),
                }
                for sub in subs
            ]
            if len(rows) >= most:
                return rows[:most]
        return rows
