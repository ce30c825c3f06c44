"""Where a destination's frames go, sans I/O: the routes table and its links, spawned
destinations, and SENDs placed on an instance that is up or parked until one is.

Rules:
- `destination:/queue/NAME` or `./NAME` names a route; an unknown one is a QueueError
  that lists the routed names. With `spawn` set, a new NAME matching SPAWN_NAME is
  offered to it; if it takes it, the destination exists at once (`spawn_pending`), its
  SENDs parked until `spawned_instance` routes it.
- A SEND goes to an instance that is up: round robin, or the one `curb-partition-key`
  hashes to (the next one up if it is down). While none is, it is parked, in order, for
  at most `link_wait` seconds, then refused: "not stored" if it was never forwarded, "may
  be stored" if an instance lost before its answer may have stored it.
- Each routed instance has an index (`indexes`), below 1 << INDEX_BITS, kept while it
  stays routed: a message's id through the router is the instance's id and this index
  (curb.router.core).
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Callable, Mapping

from curb.log.reasons import MaybeStored
from curb.peer import Peer
from curb.queue_errors import QueueError
from curb.receipts import Done
from curb.router.links import BROWSES, CONSUMES, SENDS, UP, Forwarded, Link, Links
from curb.router.routes import SPAWN_NAME, Address, Routes, destination_name
from curb.router.tally import DestTally
from curb.router.waits import Waits

INDEX_BITS = 12  # message ids through the router: the instance's id << 12 | its index
PARTITION_KEY = "curb-partition-key"
NAMED_KEPT = 1024  # destination headers whose routed names are remembered


class Placement:
    """The routes, their links, and the SENDs waiting for an instance."""

    def __init__(self, links: Links, clock: Callable[[], float], link_wait: float, alive: Callable[[Peer], bool]):
        self.links = links
        self.clock = clock
        self.link_wait = link_wait
        self.alive = alive  # whether a session is still connected
        self.routes = Routes({})
        self.dests: dict[str, list[Link]] = {}  # a destination's CONSUMES links, in route order
        self.senders: dict[str, list[Link]] = {}  # its SENDS links, in the same order
        self.indexes: dict[tuple[str, Address], int] = {}
        self.removed: list[Link] = []  # links whose route went, for the core to forget
        self.parked: dict[str, collections.deque[tuple[float, Forwarded]]] = {}
        self._named: dict[str, str] = {}  # destination headers routed before, and their names
        self.tallies: collections.defaultdict[str, DestTally] = collections.defaultdict(DestTally)
        self._turn: dict[str, int] = {}
        # Spawning (-spawn): asked for a destination with no route; True if it will come.
        self.spawn: Callable[[str], bool] | None = None
        self.spawning: set[str] = set()
        self.spawned: dict[str, Address] = {}

    def consumers(self, dest: str) -> list[Link]:
        return self.dests.get(dest, [])

    def set_routes(self, routes: Routes) -> list[Link]:
        """Take a new routes table: links for new instances (returned, for the glue to
        connect), removed ones lost. Kept instances keep their links; instances the router
        spawned stay, unless a route now names their destination."""
        self.routes = routes
        self._named.clear()
        table = dict(routes.table)
        for name, address in self.spawned.items():
            table.setdefault(name, (address,))
        for name in self.spawning:
            table.setdefault(name, ())
        return self._build(table)

    def spawn_pending(self, name: str) -> None:
        """An instance for `name` is being started: a destination from now on."""
        if name not in self.dests:
            self.spawning.add(name)
            self.dests[name], self.senders[name] = [], []

    def spawned_instance(self, name: str, address: Address) -> list[Link]:
        self.spawning.discard(name)
        self.spawned[name] = address
        return self.set_routes(self.routes)

    def _build(self, routed: dict[str, tuple[Address, ...]]) -> list[Link]:
        old = {
            (link.dest, link.address, link.role): link
            for link in self.links.by_number.values()
            if link.role is not BROWSES
        }
        tables: dict[str, dict[str, list[Link]]] = {CONSUMES: {}, SENDS: {}}
        new: list[Link] = []
        for name, addresses in routed.items():
            for role, table in tables.items():
                links = table[name] = []
                for address in addresses:
                    link = old.pop((name, address, role), None)
                    if link is None:
                        link = Link(self.links.new_number(), name, address, role)
                        self.links.by_number[link.number] = link
                        new.append(link)
                    links.append(link)
        self.dests, self.senders = tables[CONSUMES], tables[SENDS]
        for link in old.values():
            self.links.drop(link, "its route was removed")
            del self.links.by_number[link.number]
            self.removed.append(link)
        kept = {(link.dest, link.address) for link in self.links.by_number.values()}
        self.indexes = {key: index for key, index in self.indexes.items() if key in kept}
        free = (index for index in range(1 << INDEX_BITS) if index not in self.indexes.values())
        for key in sorted(kept - self.indexes.keys()):
            self.indexes[key] = next(free)
        return new

    def route(self, header: str | None, command: str, shown: str | None = None) -> str:
        """The routed destination a `destination` header names, or QueueError (naming
        `shown`, the header as the client gave it, if not `header`)."""
        if header is not None and (known := self._named.get(header)) is not None:
            return known
        name = self._look_up(header, command, shown)
        if header is not None and len(self._named) < NAMED_KEPT:
            self._named[header] = name
        return name

    def _look_up(self, header: str | None, command: str, shown: str | None) -> str:
        name = destination_name(header)
        shown = header if shown is None else shown
        spawn = self.spawn
        new = spawn is not None and name is not None and name not in self.dests and SPAWN_NAME.fullmatch(name)
        if new and spawn is not None and name is not None and spawn(name):
            self.spawn_pending(name)
        if name is None or name not in self.dests:
            known = ", ".join(f"/queue/{n}" for n in sorted(self.dests)) or "none"
            how = (
                " -spawn starts an instance for a new NAME of letters, digits, '_', '.' and '-' that starts "
                "with a letter or digit (64 characters at most), while fewer than -spawn-max run."
                if spawn is not None
                else ""
            )
            raise QueueError(
                f"unknown destination {(shown or '')[:80]!r}" if shown else f"{command} needs a destination",
                f"Give destination:/queue/NAME (or ./NAME) with a routed NAME; this router routes: {known}.{how}",
            )
        return name

    def send(
        self,
        session: Peer,
        waits: Waits,
        headers: Mapping[str, str],
        body: bytes,
        dest: str,
        lines: bytes,
        done: Done | None,
    ) -> None:
        """A client's checked SEND to `dest`, whose kept header lines are `lines`:
        numbered among its session's forwarded frames, encoded once for the instances
        (the router's receipt goes in per link), and placed."""
        item = Forwarded(session, waits, "SEND", headers, body, dest, done, waits.forwarded())
        item.wire = b"SEND\ndestination:/queue/%s\n%scontent-length:%d\n\n%s\x00" % (
            dest.encode(),
            lines,
            len(body),
            body,
        )
        self.place_send(item)

    def place_send(self, item: Forwarded) -> None:
        """Forward a SEND to an instance of its destination that is up, or park it until
        one is (for at most link_wait seconds)."""
        link = None if item.dest in self.parked else self.pick(item.dest, item.headers.get(PARTITION_KEY))
        if link is not None:
            self.links.forward(link, item)
        elif self.link_wait > 0:
            deadline = self.clock() + self.link_wait
            self.tallies[item.dest].parked += 1
            self.parked.setdefault(item.dest, collections.deque()).append((deadline, item))
        else:
            self.not_stored(item, "is up")

    def not_stored(self, item: Forwarded, what: str) -> None:
        self.tallies[item.dest].not_stored += 1
        why = f"no instance of destination {item.dest!r} {what} ({self.why_down(item.dest)})"
        item.failed(MaybeStored(why) if item.sent else why)

    def why_down(self, dest: str) -> str:
        links = self.senders.get(dest)
        if not links:
            return "its instance is being started" if dest in self.spawning else "it has no instance"
        return "; ".join(f"{link.name}: {link.why_down}" for link in links)

    def pick(self, dest: str, key: str | None) -> Link | None:
        links = self.senders.get(dest)
        if not links:
            return None
        count = len(links)
        if key is not None:
            start = zlib.crc32(key.encode()) % count
        else:
            start = self._turn.get(dest, 0)
            self._turn[dest] = (start + 1) % count
        for step in range(count):
            link = links[(start + step) % count]
            if link.state is UP:
                return link
        return None

    def unpark(self, dest: str) -> None:
        """An instance of `dest` is up: its parked SENDs go, in order."""
        for _, item in self.parked.pop(dest, ()):
            if item.session is not None and self.alive(item.session):
                self.place_send(item)

    def refuse_parked(self, now: float) -> None:
        """SENDs parked past link_wait are refused."""
        for dest, parked in list(self.parked.items()):
            while parked and parked[0][0] <= now:
                _, item = parked.popleft()
                if item.session is not None and self.alive(item.session):
                    self.not_stored(item, "came up")
            if not parked:
                del self.parked[dest]
