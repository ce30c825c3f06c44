"""Clients' credit and the instances' subscriptions, sans I/O: how much each instance may
send the router, and which client subscription takes each MESSAGE.

Rules (invariants the tests check):
- Per instance at most one upstream subscription, open while clients of its destination
  have free credit for it. Its prefetch (`window`) never exceeds the clients' free
  credit for that instance (`free`: the sum over client subscriptions of their share of
  the instance less what they hold from it, each at most its prefetch less what it holds
  from all instances): `window - on_current <= free`. So every
  MESSAGE of the current subscription finds a client with credit, and an ACK or NACK
  frees one place on each side. When `free` falls below what the instance may still send
  (a client leaves, unsubscribes, cannot take output, or its share moves) the router
  UNSUBSCRIBEs (the held messages stay ACKable on the link) and SUBSCRIBEs again with
  the new `free`, or not at all when it is 0.
- Each MESSAGE goes to one client subscription with credit, taken in turn. One that
  came on an earlier upstream subscription (it crossed the UNSUBSCRIBE) takes credit
  the current window counted as free, so the window is checked again after it, and
  after a hand-back.
- An upstream subscription has no ack deadline of the instance's (`curb-ack-timeout:0`):
  the router keeps its clients' deadlines, so an instance never takes back a message
  the router still holds for a client.
- A client subscription's prefetch is split into shares, one per instance of its
  destination that is up: at least 1 each, the rest to those that report queued
  messages (their `./count`), NSQ's shape; a single instance gets all of it. A session
  that cannot take output has no share. Shares move with the counts while what a client
  holds stays where it came from, so a share alone could offer credit a full client
  does not have: a client that holds its prefetch takes nothing more from any instance
  (without that bound, a full client's credit moved between instances with their counts
  and made them hand the same messages back and forth for good).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from curb.log.cursor import Record
from curb.peer import Peer
from curb.queue import Subscription
from curb.router.links import UP, Link, Links

# The most an instance lets one subscription hold (its queue's bound): a larger window
# would be cut there, silently.
MAX_WINDOW = 10_000


class ClientSub(Subscription[Peer, Record]):
    """A client's SUBSCRIBE through the router: its destination (its dead letters with
    `dead`) and its credit per instance."""

    def __init__(
        self,
        conn: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int,
        ack_timeout_ms: int = 0,
        dest: str = "",
        dead: bool = False,
    ):
        super().__init__(conn, sub_id, ack_mode, prefetch, ack_timeout_ms)
        self.dest = dest
        self.dead = dead
        self.shares: dict[Link, int] = {}
        self.held: dict[Link, int] = {}
        self.total = 0  # what it holds from every instance: the sum of `held`

    @property
    def line(self) -> str:
        """What it takes from: a destination's queue, or its dead letters."""
        return f"{self.dest}/dead" if self.dead else self.dest

    def free(self, link: Link) -> int:
        """What it may still take from the instance: its share there less what it holds
        from it, and never more than its prefetch less what it holds in all."""
        if not self.active:
            return 0
        return max(0, min(self.shares.get(link, 0) - self.held.get(link, 0), self.prefetch - self.total))


@dataclass(slots=True, eq=False)
class Upstream:
    """A consuming link's subscription to its instance's queue (or dead letters), and the
    instance's counts."""

    sub_id: str | None = None
    sub_seq: int = 0
    window: int = 0
    on_current: int = 0  # messages held from the current subscription
    free: int = 0  # the clients' free credit for this instance
    counts: dict[str, int] = field(default_factory=dict)  # the instance's ./count
    deliveries: dict[str, Delivery] = field(default_factory=dict)  # by the instance's ack id


