"""The router's forwarding rules, sans I/O: frames in from clients and from instances, bytes out.

The glue (curb.router.glue) tells the core what happened: a client connected, sent bytes
or went away; a link to an instance connected, sent bytes or was lost; time passed
(`tick`). The core writes bytes into the endpoints' `out` lists and marks them in
`dirty`; the glue writes them to the sockets and closes what has `close_wanted`. The core
has no socket, no clock and no event loop.

One link per instance, shared by every client: SENDs, ACKs and NACKs of all clients are
forwarded on it, each with a receipt of the router's own (`r<N>`), and the instance's
RECEIPT settles the client's place in its line.

Rules (invariants the tests check):
- Receipts: a client's SENDs, COMMITs and its frames that ask for a receipt take places
  in its line in frame order; a place is filled once every frame forwarded for it has
  the instance's RECEIPT (at once for frames that forward nothing), and a RECEIPT leaves
  only when every place before it is filled. So a client's RECEIPT means its frame and
  every earlier SEND of the connection are on disk, on whichever instance. An ACK or
  NACK without a receipt is forwarded without one and waits for nothing.
- Destinations: `destination:/queue/NAME` or `./NAME` names a route; an unknown one is an
  ERROR that lists the routed names.
- Subscriptions: per instance at most one upstream subscription, opened when clients of
  its destination have free credit. Its prefetch (`window`) never exceeds the clients'
  free credit for that instance (`free`, the sum over client subscriptions of their
  share of the instance less what they hold from it): `window - held_on_current <= free`.
  So every MESSAGE of the current subscription finds a client with credit; an ACK or NACK
  frees one place on each side. When a client leaves, unsubscribes or its share moves,
  `free` can fall below what the instance may still send: the router UNSUBSCRIBEs (the
  held messages stay ACKable on the link) and SUBSCRIBEs again with the new `free`, or
  not at all when it is 0 (no client left, or all busy). A MESSAGE that finds no client
  with credit anyway (one sent before the UNSUBSCRIBE arrived) is NACKed back at once, so
  the router never sits on a message.
- Each MESSAGE goes to one client subscription with credit, taken in turn. Its message
  and ack ids are `<link>.<epoch>.<instance id>`: the link's number in this router, the
  number of its connection, the instance's id. An ACK or NACK is forwarded to that link
  as the instance's id; one whose epoch is over (the link was lost, so the instance
  requeued the message) changes nothing and gets a RECEIPT with `curb-late:true`.
- A client that goes has every message it holds NACKed, so it is redelivered.
- A SEND is forwarded to an instance that is up; while none of its destination is, it is
  parked (in order) for at most `link_wait` seconds, then refused with an ERROR.
- A link lost: every message it delivered is dropped from the clients' credit (the
  instance requeues them); every forwarded SEND without its RECEIPT is placed again (to
  another instance, or parked until this one is back: at least once, since the instance
  may have stored it); an ACK or NACK without its RECEIPT gets a RECEIPT with
  `curb-late:true`, which promises nothing (it may or may not have taken effect: the
  message may come again), or, in a COMMIT, an ERROR.
- An instance's ERROR names the frame by our receipt: its client gets the ERROR; the
  frames after it were dropped unread by the instance, so they are sent again once the
  link is back. SENDs and consuming have a link each (SENDS, CONSUMES), so a refused
  SEND does not return the messages consumers hold.
- Partitioned destinations: SENDs go round robin over the instances whose link is up, or
  to the one `curb-partition-key` hashes to (the next one up if it is down). A client
  subscription's prefetch is split into shares, one per instance: at least 1 each, the
  rest to the instances that report queued messages (their `./count`), NSQ's shape.
- `./NAME/count` (or `/queue/NAME/count`): a subscription to a destination's counts, its
  instances' `./count` summed (and how many there are and are up), sent at once and on
  every change; it takes no credit and its MESSAGEs need no ACK.
- Spawning: with `spawn` set, a destination that no route names is offered to it; if it
  takes it, frames for that destination are handled as for an instance that is not up
  yet (SENDs parked), until `spawned_instance` routes it.
- Access: with a users file (`users`), CONNECT must carry a login and passcode of one of
  its users, checked off the loop (`check_login`); the frames after it wait until the
  answer. A SEND needs `send`, a SUBSCRIBE `consume` (a `./NAME/count` one `count`), an
  ACK or NACK `consume`, each for the frame's destination (`users.allows`: the plain
  permission or `PERMISSION@NAME`).
- Transactions: SEND, ACK and NACK with a `transaction` header are held in the router
  until COMMIT forwards them (each SEND stamped with `curb-transaction` and
  `curb-transaction-seq`); COMMIT's RECEIPT waits for all of their RECEIPTs. ABORT, a
  DISCONNECT or a lost client drop them.
"""

from __future__ import annotations

import collections
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from curb import heartbeat, message_limits, payload, receipts, send_rule, users
from curb.access import SERVER
from curb.commands import KNOWN_COMMANDS, prefetch_header
from curb.deadlines import BEAT_EARLY
from curb.frame import Frame, FrameParser, ProtocolError, decimal, encode
from curb.queue import QueueError
from curb.router.routes import SPAWN_NAME, Address, Routes, count_name, destination_name
from curb.router.transactions import Budget, Transactions

NEW, OPEN, CLOSING = "before CONNECT", "after CONNECT", "closing"
DOWN, CONNECTING, UP = "down", "connecting", "up"
SENDS, CONSUMES = "sends", "consumes"
# The most an instance lets one subscription hold (its queue's bound): a larger window
# would be cut there, silently.
MAX_WINDOW = 10_000
LINK_MAX_FRAME = 64 * 1024 * 1024
TX_HEADER = "curb-transaction"
TX_SEQ_HEADER = "curb-transaction-seq"
PARTITION_KEY = "curb-partition-key"
# Headers a SEND carries to its instance as the client gave them: all but these.
_HOP_HEADERS = frozenset(("destination", "receipt", "transaction", "content-length"))
# Headers of an instance's MESSAGE that the router writes anew.
_MESSAGE_OWN = frozenset(("subscription", "destination", "message-id", "ack", "content-length"))


