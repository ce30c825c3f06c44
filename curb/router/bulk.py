"""ACK up to an id and redrive through the router, sans I/O: a client's frame that acts on
a destination's instances as a whole, forwarded on their SENDS links with the router's
receipts; its answers are the instances' own (an id above the highest is their ERROR).

Rules:
- ACK `curb-upto:U` names the router's ids (curb.router.deliveries), so it is exact on a
  destination of one instance, whose index is k: that instance's ids up to
  (U - k) >> INDEX_BITS. On a partitioned destination the router's ids do not order the
  instances' messages together, and it is refused: send it to each instance.
- A redrive (`SEND ./NAME/redrive`, `curb-count:N` for at most N) moves each instance's
  dead letters in route order, the next instance asked for what is left of N, and
  answers with the sum (`curb-moved`).
- Both need every instance of the destination up (a redrive that reached only some would
  answer less than was asked): one that is down is an ERROR that says so.
"""

from __future__ import annotations

from collections.abc import Callable

from curb.frame import decimal
from curb.queue_errors import QueueError
from curb.receipts import Done
from curb.router.links import UP, Forwarded, Link, Links
from curb.router.placement import INDEX_BITS, Placement
from curb.router.waits import Waits


class Bulk:
    """ACK up to an id and redrive, forwarded to a destination's instances."""

    def __init__(self, links: Links, placement: Placement):
        self.links = links
        self.placement = placement

    def ack_upto(self, upto: int, done: Done, destination: str | None) -> None:
        if destination is None:
            raise QueueError(
                "ACK curb-upto through the router needs a destination header",
                "Give the ACK destination:/queue/NAME, the routed destination whose messages it acknowledges.",
            )
        name = self.placement.route(destination, "ACK")
        links = self._up(name)
        if len(links) != 1:
            raise QueueError(
                f"ACK curb-upto is not routed to a partitioned destination ({name!r})",
                "The ids of a partitioned destination's instances do not order their messages together: send ACK "
                "curb-upto to each instance at its own address, with an id of that instance.",
            )
        [link] = links
        index = self.placement.indexes[(name, link.address)]
        own = (upto - index) >> INDEX_BITS if upto >= index else 0
        self._forward(link, "ACK", {"curb-upto": str(own)}, name, done)

    def redrive(self, name: str, count: int | None, moved: Callable[[int], None], failed: Done) -> None:
        self._redrive(self._up(name), 0, count, 0, moved, failed)

    def _redrive(
        self, links: list[Link], at: int, left: int | None, total: int, moved: Callable[[int], None], failed: Done
    ) -> None:
        if at == len(links) or left == 0:
            moved(total)
            return
        headers = {"destination": "./redrive"}
        if left is not None:
            headers["curb-count"] = str(left)

        def done(err: str | None) -> None:
            if err is not None:
                failed(err)
                return
            answer = item.answer.headers if item.answer is not None else {}
            try:
                n = decimal(answer.get("curb-moved", "0"), "curb-moved", 1 << 62)
            except ValueError as bad:
                failed(f"instance {links[at].name} answered a redrive with {bad}")
                return
            self._redrive(links, at + 1, None if left is None else max(0, left - n), total + n, moved, failed)

        item = self._forward(links[at], "SEND", headers, links[at].dest, done)

    def _up(self, name: str) -> list[Link]:
        links = self.placement.senders.get(name, [])
        down = [link for link in links if link.state is not UP]
        if down or not links:
            why = "; ".join(f"{link.name}: {link.why_down}" for link in down) or "it has no instance yet"
            raise QueueError(
                f"an instance of {name!r} is down",
                f"This acts on every instance of the destination, and not all are up ({why}): try again once they are.",
            )
        return links

    def _forward(self, link: Link, command: str, headers: dict[str, str], name: str, done: Done) -> Forwarded:
        item = Forwarded(None, Waits(), command, headers, b"", name, done)
        self.links.forward(link, item)
        return item
