"""A routed destination's counts: its instances' `./count` summed, for the clients that
subscribe to `./NAME/count` (or `/queue/NAME/count`).

Each instance sends its own `./count` on its consuming link whenever its counts change
(coalesced there); the router sums the instances that are up, adds how many there are
and are up, and sends each watcher of the destination the sum when it changed (its JSON
body also lists the instances, `endpoints`, HOST:PORT in route order, so that a client
such as the Spark connector can reach them)
(curb.render.Messages drops an update equal to the last). The MESSAGE is laid out as an
instance's (curb.counts.CountMessages), one version sequence per destination.
"""

from __future__ import annotations

from collections.abc import Callable

from curb.counts import CountMessages
from curb.frame import Frame, decimal
from curb.peer import Peer
from curb.router.credit import Credit
from curb.router.links import UP, Link

COUNTED = ("rdy", "wip", "delayed", "dead")


def endpoint(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class DestinationCounts:
    """Watchers per destination, and the sums they are sent."""

    def __init__(self, credit: Credit, dests: Callable[[str], list[Link]]):
        self.credit = credit
        self.dests = dests
        self.watchers: dict[str, dict[Peer, None]] = {}
        self._messages: dict[str, CountMessages] = {}

    def of(self, dest: str) -> dict[str, int]:
        links = self.dests(dest)
        up = [link for link in links if link.state is UP]
        counts = {name: sum(self.credit.of(link).counts.get(name, 0) for link in up) for name in COUNTED}
        counts["subscriptions"] = len(self.credit.subs.get(dest, ()))
        counts["instances"], counts["up"] = len(links), len(up)
        return counts

    def tail(self, dest: str, counts: dict[str, int]) -> tuple[bytes, bytes]:
        messages = self._messages.get(dest)
        if messages is None:
            messages = self._messages[dest] = CountMessages()
        endpoints = [endpoint(link.address) for link in self.dests(dest)]
        return messages.tail(counts, {"endpoints": endpoints})

    def watch(self, session: Peer, dest: str, watching: bool) -> None:
        watchers = self.watchers.setdefault(dest, {})
        if watching:
            watchers[session] = None
        else:
            watchers.pop(session, None)
            if not watchers:
                del self.watchers[dest]

    def instance_counts(self, link: Link, frame: Frame) -> bool:
        """An instance's ./count MESSAGE; whether it now has queued messages changed."""
        upstream = self.credit.of(link)
        had = upstream.counts.get("rdy", 0) > 0
        try:
            upstream.counts = {name: decimal(frame.headers.get(name, "0"), name, 1 << 62) for name in COUNTED}
        except ValueError:
            return False
        self.changed(link.dest)
        return (upstream.counts["rdy"] > 0) != had

    def changed(self, dest: str) -> None:
        watchers = self.watchers.get(dest)
        if watchers:
            counts = self.of(dest)
            for session in list(watchers):
                session.send_counts(counts)
