"""The model of what the router and its instances promised a client, and the invariants
over it.

The driver tells the checker every frame a client sent, every frame it got, every
client gone, every link lost, every instance crash and restart, every router crash and
every move of the clock. The router stores at least once (a SEND whose link was lost
before its RECEIPT is placed again, so it may be stored twice), so the checker keeps a
SEND (by its tag) apart from its stored copies, each named by its instance and that
instance's message id (the router's id is that id << INDEX_BITS | the instance's index), and a
copy's deliveries apart from both: a delivery is live while the router still knows it
(no ACK or NACK of it yet, its link not lost, its client not gone, no router crash), and
the instance holds it until its ack deadline passes as well.

Invariants (each raises `SimFailure` the moment it breaks):

- **No receipted SEND lost**: a SEND is promised once its RECEIPT, or a RECEIPT of a later
  SEND, ACK, NACK or DISCONNECT of its connection, came ("its frame and every earlier
  SEND of the connection are on disk, on whichever instance"; a SUBSCRIBE's or an
  UNSUBSCRIBE's RECEIPT leaves at once, as an instance's does, and promises nothing of
  the SENDs before it); at the end of a seed every promised SEND of which no
  copy was ever ACKed or delivered to an `ack:auto` subscriber comes out of the drain of
  its destination (`missing`).
- **No receipted ACK undone**: once an ACK's RECEIPT came without `curb-late:true` or
  `curb-unconfirmed:true`, the copies it settled are never delivered again nor found by
  an instance's restart.
- **Late means late**: the RECEIPT of an ACK or NACK of a delivery the router no longer
  had (its link lost, so its epoch is over), or whose ack deadline had passed (the
  message went back to its instance), says `curb-late:true`, and no other RECEIPT does:
  `curb-late:true` says that the frame changed nothing. What a lost link leaves unknown
  is `curb-unconfirmed:true`, which an ACK's, a NACK's or a DISCONNECT's RECEIPT may
  carry (each waits for the ACKs and NACKs before it); a SEND's, SUBSCRIBE's or
  UNSUBSCRIBE's never does. RECEIPTs come in frame order, only for frames that asked.
- **One holder**: a copy is held by at most one client at a time (a delivery holds it
  from its MESSAGE until the router lets it go or the instance's ack deadline passes);
  after every step each instance's wip count is the number of copies it delivered that a
  client holds so: the router sits on no message, and every message it let go the
  instance has back.
- **A bounce is no delivery**: the router hands back what it has no client for with NACK
  `curb-undelivered:true`, which the instance does not count. So the `curb-deliveries` of
  a copy's k-th MESSAGE to a client is at most k plus the number of crashes of its
  instance, and cuts of its links, that struck amid a step since its SEND. The bound,
  worked out: an instance counts each MESSAGE it writes to the router; one reaches a
  client (counted in k), or is handed back undelivered (uncounted), or is lost in a pipe
  with the link it was on. Between steps the simulator has moved every byte (it settles
  until nothing moves), so a link lost, an instance killed or the router crashed between
  steps loses no MESSAGE in flight and adds nothing (what clients held was counted when
  they got it); only a crash amid a step (or a link cut amid one, `--no-bounce-loops`)
  can cut a pipe with a MESSAGE or a hand-back in it, once per crash or cut for each copy
  at most. A crash may lose counts too, which only lowers them.
- Every MESSAGE is a SEND's body byte for byte, carries its `sim-tag`, comes on a
  subscription the client has not UNSUBSCRIBEd, for the destination that SEND named,
  from one of that destination's instances; a copy keeps its tag (an instance never
  reuses an id).
- The only ERRORs are a SEND's that could not be placed in time (`message not stored`,
  or `message may not be stored` when an instance lost before its answer may have it:
  no instance of its destination came up within `link_wait`) and an instance's refusal
  of a SEND (`queue full`).
- **Counts**: once every instance is quiet (no `./count` update pending), each
  `./NAME/count` watcher's last MESSAGE is the sum of the instances' own counts whose
  link is up, with how many instances there are and are up; its headers say what its
  JSON says.
- **The end**: after settling, one consumer per destination drains it: it gets every
  promised SEND (above), never a copy a receipted ACK took, never a copy twice; its
  receipted ACKs of all of them are never late, every instance then counts nothing, and
  a power loss of each leaves an empty log.
- **A browse changes nothing** (only with browses switched on, once the router routes
  them): its MESSAGEs carry no ack header and count as no delivery, and every
  instance's counts are the same after it as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sim.runner import SimFailure

# The frames whose RECEIPT waits until what the connection sent before is durable.
DURABLE = ("SEND", "ACK", "NACK", "DISCONNECT")
# A SEND that could not be placed in time (never forwarded, or forwarded to an instance lost
# before it answered), and an instance's refusal, passed on as its own.
LATE_ERRORS = ("message not stored", "message may not be stored", "queue full", "an earlier frame failed")


def fail(kind: str, detail: str) -> SimFailure:
    return SimFailure(kind, detail)


@dataclass(slots=True)
class Sent:
    """One SEND, by its tag."""

    tag: int
    dest: str
    body: bytes
    amid_at_send: tuple[int, ...]  # each instance's crashes amid a step so far
    promised: bool = False  # its RECEIPT (or a later one of its connection) came
    consumed: bool = False  # an ACK of a copy was sent, or a copy went to ack:auto: it may be gone
    delivered: bool = False


@dataclass(slots=True, eq=False)
class Copy:
    """One stored copy of a SEND: on `instance`, as its message `id`."""

    tag: int
    instance: int
    id: int
    received: int = 0  # MESSAGEs of it clients got
    current: Held | None = None  # the delivery the instance counts as wip
    ack_promised: bool = False


@dataclass(slots=True, eq=False)
class Held:
    """One delivery to a client, until the client settles it or it ends otherwise."""

    serial: int
    sub: str
    key: str
    copy: Copy
    deadline: int | None  # ms: when the instance's ack deadline passes
    live: bool = True  # the router still knows it
    expired: bool = False  # the instance's deadline passed: it let the copy go


@dataclass(slots=True)
class Expect:
    """A RECEIPT a connection waits for. `late`: whether it must say curb-late:true (or
    must not); `unknowable`: whether it may say curb-unconfirmed:true (what it waits for
    may be lost with a link before its instance answers). `acked`: the copies an ACK's
    RECEIPT promises."""

    seq: int
    kind: str
    late: bool
    acked: tuple[Copy, ...] = ()
    unknowable: bool = False


@dataclass(slots=True)
class Sub:
    dest: str
    ack: str
    active: bool = True


@dataclass(slots=True)
class Conn:
    serial: int
    subs: dict[str, Sub] = field(default_factory=dict)
    holding: OrderedDict[str, Held] = field(default_factory=OrderedDict)  # what it believes it holds, by ack id
    order: list[Held] = field(default_factory=list)  # its deliveries, in order (the live ones are the router's)
    expect: dict[str, Expect] = field(default_factory=dict)
    sends: list[tuple[int, int]] = field(default_factory=list)  # (seq, tag) of SENDs not yet promised
    last_receipt: int = -1
    closing: bool = False
    count_dest: str = ""
    counts: dict[str, int] | None = None
    browses: dict[str, str] = field(default_factory=dict)  # browse subscription id -> destination


class RouterChecker:
    """The model, fed by the driver; every method raises SimFailure on a broken invariant.
    `homes[i]` is the destination instance i serves; `ack_timeout_ms` the instances'."""

    def __init__(self, homes: list[str], ack_timeout_ms: int, now: int):
        self.homes = homes
        self.ack_timeout_ms = ack_timeout_ms
        self.now = now
        self.sent: dict[int, Sent] = {}
        self.copies: dict[tuple[int, int], Copy] = {}
        self.conns: dict[int, Conn] = {}
        self.amid = [0] * len(homes)  # each instance's crashes amid a step

    # ---------------------------------------------------------------- frames sent

    def connected(self, serial: int) -> None:
        self.conns[serial] = Conn(serial)

    def subscribed(self, serial: int, seq: int, sub: str, dest: str, ack: str, receipt: str | None) -> None:
        conn = self.conns[serial]
        conn.subs[sub] = Sub(dest, ack)
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "SUBSCRIBE", False)

    def unsubscribed(self, serial: int, seq: int, sub: str, receipt: str | None) -> None:
        """No MESSAGE comes to the subscription after this; what it holds stays held."""
        conn = self.conns[serial]
        conn.subs[sub].active = False
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "UNSUBSCRIBE", False)

    def watching(self, serial: int, dest: str) -> None:
        self.conns[serial].count_dest = dest

    def browsing(self, serial: int, sub: str, dest: str) -> None:
        self.conns[serial].browses[sub] = dest

    def sent_frame(self, serial: int, seq: int, tag: int, dest: str, body: bytes, receipt: str | None) -> None:
        self.sent[tag] = Sent(tag, dest, body, tuple(self.amid))
        conn = self.conns[serial]
        conn.sends.append((seq, tag))
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "SEND", False)

    def settle(self, serial: int, seq: int, kind: str, key: str, receipt: str | None) -> list[str]:
        """An ACK or NACK of the delivery with ack id `key`; returns the ack ids the
        client counts as settled by it (with ack:client an ACK settles every earlier
        delivery of its subscription too)."""
        conn = self.conns[serial]
        named = conn.holding.get(key)
        if named is None:
            raise fail("client model", f"connection {serial} settles {key}, which it does not hold")
        keys, settled = [key], [named]
        if kind == "ACK" and conn.subs[named.sub].ack == "client":
            # Every earlier delivery of the subscription: in the client's eyes those it
            # believes it holds, in the router's those it still has (a late ACK of an
            # earlier one settled nothing there).
            same = [k for k, h in conn.holding.items() if h.sub == named.sub]
            keys = same[: same.index(key) + 1]
            conn.order = [h for h in conn.order if h.live]
            same_live = [h for h in conn.order if h.sub == named.sub]
            settled = same_live[: same_live.index(named) + 1] if named in same_live else []
        for k in keys:
            del conn.holding[k]
        late = not named.live or named.expired
        acked: list[Copy] = []
        if named.live:
            for held in settled:
                held.live = False
                if held.expired:
                    continue  # the instance let it go already: its answer is late
                held.copy.current = None
                if kind == "ACK":
                    self.sent[held.copy.tag].consumed = True
                    acked.append(held.copy)
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, kind, late, tuple(acked), unknowable=True)
        return keys

    def disconnecting(self, serial: int, seq: int, receipt: str | None) -> None:
        conn = self.conns[serial]
        conn.closing = True
        if receipt is not None:
            # Its RECEIPT waits for the ACKs and NACKs before it: curb-unconfirmed:true
            # (promising nothing of them) if a link was lost before its instance answered one.
            conn.expect[receipt] = Expect(seq, "DISCONNECT", False, unknowable=True)

    # ---------------------------------------------------------------- frames received

    def delivered(
        self,
        serial: int,
        sub_id: str,
        key: str,
        instance: int,
        msg_id: int,
        tag: int | None,
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        conn = self.conns[serial]
        where = f"#{tag} (instance {instance} message {msg_id}, {key}) to connection {serial}"
        sub = conn.subs.get(sub_id)
        if sub is None:
            raise fail("MESSAGE on no subscription", f"{where} on {sub_id!r}")
        if not sub.active:
            raise fail("delivered after UNSUBSCRIBE", where)
        sent = self.sent.get(tag) if tag is not None else None
        if sent is None or body != sent.body or headers.get("sim-tag") != str(tag):
            raise fail("damaged delivery", f"{where}: body {body[:32]!r}, sim-tag {headers.get('sim-tag')}")
        if sent.dest != sub.dest or self.homes[instance] != sub.dest:
            raise fail(
                "delivered to the wrong destination",
                f"{where}: sent to {sent.dest!r}, from an instance of {self.homes[instance]!r}, "
                f"subscribed to {sub.dest!r}",
            )
        copy = self._copy(instance, msg_id, sent.tag, where)
        if copy.ack_promised:
            raise fail("receipted ACK undone", where)
        if copy.current is not None:
            holder = copy.current
            raise fail("held by two consumers", f"{where} while connection {holder.serial} holds it as {holder.key}")
        count = int(headers.get("curb-deliveries", "1"))
        bound = copy.received + 1 + self.amid[instance] - sent.amid_at_send[instance]
        if count > bound:
            raise fail(
                "delivery count past its bound",
                f"{where} with curb-deliveries {count}: clients got it {copy.received} times before, and "
                f"{self.amid[instance] - sent.amid_at_send[instance]} crashes of its instance struck amid a step since",
            )
        copy.received += 1
        sent.delivered = True
        if sub.ack == "auto":
            sent.consumed = True
            return
        deadline = self.now + self.ack_timeout_ms if self.ack_timeout_ms else None
        held = Held(serial, sub_id, key, copy, deadline)
        copy.current = held
        conn.holding.pop(key, None)  # a message delivered again keeps its id: it is the newest now
        conn.holding[key] = held
        conn.order.append(held)

    def _copy(self, instance: int, msg_id: int, tag: int, where: str) -> Copy:
        copy = self.copies.get((instance, msg_id))
        if copy is None:
            copy = self.copies[instance, msg_id] = Copy(tag, instance, msg_id)
        elif copy.tag != tag:
            raise fail("message id reused", f"{where}: it was #{copy.tag}")
        return copy

    def browsed(self, serial: int, sub_id: str, tag: int | None, headers: dict[str, str], body: bytes) -> None:
        """A browse's MESSAGE: a SEND's body, of the browsed destination, and no delivery."""
        dest = self.conns[serial].browses[sub_id]
        sent = self.sent.get(tag) if tag is not None else None
        where = f"#{tag} in a browse of {dest!r} by connection {serial}"
        if sent is None or body != sent.body or sent.dest != dest:
            raise fail("damaged browse", f"{where}: body {body[:32]!r}")
        if "ack" in headers:
            raise fail("browse changed something", f"{where} came as a delivery: {sorted(headers)}")

    def receipt(self, serial: int, receipt: str, late: bool, unconfirmed: bool) -> None:
        conn = self.conns[serial]
        expect = conn.expect.pop(receipt, None)
        if expect is None:
            raise fail("unexpected RECEIPT", f"connection {serial} got receipt {receipt!r}, which it never asked for")
        if expect.seq <= conn.last_receipt:
            raise fail("RECEIPTs out of order", f"connection {serial}: {receipt!r} after a later frame's")
        conn.last_receipt = expect.seq
        if late != expect.late or (unconfirmed and not expect.unknowable):
            tags = [c.tag for c in expect.acked]
            raise fail(
                "late RECEIPT wrong",
                f"connection {serial}: the RECEIPT of its {expect.kind} ({receipt}, {tags or ''}) says "
                f"curb-late:{str(late).lower()} curb-unconfirmed:{str(unconfirmed).lower()}, expected "
                f"curb-late:{str(expect.late).lower()}" + ("" if expect.unknowable else " and no curb-unconfirmed"),
            )
        if expect.kind in DURABLE:
            for seq, tag in conn.sends:
                if seq <= expect.seq:
                    self.sent[tag].promised = True
            conn.sends = [(seq, tag) for seq, tag in conn.sends if seq > expect.seq]
        if expect.kind == "ACK" and not late and not unconfirmed:
            for copy in expect.acked:
                copy.ack_promised = True

    def error(self, serial: int, message: str) -> None:
        conn = self.conns[serial]
        if message not in LATE_ERRORS:
            raise fail("unexpected ERROR", f"connection {serial} got ERROR {message!r}")
        conn.closing = True

    def count_update(self, serial: int, headers: dict[str, str], counts: dict[str, int]) -> None:
        for key in ("rdy", "wip"):
            if headers.get(key) != str(counts.get(key)):
                raise fail("./count headers", f"connection {serial}: header {key}:{headers.get(key)}, JSON {counts}")
        self.conns[serial].counts = counts

    # ---------------------------------------------------------------- what ends deliveries

    def gone(self, serial: int) -> None:
        """The client is gone: the router NACKs what it held."""
        for held in self.conns.pop(serial).order:
            self._let_go(held)

    def _let_go(self, held: Held) -> None:
        if held.live:
            held.live = False
            if held.copy.current is held:
                held.copy.current = None

    def link_lost(self, instance: int) -> None:
        """The link consuming from the instance is lost: the router forgets what it
        delivered, and the instance takes it back."""
        for conn in self.conns.values():
            for held in conn.order:
                if held.copy.instance == instance:
                    self._let_go(held)

    def instance_crashed(self, instance: int, amid: bool) -> None:
        self.link_lost(instance)
        self.amid[instance] += amid

    def cut_amid(self, instance: int) -> None:
        """A link of the instance is about to be cut amid a step, a MESSAGE maybe in flight."""
        self.amid[instance] += 1

    def restarted(self, instance: int, found: list[tuple[int, int | None]]) -> None:
        """A restart of the instance found these (message id, tag): no copy a receipted
        ACK took, none under another tag."""
        for msg_id, tag in found:
            copy = self.copies.get((instance, msg_id))
            where = f"#{tag} (instance {instance} message {msg_id}) found after a restart"
            if tag is None or tag not in self.sent:
                raise fail("damaged record after restart", where)
            if copy is not None and copy.tag != tag:
                raise fail("message id reused", f"{where}: it was #{copy.tag}")
            if copy is not None and copy.ack_promised:
                raise fail("receipted ACK undone", where)

    def advance(self, now: int) -> None:
        """The clock is at `now` (ms): every delivery whose instance deadline is due is let
        go by its instance (the router does not know)."""
        self.now = now
        for copy in self.copies.values():
            held = copy.current
            if held is not None and held.deadline is not None and held.deadline <= now:
                held.expired = True
                copy.current = None

    # ---------------------------------------------------------------- checks

    def check_wip(self, instance: int, wip: int) -> None:
        held = sum(1 for c in self.copies.values() if c.instance == instance and c.current is not None)
        if wip != held:
            raise fail(
                "wip count",
                f"instance {instance} says {wip} messages held, the clients hold {held} from it"
                + (" (the router sits on some?)" if wip > held else ""),
            )

    def check_count_views(self, expected: dict[str, dict[str, int]], ending: set[int]) -> None:
        """Every ./count watcher's last counts are `expected`, but for those the router
        is ending (`ending`: it sends them nothing more)."""
        for conn in self.conns.values():
            if conn.closing or conn.counts is None or conn.serial in ending:
                continue
            want = expected[conn.count_dest]
            if {key: conn.counts.get(key) for key in want} != want:
                raise fail(
                    "./count stale",
                    f"connection {conn.serial} last got {conn.counts} for {conn.count_dest!r}, "
                    f"the instances say {want}",
                )

    def missing(self, dest: str, got: set[int]) -> list[int]:
        """The promised SENDs of `dest` never consumed that a drain which got `got` (tags)
        did not get."""
        return [
            tag for tag, s in self.sent.items() if s.dest == dest and s.promised and not s.consumed and tag not in got
        ]

    def unanswered(self) -> list[str]:
        return [r for conn in self.conns.values() if not conn.closing for r in conn.expect]
