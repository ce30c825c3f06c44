"""The router as its clients' backend, sans I/O: each client is a `curb.session.Session`
with this core as its `curb.backend.Backend`, so a client of `curb router` meets the rules
of an instance; the core forwards what the sessions ask to instances over its links
(curb.router.links) and hands their MESSAGEs to the sessions.

The glue (curb.router.glue) serves the clients with curb.server, connects the links,
writes their output (`flush_links`, once per loop pass, curb.loop_pass) and ticks the
core (`tick`) for link heart-beats and parked SENDs. The core has no socket, no clock
and no event loop of its own: `clock`, `schedule` and `wall_ms` are given.

Rules (invariants the tests check):
- Destinations: `destination:/queue/NAME` or `./NAME` names a route, `./NAME/count` its
  counts (curb.router.counts); an unknown one is an ERROR that lists the routed names.
  With `spawn` set, a new NAME matching SPAWN_NAME is offered to it; if it takes it, the
  destination exists at once, its SENDs parked until `spawned_instance` routes it.
- Receipts: a SEND is forwarded with a receipt of the router's own, and the session's
  RECEIPT waits for the instance's; an ACK or NACK goes without one, and a RECEIPT that
  waits for it (`durability`) sends a marker with one on each link the session's frames
  used since (`ACK id:count-0`: its RECEIPT leaves once what came before is durable on
  the instance). So a client's RECEIPT means its frame and every earlier one are
  durable, on whichever instance (curb.router.waits).
- A SEND goes to an instance that is up: round robin, or the one `curb-partition-key`
  hashes to (the next one up if it is down); while none is, it is parked for at most
  `link_wait` seconds, then refused. A SEND whose link is lost before the instance
  answered is placed again (at least once: the instance may have stored it).
- Message ids: a MESSAGE's id through the router is the instance's id times 4096 plus the
  instance's index in the router (INDEX_BITS), the same on every delivery of the message
  and across reconnects, and its ack id too.
- Credit (curb.router.credit): an instance never sends more than clients can take; a
  MESSAGE that finds no client with credit anyway (one sent before an UNSUBSCRIBE
  arrived) is handed back at once with `curb-undelivered:true`, which the instance does
  not count as a delivery.
- A link lost: every message it delivered is dropped from its client (the instance
  requeued it); an ACK or NACK of it is late (`curb-late:true`), changing nothing.
- A session gone has every message it holds NACKed, so it is redelivered.
- Browses, `./NAME/dead`, ACK `curb-upto`, `./NAME/redrive` and `curb-ack-timeout` are
  refused with an ERROR that says where they work.
"""

from __future__ import annotations

import collections
import time
import zlib
from collections.abc import Callable, Mapping, Sequence

from curb import payload, send_rule
from curb.backend import COUNT, DEAD, QUEUE, REDRIVE, Done
from curb.broker import Refused
from curb.dead import DeadBrowse
from curb.frame import Frame, decimal
from curb.log.browse import Browse
from curb.log.cursor import Record
from curb.log.waiters import MaybeStored
from curb.logins import Answer, LoginChecks, Offload, run_now
from curb.loop_pass import LoopPass, Schedule
from curb.metrics import Metrics
from curb.peer import Peer
from curb.queue import MAX_PREFETCH, Late, QueueError, not_awaiting, settings
from curb.receipts import Refusal
from curb.refusals import Refusals
from curb.router.config import RouterConfig
from curb.router.counts import DestinationCounts
from curb.router.credit import ClientSub, Credit, Delivery
from curb.router.links import CONSUMES, SENDS, UP, Forwarded, Link, Links
from curb.router.routes import SPAWN_NAME, Address, Routes, destination_name, own_name
from curb.router.waits import Waits
from curb.transactions import Budget
from curb.users import User

INDEX_BITS = 12  # message ids through the router: the instance's id << 12 | its index
PARTITION_KEY = "curb-partition-key"
LATE_KEPT = 4096  # ids a session held when their link was lost: their ACKs are late
_HOP_HEADERS = frozenset(("destination", "receipt", "transaction", "content-length"))
_MESSAGE_OWN = frozenset(
    ("subscription", "destination", "message-id", "ack", "content-length", "redelivered", "curb-deliveries")
)


