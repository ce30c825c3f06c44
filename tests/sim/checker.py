"""The model of what the broker promised, and the invariants over it.

The driver tells the checker every frame a client sent, every frame it got, every
connection that went, every move of the clock and every crash and restart; the checker
keeps, for each message, what may and what must be true of it, and raises `SimFailure`
the moment something else is:

- a SEND whose RECEIPT came, or that a later receipt on its connection covered (a NACK's,
  a touch's, a DISCONNECT's, a late one's: "everything the connection sent before is on
  disk"), is found by every restart until an ACK took it (as a queued message or a dead
  letter), and delivered at the end;
- an ACK whose RECEIPT came, or that such a later receipt covered, is never undone: the
  message is never found or delivered again (an ACK on `./dead` deletes a dead letter
  the same way);
- a message is held by at most one consumer at a time, and by none once its ack
  deadline passed (the checker keeps each delivery's deadline: its subscription's
  timeout or the broker's, moved by touches), its holder settled it or its connection
  went; the queue's wip count is what the checker holds, and the queue's rdy, delayed,
  wip and dead counts add up to the messages the checker has queued or dead (while the
  log still walks past what an ACK up to an id took, at least to them), and once the
  broker is idle every ./count watcher's last MESSAGE says what the counts do;
- an ACK, NACK or touch of a message whose deadline passed on that connection changes
  nothing and its RECEIPT says `curb-late:true`; one of a message still held does not;
- nothing is delivered before it is due (a SEND's `curb-delay`, `AMQ_SCHEDULED_DELAY`
  or `AMQ_SCHEDULED_TIME`; a NACK's `curb-delay`; the broker's redelivery delay, grown
  with the count), nor at or after it expired (`expires`, `curb-ttl`): the clock is the
  simulator's, so both are exact;
- a message that comes back (NACK, deadline, disconnect) after being delivered
  `max_deliveries` times is a dead letter at once: never delivered to an ordinary
  subscriber again, never lost, served by `./dead` with `curb-dead-reason:max-deliveries`
  (an expired one with `expired`); a MESSAGE never carries a count past the limit; a
  bounce (NACK `curb-undelivered`) takes its delivery back from the count, and until it
  is durable a crash may keep the count it lowered (a copy compaction writes a held
  message's count as it is), so one bounced at the limit may be buried after a crash;
- a redrive makes every dead letter no `./dead` subscriber holds a queued message again,
  its count reset (the next delivery says 1), and loses none; which it moved is read
  from the broker (a message the model has queued may be a dead letter already, met at
  the limit or expired), and one it moved may be dead again after a crash until the
  redrive is durable (a power loss may keep the burial's write and lose the redrive's);
- RECEIPTs come in frame order, and the only ERROR is the refusal of a SEND (queue full);
- every delivery is a message sent, byte for byte with its headers, under one id for
  good, never a refused one; its delivery count goes up by one each time in a run,
  `redelivered` with it, and after a crash is above the count a covered NACK made durable;
- a message a restart did not find (lost with its unsynced SEND, or taken by an ACK)
  never comes back;
- ACK `curb-upto:n` takes every message with an id up to n at once, wherever it is
  (queued, delayed, held by any connection, a dead letter): none is delivered again, a
  holder's later ACK or NACK of one gets the ERROR of an id not wip there (or, its
  deadline having passed there before, a `curb-late` RECEIPT); n above every id assigned
  is an ERROR; its RECEIPT is never undone (the watermark never goes back), and a crash
  keeps all it took or none (each message it took that had to survive is back exactly
  when the recovered watermark is below it); message ids are never reused, across
  crashes too; ./count stops counting what it took (kept pending: `note`);
- a redrive with `curb-count:n` moves at most n dead letters, none a ./dead subscriber
  holds, none that is not dead, and no fewer than it can (an expired one it moves the
  queue buries again at once); its RECEIPT, once come, means they moved: after a crash
  they are queued, their count reset;
- a browse (`browser:true`, `curb-from-id`, `curb-to-id`) returns only messages live
  while it ran with ids in its range, each once, as stored, with no ack header (it
  changes nothing: no delivery, no count, no wip, which the counts and the delivery
  counts check), every message live and unchanged all along, and an end marker whose
  `curb-last-id` is the range's end (the SUBSCRIBE's, or the highest id on disk then);
  a browse of ./dead returns only dead letters (with their reason), each once, and every
  one dead and unchanged all along;
- no MESSAGE comes to a subscription after its UNSUBSCRIBE (what it holds stays held,
  and may be ACKed or NACKed);
- a `./count` MESSAGE's headers say what its JSON says, its version rises, and once
  the broker is idle every subscriber's last one is the queue's counts;
- under disk faults (EIO on writes or syncs, no room to grow the file): a SEND, ACK,
  NACK, DISCONNECT or redrive that cannot be stored gets an ERROR "... not stored"
  instead of its RECEIPT, never a RECEIPT; a broken log stops the broker (the simulator
  restarts it), and a failed sync made nothing durable; SENDs not yet promised may be
  lost (or, from a write that failed in part, found after a restart), receipted ones
  never;
- a `./dead` subscription's ack deadline (its `curb-ack-timeout`, else the broker's;
  workload.DEAD_ACK_TIMEOUTS) puts a dead letter held past it back among the dead, never
  in the queue, its count unchanged; a touch moves it; a later ACK, NACK or touch of it
  by that connection changes nothing (an ACK deletes nothing) and its RECEIPT says
  `curb-late:true`.

Between a crash and the next restart's full read the model is unsure which unpromised
changes survived (a SEND, an ACK, a burial, a NACK's due time, a redrive); the read
makes it exact again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from sim.runner import SimFailure
from sim.workload import Config

LIVE, ACKED, GONE, REFUSED, DEAD = "live", "acked", "gone", "refused", "dead"
# A SEND the log may or may not have stored: accepted, then answered "message not
# stored" after a disk fault (a write that failed may have reached the disk in part). It
# is never owed a delivery; the next restart's read says which it is.
UNSURE = "unsure"
LIMIT, EXPIRED = "max-deliveries", "expired"
COVERING = frozenset(("NACK", "bounce", "touch", "DISCONNECT"))


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
class Found:
    """A message a full read of the log found after a restart."""

    id: int
    body: bytes
    dead: str = ""  # a dead letter's reason
    deliveries: int = 0


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
    durable_count: int = 0  # a count a receipt or a sync made durable: later deliveries are above it
    returned: int = 0  # its count when it last came back in this run (written with its return)
    due: int = 0  # wall ms before which it is not delivered
    durable_due: int = 0  # a due time a receipt made durable (the SEND's, a covered NACK's)
    expires: int = 0  # wall ms from which it is never delivered; 0: never
    reason: str = ""  # a dead letter's reason
    dead_promised: bool = False  # its burial is durable (the NACK that buried it was covered)
    was_limit_dead: bool = False  # buried for the delivery limit at some time
    fresh: bool = False  # redriven: its next delivery says 1
    redrives: int = 0  # how often it was redriven: a NACK from before a redrive counts no more
    # A redrive moved it from the dead letters: it was in the log, whatever its count says
    # now (a redrive of a message only maybe dead, met expired, does not say so: it may
    # still be waiting to be written, and a disk fault may refuse it).
    redriven_dead: bool = False
    # Held (or ACKed without a durable receipt) at a crash with its count at the limit: if
    # that count reached the disk, the queue buries it when it meets it.
    spent: bool = False
    redrive_unsure: bool = False  # redriven, not yet durably: a crash may leave it dead
    # A dead letter, expired, that a redrive may have moved and the queue, meeting
    # it expired, buried again at once: its count may be reset and its reason "expired".
    reason_unsure: bool = False
    # Redriven (not yet durably) from a burial at the delivery limit: a crash may lose the
    # redrive's reset of the count while a copy compaction made keeps the count at the
    # limit (a copy writes the count as it is in memory), so the queue may bury it again.
    redrive_at_limit: bool = False
    # Its last bounce, until durable: the bounce lowered the count in memory (to the
    # effect's count), but a copy compaction made while it was held may have written the
    # count before it (a copy writes the count as it is in memory), which a crash keeps.
    bounce: Effect | None = None


@dataclass(slots=True)
class Effect:
    """A frame that changed the log, until a receipt covers it."""

    seq: int
    kind: str  # SEND, ACK, NACK, REDRIVE
    tags: tuple[int, ...]
    count: int = 0  # NACK: the delivery count it put back
    due: int = 0  # NACK: the due time it gave the message
    buried: bool = False  # NACK: it made the message a dead letter
    redrives: int = 0  # NACK: the message's redrives then


@dataclass(slots=True)
class Expect:
    """A RECEIPT a connection waits for."""

    seq: int
    kind: str
    tags: tuple[int, ...]
    late: bool


@dataclass(slots=True)
class Browsing:
    """A browse a connection runs: of the queue (ids first..last; `last` the SUBSCRIBE's
    curb-to-id or the highest id on disk then) or of the dead letters. `must`: the
    messages it must return unless they changed while it ran (tag -> their state and
    redrives then); `may`: those it may return (live, or dead for a dead browse, at some
    time while it ran); `got`: those it returned."""

    dead: bool
    first: int
    last: int
    must: dict[int, tuple[str, int]]
    may: set[int]
    got: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Conn:
    """One connection as the checker sees it."""

    serial: int
    ack_mode: str = ""
    dead: bool = False  # subscribed to ./dead
    timeout_ms: int = 0
    holding: OrderedDict[int, None] = field(default_factory=OrderedDict)  # tags, in delivery order
    late: set[int] = field(default_factory=set)  # tags whose deadline passed while held here
    effects: list[Effect] = field(default_factory=list)
    expect: dict[str, Expect] = field(default_factory=dict)
    last_receipt: int = -1
    refused: bool = False  # a SEND was refused: its ERROR is the one expected
    error_expected: str = ""  # an ERROR its last frame must get (a part of its message)
    upto_taken: set[int] = field(default_factory=set)  # tags it held that an ACK up to an id took
    paused: set[str] = field(default_factory=set)  # its subscriptions UNSUBSCRIBEd: "queue", "dead"
    browses: dict[str, Browsing] = field(default_factory=dict)  # by subscription id
    counts: dict[str, int] | None = None  # the last ./count MESSAGE's counts
    count_version: int = 0
    closing: bool = False  # it sent DISCONNECT, or a frame its ERROR answers: it takes nothing more


class Checker:
    """The model, fed by the driver; every method raises SimFailure on a broken invariant.
    `now` is the simulated monotonic clock in ms, `wall` the wall clock the log keeps due
    and expiry times by (the simulated clock's `wall_ms`, which the broker and the log
    read too)."""

    def __init__(self, cfg: Config, now: int, wall: Callable[[], int]):
        self.cfg = cfg
        self.messages: dict[int, Msg] = {}
        self.conns: dict[int, Conn] = {}
        self.now = now
        self.wall_clock = wall
        self.id_floor = 0  # the highest message id assigned so far, in any run
        self.upto_durable = 0  # the highest ACK up to an id whose RECEIPT came
        # ACKs up to an id since the last restart: (id, the messages it took that had to
        # survive a crash until then); a crash keeps the watermark, and so all of them, or not.
        self.open_uptos: list[tuple[int, list[int]]] = []
        self.disk_trouble = False  # a disk fault refused or broke something: "... not stored" may come
        self.dead_timeouts = False  # ./dead subscriptions have an ack deadline (workload.DEAD_ACK_TIMEOUTS)

    @property
    def wall(self) -> int:
        return self.wall_clock()

    # ---------------------------------------------------------------- connections

    def connected(self, serial: int) -> None:
        self.conns[serial] = Conn(serial)

    def subscribed(self, serial: int, ack_mode: str, timeout_ms: int | None, dead: bool = False) -> None:
        conn = self.conns[serial]
        conn.ack_mode, conn.dead = ack_mode, dead
        if dead and not self.dead_timeouts:
            conn.timeout_ms = 0  # ./dead without ack deadlines (workload.DEAD_ACK_TIMEOUTS off)
        elif ack_mode == "auto":
            conn.timeout_ms = 0
        else:
            conn.timeout_ms = self.cfg.ack_timeout_ms if timeout_ms is None else timeout_ms

    def unsubscribed(self, serial: int, seq: int, receipt: str | None, which: str) -> None:
        """UNSUBSCRIBE of the queue's ("queue") or the dead letters' ("dead")
        subscription: no delivery to it after this; what it holds stays held."""
        conn = self.conns[serial]
        conn.paused.add(which)
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "UNSUBSCRIBE", (), False)

    def gone(self, serial: int) -> None:
        """The connection is gone: what it held comes back, its receipts never come."""
        for tag in list(self.conns[serial].holding):
            self._come_back(self.messages[tag], None)
        del self.conns[serial]

    # ---------------------------------------------------------------- frames sent

    def sent(
        self, serial: int, seq: int, tag: int, body: bytes, receipt: str | None, due: int = 0, expires: int = 0
    ) -> None:
        """A SEND, with the wall times its headers asked for (0: none)."""
        self.messages[tag] = Msg(tag, body, due=due, durable_due=due, expires=expires)
        conn = self.conns[serial]
        conn.effects.append(Effect(seq, "SEND", (tag,)))
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "SEND", (tag,), False)

    def assigned(self, tag: int, msg_id: int) -> None:
        """The broker took the SEND and gave it this id: ids are never reused and never
        go back, across crashes too."""
        if msg_id <= self.id_floor:
            raise fail("message id reused", f"#{tag} got id {msg_id}; ids up to {self.id_floor} were assigned before")
        self.id_floor = msg_id
        self.messages[tag].id = msg_id
        for conn in self.conns.values():
            for b in conn.browses.values():
                if not b.dead and b.first <= msg_id <= b.last:
                    b.may.add(tag)  # a browse reaching past the ids on disk returns it, once written

    def refused(self, serial: int, tag: int, receipt: str | None, broken: bool = False) -> None:
        """The SEND just sent ended the connection: it was refused, nothing stored; or
        (`broken`: a disk fault broke the log as it wrote it, and the ERROR says "message
        may not be stored") it may be on disk, and then delivered."""
        msg = self.messages[tag]
        msg.state = UNSURE if broken else REFUSED
        conn = self.conns[serial]
        conn.refused = True
        conn.effects.pop()
        if receipt is not None:
            del conn.expect[receipt]

    def settle(
        self,
        serial: int,
        seq: int,
        kind: str,
        tag: int,
        receipt: str | None,
        touch_ms: int = 0,
        delay_ms: int | None = None,
    ) -> None:
        """An ACK, NACK or touch of `tag` by this connection (kind ACK, NACK, touch, or
        bounce: a NACK with curb-undelivered:true); `delay_ms`: the NACK's curb-delay."""
        conn = self.conns[serial]
        msg = self.messages[tag]
        late = msg.holder != serial
        if late and tag not in conn.late and tag in conn.upto_taken:
            # An ACK up to an id took it from this connection: the ERROR of an id not wip
            # here, and the connection closes (docs/guide.md: ACK up to an id).
            conn.error_expected = "not awaiting ACK or NACK"
            return
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
        for settled in tags:
            m = self.messages[settled]
            if kind == "ACK":
                self._release(m)
                m.state = ACKED
            else:
                bounced = kind == "bounce" and not conn.dead
                if bounced:  # undelivered: uncounted, rdy at once (a dead letter's goes back
                    # among the dead, as its NACK would)
                    bounced = m.count > 0  # it lowered a count
                    m.count = max(0, m.count - 1)
                    delay_ms = 0
                count = m.count
                self._come_back(m, delay_ms)
                effect = Effect(seq, "NACK", (settled,), count, m.due, m.state == DEAD, m.redrives)
                conn.effects.append(effect)
                if bounced:
                    m.bounce = effect
        if receipt is not None:
            conn.expect[receipt].tags = tuple(tags)
        if kind == "ACK":
            conn.effects.append(Effect(seq, "ACK", tuple(tags)))

    def disconnecting(self, serial: int, seq: int, receipt: str | None) -> None:
        conn = self.conns[serial]
        conn.closing = True
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "DISCONNECT", (), False)

    def redrive(self, serial: int, seq: int, receipt: str | None, count: int | None, moved_ids: set[int]) -> None:
        """SEND ./redrive, of all (`count` None) or with curb-count: `moved_ids` are the
        dead letters the broker moved (what its dead letters lost in the frame). At most
        `count`, none a ./dead subscriber holds, none that is not (or may not be) a dead
        letter, and no fewer than it could: the oldest first is the broker's to order.
        Which it moved is read from the broker, not guessed: a message the model has
        queued may be a dead letter already (met at the limit or expired), and one the
        redrive moved is, until the redrive is durable, dead again after a crash that
        kept its burial and lost the redrive."""
        wall = self.wall
        by_id = {msg.id: msg for msg in self.messages.values() if msg.id is not None}
        where = f"redrive of {'all' if count is None else count} by connection {serial}"
        moved = []
        for msg_id in sorted(moved_ids):
            found = by_id.get(msg_id)
            if found is None:
                raise fail("redrive moved a message never sent", f"{where}: id {msg_id}")
            moved.append(found)
        free = [m for m in self.messages.values() if m.state == DEAD and m.holder is None]
        maybe = [
            m
            for m in self.messages.values()
            if m.state in (LIVE, UNSURE) and m.holder is None and (m.spent or (m.expires and wall >= m.expires))
        ]
        for msg in moved:
            if msg.state == DEAD and msg.holder is not None:
                raise fail("redrive moved a held dead letter", f"{where}: #{msg.tag} held by {msg.holder}")
            if msg not in free and msg not in maybe:
                raise fail("redrive moved a message that is not dead", f"{where}: #{msg.tag} is {msg.state}")
        if count is not None and len(moved) > count:
            raise fail("redrive moved more than curb-count", f"{where}: moved {len(moved)}")
        # An expired dead letter it moved the queue buries again at once (it meets it
        # expired): it is not among the moved, and is dead still.
        reburied = [m for m in free + maybe if m.expires and wall >= m.expires and m not in moved]
        if len(moved) + len(reburied) < (len(free) if count is None else min(count, len(free))):
            raise fail(
                "redrive moved fewer than it could",
                f"{where}: moved {len(moved)} of {len(free)} dead letters no one holds"
                f" (e.g. #{free[0].tag}, message {free[0].id})",
            )
        for msg in reburied:
            msg.count = msg.durable_count = msg.returned = 0
            msg.reason_unsure = msg.state == DEAD
            # Its redrive's rewrite and its burial again are two writes: a crash between
            # them leaves it queued, the burial before no longer binding.
            msg.dead_promised = False
            msg.redrives += 1
        tags = []
        for msg in moved:
            msg.redrive_at_limit = msg.reason == LIMIT or (msg.state == LIVE and msg.spent)
            msg.state, msg.reason = LIVE, ""
            msg.count = msg.durable_count = msg.returned = msg.due = msg.durable_due = 0
            msg.fresh = msg.redrive_unsure = msg.redriven_dead = True
            msg.dead_promised = msg.spent = False
            msg.redrives += 1
            tags.append(msg.tag)
            self._now_live(msg)
        conn = self.conns[serial]
        conn.effects.append(Effect(seq, "REDRIVE", tuple(tags)))
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "REDRIVE", tuple(tags), False)

    def redrive_interrupted(self) -> None:
        """A crash struck amid a redrive: any dead letter no one held may have
        moved, and its reset may reach the disk; the restart's read says which did."""
        for msg in self.messages.values():
            if msg.state == DEAD and msg.holder is None:
                msg.redrive_at_limit = msg.reason == LIMIT
                msg.count = msg.durable_count = msg.returned = msg.due = msg.durable_due = 0
                msg.redrive_unsure = msg.redriven_dead = True
                msg.dead_promised = False
                msg.redrives += 1

    def disk_fault(self) -> None:
        """The disk failed a write or a sync, or had no room: the log may refuse (or
        lose with a broken write) the SENDs it had not yet stored, and not every such
        connection hears of it (one that sent DISCONNECT, or went): every SEND not yet
        promised and never delivered may or may not be in the log from here on."""
        self.disk_trouble = True
        for msg in self.messages.values():
            if msg.state == LIVE and not msg.stored and msg.holder is None and not msg.count and not msg.redriven_dead:
                msg.state = UNSURE

    def ack_upto(self, serial: int, seq: int, upto: int, receipt: str | None, last_id: int) -> None:
        """ACK curb-upto: every message with an id up to `upto` not yet acknowledged is
        acknowledged, wherever it is (queued, delayed, held by any connection, a dead
        letter); `upto` above the highest id assigned (`last_id`) is an ERROR."""
        conn = self.conns[serial]
        if upto > last_id:
            conn.error_expected = "curb-upto"
            return
        tags = []
        for msg in self.messages.values():
            if msg.id is not None and msg.id <= upto and msg.state in (LIVE, DEAD, UNSURE):
                if msg.holder is not None:
                    self.conns[msg.holder].upto_taken.add(msg.tag)
                self._release(msg)
                msg.state = ACKED
                tags.append(msg.tag)
        self.open_uptos.append((upto, [t for t in tags if self.messages[t].stored]))
        conn.effects.append(Effect(seq, "UPTO", tuple(tags), count=upto))
        if receipt is not None:
            conn.expect[receipt] = Expect(seq, "UPTO", tuple(tags), False)

    # ---------------------------------------------------------------- browses and ./count

    def browse_started(self, serial: int, sub: str, first: int, last: int) -> None:
        """A browse of the queue, ids first..last."""
        must = {
            m.tag: (m.state, m.redrives)
            for m in self.messages.values()
            if m.state == LIVE and m.id is not None and first <= m.id <= last
        }
        # One a disk fault left unsure may be stored after all: the browse may return it
        # (and a delivery may show it stored before the browse's MESSAGE of it comes).
        unsure = {
            m.tag for m in self.messages.values() if m.state == UNSURE and m.id is not None and first <= m.id <= last
        }
        self.conns[serial].browses[sub] = Browsing(False, first, last, must, set(must) | unsure)

    def dead_browse_started(self, serial: int, sub: str) -> None:
        wall = self.wall
        must = {m.tag: (m.state, m.redrives) for m in self.messages.values() if m.state == DEAD}
        may = set(must) | {
            m.tag
            for m in self.messages.values()
            if m.state == LIVE and m.holder is None and (m.spent or (m.expires and wall >= m.expires))
        }
        self.conns[serial].browses[sub] = Browsing(True, 0, 0, must, may)

    def _now_live(self, msg: Msg) -> None:
        for conn in self.conns.values():
            for b in conn.browses.values():
                if not b.dead:
                    b.may.add(msg.tag)

    def _now_dead(self, msg: Msg) -> None:
        for conn in self.conns.values():
            for b in conn.browses.values():
                if b.dead:
                    b.may.add(msg.tag)

    def browsed(
        self, serial: int, sub: str, tag: int | None, msg_id: int, headers: dict[str, str], body: bytes
    ) -> None:
        """A MESSAGE of a browse: a message sent, byte for byte, in range, live (or dead,
        for a dead browse) while the browse ran, once, and no delivery (no ack header)."""
        b = self.conns[serial].browses[sub]
        msg = self.messages.get(tag) if tag is not None else None
        if tag is None or msg is None or body != msg.body or headers.get("sim-tag") != str(tag):
            raise fail("damaged browse", f"message {msg_id}: body {body[:32]!r}, sim-tag {headers.get('sim-tag')}")
        self._check_id(msg, msg_id)
        where = f"#{tag} (message {msg_id}) in a {'dead ' if b.dead else ''}browse of connection {serial}"
        if "ack" in headers or "redelivered" in headers:
            raise fail("browse changed something", f"{where} came as a delivery: {sorted(headers)}")
        if tag in b.got:
            raise fail("browsed twice", where)
        b.got.add(tag)
        if msg.state == UNSURE and not b.dead:
            msg.state = LIVE  # it was stored after all
            return
        if b.dead:
            if msg.state == UNSURE and msg.expires and self.wall >= msg.expires:
                msg.state = LIVE  # stored after all, and the queue met it expired
                return
            if tag not in b.may:
                raise fail("dead browse returned a message that is not dead", f"{where}; the model has it {msg.state}")
            reason = headers.get("curb-dead-reason", "")
            if msg.state == DEAD and reason != msg.reason and not msg.reason_unsure:
                raise fail("dead letter's reason", f"{where} says {reason!r}, expected {msg.reason!r}")
            return
        if not b.first <= msg_id <= b.last:
            raise fail("browse out of its range", f"{where}, range {b.first}..{b.last}")
        if tag not in b.may:
            raise fail("browse returned a message that is not live", f"{where}; the model has it {msg.state}")

    def browse_ended(self, serial: int, sub: str, last_id: int) -> None:
        """The end marker: it names the range's end, and every message the browse had to
        return, unchanged since it began, came."""
        b = self.conns[serial].browses.pop(sub)
        if not b.dead and last_id != b.last:
            raise fail("browse end marker", f"connection {serial}: curb-last-id {last_id}, the range ends at {b.last}")
        wall = self.wall
        missed = []
        for tag, (state, redrives) in b.must.items():
            msg = self.messages[tag]
            if msg.state != state or msg.redrives != redrives or tag in b.got:
                continue
            if not b.dead and (msg.spent or (msg.expires and wall >= msg.expires)):
                continue  # the queue may have buried it meanwhile
            missed.append(tag)
        if missed:
            m = self.messages[missed[0]]
            raise fail(
                "dead browse missed a dead letter" if b.dead else "browse missed a live message",
                f"connection {serial}: {len(missed)} missed, e.g. #{m.tag} (message {m.id}, {m.state})",
            )

    def count_update(self, serial: int, headers: dict[str, str], counts: dict[str, int]) -> None:
        """A ./count MESSAGE: its headers say what its JSON says, and its version rises."""
        conn = self.conns[serial]
        version = int(headers.get("message-id", "count-0").removeprefix("count-"))
        if version <= conn.count_version:
            raise fail("./count version", f"connection {serial}: count-{version} after count-{conn.count_version}")
        conn.count_version = version
        for key in ("rdy", "wip", "delayed", "dead"):
            if headers.get(key) != str(counts.get(key)):
                raise fail("./count headers", f"connection {serial}: header {key}:{headers.get(key)}, JSON {counts}")
        conn.counts = counts

    def check_count_views(self, counts: dict[str, int], owed: set[int]) -> None:
        """Once the broker is idle, every ./count subscriber's last MESSAGE is the counts,
        but for those (`owed`) that could take no output: theirs comes once they can."""
        for conn in self.conns.values():
            if conn.closing or conn.refused or conn.error_expected or conn.serial in owed:
                continue
            if conn.counts is not None and conn.counts != counts:
                raise fail("./count stale", f"connection {conn.serial} last got {conn.counts}, the queue says {counts}")

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
                f"connection {serial}: {expect.kind} of {expect.tags[:1]} was {'late' if expect.late else 'in time'}, "
                f"its RECEIPT says curb-late:{str(late).lower()}",
            )
        if expect.kind in COVERING or late:
            self._cover(conn, expect.seq)
            return
        for effect in conn.effects:
            if effect.seq == expect.seq:
                self._made_durable(effect)
        conn.effects = [e for e in conn.effects if e.seq != expect.seq]

    def _cover(self, conn: Conn, seq: int) -> None:
        """Everything the connection sent up to frame `seq` is on disk."""
        for effect in conn.effects:
            if effect.seq <= seq:
                self._made_durable(effect)
        conn.effects = [e for e in conn.effects if e.seq > seq]

    def _made_durable(self, effect: Effect) -> None:
        for tag in effect.tags:
            msg = self.messages[tag]
            if effect.kind == "SEND":
                msg.stored = msg.state != REFUSED
            elif effect.kind == "ACK":
                msg.ack_promised = True
            elif effect.kind == "REDRIVE":
                msg.redrive_unsure = msg.redrive_at_limit = False
            elif effect.kind == "UPTO":
                msg.ack_promised = True
                self.upto_durable = max(self.upto_durable, effect.count)
            elif effect.redrives == msg.redrives:  # NACK: its count, where it put the message
                if msg.bounce is effect:
                    msg.bounce = None
                msg.durable_count = max(msg.durable_count, effect.count)
                msg.durable_due = max(msg.durable_due, effect.due)
                msg.dead_promised = msg.dead_promised or (effect.buried and msg.state == DEAD)

    def error(self, serial: int, message: str) -> None:
        """The ERRORs a connection may get: a refused SEND's, the one its last frame
        asked for (an ACK of a message an ACK up to an id took, a curb-upto above every
        id), and after a disk fault a frame's that could not be stored (then the
        connection's SENDs not yet durable may or may not be in the log)."""
        conn = self.conns[serial]
        if conn.refused and message in ("queue full", "message too large", "message may not be stored"):
            return
        if conn.error_expected and conn.error_expected in message:
            return
        if self.disk_trouble and message.endswith((" not stored", " may not be stored")):
            for effect in conn.effects:
                for tag in effect.tags if effect.kind == "SEND" else ():
                    msg = self.messages[tag]
                    if msg.state == LIVE and not msg.stored and msg.holder is None and not msg.count:
                        msg.state = UNSURE
            return
        raise fail("unexpected ERROR", f"connection {serial} got ERROR {message!r}")

    def delivered(self, serial: int, tag: int | None, msg_id: int, headers: dict[str, str], body: bytes) -> None:
        """A MESSAGE to a queue subscriber or (`./dead`) a dead letter's."""
        msg = self.messages.get(tag) if tag is not None else None
        if tag is None or msg is None or body != msg.body or headers.get("sim-tag") != str(tag):
            raise fail("damaged delivery", f"message {msg_id}: body {body[:32]!r}, sim-tag {headers.get('sim-tag')}")
        self._check_id(msg, msg_id)
        conn = self.conns[serial]
        count = int(headers.get("curb-deliveries", "1"))
        if ("dead" if conn.dead else "queue") in conn.paused:
            raise fail("delivered after UNSUBSCRIBE", f"#{tag} (message {msg_id}) to connection {serial}")
        if msg.state == UNSURE:
            msg.state = LIVE  # it was stored after all
        if conn.dead:
            self._delivered_dead(conn, msg, headers.get("curb-dead-reason", ""), count)
            return
        where = f"#{tag} (message {msg_id}) to connection {serial}"
        if msg.state != LIVE:
            kind = {
                REFUSED: "refused SEND delivered",
                ACKED: "delivered after its ACK in the same run",
                GONE: "a message gone for good came back",
                DEAD: "dead letter delivered to a queue subscriber",
            }[msg.state]
            raise fail("receipted ACK undone" if msg.ack_promised else kind, where)
        if msg.holder is not None:
            raise fail(
                "held by two consumers",
                f"{where} while connection {msg.holder} holds it, its deadline "
                f"{'none' if msg.deadline is None else msg.deadline - self.now} ms away",
            )
        if self.wall < msg.due:
            raise fail("delivered before it was due", f"{where} {msg.due - self.wall} ms early")
        if msg.expires and self.wall >= msg.expires:
            raise fail("delivered after it expired", f"{where} {self.wall - msg.expires} ms after")
        limit = self.cfg.max_deliveries
        if limit and count > limit:
            raise fail("delivered past the delivery limit", f"{where} with count {count}, limit {limit}")
        if (headers.get("redelivered") == "true") != (count > 1):
            raise fail("redelivered header", f"#{tag}: redelivered {headers.get('redelivered')}, count {count}")
        self._check_count(msg, count, where)
        if conn.ack_mode == "auto":
            msg.state = ACKED  # done once handed over
            return
        msg.holder = serial
        msg.deadline = self.now + conn.timeout_ms if conn.timeout_ms else None
        conn.holding[tag] = None
        # A late mark stays: the broker answers for the message's id, not the delivery, so
        # once this delivery ends otherwise (an ACK up to an id), its ACK is late again.

    def _check_count(self, msg: Msg, count: int, where: str) -> None:
        if msg.fresh and count != 1:
            raise fail("delivery count after a redrive", f"{where} with count {count}, not 1")
        if msg.count and count != msg.count + 1:
            raise fail("delivery count", f"{where} with count {count} after {msg.count} in this run")
        if not msg.count and count <= msg.durable_count:
            raise fail(
                "delivery count went back",
                f"{where} with count {count} after a restart, though a receipt made {msg.durable_count} durable",
            )
        msg.count, msg.fresh, msg.spent = count, False, False

    def _delivered_dead(self, conn: Conn, msg: Msg, reason: str, count: int) -> None:
        where = f"#{msg.tag} (message {msg.id}) from ./dead to connection {conn.serial}"
        if msg.state == LIVE and msg.holder is None:
            # Dead-lettered when the queue met it: expired, or met at the limit (either
            # reason, when both held then).
            met = {EXPIRED} if msg.expires and self.wall >= msg.expires else set()
            met |= {LIMIT} if msg.spent else set()
            if met:
                msg.state, msg.reason = DEAD, reason if reason in met else min(met)
                msg.spent = False
                self._now_dead(msg)
        if msg.state != DEAD:
            raise fail("receipted ACK undone" if msg.ack_promised else "a dead letter that is not dead", where)
        if msg.holder is not None:
            raise fail("held by two consumers", f"{where} while connection {msg.holder} holds it")
        if reason != msg.reason and not msg.reason_unsure:
            raise fail("dead letter's reason", f"{where} says {reason!r}, expected {msg.reason!r}")
        msg.reason, msg.reason_unsure = reason, False
        if msg.count and count != msg.count:
            raise fail("dead letter's count", f"{where} says {count}, its last delivery {msg.count}")
        msg.holder = conn.serial
        msg.deadline = self.now + conn.timeout_ms if conn.timeout_ms else None
        conn.holding[msg.tag] = None

    def _check_id(self, msg: Msg, msg_id: int) -> None:
        if msg.id is None:
            msg.id = msg_id
        elif msg.id != msg_id:
            raise fail("message id changed", f"#{msg.tag} was message {msg.id}, now {msg_id}")

    # ---------------------------------------------------------------- where a message goes back

    def _come_back(self, msg: Msg, asked_ms: int | None) -> None:
        """The holder let go without an ACK (NACK, deadline, gone): the broker's policy
        decides, and the checker applies it on its own: a dead letter back in the dead
        letters; past the limit, a dead letter; else rdy after the NACK's delay or the
        redelivery delay, grown with the count."""
        self._release(msg)
        if msg.state == DEAD:
            return
        msg.returned = msg.count
        cfg = self.cfg
        if cfg.max_deliveries and msg.count >= cfg.max_deliveries:
            msg.state, msg.reason, msg.was_limit_dead = DEAD, LIMIT, True
            self._now_dead(msg)
            return
        if asked_ms is not None:
            wait = asked_ms
        elif cfg.redelivery_delay_ms:
            grown = cfg.redelivery_delay_ms * cfg.redelivery_multiplier ** max(msg.count - 1, 0)
            wait = min(cfg.redelivery_max_delay_ms, round(grown))
        else:
            wait = 0
        msg.due = self.wall + wait if wait else 0

    def _release(self, msg: Msg) -> None:
        if msg.holder is not None:
            self.conns[msg.holder].holding.pop(msg.tag, None)
        msg.holder = msg.deadline = None

    # ---------------------------------------------------------------- time and crashes

    def advance(self, now: int) -> None:
        """The clock is at `now` (ms): every delivery whose deadline is due comes back."""
        self.now = now
        for msg in self.messages.values():
            if msg.holder is not None and msg.deadline is not None and msg.deadline <= now:
                self.conns[msg.holder].late.add(msg.tag)
                self._come_back(msg, None)

    def synced(self) -> None:
        """The log wrote and synced what it held: every return so far is on disk with
        its count (docs/guide.md: a crash loses only the returns not yet synced)."""
        for msg in self.messages.values():
            if msg.returned > msg.durable_count:
                msg.durable_count = msg.returned
            msg.bounce = None

    def crash(self) -> None:
        self.conns.clear()
        limit = self.cfg.max_deliveries
        for msg in self.messages.values():
            if limit and (msg.holder is not None or msg.state == ACKED) and msg.count >= limit:
                msg.spent = msg.was_limit_dead = True
            if limit and msg.state == LIVE and msg.bounce is not None and msg.bounce.count + 1 >= limit:
                msg.spent = msg.was_limit_dead = True  # the copy's count may outlive the bounce
            msg.holder = msg.deadline = msg.bounce = None
            msg.count = msg.returned = 0

    def restarted(self, found: dict[int, Found], watermark: int = 0) -> None:
        """A full read after recovery found these messages (by tag), queued or dead, and
        the log's ACK-up-to watermark: check them against the promises and make the
        model exact again."""
        self.disk_trouble = False
        if watermark < self.upto_durable:
            raise fail("receipted ACK up to an id undone", f"watermark {watermark}, {self.upto_durable} was receipted")
        for upto, took in self.open_uptos:
            for tag in took:
                taken_id = self.messages[tag].id or 0
                if taken_id <= watermark and tag in found:
                    raise fail(
                        "ACK up to an id partly undone",
                        f"#{tag} (message {taken_id}) is back; the watermark {watermark} covers it",
                    )
                if taken_id > watermark and tag not in found:
                    raise fail(
                        "ACK up to an id partly durable",
                        f"#{tag} (message {taken_id}) of ACK up to {upto} is gone, yet the watermark is {watermark}",
                    )
        self.open_uptos.clear()
        for tag, got in found.items():
            msg = self.messages.get(tag)
            where = f"#{tag} (message {got.id}) is in the log after a restart"
            if msg is None or got.body != msg.body:
                raise fail("damaged record after restart", f"message {got.id}: {got.body[:32]!r}")
            self._check_id(msg, got.id)
            if msg.ack_promised:
                raise fail("receipted ACK undone", where)
            if msg.state in (GONE, REFUSED):
                raise fail(
                    "refused SEND stored" if msg.state == REFUSED else "a message gone for good came back", where
                )
            if got.dead:
                self._found_dead(msg, got, where)
            else:
                self._found_queued(msg, where)
        for msg in self.messages.values():
            if msg.tag in found or msg.state in (GONE, REFUSED):
                continue
            if msg.state == UNSURE:
                msg.state = GONE
                continue
            if msg.stored and (msg.state == LIVE or msg.state == DEAD):
                kind = "receipted SEND lost" if msg.state == LIVE else "dead letter lost"
                raise fail(kind, f"#{msg.tag} (message {msg.id}) is not in the log after a restart")
            msg.state = GONE

    def _found_queued(self, msg: Msg, where: str) -> None:
        """Queued after the restart: a dead letter only if its burial may have been lost."""
        if msg.state == DEAD and msg.dead_promised:
            raise fail("dead letter came back to life", f"{where}, queued; the NACK that buried it was receipted")
        if msg.state in (DEAD, ACKED) and msg.reason == LIMIT:
            # Its burial was lost, not its count (so too when an ACK up to an id took it
            # after its burial and the ACK was lost): the queue buries it again.
            msg.spent = True
        if msg.redrive_unsure and msg.redrive_at_limit:
            msg.spent = True  # the redrive's reset was lost, maybe not its count at the limit
        if msg.redrive_unsure:
            msg.fresh = False  # its count reset may be lost with the redrive: any count goes
        msg.state, msg.reason = LIVE, ""
        msg.due = msg.durable_due  # a later due time may be lost with its NACK
        msg.redrive_unsure = msg.redrive_at_limit = msg.dead_promised = False

    def _found_dead(self, msg: Msg, got: Found, where: str) -> None:
        """A dead letter after the restart: for its own reason, and only if the model
        buried it (or may have: an expired one, a redrive not yet durable, an ACK on
        ./dead not yet durable)."""
        if got.dead == LIMIT and not msg.was_limit_dead:
            raise fail("dead letter's reason", f"{where} as dead for the delivery limit, never reached")
        if got.dead == EXPIRED and not (msg.expires and self.wall >= msg.expires):
            raise fail("dead letter's reason", f"{where} as expired, before its expiry time")
        if got.dead not in (LIMIT, EXPIRED):
            raise fail("dead letter's reason", f"{where} as dead for {got.dead!r}")
        buried = msg.state == DEAD or (msg.state == ACKED and msg.reason) or msg.redrive_unsure or msg.spent
        if not buried and got.dead != EXPIRED:
            raise fail("dead letter from nowhere", f"{where} as dead ({got.dead}); the model has it {msg.state}")
        msg.state, msg.reason = DEAD, got.dead
        msg.redrive_unsure = msg.fresh = msg.spent = False

    # ---------------------------------------------------------------- checks

    def queued(self) -> set[int]:
        """Live messages (queued, delayed or held), expired ones included."""
        return {tag for tag, msg in self.messages.items() if msg.state == LIVE}

    def dead(self) -> set[int]:
        return {tag for tag, msg in self.messages.items() if msg.state == DEAD}

    def unsure(self) -> set[int]:
        return {tag for tag, msg in self.messages.items() if msg.state == UNSURE}

    def expired(self) -> set[int]:
        wall = self.wall
        return {tag for tag, m in self.messages.items() if m.state == LIVE and m.expires and wall >= m.expires}

    def spent(self) -> set[int]:
        """Queued messages that may be dead letters once the queue meets them (`Msg.spent`)."""
        return {tag for tag, m in self.messages.items() if m.state == LIVE and m.spent}

    def check_counts(self, counts: dict[str, int], walking: bool = False) -> None:
        """The queue's counts against the model: wip is what the checker holds; rdy,
        delayed, wip and dead add up to its live and dead messages (an expired message
        is dead-lettered when the queue meets it, which the model cannot time). While the
        log walks in slices (`walking`: passing what an ACK up to an id took), rdy still
        counts what the walk has not yet passed (docs/guide.md: ./count shows them gone as it
        passes them), so only the lower bound holds."""
        live = held = dead = unsure = 0
        for msg in self.messages.values():
            if msg.state == LIVE:
                live += 1
                held += msg.holder is not None
            elif msg.state == DEAD:
                dead += 1
            elif msg.state == UNSURE:
                unsure += 1
        if counts["wip"] != held:
            raise fail(
                "wip count",
                f"the queue says {counts['wip']} held, the checker {held}"
                + (" (a deadline passed without releasing its message?)" if counts["wip"] > held else ""),
            )
        total = counts["rdy"] + counts["delayed"] + counts["wip"] + counts["dead"]
        if not live + dead <= total <= (live + dead + unsure if not walking else total):
            raise fail(
                "counts",
                f"the queue says {counts}, the checker {live} queued and {dead} dead",
            )

    def unanswered(self) -> list[str]:
        """Receipts still owed to open connections."""
        return [r for conn in self.conns.values() for r in conn.expect]