@dataclass(slots=True, eq=False)
class Place:
    """A place in a client's line of receipts: filled once `waiting` forwarded frames are
    answered; `data` is what it writes then (a RECEIPT, an ERROR, or b"")."""

    data: bytes
    waiting: int = 0
    receipt: str | None = None  # the client's receipt id, if it asked for one
    commit: bool = False  # a COMMIT's place, which answers for all of its frames
    then: Callable[[], None] | None = None


@dataclass(slots=True, eq=False)
class Forwarded:
    """A frame sent on a link with our receipt, until the instance answers it."""

    client: ClientConn
    place: Place
    command: str
    headers: dict[str, str]
    body: bytes
    dest: str
    wire: bytes | None = None  # the frame as the instance gets it, but for our receipt


@dataclass(slots=True, eq=False)
class Delivery:
    """A message an instance delivered to the router and the router to one client."""

    link: Link
    upstream_id: str  # the instance's ack id
    sub_id: str  # the upstream subscription it came on
    client_sub: ClientSub
    key: str  # <link>.<epoch>.<id>, the client's ack id


class Endpoint:
    """Something the core writes to: a client connection or a link."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.close_wanted = False
        self.last_recv = self.last_send = 0.0
        self.send_every = self.expect_every = 0.0


@dataclass(slots=True, eq=False)
class ClientSub:
    client: ClientConn
    id: str
    dest: str
    destination: str  # the header as the client wrote it
    ack: str
    prefetch: int
    shares: dict[Link, int] = field(default_factory=dict)
    held: dict[Link, int] = field(default_factory=dict)
    order: collections.OrderedDict[str, Delivery] = field(default_factory=collections.OrderedDict)

    def free(self, link: Link) -> int:
        return max(0, self.shares.get(link, 0) - self.held.get(link, 0))


class ClientConn(Endpoint):
    """One client's connection: its state, line of receipts, subscriptions, transactions."""

    def __init__(self, peer: str, now: float, max_frame: int, budget: Budget):
        super().__init__()
        self.peer = peer
        self.state = NEW
        self.gone = False
        self.last_recv = self.last_send = now
        self.parser = FrameParser(max_frame_bytes=max_frame)
        self.line: collections.deque[Place] = collections.deque()
        self.subs: dict[str, ClientSub] = {}
        self.deliveries: dict[str, Delivery] = {}
        self.transactions = Transactions(budget)
        self.counts: dict[str, tuple[str, str]] = {}  # ./count subscriptions: id -> (name, header)
        self.held: list[Frame] | None = None  # frames after a CONNECT whose login is being checked
        self.permissions: frozenset[str] | None = None  # None: everything is allowed
        self.user: str | None = None
        self.erring = False