class RouterCore:
    """Every client session and link of one router; see the module docstring."""

    def __init__(
        self,
        routes: Routes,
        config: RouterConfig | None = None,
        *,
        events: Callable[..., None] = lambda *args, **fields: None,
        schedule: Schedule,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        clock: Callable[[], float] = time.monotonic,
        offload: Offload | None = None,
    ):
        self.config = config = config or RouterConfig()
        self.max_message = config.max_frame
        self.events, self.schedule, self.wall_ms, self.clock = events, schedule, wall_ms, clock
        self.transactions = Budget()
        self.refusals = Refusals(Metrics(), events, clock)
        self.logins = LoginChecks(offload or run_now, lambda callback: self.schedule(0, callback))
        self._users: Mapping[str, User] | None = None
        self.handshaking = 0
        self.hold_flush = False
        self.flush_links: Callable[[], None] = lambda: None  # the glue's: write the links' output
        self.passes = LoopPass(self, self.pump, schedule)
        self.links = Links(self, config.link_heartbeat_ms, config.login, config.passcode, events)
        self.dests: dict[str, list[Link]] = {}  # a destination's CONSUMES links, in route order
        self.senders: dict[str, list[Link]] = {}  # its SENDS links, in the same order
        self.credit = Credit(self.links, self.consumers)
        self.counts = DestinationCounts(self.credit, self.consumers)
        self.sessions: dict[Peer, None] = {}
        self.subs: dict[Peer, dict[str, ClientSub]] = {}
        self.holding: dict[Peer, dict[int, Delivery]] = {}
        self.late: dict[Peer, collections.deque[int]] = {}  # ids held when their link was lost
        self.waits: dict[Peer, Waits] = {}
        self.unsynced: dict[Peer, dict[Link, int]] = {}  # links its ACKs used since, and their epoch
        self.parked: dict[str, collections.deque[tuple[float, Forwarded]]] = {}
        self._turn: dict[str, int] = {}
        self.indexes: dict[tuple[str, Address], int] = {}
        # Spawning (-spawn): asked for a destination with no route; True if it will come.
        self.spawn: Callable[[str], bool] | None = None
        self.spawning: set[str] = set()
        self.spawned: dict[str, Address] = {}
        self._numbers = 0
        self.routes = routes
        self.set_routes(routes)

    def consumers(self, dest: str) -> list[Link]:
        return self.dests.get(dest, [])

    def flush(self) -> None:
        """The loop pass's log write (curb.loop_pass): the links' output goes out."""
        self.flush_links()

    @property
    def users(self) -> Mapping[str, User] | None:
        return self._users

    @users.setter
    def users(self, table: Mapping[str, User] | None) -> None:
        self._users = table
        self.logins.users = table or {}

    # ---------------------------------------------------------------- routes

    def set_routes(self, routes: Routes) -> list[Link]:
        """Take a new routes table: links for new instances (returned, for the glue to
        connect), removed ones lost. Kept instances keep their links; instances the router
        spawned stay, unless a route now names their destination."""
        self.routes = routes
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
        old = {(link.dest, link.address, link.role): link for link in self.links.by_number.values()}
        tables: dict[str, dict[str, list[Link]]] = {CONSUMES: {}, SENDS: {}}
        new: list[Link] = []
        for name, addresses in routed.items():
            for role, table in tables.items():
                links = table[name] = []
                for address in addresses:
                    link = old.pop((name, address, role), None)
                    if link is None:
                        self._numbers += 1
                        link = Link(self._numbers, name, address, role)
                        self.links.by_number[link.number] = link
                        new.append(link)
                    links.append(link)
        self.dests, self.senders = tables[CONSUMES], tables[SENDS]
        for link in old.values():
            self.links.drop(link, "its route was removed")
            del self.links.by_number[link.number]
            self.credit.upstream.pop(link, None)
        kept = {(link.dest, link.address) for link in self.links.by_number.values()}
        self.indexes = {key: index for key, index in self.indexes.items() if key in kept}
        free = (index for index in range(1 << INDEX_BITS) if index not in self.indexes.values())
        for key in sorted(kept - self.indexes.keys()):
            self.indexes[key] = next(free)
        for name in routed:
            self.credit.reshare(name)
        return new

    def _route(self, header: str | None, command: str) -> str:
        """The routed destination a `destination` header names, or QueueError."""
        name = destination_name(header)
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
                f"unknown destination {(header or '')[:80]!r}" if header else f"{command} needs a destination",
                f"Give destination:/queue/NAME (or ./NAME) with a routed NAME; this router routes: {known}.{how}",
            )
        return name

    # ---------------------------------------------------------------- connections

    def admit(self, now: float, peer: str) -> bool:
        return True

    def join(self, session: Peer) -> None:
        self.sessions[session] = None
        self.refusals.metrics.connections_total += 1

    def check_login(self, session: Peer, login: str, passcode: str, then: Callable[[Answer], None]) -> None:
        def shed(_: Answer) -> None:
            self.refusals.login_shed(session, self.logins.queued)

        self.logins.check_peer(session.peer, session, login, passcode, then, shed)

    def durability(self, session: Peer) -> Callable[[Done], None]:
        waits = self.waits.setdefault(session, Waits())

        def when_durable(done: Done) -> None:
            for link, epoch in self.unsynced.pop(session, {}).items():
                number = waits.forwarded()
                if link.state is UP and link.epoch == epoch:
                    marker = Forwarded(session, waits, "ACK", {"id": "count-0"}, b"", link.dest, number=number)
                    self.links.forward(link, marker)
                else:
                    waits.answered(number, f"instance {link.name} was lost before it answered")
            waits.wait(done)

        return when_durable

    def gone(self, session: Peer) -> None:
        """The connection is gone: NACK what it held, so the instances redeliver it."""
        self.sessions.pop(session, None)
        self.logins.forget(session)
        for dest in [dest for dest, watchers in self.counts.watchers.items() if session in watchers]:
            self.counts.watch(session, dest, False)
        for delivery in list(self.holding.pop(session, {}).values()):
            self._settle(delivery)
            self.links.send(delivery.link, "NACK", {"id": delivery.upstream})
        for sub in self.subs.pop(session, {}).values():
            self.credit.drop(sub)
        self.waits.pop(session, None)
        self.unsynced.pop(session, None)
        self.late.pop(session, None)

    # ---------------------------------------------------------------- destinations

    def send_kind(self, destination: str | None) -> tuple[str, str]:
        redrive = own_name(destination, "/redrive")
        if redrive is not None:
            return REDRIVE, redrive
        return QUEUE, self._route(destination, "SEND")

    def subscribe_kind(self, destination: str | None) -> tuple[str, str]:
        for kind, suffix in ((COUNT, "/count"), (DEAD, "/dead")):
            name = own_name(destination, suffix)
            if name is not None:
                return kind, self._route(f"./{name}", "SUBSCRIBE")
        return QUEUE, self._route(destination, "SUBSCRIBE")

    def scope(self, session: Peer, frame: Frame) -> str | None:
        if frame.command in ("SEND", "SUBSCRIBE"):
            try:
                kinds = self.send_kind if frame.command == "SEND" else self.subscribe_kind
                return kinds(frame.headers.get("destination"))[1]
            except QueueError:
                return None
        raw = frame.headers.get("id", "")
        delivery = self.holding.get(session, {}).get(int(raw)) if raw.isdigit() else None
        return None if delivery is None else delivery.link.dest

    # ---------------------------------------------------------------- SEND

    def check_send(self, headers: Mapping[str, str], body: bytes) -> None:
        """What an instance would refuse is refused here, before it is forwarded or held
        in a transaction: a COMMIT forwards only SENDs that pass."""
        self._route(headers.get("destination"), "SEND")
        lines = payload.header_lines(headers)
        size = len(lines) + 1 + len(body)
        max_frame = self.config.max_frame
        try:
            send_rule.check(headers, lines, size, max_frame, self.wall_ms)
        except send_rule.BadSend as err:
            raise Refused(str(err), err.advice) from None

    def accept(
        self,
        headers: Mapping[str, str],
        body: bytes,
        done: Done | None = None,
        urgent: bool = True,
        session: Peer | None = None,
    ) -> None:
        assert session is not None  # every SEND through the router comes from a session
        self.check_send(headers, body)
        dest = self._route(headers.get("destination"), "SEND")
        forwarded = {"destination": f"/queue/{dest}"}
        forwarded.update((k, v) for k, v in headers.items() if k not in _HOP_HEADERS)
        waits = self.waits.setdefault(session, Waits())
        item = Forwarded(session, waits, "SEND", forwarded, body, dest, done, waits.forwarded())
        self._place_send(item)

    def _place_send(self, item: Forwarded) -> None:
        """Forward a SEND to an instance of its destination that is up, or park it until
        one is (for at most link_wait seconds)."""
        link = None if item.dest in self.parked else self._pick(item.dest, item.headers.get(PARTITION_KEY))
        if link is not None:
            self.links.forward(link, item)
        elif self.config.link_wait > 0:
            deadline = self.clock() + self.config.link_wait
            self.parked.setdefault(item.dest, collections.deque()).append((deadline, item))
        else:
            self._not_stored(item, "is up")

    def _not_stored(self, item: Forwarded, what: str) -> None:
        why = f"no instance of destination {item.dest!r} {what} ({self._why_down(item.dest)})"
        item.failed(MaybeStored(why) if item.wire is not None else why)

    def _why_down(self, dest: str) -> str:
        links = self.senders.get(dest)
        if not links:
            return "its instance is being started" if dest in self.spawning else "it has no instance"
        return "; ".join(f"{link.name}: {link.why_down}" for link in links)

    def _pick(self, dest: str, key: str | None) -> Link | None:
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

    # ---------------------------------------------------------------- SUBSCRIBE

    def subscribe(
        self,
        session: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int | None,
        ack_timeout: float | None,
        dead: bool,
        name: str = "",
    ) -> ClientSub:
        if dead or ack_timeout is not None:
            what = f"./{name}/dead" if dead else "curb-ack-timeout"
            raise QueueError(
                f"{what} is not routed",
                f"Through the router the instances' own dead letters and -ack-timeout apply: use {what} on an "
                "instance itself (docs/router.md: What is not routed).",
            )
        subs = self.subs.setdefault(session, {})
        if sub_id in subs:
            raise QueueError(
                f"subscription {sub_id!r} exists already on this connection",
                "Give each SUBSCRIBE of a connection its own id, or UNSUBSCRIBE the old one first.",
            )
        prefetch, _ = settings(ack_mode, prefetch, None, self.config.prefetch, MAX_PREFETCH, 0)
        sub = subs[sub_id] = ClientSub(session, sub_id, ack_mode, prefetch, dest=name)
        self.credit.add(sub)
        self.counts.changed(name)
        return sub

    def unsubscribe(self, session: Peer, sub_id: str, dead: bool = False) -> None:
        sub = self.subs.get(session, {}).pop(sub_id, None)
        if sub is None:
            raise QueueError(
                f"no active subscription {sub_id!r} on this connection",
                "UNSUBSCRIBE with the id of this connection's SUBSCRIBE, once; it needs no UNSUBSCRIBE after that.",
            )
        self.credit.drop(sub)
        self.counts.changed(sub.dest)

    def browse(self, session: Peer, from_id: int, to_id: int | None, name: str = "") -> Browse:
        raise _not_routed("browse subscriptions", "SUBSCRIBE with browser:true")

    def browse_dead(self, session: Peer, name: str = "") -> DeadBrowse:
        raise _not_routed("browse subscriptions", "SUBSCRIBE with browser:true")

    def end_browse(self, browse: Browse | DeadBrowse) -> None:
        """No browse runs through the router."""

    def ack_upto(self, upto: int, done: Done | None = None, destination: str | None = None) -> None:
        raise _not_routed("ACK with curb-upto", "send ACK curb-upto")

    def redrive(self, name: str, count: int | None, moved: Callable[[int], None]) -> None:
        raise _not_routed(f"./{name}/redrive", "SEND to ./redrive")

    # ---------------------------------------------------------------- MESSAGEs from instances

    def instance_message(self, link: Link, frame: Frame) -> None:
        headers = frame.headers
        if headers.get("subscription") == "count":
            if self.counts.instance_counts(link, frame) and len(self.consumers(link.dest)) > 1:
                self.credit.reshare(link.dest)
            return
        upstream = headers.get("ack") or headers.get("message-id", "")
        sub = self.credit.taker(link)
        index = self.indexes.get((link.dest, link.address))
        if sub is None or index is None or not upstream.isdigit():
            # No client has credit for it (it crossed a smaller SUBSCRIBE): handed back
            # undelivered, so the instance counts no delivery and applies no delay.
            self.links.send(link, "NACK", {"id": upstream, "curb-undelivered": "true"})
            return
        try:
            deliveries = decimal(headers.get("curb-deliveries", "1"), "curb-deliveries", 1 << 31)
        except ValueError:
            deliveries = 1
        msg_id = int(upstream) << INDEX_BITS | index
        rec = Record(msg_id, 0, len(frame.body), deliveries, 0, None)
        delivery = Delivery(link, upstream, headers.get("subscription", ""), sub, rec, link.epoch)
        self.credit.hold(delivery, 1)
        self.credit.of(link).deliveries[upstream] = delivery
        self.holding.setdefault(sub.conn, {})[msg_id] = delivery
        sub.unacked[msg_id] = rec
        kept = {name: value for name, value in headers.items() if name not in _MESSAGE_OWN}
        sub.conn.deliver(sub, rec, payload.encode(kept, frame.body))

    def handed_off(self, session: Peer, records: Sequence[Record]) -> None:
        """Auto-acked messages went to the transport: done, on their instances too."""
        holding = self.holding.get(session, {})
        for rec in records:
            delivery = holding.get(rec.id)
            if delivery is not None:
                self._settle(delivery)
                self.links.send(delivery.link, "ACK", {"id": delivery.upstream})

    def _settle(self, delivery: Delivery) -> None:
        """The delivery is over for the router (ACKed, NACKed, or its client gone)."""
        self.credit.of(delivery.link).deliveries.pop(delivery.upstream, None)
        self.holding.get(delivery.sub.conn, {}).pop(delivery.rec.id, None)
        delivery.sub.unacked.pop(delivery.rec.id, None)
        self.credit.hold(delivery, -1)
        self.credit.rebalance(delivery.link)

    # ---------------------------------------------------------------- ACK and NACK

    def ack(self, session: Peer, msg_id: int) -> None:
        delivery = self._held(session, msg_id)
        sub = delivery.sub
        settled = [delivery]
        if sub.ack_mode == "client":  # every delivery of the subscription up to it
            ids = list(sub.unacked)
            settled = [self.holding[session][each] for each in ids[: ids.index(msg_id) + 1]]
        for each in settled:
            self._answer(session, each, "ACK", {})

    def nack(self, session: Peer, msg_id: int, delay_ms: int | None = None) -> None:
        extra = {} if delay_ms is None else {"curb-delay": str(delay_ms)}
        self._answer(session, self._held(session, msg_id), "NACK", extra)

    def bounce(self, session: Peer, msg_id: int) -> None:
        self._answer(session, self._held(session, msg_id), "NACK", {"curb-undelivered": "true"})

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        delivery = self._held(session, msg_id)
        extra = {"id": delivery.upstream, "curb-touch": str(round(seconds * 1000))}
        self.links.send(delivery.link, "NACK", extra)
        self.unsynced.setdefault(session, {})[delivery.link] = delivery.link.epoch

    def _answer(self, session: Peer, delivery: Delivery, command: str, extra: dict[str, str]) -> None:
        self._settle(delivery)
        self.links.send(delivery.link, command, {"id": delivery.upstream, **extra})
        self.unsynced.setdefault(session, {})[delivery.link] = delivery.link.epoch

    def _held(self, session: Peer, msg_id: int) -> Delivery:
        """The delivery the session holds as `msg_id`; Late when its link was lost (the
        instance requeued it), QueueError when it holds none."""
        delivery = self.holding.get(session, {}).get(msg_id)
        if delivery is not None:
            return delivery
        if msg_id in self.late.get(session, ()):
            raise Late(
                f"message {msg_id}'s instance was lost while this connection held it",
                "Nothing to do: the instance queued it again, and it will be delivered again.",
            )
        raise not_awaiting(msg_id)

    # ---------------------------------------------------------------- links (LinkEvents)

    def link_up(self, link: Link) -> None:
        if link.role is SENDS:
            for _, item in self.parked.pop(link.dest, ()):
                if item.session in self.sessions:
                    self._place_send(item)
            return
        self.credit.link_up(link)
        self.counts.changed(link.dest)

    def link_down(self, link: Link, why: str, pending: list[Forwarded]) -> None:
        if link.role is CONSUMES:
            for delivery in self.credit.link_down(link):
                session = delivery.sub.conn
                self.holding.get(session, {}).pop(delivery.rec.id, None)
                delivery.sub.unacked.pop(delivery.rec.id, None)
                self.late.setdefault(session, collections.deque(maxlen=LATE_KEPT)).append(delivery.rec.id)
            self.counts.changed(link.dest)
        for item in pending:
            self._lost(item, f"instance {link.name} of {link.dest!r} was lost before it answered ({why})")

    def _lost(self, item: Forwarded, why: str) -> None:
        if item.session not in self.sessions:
            return
        if item.command == "SEND":
            self._place_send(item)  # at least once: the instance may have stored it
        else:
            item.waits.answered(item.number, why)

    def instance_refused(self, link: Link, item: Forwarded, frame: Frame, after: list[Forwarded]) -> None:
        """An instance's ERROR: its frame's client gets it; the frames after it, dropped
        unread by the instance, are placed again."""
        reason = frame.headers.get("message", "ERROR")
        detail = frame.body.decode(errors="replace").strip() or reason
        item.failed(Refusal(reason, f"{detail} (instance {link.name} of destination {link.dest!r})"))
        for each in after:
            self._lost(each, f"instance {link.name} refused an earlier frame")

    # ---------------------------------------------------------------- flow and time

    def set_writable(self, session: Peer, writable: bool) -> None:
        for sub in self.subs.get(session, {}).values():
            self.credit.share(sub)
            self.credit.rebalance_dest(sub.dest)

    def pump(self) -> None:
        """Instances push their MESSAGEs: nothing to pull."""

    def counts_of(self, name: str) -> dict[str, int]:
        return self.counts.of(name)

    def count_tail(self, name: str, counts: dict[str, int]) -> tuple[bytes, bytes]:
        return self.counts.tail(name, counts)

    def watch_counts(self, session: Peer, name: str, watching: bool) -> None:
        self.counts.watch(session, name, watching)

    def tick(self, now: float) -> None:
        """Link heart-beats; SENDs parked past link_wait are refused."""
        self.links.tick(now)
        for dest, parked in list(self.parked.items()):
            while parked and parked[0][0] <= now:
                _, item = parked.popleft()
                if item.session in self.sessions:
                    self._not_stored(item, "came up")
            if not parked:
                del self.parked[dest]


def _not_routed(what: str, how: str) -> QueueError:
    return QueueError(
        f"{what} are not routed" if what.endswith("s") else f"{what} is not routed",
        f"{how} on the destination's instance itself, at its own address (docs/router.md: What is not routed).",
    )
