"""The model of what the broker promised, and the invariants over it.

The driver tells the checker every frame a client sent, every frame it got, every
connection that went, every move of the clock and every crash and restart; the checker
keeps, for each message, what may and what must be true of it, and raises `SimFailure`
the moment something else is:

- a SEND whose RECEIPT came, or that a later receipt on its connection covered (a NACK's,
  a touch's, a DISCONNECT's, a late one's: "everything the connection sent before is on
  disk"), is found by every restart until an ACK took it, and delivered at the end;
- an ACK whose RECEIPT came, or that such a later receipt covered, is never undone: the
  message is never found or delivered again;
- a message is held by at most one consumer at a time, and by none once its ack
  deadline passed (the checker keeps each delivery's deadline: its subscription's
  timeout or the broker's, moved by touches), its holder settled it or its connection
  went; the queue's wip count is what the checker holds, and its rdy count the live
  messages it does not;
- an ACK, NACK or touch of a message whose deadline passed on that connection changes
  nothing and its RECEIPT says `curb-late:true`; one of a message still held does not;
- RECEIPTs come in frame order, and the only ERROR is the refusal of a SEND (queue full);
- every delivery is a message sent, byte for byte with its headers, under one id for
  good, never a refused one; its delivery count goes up by one each time in a run,
  `redelivered` with it, and after a crash is above the count a NACK's covered receipt
  made durable;
- a message a restart did not find (lost with its unsynced SEND, or taken by an ACK)
  never comes back.

Between a crash and the next restart's full read the model is unsure which unpromised
messages survived; the read makes it exact again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

LIVE, ACKED, GONE, REFUSED = "live", "acked", "gone", "refused"
COVERING = frozenset(("NACK", "touch", "DISCONNECT"))


class SimFailure(Exception):
    """An invariant broke. `kind` groups failures of one sort across seeds."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def fail(kind: str, detail: str) -> SimFailure:
    return SimFailure(kind, detail)