class Link(Endpoint):
    """One of the router's two connections to an instance: SENDS carries SENDs, CONSUMES
    the subscription, its ACKs and NACKs. Two, because an instance ends a connection after
    an ERROR (a SEND refused as queue full, say), and that must not return the messages
    consumers hold."""

    def __init__(self, number: int, dest: str, address: Address, role: str):
        super().__init__()
        self.number = number
        self.dest = dest
        self.address = address
        self.role = role
        self.state = DOWN
        self.epoch = 0
        self.parser = FrameParser(max_frame_bytes=LINK_MAX_FRAME)
        self.forwarded: collections.OrderedDict[str, Forwarded] = collections.OrderedDict()
        self.resend: list[Forwarded] = []  # dropped unread after an instance's ERROR
        self.next_receipt = 0
        self.sub_id: str | None = None
        self.sub_seq = 0
        self.window = 0
        self.on_current = 0  # messages held from the current subscription
        self.free = 0  # the clients' free credit for this instance
        self.rdy = 0  # queued messages, from the instance's ./count
        self.wip = 0  # messages delivered and not yet ACKed, from the same
        self.deliveries: dict[str, Delivery] = {}  # by the instance's ack id
        self.why_down = "not connected yet"
        self.tried = False  # a connection was tried (the glue's start-up waits for it)

    @property
    def name(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


def _refuse_unrouted_subscribe(headers: dict[str, str]) -> None:
    """A browse, or a SUBSCRIBE with its own ack deadline, is not routed: refused with an
    ERROR rather than turned into a consuming subscription (a browse through the router
    once took the messages it read) or stripped of its deadline."""
    if headers.get("browser") == "true" or "curb-from-id" in headers or "curb-to-id" in headers:
        raise QueueError(
            "browse subscriptions are not routed",
            "Browse a destination on its instance: SUBSCRIBE with browser:true to the instance's own address. "
            "Through the router, a SUBSCRIBE consumes.",
        )
    if "curb-ack-timeout" in headers:
        raise QueueError(
            "curb-ack-timeout is not routed",
            "Through the router the instances' -ack-timeout applies; leave out curb-ack-timeout, or SUBSCRIBE "
            "on the instance itself to set a deadline of your own.",
        )


class RouterCore:
    """Every client and link of one router; see the module docstring for the rules."""

    def __init__(
        self,
        routes: Routes,
        *,
        prefetch: int = 100,
        max_frame: int = 16 * 1024 * 1024,
        heartbeat_ms: int = 10_000,
        link_heartbeat_ms: int = 2_000,
        link_wait: float = 5.0,
        login: str | None = None,
        passcode: str | None = None,
        events: Callable[..., None] = lambda *args, **fields: None,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ):
        self.prefetch = prefetch
        self.wall_ms = wall_ms  # for a SEND's due times, checked as an instance checks them
        self.tx_budget = Budget()  # what all clients' transactions hold (curb.router.transactions)
        self.max_frame = max_frame
        self.heartbeat_ms = heartbeat_ms
        self.link_heartbeat_ms = link_heartbeat_ms
        self.link_wait = link_wait
        self.now = 0.0  # the time of the event being handled, as the glue passed it
        # SENDs for a destination with no instance up, until one is or link_wait passes.
        self.parked: dict[str, collections.deque[tuple[float, Forwarded]]] = {}
        self.login = login
        self.passcode = passcode
        self.events = events
        self.dirty: dict[Endpoint, None] = {}
        self.clients: set[ClientConn] = set()
        self.links: dict[int, Link] = {}
        self.dests: dict[str, list[Link]] = {}  # a destination's CONSUMES links, in route order
        self.senders: dict[str, list[Link]] = {}  # its SENDS links, in the same order
        self.subs_by_dest: dict[str, list[ClientSub]] = {}
        self._turn: dict[str, int] = {}  # round-robin positions, per destination
        # ./count subscribers per destination, and the counts each was sent last.
        self.count_subs: dict[str, dict[tuple[ClientConn, str], dict[str, object] | None]] = {}
        self._count_version = 0
        # Spawning (-spawn): asked for a destination with no route; True if it will come.
        self.spawn: Callable[[str], bool] | None = None
        # Logins (-users): the users file, and the glue's check of a password off the loop,
        # which answers with the user or None.
        self.users: dict[str, users.User] | None = None
        self.check_login: Callable[[str, str, Callable[[users.User | None], None]], None] | None = None
        self.spawning: set[str] = set()
        self.spawned: dict[str, Address] = {}
        self.routes = routes
        self._numbers = 0
        self.set_routes(routes)

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
        """An instance for `name` is being started (-spawn): it is a destination from now
        on, its SENDs parked and its counts zero until the instance is up."""
        if name not in self.dests:
            self.spawning.add(name)
            self.dests[name], self.senders[name] = [], []

    def spawned_instance(self, name: str, address: Address) -> list[Link]:
        """The instance the glue spawned for `name` listens at `address`: route to it."""
        self.spawning.discard(name)
        self.spawned[name] = address
        return self.set_routes(self.routes)

    def _build(self, routed: dict[str, tuple[Address, ...]]) -> list[Link]:
        old = {
            (link.dest, link.address, link.role): link
            for table in (self.dests, self.senders)
            for links in table.values()
            for link in links
        }
        tables: dict[str, dict[str, list[Link]]] = {CONSUMES: {}, SENDS: {}}
        new: list[Link] = []
        for name, addresses in routed.items():
            for role, table in tables.items():
                links = []
                for address in addresses:
                    link = old.pop((name, address, role), None)
                    if link is None:
                        self._numbers += 1
                        link = Link(self._numbers, name, address, role)
                        self.links[link.number] = link
                        new.append(link)
                    links.append(link)
                table[name] = links
        self.dests, self.senders = tables[CONSUMES], tables[SENDS]
        for link in old.values():
            link.close_wanted = True
            self._mark(link)
            self.link_lost(link, "its route was removed")
            del self.links[link.number]
        for name in list(self.subs_by_dest):
            for sub in self.subs_by_dest[name]:
                self._share(sub)
            self._rebalance_dest(name)
        return new

    # ---------------------------------------------------------------- output

    def _mark(self, endpoint: Endpoint) -> None:
        self.dirty[endpoint] = None

    def _write(self, endpoint: Endpoint, data: bytes) -> None:
        if endpoint.close_wanted:
            return
        endpoint.out.append(data)
        self.dirty[endpoint] = None

    def take_dirty(self, now: float) -> list[Endpoint]:
        """The endpoints with output or a close to apply; their `out` is the glue's to write."""
        dirty = list(self.dirty)
        self.dirty.clear()
        for endpoint in dirty:
            if endpoint.out:
                endpoint.last_send = now
        return dirty

    # ---------------------------------------------------------------- clients

    def client_opened(self, peer: str, now: float) -> ClientConn:
        client = ClientConn(peer, now, self.max_frame, self.tx_budget)
        self.clients.add(client)
        return client

    def client_data(self, client: ClientConn, data: bytes, now: float) -> None:
        if client.state is CLOSING or client.gone:
            return
        client.last_recv = self.now = now
        bad: ProtocolError | None = None
        try:
            frames = client.parser.feed(data)
        except ProtocolError as err:
            bad, frames = err, err.frames
        for frame in frames:
            if client.state is CLOSING:
                return
            self._handle(client, frame)
        if bad is not None and client.state is not CLOSING:
            self._error(
                client,
                str(bad),
                "The frame is not valid STOMP 1.2 or breaks the router's limits: fix the frame and reconnect.",
                receipt=bad.receipt,
            )

    def client_lost(self, client: ClientConn) -> None:
        """The connection is gone: NACK what it held, so the instances redeliver it."""
        if client.gone:
            return
        client.gone = True
        client.state = CLOSING
        client.out.clear()
        self.clients.discard(client)
        client.transactions.clear()
        for sub_id, (name, _) in client.counts.items():
            self.count_subs.get(name, {}).pop((client, sub_id), None)
        touched: set[Link] = set()
        for delivery in list(client.deliveries.values()):
            self._settle(delivery)
            self._write_link(delivery.link, "NACK", {"id": delivery.upstream_id})
            touched.add(delivery.link)
        for sub in list(client.subs.values()):
            self._drop_sub(sub)
            touched.update(self.dests.get(sub.dest, ()))
        client.subs.clear()
        for link in touched:
            self._rebalance(link)

    def _handle(self, client: ClientConn, frame: Frame) -> None:
        if client.held is not None:
            client.held.append(frame)
            return
        handler = RULES.get((client.state, frame.command))
        if handler is None:
            self._unexpected(client, frame)
            return
        try:
            handler(self, client, frame)
        except QueueError as err:
            self._error(client, str(err), err.advice, frame.headers.get("receipt"))

    def _unexpected(self, client: ClientConn, frame: Frame) -> None:
        command = frame.command
        if command in KNOWN_COMMANDS:
            detail = (
                "Send CONNECT (or STOMP) once, first; then any other frame."
                if client.state is NEW
                else "CONNECT may only be sent once per connection: open a new connection to connect again."
            )
            self._error(client, f"{command} not allowed {client.state}", detail, frame.headers.get("receipt"))
        else:
            self._error(
                client,
                f"unknown command {command[:40]!r} {client.state}",
                "The router speaks STOMP 1.2: CONNECT (or STOMP), SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, "
                "BEGIN, COMMIT, ABORT or DISCONNECT.",
                frame.headers.get("receipt"),
            )

    def on_connect(self, client: ClientConn, frame: Frame) -> None:
        versions = frame.headers.get("accept-version", "1.0").split(",")
        if "1.2" not in versions:
            self._error(
                client, "unsupported protocol version", "The router speaks STOMP 1.2 only; send accept-version:1.2."
            )
            return
        try:
            theirs = heartbeat.parse(frame.headers.get("heart-beat", "0,0"))
        except ValueError as err:
            self._error(client, "bad heart-beat header", f"{err}.")
            return
        if self.users is None or self.check_login is None:
            self._connected(client, theirs)
            return
        login, passcode = frame.headers.get("login"), frame.headers.get("passcode", "")
        if login is None:
            self._refuse(client)
            return
        client.held = []
        self.check_login(login, passcode, lambda user: self._checked(client, user, theirs))

    def _checked(self, client: ClientConn, user: users.User | None, theirs: tuple[int, int]) -> None:
        """The login's answer: connect and handle the frames held meanwhile, or refuse."""
        held, client.held = client.held or [], None
        if client.gone:
            return
        if user is None:
            self._refuse(client)
            return
        client.user, client.permissions = user.name, user.permissions
        self._connected(client, theirs)
        for frame in held:
            if client.state is CLOSING:
                break
            self._handle(client, frame)

    def _refuse(self, client: ClientConn) -> None:
        self._error(
            client,
            "access refused",
            "Send the login and passcode of a user in the router's users file (-users).",
        )

    def _allow(self, client: ClientConn, permission: str, dest: str) -> None:
        """QueueError unless the client's user may do `permission` on `dest`."""
        if client.permissions is not None and not users.allows(client.permissions, permission, dest):
            raise QueueError(
                f"{permission} permission needed for {dest!r}",
                f"User {client.user!r} may not {permission} on {dest!r}: the operator grants it with "
                f"`curb passwd USERS-FILE {client.user} --perm {permission}@{dest}` (or --perm {permission} "
                "for every destination).",
            )

    def _connected(self, client: ClientConn, theirs: tuple[int, int]) -> None:
        ours = self.heartbeat_ms
        client.send_every, client.expect_every = heartbeat.negotiate((ours, ours), theirs)
        client.state = OPEN
        self._write(
            client,
            encode(
                "CONNECTED",
                {
                    "version": "1.2",
                    "server": f"{SERVER} router",
                    "heart-beat": f"{ours},{ours}",
                    "session": str(id(client)),
                },
            ),
        )

    def on_send(self, client: ClientConn, frame: Frame) -> None:
        dest = self._route(frame)
        self._allow(client, "send", dest)
        headers = frame.headers
        lines = payload.header_lines(headers)
        size = len(lines) + 1 + len(frame.body)
        if lines or size - 1 + message_limits.RESERVE > self.max_frame:  # else nothing to check
            # What an instance would refuse is refused here, before it is forwarded or
            # held in a transaction: a COMMIT forwards only SENDs that pass.
            send_rule.check(headers, lines, size, self.max_frame, self.wall_ms)
        tx = headers.get("transaction")
        if tx is not None:
            self._hold(client, tx, frame)
            self._place_now(client, headers.get("receipt"))
            return
        place = self._place(client, headers.get("receipt"), 1)
        self._forward_send(client, place, frame, dest)

    def _forward_send(
        self, client: ClientConn, place: Place, frame: Frame, dest: str, extra: dict[str, str] | None = None
    ) -> None:
        forwarded = {"destination": f"/queue/{dest}"}
        forwarded.update((k, v) for k, v in frame.headers.items() if k not in _HOP_HEADERS)
        if extra:
            forwarded.update(extra)
        self._place_send(Forwarded(client, place, "SEND", forwarded, frame.body, dest))

    def _place_send(self, item: Forwarded) -> None:
        """Forward a SEND to an instance of its destination that is up, or park it until
        one is (for at most link_wait seconds)."""
        link = None if item.dest in self.parked else self._pick(item.dest, item.headers.get(PARTITION_KEY))
        if link is not None:
            self._forward(link, item)
        elif self.link_wait > 0:
            self.parked.setdefault(item.dest, collections.deque()).append((self.now + self.link_wait, item))
        else:
            self._lost_frame(item, f"no instance of destination {item.dest!r} is up ({self._why_down(item.dest)})")

    def on_subscribe(self, client: ClientConn, frame: Frame) -> None:
        headers = frame.headers
        sub_id = headers.get("id")
        if sub_id is None:
            raise QueueError(
                "SUBSCRIBE needs an id header",
                "Give SUBSCRIBE an id header (any name); MESSAGEs carry it as subscription and UNSUBSCRIBE names it.",
            )
        if sub_id in client.subs or sub_id in client.counts:
            raise QueueError(
                f"subscription {sub_id!r} exists already on this connection",
                "Give each SUBSCRIBE of a connection its own id, or UNSUBSCRIBE the old one first.",
            )
        counted = count_name(headers.get("destination"))
        if counted is not None and counted in self.dests:
            self._allow(client, "count", counted)
            client.counts[sub_id] = (counted, headers["destination"])
            self.count_subs.setdefault(counted, {})[(client, sub_id)] = None
            self._place_now(client, headers.get("receipt"))
            self._send_counts(counted)
            return
        _refuse_unrouted_subscribe(headers)
        dest = self._route(frame)
        self._allow(client, "consume", dest)
        ack = headers.get("ack", "auto")
        if ack not in ("auto", "client", "client-individual"):
            raise QueueError(
                f"unknown ack mode {ack!r}; use one of auto, client, client-individual",
                "Send SUBSCRIBE with an ack header of auto, client or client-individual, or none for auto.",
            )
        prefetch = prefetch_header(headers) or self.prefetch
        sub = ClientSub(client, sub_id, dest, headers["destination"], ack, prefetch)
        client.subs[sub_id] = sub
        self.subs_by_dest.setdefault(dest, []).append(sub)
        self._share(sub)
        self._rebalance_dest(dest)
        self._place_now(client, headers.get("receipt"))

    def on_unsubscribe(self, client: ClientConn, frame: Frame) -> None:
        sub_id = frame.headers.get("id")
        if sub_id is not None and sub_id in client.counts:
            name, _ = client.counts.pop(sub_id)
            self.count_subs.get(name, {}).pop((client, sub_id), None)
            self._place_now(client, frame.headers.get("receipt"))
            return
        sub = client.subs.pop(sub_id, None) if sub_id is not None else None
        if sub is None:
            raise QueueError(
                f"no subscription {sub_id!r} on this connection",
                "UNSUBSCRIBE with the id of this connection's SUBSCRIBE, once.",
            )
        self._drop_sub(sub)
        self._rebalance_dest(sub.dest)
        self._place_now(client, frame.headers.get("receipt"))

    def on_ack(self, client: ClientConn, frame: Frame) -> None:
        if "curb-upto" in frame.headers:
            raise QueueError(
                "ACK with curb-upto is not routed",
                "An ACK through the router names one message (its ack header); send curb-upto to an instance directly.",
            )
        self._ack_or_nack(client, frame)

    def on_nack(self, client: ClientConn, frame: Frame) -> None:
        self._ack_or_nack(client, frame)

    def _ack_or_nack(self, client: ClientConn, frame: Frame, place: Place | None = None) -> None:
        headers = frame.headers
        if headers.get("id", "").startswith("count-") and client.counts:
            self._place_now(client, headers.get("receipt"))  # a ./count MESSAGE needs no answer
            return
        tx = headers.get("transaction")
        if tx is not None and place is None:
            self._ack_id(frame)  # a bad id is refused now, not at COMMIT
            self._hold(client, tx, frame)
            self._place_now(client, headers.get("receipt"))
            return
        key = self._ack_id(frame)
        delivery = client.deliveries.get(key)
        if delivery is None:
            self._ack_of_lost_link(client, frame, key, place)
            return
        self._allow(client, "consume", delivery.link.dest)
        deliveries = _settled_by(delivery, frame.command)
        touch = frame.command == "NACK" and "curb-touch" in headers
        receipt = headers.get("receipt")
        if place is None and receipt is not None:
            place = self._place(client, receipt, 0)
        extra = {k: v for k, v in headers.items() if k not in ("id", "receipt", "transaction")}
        links: set[Link] = set()
        for each in deliveries:
            if not touch:
                self._settle(each)
            if place is None:  # nothing waits for it: no receipt asked of the instance either
                self._write_link(each.link, frame.command, {"id": each.upstream_id, **extra})
            else:
                place.waiting += 1
                item = Forwarded(client, place, frame.command, {"id": each.upstream_id, **extra}, b"", each.link.dest)
                self._forward(each.link, item)
            links.add(each.link)
        for link in links:
            self._rebalance(link)

    def _ack_of_lost_link(self, client: ClientConn, frame: Frame, key: str, place: Place | None) -> None:
        """An ACK or NACK of no delivery this client holds: an error, unless the delivery's
        link was lost since (the instance has queued it again, nothing changes)."""
        number, epoch, _ = key.split(".", 2)
        link = self.links.get(int(number))
        if link is not None and int(epoch) == link.epoch and link.state is UP:
            raise QueueError(
                f"unknown ack id {key[:40]!r}",
                f"Give {frame.command} the ack header of a MESSAGE this connection holds, once.",
            )
        if place is None:
            receipt = frame.headers.get("receipt")
            if receipt is not None:
                client.line.append(Place(receipts.late_receipt(receipt), 0, receipt))
                self._pump(client)

    def _ack_id(self, frame: Frame) -> str:
        raw = frame.headers.get("id")
        if raw is None:
            raise QueueError(
                f"{frame.command} needs an id header",
                f"Give {frame.command} the id header: the ack header of the MESSAGE it answers.",
            )
        parts = raw.split(".")
        if len(parts) != 3 or not all(part.isascii() and part.isdigit() for part in parts):
            raise QueueError(
                f"unknown ack id {raw[:40]!r}",
                f"Give {frame.command} the ack header of a MESSAGE this connection received "
                "(three numbers with dots, as the router wrote it).",
            )
        return raw

    def on_begin(self, client: ClientConn, frame: Frame) -> None:
        tx = self._tx_name(frame)
        if tx in client.transactions:
            raise QueueError(
                f"transaction {tx!r} has begun already",
                "COMMIT or ABORT it first, or give the new transaction another name.",
            )
        client.transactions.begin(tx)
        self._place_now(client, frame.headers.get("receipt"))

    def on_commit(self, client: ClientConn, frame: Frame) -> None:
        tx = self._tx_name(frame)
        frames = self._open_tx(client, tx, frame)
        place = self._place(client, frame.headers.get("receipt"), 0)
        place.commit = True
        place.waiting += 1  # until every frame is forwarded
        seq = 0
        for held in frames:
            if held.command == "SEND":
                place.waiting += 1
                dest = destination_name(held.headers.get("destination"))
                assert dest is not None  # checked when it came
                self._forward_send(client, place, held, dest, {TX_HEADER: tx, TX_SEQ_HEADER: str(seq)})
                seq += 1
            else:
                self._ack_or_nack(client, held, place)
            if client.state is CLOSING:
                return
        place.waiting -= 1
        self._pump(client)

    def on_abort(self, client: ClientConn, frame: Frame) -> None:
        self._open_tx(client, self._tx_name(frame), frame)
        self._place_now(client, frame.headers.get("receipt"))

    def _tx_name(self, frame: Frame) -> str:
        tx = frame.headers.get("transaction")
        if not tx:
            raise QueueError(
                f"{frame.command} needs a transaction header",
                f"Give {frame.command} the transaction header: the name its BEGIN gave.",
            )
        return tx

    def _open_tx(self, client: ClientConn, tx: str, frame: Frame) -> list[Frame]:
        frames = client.transactions.take(tx)
        if frames is None:
            raise QueueError(
                f"no transaction {tx[:40]!r} on this connection",
                f"BEGIN the transaction before {frame.command}, and COMMIT or ABORT it once.",
            )
        return frames

    def _hold(self, client: ClientConn, tx: str, frame: Frame) -> None:
        if tx not in client.transactions:
            raise QueueError(
                f"no transaction {tx[:40]!r} on this connection",
                f"BEGIN the transaction before a {frame.command} names it.",
            )
        client.transactions.hold(tx, frame)

    def on_disconnect(self, client: ClientConn, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        client.transactions.clear()
        client.state = CLOSING
        place = self._place(client, receipt, 0)
        place.then = lambda: self._close(client)
        self._pump(client)

    def _route(self, frame: Frame) -> str:
        header = frame.headers.get("destination")
        name = destination_name(header)
        spawn = self.spawn
        if (
            spawn is not None
            and name is not None
            and name not in self.dests
            and SPAWN_NAME.fullmatch(name)
            and spawn(name)
        ):
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
                f"unknown destination {(header or '')[:80]!r}" if header else f"{frame.command} needs a destination",
                f"Give destination:/queue/NAME (or ./NAME) with a routed NAME; this router routes: {known}.{how}",
            )
        return name

    # ---------------------------------------------------------------- the line of receipts

    def _place(self, client: ClientConn, receipt: str | None, waiting: int) -> Place:
        place = Place(receipts.receipt(receipt) if receipt is not None else b"", waiting, receipt)
        client.line.append(place)
        return place

    def _place_now(self, client: ClientConn, receipt: str | None) -> None:
        if receipt is not None:
            self._place(client, receipt, 0)
            self._pump(client)

    def _pump(self, client: ClientConn) -> None:
        """Write every filled place at the front of the line."""
        line = client.line
        while line and line[0].waiting <= 0:
            done = line.popleft()
            if done.data:
                self._write(client, done.data)
            if done.then is not None:
                done.then()

    def _error(
        self, client: ClientConn, message: str, detail: str, receipt: str | None = None, place: Place | None = None
    ) -> None:
        """One ERROR, then the close: in `place` (a frame that failed) or after every place."""
        if client.erring or client.gone:
            return
        client.erring = True
        client.state = CLOSING
        client.transactions.clear()
        headers = {"message": message, "content-type": "text/plain"}
        if receipt is not None:
            headers["receipt-id"] = receipt
        data = encode("ERROR", headers, (detail + "\n").encode())
        if place is None:
            place = self._place(client, None, 0)
        else:
            while client.line and client.line[-1] is not place:
                client.line.pop()
        place.data, place.waiting, place.then = data, 0, lambda: self._close(client)
        self._pump(client)

    def _close(self, client: ClientConn) -> None:
        client.line.clear()
        client.close_wanted = True
        self._mark(client)

    # ---------------------------------------------------------------- links

    def link_connected(self, link: Link, now: float) -> None:
        """A TCP (or TLS) connection to the instance is open: log in."""
        link.state = CONNECTING
        link.parser = FrameParser(max_frame_bytes=LINK_MAX_FRAME)
        link.out.clear()
        link.close_wanted = False
        link.last_recv = link.last_send = now
        beat = self.link_heartbeat_ms
        headers = {"accept-version": "1.2", "host": link.address[0], "heart-beat": f"{beat},{beat}"}
        if self.login is not None:
            headers["login"] = self.login
            headers["passcode"] = self.passcode or ""
        self._write(link, encode("CONNECT", headers))

    def link_data(self, link: Link, data: bytes, now: float) -> None:
        link.last_recv = self.now = now
        try:
            frames = link.parser.feed(data)
        except ProtocolError as err:
            for frame in err.frames:
                self._link_frame(link, frame)
            self._drop_link(link, f"bad frame from the instance: {err}")
            return
        for frame in frames:
            if link.state is DOWN:
                return
            self._link_frame(link, frame)

    def _link_frame(self, link: Link, frame: Frame) -> None:
        command = frame.command
        if command == "MESSAGE":
            if frame.headers.get("destination") == "./count":
                self._counts(link, frame)
            else:
                self._message(link, frame)
        elif command == "RECEIPT":
            self._answered(link, frame.headers.get("receipt-id", ""))
        elif command == "CONNECTED":
            self._link_up(link, frame)
        elif command == "ERROR":
            self._instance_error(link, frame)
        else:
            self._drop_link(link, f"unexpected {command[:40]} frame from the instance")

    def _link_up(self, link: Link, frame: Frame) -> None:
        try:
            theirs = heartbeat.parse(frame.headers.get("heart-beat", "0,0"))
        except ValueError:
            self._drop_link(link, "bad heart-beat header from the instance")
            return
        beat = self.link_heartbeat_ms
        link.send_every, link.expect_every = heartbeat.negotiate((beat, beat), theirs)
        link.state = UP
        link.epoch += 1
        link.why_down = ""
        self.events(
            "link_up",
            f"instance {link.name} of {link.dest!r} is up ({link.role})",
            instance=link.name,
            dest=link.dest,
            role=link.role,
        )
        if link.role is SENDS:
            resend, link.resend = link.resend, []
            for item in resend:
                if not item.client.gone:
                    self._forward(link, item)
            for _, item in self.parked.pop(link.dest, ()):
                if not item.client.gone:
                    self._place_send(item)
            return
        self._write_link(link, "SUBSCRIBE", {"id": "count", "destination": "./count"})
        for sub in self.subs_by_dest.get(link.dest, ()):
            self._share(sub)
        self._rebalance_dest(link.dest)

    def link_lost(self, link: Link, why: str) -> None:
        """The connection to the instance is gone (or never came): see the module docstring."""
        if link.state is DOWN and not link.forwarded and not link.deliveries:
            link.why_down = why
            return
        was_up = link.state is UP
        link.state = DOWN
        link.why_down = why
        link.sub_id, link.window, link.on_current, link.rdy, link.wip = None, 0, 0, 0, 0
        if was_up:
            self.events(
                "link_down",
                f"instance {link.name} of {link.dest!r} is down ({link.role}): {why}",
                instance=link.name,
                dest=link.dest,
                reason=why,
            )
        for delivery in list(link.deliveries.values()):
            self._settle(delivery)
        if link.role is CONSUMES:
            self._send_counts(link.dest)
        pending = list(link.forwarded.values())
        link.forwarded.clear()
        for sub in self.subs_by_dest.get(link.dest, ()):
            self._share(sub)
        self._rebalance_dest(link.dest)
        for item in pending:
            if item.client.gone:
                continue
            if item.command == "SEND":
                self._place_send(item)  # at least once: the instance may have stored it
            elif item.place.commit:
                self._lost_frame(item, f"instance {link.name} of {link.dest!r} was lost before it answered ({why})")
            else:  # it may or may not have taken effect: the message may come again
                self._late(item.client, item.place)

    def _drop_link(self, link: Link, why: str) -> None:
        link.close_wanted = True
        self._mark(link)
        self.link_lost(link, why)

    def _instance_error(self, link: Link, frame: Frame) -> None:
        """An instance's ERROR: its frame's client gets it; the frames after it come again."""
        receipt = frame.headers.get("receipt-id")
        item = link.forwarded.pop(receipt, None) if receipt is not None else None
        reason = frame.headers.get("message", "ERROR")
        if item is None:
            self._drop_link(link, f"the instance sent ERROR {reason[:80]!r}")
            return
        for after in link.forwarded.values():
            if after.command == "SEND":
                link.resend.append(after)
            else:  # dropped unread: the message is queued again, as after a late ACK
                self._late(after.client, after.place)
        link.forwarded.clear()
        detail = frame.body.decode(errors="replace").strip() or reason
        self._drop_link(link, f"the instance refused a {item.command}: {reason[:80]}")
        self._error(
            item.client,
            reason,
            f"{detail} (instance {link.name} of destination {link.dest!r})",
            receipt=item.place.receipt,
            place=item.place,
        )

    def _lost_frame(self, item: Forwarded, why: str) -> None:
        self._error(
            item.client,
            f"{item.command} not confirmed",
            f"{why}. Whether this {item.command} took effect is unknown: reconnect and send it again "
            "(a SEND may then be stored twice; an ACKed message may come again).",
            receipt=item.place.receipt,
            place=item.place,
        )

    def _late(self, client: ClientConn, place: Place) -> None:
        """A forwarded ACK or NACK that changed nothing, or may not have: its place gets a
        RECEIPT with curb-late:true, which promises nothing (a COMMIT's keeps its own)."""
        place.waiting -= 1
        if place.receipt is not None and not place.commit:
            place.data = receipts.late_receipt(place.receipt)
        if not client.gone:
            self._pump(client)

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

    def _forward(self, link: Link, item: Forwarded) -> None:
        link.next_receipt += 1
        receipt = f"r{link.next_receipt}"
        link.forwarded[receipt] = item
        if item.wire is None:  # encoded once, without our receipt, which goes in per link
            item.wire = encode(item.command, item.headers, item.body)
        cut = len(item.command) + 1
        self._write(link, b"%sreceipt:%s\n%s" % (item.wire[:cut], receipt.encode(), item.wire[cut:]))

    def _write_link(self, link: Link, command: str, headers: dict[str, str]) -> None:
        if link.state is not DOWN:
            self._write(link, encode(command, headers))

    def _answered(self, link: Link, receipt: str) -> None:
        item = link.forwarded.pop(receipt, None)
        if item is None:
            return
        item.place.waiting -= 1
        if not item.client.gone:
            self._pump(item.client)

    # ---------------------------------------------------------------- deliveries and credit

    def _message(self, link: Link, frame: Frame) -> None:
        headers = frame.headers
        upstream = headers.get("ack") or headers.get("message-id", "")
        sub_id = headers.get("subscription", "")
        sub = self._taker(link)
        if sub is None:
            # No client has credit for it (it crossed a smaller SUBSCRIBE): handed back
            # undelivered, so the instance counts no delivery and applies no delay.
            self._write_link(link, "NACK", {"id": upstream, "curb-undelivered": "true"})
            return
        key = f"{link.number}.{link.epoch}.{upstream}"
        delivery = Delivery(link, upstream, sub_id, sub, key)
        self._adjust(sub, link, held=1)
        if sub_id == link.sub_id:
            link.on_current += 1
        out = {"subscription": sub.id, "destination": sub.destination, "message-id": key}
        if sub.ack != "auto":
            out["ack"] = key
        for name, value in headers.items():
            if name not in _MESSAGE_OWN:
                out[name] = value
        self._write(sub.client, encode("MESSAGE", out, frame.body))
        if sub.ack == "auto":
            self._settle(delivery)
            self._write_link(link, "ACK", {"id": upstream})
            self._rebalance(link)
            return
        link.deliveries[upstream] = delivery
        sub.client.deliveries[key] = delivery
        sub.order[key] = delivery

    def _taker(self, link: Link) -> ClientSub | None:
        """The next client subscription (in turn) with free credit for this instance."""
        subs = self.subs_by_dest.get(link.dest)
        if not subs:
            return None
        count = len(subs)
        start = self._turn.get("\0" + link.dest, 0)
        for step in range(count):
            sub = subs[(start + step) % count]
            if sub.free(link) > 0 and not sub.client.gone and sub.client.state is OPEN:
                self._turn["\0" + link.dest] = (start + step + 1) % count
                return sub
        return None

    def _settle(self, delivery: Delivery) -> None:
        """The delivery is over for the router (ACKed, NACKed, or its client or link gone)."""
        link, sub = delivery.link, delivery.client_sub
        link.deliveries.pop(delivery.upstream_id, None)
        sub.client.deliveries.pop(delivery.key, None)
        sub.order.pop(delivery.key, None)
        self._adjust(sub, link, held=-1)
        if delivery.sub_id == link.sub_id:
            link.on_current -= 1

    def _adjust(self, sub: ClientSub, link: Link, held: int = 0, share: int | None = None) -> None:
        """Change what a client subscription holds from, or may take from, an instance,
        keeping the instance's `free` the sum of every subscription's free credit."""
        live = sub.client.subs.get(sub.id) is sub
        before = sub.free(link) if live else 0
        if held:
            sub.held[link] = sub.held.get(link, 0) + held
        if share is not None:
            sub.shares[link] = share
        after = sub.free(link) if sub.client.subs.get(sub.id) is sub else 0
        link.free += after - before

    def _drop_sub(self, sub: ClientSub) -> None:
        """A client subscription ends: its free credit leaves the instances' sums. What it
        holds stays ACKable (UNSUBSCRIBE) or was NACKed (a client gone)."""
        subs = self.subs_by_dest.get(sub.dest, [])
        if sub in subs:
            subs.remove(sub)
        for link in list(sub.shares):
            link.free -= sub.free(link)
            sub.shares[link] = 0
        if not subs:
            self.subs_by_dest.pop(sub.dest, None)

    def _share(self, sub: ClientSub) -> None:
        """Split a subscription's prefetch over its destination's instances that are up:
        1 each, the rest to those with queued messages (or to all, when none has)."""
        if sub.client.subs.get(sub.id) is not sub:
            return
        links = self.dests.get(sub.dest, [])
        up = [link for link in links if link.state is UP]
        if not up:
            for link in links:
                self._adjust(sub, link, share=0)
            return
        busy = [link for link in up if link.rdy > 0] or up
        rest = max(0, sub.prefetch - len(up))
        each, extra = divmod(rest, len(busy))
        for link in links:
            share = 0
            if link.state is UP:
                share = 1
                if link in busy:
                    index = busy.index(link)
                    share += each + (1 if index < extra else 0)
                if len(links) == 1:
                    share = sub.prefetch
            self._adjust(sub, link, share=share)

    def _counts(self, link: Link, frame: Frame) -> None:
        """An instance's ./count: move credit when whether it has queued messages changes."""
        try:
            rdy = decimal(frame.headers.get("rdy", "0"), "rdy", 1 << 62)
            wip = decimal(frame.headers.get("wip", "0"), "wip", 1 << 62)
        except ValueError:
            return
        had = link.rdy > 0
        link.rdy, link.wip = rdy, wip
        self._send_counts(link.dest)
        if (rdy > 0) != had and len(self.dests.get(link.dest, ())) > 1:
            for sub in self.subs_by_dest.get(link.dest, ()):
                self._share(sub)
            self._rebalance_dest(link.dest)

    def _send_counts(self, dest: str) -> None:
        """A ./count MESSAGE to each subscriber of the destination's counts that changed:
        its instances' rdy and wip summed, its instances' HOST:PORT in route order (so a
        client such as the Spark source can reach them directly), and how many are up."""
        subscribers = self.count_subs.get(dest)
        if not subscribers:
            return
        links = self.dests.get(dest, [])
        up = [link for link in links if link.state is UP]
        counts = {
            "rdy": sum(link.rdy for link in up),
            "wip": sum(link.wip for link in up),
            "instances": [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in (link.address for link in links)],
            "up": len(up),
        }
        for key, last in list(subscribers.items()):
            client, sub_id = key
            if last == counts or client.state is not OPEN:
                continue
            subscribers[key] = counts
            self._count_version += 1
            headers = {
                "subscription": sub_id,
                "message-id": f"count-{self._count_version}",
                "destination": client.counts[sub_id][1],
                "content-type": "application/json",
                "rdy": str(counts["rdy"]),
                "wip": str(counts["wip"]),
            }
            self._write(client, encode("MESSAGE", headers, json.dumps(counts).encode()))

    def _rebalance_dest(self, dest: str) -> None:
        for link in self.dests.get(dest, ()):
            self._rebalance(link)

    def _rebalance(self, link: Link) -> None:
        """Keep what the instance may still send within the clients' free credit, and open
        it up again when much more credit is free than the subscription allows."""
        if link.state is not UP:
            return
        may_send = link.window - link.on_current
        slack = link.free - may_send
        if slack == 0 or (slack > 0 and link.window >= MAX_WINDOW):
            return
        if slack > 0 and link.window and 2 * slack < link.window:
            return
        if link.sub_id is not None:
            self._write_link(link, "UNSUBSCRIBE", {"id": link.sub_id})
            link.sub_id, link.window, link.on_current = None, 0, 0
        if link.free > 0:
            link.sub_seq += 1
            link.sub_id = f"s{link.sub_seq}"
            link.window = min(link.free, MAX_WINDOW)
            self._write_link(
                link,
                "SUBSCRIBE",
                {
                    "id": link.sub_id,
                    "destination": f"/queue/{link.dest}",
                    "ack": "client-individual",
                    "prefetch-count": str(link.window),
                },
            )

    # ---------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Heart-beats: send ours when due, drop a peer silent for too long; SENDs parked
        for longer than link_wait are refused."""
        self.now = now
        self._refuse_parked(now)
        self._beat_clients(now)
        self._beat_links(now)

    def _refuse_parked(self, now: float) -> None:
        """Refuse the SENDs parked until `now` for an instance that did not come up."""
        for dest, parked in list(self.parked.items()):
            while parked and parked[0][0] <= now:
                _, item = parked.popleft()
                if not item.client.gone:
                    self._lost_frame(item, f"no instance of destination {dest!r} came up ({self._why_down(dest)})")
            if not parked:
                del self.parked[dest]

    def _beat_clients(self, now: float) -> None:
        """Drop the clients silent for too long; send a heart-beat to those owed one."""
        for client in list(self.clients):
            if client.state is NEW or client.close_wanted:
                continue
            if client.expect_every and now - client.last_recv > heartbeat.tolerance(client.expect_every):
                client.close_wanted = True
                self._mark(client)
                self.client_lost(client)
            elif client.send_every and now - client.last_send >= client.send_every * BEAT_EARLY:
                self._write(client, b"\n")

    def _beat_links(self, now: float) -> None:
        """Drop the links to instances silent for too long; send a heart-beat to those owed one."""
        for link in self.links.values():
            if link.state is DOWN:
                continue
            if link.expect_every and now - link.last_recv > heartbeat.tolerance(link.expect_every):
                self._drop_link(link, "the instance fell silent (no heart-beat)")
            elif link.send_every and now - link.last_send >= link.send_every * BEAT_EARLY:
                self._write(link, b"\n")


def _settled_by(delivery: Delivery, command: str) -> list[Delivery]:
    """The deliveries an ACK or NACK of `delivery` settles: with ack:client an ACK settles
    every delivery of the subscription up to it, else it settles that one."""
    if delivery.client_sub.ack != "client" or command != "ACK":
        return [delivery]
    deliveries = []
    for each in delivery.client_sub.order.values():
        deliveries.append(each)
        if each is delivery:
            break
    return deliveries


Handler = Callable[[RouterCore, ClientConn, Frame], None]
RULES: dict[tuple[str, str], Handler] = {
    (NEW, "CONNECT"): RouterCore.on_connect,
    (NEW, "STOMP"): RouterCore.on_connect,
    (OPEN, "SEND"): RouterCore.on_send,
    (OPEN, "SUBSCRIBE"): RouterCore.on_subscribe,
    (OPEN, "UNSUBSCRIBE"): RouterCore.on_unsubscribe,
    (OPEN, "ACK"): RouterCore.on_ack,
    (OPEN, "NACK"): RouterCore.on_nack,
    (OPEN, "BEGIN"): RouterCore.on_begin,
    (OPEN, "COMMIT"): RouterCore.on_commit,
    (OPEN, "ABORT"): RouterCore.on_abort,
    (OPEN, "DISCONNECT"): RouterCore.on_disconnect,
}