class Delivery:
    """A message an instance delivered to the router and the router to one client. A
    plain class, not a dataclass: one is made for every message, and a dataclass's
    generated __init__ would run as Python code in the compiled build."""

    __slots__ = ("due", "epoch", "link", "rec", "source", "sub", "sub_id", "upstream")

    def __init__(
        self, link: Link, upstream: str, sub_id: str, sub: ClientSub, rec: Record, epoch: int, source: Upstream
    ):
        self.link = link
        self.upstream = upstream  # the instance's ack id
        self.sub_id = sub_id  # the upstream subscription it came on
        self.sub = sub
        self.rec = rec  # as the client's session renders it: the router's stable id
        self.epoch = epoch  # the link's connection it came on
        self.source = source  # the link's upstream (queue or dead letters) it came from
        self.due = 0.0  # its ack deadline (curb-ack-timeout), 0: none


class Credit:
    """Every client subscription of the router, and each consuming link's upstream."""

    def __init__(self, links: Links, dests: Callable[[str], list[Link]]):
        self.links = links
        self.dests = dests  # a destination's consuming links, in route order
        self.subs: dict[str, list[ClientSub]] = {}  # by line (ClientSub.line)
        self.upstream: dict[Link, Upstream] = {}
        self.dead_upstream: dict[Link, Upstream] = {}
        self._turn: dict[str, int] = {}

    def of(self, link: Link, dead: bool = False) -> Upstream:
        table = self.dead_upstream if dead else self.upstream
        upstream = table.get(link)
        if upstream is None:
            upstream = table[link] = Upstream()
        return upstream

    def forget(self, link: Link) -> None:
        self.upstream.pop(link, None)
        self.dead_upstream.pop(link, None)

    def add(self, sub: ClientSub) -> None:
        self.subs.setdefault(sub.line, []).append(sub)
        self.share(sub)
        self._rebalance_line(sub.dest, sub.dead)

    def drop(self, sub: ClientSub) -> None:
        """A client subscription ends: its free credit leaves the instances' sums. What
        it holds stays ACKable (UNSUBSCRIBE) or is NACKed (a session gone)."""
        subs = self.subs.get(sub.line, [])
        if sub in subs:
            subs.remove(sub)
        for link in list(sub.shares):
            self.of(link, sub.dead).free -= sub.free(link)
            sub.shares[link] = 0
        sub.active = False
        if not subs:
            self.subs.pop(sub.line, None)
        self._rebalance_line(sub.dest, sub.dead)

    def taker(self, link: Link, dead: bool = False) -> ClientSub | None:
        """The next client subscription (in turn) with free credit for this instance
        (`ClientSub.free`, inline)."""
        line = f"{link.dest}/dead" if dead else link.dest
        subs = self.subs.get(line)
        if not subs:
            return None
        count = len(subs)
        start = self._turn.get(line, 0)
        for step in range(count):
            sub = subs[(start + step) % count]
            if sub.active and sub.shares.get(link, 0) > sub.held.get(link, 0) and sub.prefetch > sub.total:
                self._turn[line] = (start + step + 1) % count
                return sub
        return None

    def hold(self, delivery: Delivery, held: int) -> None:
        """A client took (1) or let go of (-1) a message from the instance, keeping every
        instance's `free` the sum of its subscriptions' free credit (`ClientSub.free`,
        written out, as this runs twice for every message). Its room in all changes too, which
        bounds its free credit for the other instances: those it changed are rebalanced."""
        sub, link, upstream = delivery.sub, delivery.link, delivery.source
        had = sub.held.get(link, 0)
        sub.held[link] = had + held
        room = sub.prefetch - sub.total  # before
        sub.total += held
        if delivery.sub_id == upstream.sub_id:
            upstream.on_current += held
        if not sub.active:
            return
        left = sub.shares.get(link, 0) - had
        before, after = min(left, room), min(left - held, room - held)  # its free credit: max(0, ...)
        upstream.free += (after if after > 0 else 0) - (before if before > 0 else 0)
        for other, share in sub.shares.items():
            if other is link:
                continue
            left = share - sub.held.get(other, 0)
            was, now = max(0, min(left, room)), max(0, min(left, room - held))
            if was != now:
                source = self.of(other, sub.dead)
                source.free += now - was
                self.rebalance(other, sub.dead, source)

    def _set_share(self, sub: ClientSub, link: Link, share: int) -> None:
        """Change what a client subscription may take from an instance, keeping the
        instance's `free` the sum of every subscription's free credit. (What it holds
        changes in `hold`, which also rebalances the other instances.)"""
        before = sub.free(link)
        sub.shares[link] = share
        self.of(link, sub.dead).free += sub.free(link) - before

    def share(self, sub: ClientSub) -> None:
        """Split a subscription's prefetch over its destination's instances (see the rules)."""
        if not sub.active:
            return
        links = self.dests(sub.dest)
        up = [link for link in links if link.state is UP] if sub.conn.writable else []
        queued = "dead" if sub.dead else "rdy"
        busy = [link for link in up if self.of(link).counts.get(queued, 0) > 0] or up
        rest = max(0, sub.prefetch - len(up))
        each, extra = divmod(rest, len(busy) or 1)
        for link in links:
            share = 0
            if link in up:
                share = sub.prefetch if len(links) == 1 else 1
                if link in busy and len(links) > 1:
                    index = busy.index(link)
                    share += each + (1 if index < extra else 0)
            self._set_share(sub, link, share)

    def reshare(self, dest: str) -> None:
        for line in (dest, f"{dest}/dead"):
            for sub in self.subs.get(line, ()):
                self.share(sub)
        self.rebalance_dest(dest)

    def rebalance_dest(self, dest: str) -> None:
        self._rebalance_line(dest, False)
        self._rebalance_line(dest, True)

    def _rebalance_line(self, dest: str, dead: bool) -> None:
        for link in self.dests(dest):
            self.rebalance(link, dead)

    def rebalance(self, link: Link, dead: bool = False, upstream: Upstream | None = None) -> None:
        """Keep what the instance may still send within the clients' free credit, and open
        it up again when much more credit is free than the subscription allows. `upstream`:
        the link's (queue or dead letters, as `dead` says), when the caller has it."""
        if link.state is not UP:
            return
        if upstream is None:
            upstream = self.of(link, dead)
        may_send = upstream.window - upstream.on_current
        slack = upstream.free - may_send
        if slack == 0 or (slack > 0 and upstream.window >= MAX_WINDOW):
            return
        if slack > 0 and upstream.window and 2 * slack < upstream.window:
            return
        if upstream.sub_id is not None:
            self.links.send(link, "UNSUBSCRIBE", {"id": upstream.sub_id})
            upstream.sub_id, upstream.window, upstream.on_current = None, 0, 0
        if upstream.free > 0:
            upstream.sub_seq += 1
            upstream.sub_id = f"{'d' if dead else 's'}{upstream.sub_seq}"
            upstream.window = min(upstream.free, MAX_WINDOW)
            headers = {
                "id": upstream.sub_id,
                "destination": "./dead" if dead else f"/queue/{link.dest}",
                "ack": "client-individual",
                "prefetch-count": str(upstream.window),
                "curb-ack-timeout": "0",  # the router keeps its clients' deadlines (curb.router.deliveries)
            }
            self.links.send(link, "SUBSCRIBE", headers)

    def link_up(self, link: Link) -> None:
        self.links.send(link, "SUBSCRIBE", {"id": "count", "destination": "./count"})
        self.reshare(link.dest)

    def link_down(self, link: Link) -> list[Delivery]:
        """The link is gone: what it delivered is requeued by the instance; the caller
        drops those deliveries (returned) from their clients."""
        deliveries: list[Delivery] = []
        for upstream in (self.of(link), self.of(link, True)):
            deliveries += upstream.deliveries.values()
            upstream.deliveries.clear()
            upstream.sub_id, upstream.window, upstream.on_current, upstream.counts = None, 0, 0, {}
        for delivery in deliveries:
            self.hold(delivery, -1)
        self.reshare(link.dest)
        return deliveries