def body_for(tag: int, size: int) -> bytes:
    """A body that names its message (#tag#) and whose filler differs per message."""
    head = b"#%d#" % tag
    unit = b"%d\n\x00pad " % tag
    fill = unit * ((size - len(head)) // len(unit) + 1)
    return head + fill[: max(0, size - len(head))]


def tag_of(body: bytes) -> int | None:
    end = body.find(b"#", 1)
    digits = body[1:end]
    return int(digits) if body.startswith(b"#") and end > 0 and digits.isdigit() else None


@dataclass(slots=True)
class Msg:
    """What the checker knows of one SEND."""

    tag: int
    body: bytes
    state: str = LIVE
    stored: bool = False  # its RECEIPT came, or a covering one: it must survive until ACKed
    ack_promised: bool = False  # an ACK of it was receipted: it never comes back
    id: int | None = None
    holder: int | None = None  # the connection holding it now
    deadline: int | None = None  # ms; None: no ack deadline
    count: int = 0  # its delivery count as last delivered in this run (0: not yet)
    durable_count: int = 0  # a count a receipt made durable: later deliveries are above it


@dataclass(slots=True)
class Effect:
    """A frame that changed the log, until a receipt covers it."""

    seq: int
    kind: str  # SEND, ACK, NACK
    tags: tuple[int, ...]
    count: int = 0  # NACK: the delivery count it put back


@dataclass(slots=True)
class Expect:
    """A RECEIPT a connection waits for."""

    seq: int
    kind: str
    tags: tuple[int, ...]
    late: bool


@dataclass(slots=True)
class Conn:
    """One connection as the checker sees it."""

    serial: int
    ack_mode: str = ""
    timeout_ms: int = 0
    holding: OrderedDict[int, None] = field(default_factory=OrderedDict)  # tags, in delivery order
    late: set[int] = field(default_factory=set)  # tags whose deadline passed while held here
    effects: list[Effect] = field(default_factory=list)
    expect: dict[str, Expect] = field(default_factory=dict)
    last_receipt: int = -1
    refused: bool = False  # a SEND was refused: its ERROR is the one expected


class Checker:
    """The model, fed by the driver; every method raises SimFailure on a broken invariant."""

    def __init__(self, ack_timeout_ms: int, now: int):
        self.ack_timeout_ms = ack_timeout_ms
        self.messages: dict[int, Msg] = {}
        self.conns: dict[int, Conn] = {}
        self.now = now  # ms

    # ---------------------------------------------------------------- connections

    def connected(self, serial: int) -> None:
        self.conns[serial] = Conn(serial)

    def subscribed(self, serial: int, ack_mode: str, timeout_ms: int | None) -> None:
        conn = self.conns[serial]
        conn.ack_mode = ack_mode
        conn.timeout_ms = 0 if ack_mode == "auto" else self.ack_timeout_ms if timeout_ms is None else timeout_ms

    def gone(self, serial: int) -> None:
        """The connection is gone: what it held is rdy again, its receipts never come."""
        for tag in list(self.conns[serial].holding):
            self._release(self.messages[tag])
        del self.conns[serial]

    # ---------------------------------------------------------------- frames sent

    def sent(self, serial: int, seq: int, tag: int, body: bytes, receipt: str | None) -> None:
        self.messages[tag] = Msg(tag, body)
        conn = self.conns[serial]
        conn.effects.append(Effect(seq, "SEND", (tag,)))
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "SEND", (tag,), False)

    def refused(self, serial: int, tag: int, receipt: str | None) -> None:
        """The SEND just sent ended the connection: it was refused, nothing stored."""
        msg = self.messages[tag]
        msg.state = REFUSED
        conn = self.conns[serial]
        conn.refused = True
        conn.effects.pop()
        if receipt is not None:
            del conn.expect[receipt]

    def settle(self, serial: int, seq: int, kind: str, tag: int, receipt: str | None, touch_ms: int = 0) -> None:
        """An ACK, NACK or touch of `tag` by this connection (kind ACK, NACK, touch)."""
        conn = self.conns[serial]
        msg = self.messages[tag]
        late = msg.holder != serial
        if late and tag not in conn.late:
            raise fail("client model", f"#{tag} settled by connection {serial}, which never held it")
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, kind, (tag,), late)
        if late:
            return
        if kind == "touch":
            msg.deadline = self.now + touch_ms
            return
        tags = [tag]
        if conn.ack_mode == "client":
            tags = list(conn.holding)
            tags = tags[: tags.index(tag) + 1]
        counts = []
        for settled in tags:
            m = self.messages[settled]
            counts.append(m.count)
            self._release(m)
            if kind == "ACK":
                m.state = ACKED
        if receipt is not None:
            conn.expect[receipt].tags = tuple(tags)
        if kind == "ACK":
            conn.effects.append(Effect(seq, "ACK", tuple(tags)))
        else:
            for settled, count in zip(tags, counts, strict=True):
                conn.effects.append(Effect(seq, "NACK", (settled,), count))

    def disconnecting(self, serial: int, seq: int, receipt: str) -> None:
        self.conns[serial].expect[receipt] = Expect(seq, "DISCONNECT", (), False)

    # ---------------------------------------------------------------- frames received

    def receipt(self, serial: int, receipt: str, late: bool) -> None:
        conn = self.conns[serial]
        expect = conn.expect.pop(receipt, None)
        if expect is None:
            raise fail("unexpected RECEIPT", f"connection {serial} got receipt {receipt!r}, which it never asked for")
        if expect.seq <= conn.last_receipt:
            raise fail("RECEIPTs out of order", f"connection {serial}: {receipt!r} after a later frame's")
        conn.last_receipt = expect.seq
        if late != expect.late:
            raise fail(
                "late RECEIPT wrong",
                f"connection {serial}: {expect.kind} of #{expect.tags[0]} was {'late' if expect.late else 'in time'}, "
                f"its RECEIPT says curb-late:{str(late).lower()}",
            )
        if expect.kind == "SEND":
            self.messages[expect.tags[0]].stored = True
        elif expect.kind == "ACK" and not late:
            for tag in expect.tags:
                self.messages[tag].ack_promised = True
        if expect.kind in COVERING or late:
            self._cover(conn, expect.seq)
        else:
            conn.effects = [e for e in conn.effects if e.seq != expect.seq]

    def _cover(self, conn: Conn, seq: int) -> None:
        """Everything the connection sent up to frame `seq` is on disk."""
        kept = []
        for effect in conn.effects:
            if effect.seq > seq:
                kept.append(effect)
                continue
            for tag in effect.tags:
                msg = self.messages[tag]
                if effect.kind == "SEND":
                    msg.stored = True
                elif effect.kind == "ACK":
                    msg.ack_promised = True
                else:
                    msg.durable_count = max(msg.durable_count, effect.count)
        conn.effects = kept

    def error(self, serial: int, message: str) -> None:
        conn = self.conns[serial]
        if not (conn.refused and message in ("queue full", "message too large")):
            raise fail("unexpected ERROR", f"connection {serial} got ERROR {message!r}")

    def delivered(self, serial: int, tag: int | None, msg_id: int, headers: dict[str, str], body: bytes) -> None:
        msg = self.messages.get(tag) if tag is not None else None
        if tag is None or msg is None or body != msg.body or headers.get("sim-tag") != str(tag):
            raise fail("damaged delivery", f"message {msg_id}: body {body[:32]!r}, sim-tag {headers.get('sim-tag')}")
        self._check_id(msg, msg_id)
        if msg.state != LIVE:
            kind = {
                REFUSED: "refused SEND delivered",
                ACKED: "delivered after its ACK in the same run",
                GONE: "a message gone for good came back",
            }[msg.state]
            if msg.ack_promised:
                kind = "receipted ACK undone"
            raise fail(kind, f"#{tag} (message {msg_id}) to connection {serial}")
        if msg.holder is not None:
            raise fail(
                "held by two consumers",
                f"#{tag} (message {msg_id}) delivered to connection {serial} while connection {msg.holder} "
                f"holds it, its deadline {'none' if msg.deadline is None else msg.deadline - self.now} ms away",
            )
        count = int(headers.get("curb-deliveries", "1"))
        if (headers.get("redelivered") == "true") != (count > 1):
            raise fail("redelivered header", f"#{tag}: redelivered {headers.get('redelivered')}, count {count}")
        if msg.count and count != msg.count + 1:
            raise fail("delivery count", f"#{tag}: delivered with count {count} after {msg.count} in this run")
        if not msg.count and count <= msg.durable_count:
            raise fail(
                "delivery count went back",
                f"#{tag}: count {count} after a restart, though a receipt made {msg.durable_count} durable",
            )
        msg.count = count
        conn = self.conns[serial]
        if conn.ack_mode == "auto":
            msg.state = ACKED  # done once handed over
            return
        msg.holder = serial
        msg.deadline = self.now + conn.timeout_ms if conn.timeout_ms else None
        conn.holding[tag] = None
        conn.late.discard(tag)

    def _check_id(self, msg: Msg, msg_id: int) -> None:
        if msg.id is None:
            msg.id = msg_id
        elif msg.id != msg_id:
            raise fail("message id changed", f"#{msg.tag} was message {msg.id}, now {msg_id}")

    # ---------------------------------------------------------------- time and crashes

    def advance(self, now: int) -> None:
        """The clock is at `now` (ms): every delivery whose deadline is due is released."""
        self.now = now
        for msg in self.messages.values():
            if msg.holder is not None and msg.deadline is not None and msg.deadline <= now:
                self.conns[msg.holder].late.add(msg.tag)
                self._release(msg)

    def _release(self, msg: Msg) -> None:
        if msg.holder is not None:
            self.conns[msg.holder].holding.pop(msg.tag, None)
        msg.holder = msg.deadline = None

    def crash(self) -> None:
        self.conns.clear()
        for msg in self.messages.values():
            msg.holder = msg.deadline = None
            msg.count = 0

    def restarted(self, found: dict[int, tuple[int, bytes]]) -> None:
        """A full read after recovery found these messages (tag -> id, body): check them
        against the promises and make the model exact again."""
        for tag, (msg_id, body) in found.items():
            msg = self.messages.get(tag)
            if msg is None or body != msg.body:
                raise fail("damaged record after restart", f"message {msg_id}: {body[:32]!r}")
            self._check_id(msg, msg_id)
            if msg.ack_promised:
                raise fail("receipted ACK undone", f"#{tag} (message {msg_id}) is in the log after a restart")
            if msg.state in (GONE, REFUSED):
                raise fail(
                    "refused SEND stored" if msg.state == REFUSED else "a message gone for good came back",
                    f"#{tag} (message {msg_id}) is in the log after a restart",
                )
            msg.state = LIVE
        for msg in self.messages.values():
            if msg.tag in found or msg.state in (GONE, REFUSED):
                continue
            if msg.state == LIVE and msg.stored:
                raise fail(
                    "receipted SEND lost",
                    f"#{msg.tag} (message {msg.id}) is not in the log after a restart",
                )
            msg.state = GONE

    # ---------------------------------------------------------------- checks

    def live(self) -> set[int]:
        return {tag for tag, msg in self.messages.items() if msg.state == LIVE}

    def check_counts(self, counts: dict[str, int]) -> None:
        """The queue's counts against the model: wip is what the checker holds, rdy the
        rest of the live messages."""
        live = held = 0
        for msg in self.messages.values():
            if msg.state == LIVE:
                live += 1
                held += msg.holder is not None
        if counts["wip"] != held:
            raise fail(
                "wip count",
                f"the queue says {counts['wip']} held, the checker {held}"
                + (" (a deadline passed without releasing its message?)" if counts["wip"] > held else ""),
            )
        if counts["rdy"] != live - held:
            raise fail("rdy count", f"the queue says {counts['rdy']} rdy, the checker {live - held}")

    def unanswered(self) -> list[str]:
        """Receipts still owed to open connections."""
        return [r for conn in self.conns.values() for r in conn.expect]
