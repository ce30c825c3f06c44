"""What a router counts, as one JSON-able snapshot: -http's /stats, and what its /metrics
renders (curb.router.web).

Per destination: the SENDs parked and refused (curb.router.tally.DestTally), the SENDs
parked now, the client subscriptions, and per instance (HOST:PORT, in route order): each
link's state (up, connecting or down, per role), the instance's counts as its last
`./count` said (rdy, wip, delayed, dead; zeros while its consuming link is down) and
the counters of its two links summed (curb.router.tally.Tally). For the whole router:
the connections open, what transactions hold (frames and bytes) and the sessions'
counters (curb.metrics.Metrics.session_stats). Read at each request, never stored, so it
cannot drift from the core's state.
"""

from __future__ import annotations

from typing import Any

from curb import __version__
from curb.router.core import RouterCore
from curb.router.counts import COUNTED, endpoint
from curb.router.links import CONSUMES, SENDS
from curb.router.tally import DEST_COUNTERS, LINK_COUNTERS


def snapshot(core: RouterCore) -> dict[str, Any]:
    placement = core.placement
    destinations: dict[str, Any] = {}
    for name, consuming in placement.dests.items():
        tally = placement.tallies.get(name)
        instances: dict[str, Any] = {}
        for consumes, sends in zip(consuming, placement.senders.get(name, []), strict=True):
            counts = core.credit.of(consumes).counts
            instances[endpoint(consumes.address)] = {
                f"{SENDS}_link": sends.state,
                f"{CONSUMES}_link": consumes.state,
                **{state: counts.get(state, 0) for state in COUNTED},
                **{key: getattr(sends.tally, key) + getattr(consumes.tally, key) for key in LINK_COUNTERS},
            }
        destinations[name] = {
            **{key: 0 if tally is None else getattr(tally, key) for key in DEST_COUNTERS},
            "parked_now": len(placement.parked.get(name, ())),
            "subscriptions": len(core.credit.subs.get(name, ())),
            "instances": instances,
        }
    return {
        "version": __version__,
        "connections": len(core.sessions),
        "transaction_frames": core.transactions.frames,
        "transaction_bytes": core.transactions.held,
        **core.refusals.metrics.session_stats(),
        "destinations": destinations,
    }
