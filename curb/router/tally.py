"""The router's counters: what it sent each instance and what came of it, and the SENDs
each destination had to park or refuse.

Each is an int incremented where its event happens, nothing more per message: a link's
`Tally` by curb.router.links (SENDs forwarded, ACKs, NACKs and hand-backs sent, the
instance's ERRORs) and curb.router.deliveries (MESSAGEs handed to clients), a
destination's `DestTally` by curb.router.placement. They are read only when someone asks
(curb.router.figures, for -http's /metrics and /stats). A link's counters live as long
as the link: a route removed and added again starts from zero, as a restarted process's
would.
"""

from __future__ import annotations

from dataclasses import dataclass

# The counters of a Tally, in the order /stats and /metrics show them.
LINK_COUNTERS = ("forwarded", "delivered", "acked", "nacked", "bounced", "refused")
DEST_COUNTERS = ("parked", "not_stored")


@dataclass(slots=True)
class Tally:
    """One link's counters (an instance has two links, one per role; their sum is its)."""

    forwarded: int = 0  # SENDs forwarded (a SEND sent again after a lost link counts again)
    delivered: int = 0  # MESSAGEs handed to a client
    acked: int = 0  # ACKs sent
    nacked: int = 0  # NACKs sent (a client's, or for a client gone)
    bounced: int = 0  # MESSAGEs handed back undelivered (NACK curb-undelivered:true)
    refused: int = 0  # frames the instance answered with ERROR


@dataclass(slots=True)
class DestTally:
    """One destination's SENDs that found no instance up."""

    parked: int = 0  # SENDs that waited for an instance (-link-wait)
    not_stored: int = 0  # SENDs refused: no instance came up in time
