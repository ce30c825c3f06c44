"""The log simulator's model of what the log promised, and the invariants over it.

The driver tells the checker every call it made of the log (appends, hand-outs, ACKs,
requeues, burials, revives, redrives, ACKs up to an id, browses) and every crash and
restart; the checker keeps, for each payload, what may and what must be true of it, and
raises `SimFailure` the moment something else is. The invariants, from the crash model
in the design notes:

- a SEND whose done(None) ran is delivered after every restart, unless an ACK took it;
  so is one a restart recovered (recovery syncs what it finds) or a full sync covered;
- an ACK whose on_durable ran with None is never undone: the message never comes back;
  and every SEND accepted before that on_durable is delivered after every restart, unless
  an ACK took it (on_durable covers appends still waiting for room, receipt or not);
- next_ready never hands out a message twice in one run of the log;
- every payload delivered is byte for byte one that was appended, under its own id,
  stamped with the simulated wall time it was appended at (the log reads no clock);
- the file never grows past the cap, nor past the log's own `end`;
- every accepted append is answered within SETTLE_ROUNDS rounds of (clock, flush, sync),
  with no ACKs needed, and refused later only for a disk fault; QueueFull comes only when
  the live bytes leave no room (by the log's own admission formula), and never while the
  queue is nowhere near full;
- the counts recovery reports are the messages a full read then finds;
- nothing is handed out before a due time the log was told in this run or that was on
  disk; a dead letter whose burial was on disk is never handed out and never lost; no
  delivery count goes below the last one on disk; a redrive loses nothing and moves no
  more than there are, or than it was asked to;
- with the replay steps: an ACK up to an id takes every message up to it at once (never
  delivered, held, or rdy again), its receipt is never undone (the watermark never goes
  back), a crash at any point of the walk it starts keeps all of it or none (each message
  it took that had to survive is back, or none is), ids are never reused across crashes,
  and a browse returns each message live in its range from its start to its end exactly
  once, and nothing that is not live; the log's live count may trail an ACK up to an id
  only while its walk is under way.

The model knows the live messages exactly (it saw every append, refusal and ACK) until a
disk fault refuses an append nobody waits for; then the next restart makes it exact again.
After bit rot only what must hold whatever the file holds is checked (start-up, nothing
damaged or refused delivered, nothing twice in a run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from simdisk import SimDisk

from curb.log import LogCore, Record
from curb.log.browse import Browse
from curb.log.parked import DELAYED
from curb.log.record import record_size
from sim.log_workload import Config
from sim.runner import SimFailure

PREFIX = b"content-type:x\n\n"
SETTLE_ROUNDS = 20


def make_payload(tag: int, size: int) -> bytes:
    """A payload that names itself (#tag#) and whose filler differs per message, so a
    record mixed with another's bytes never passes as either. Newlines, NULs and text
    that looks like a record header are in there on purpose."""
    head = PREFIX + b"#%d#" % tag
    unit = b"%d\n\x00rdy 0000 pad " % tag
    fill = unit * ((size - len(head)) // len(unit) + 1)
    return head + fill[: max(0, size - len(head))]


def payload_tag(payload: bytes) -> int | None:
    if not payload.startswith(PREFIX + b"#"):
        return None
    end = payload.find(b"#", len(PREFIX) + 1)
    digits = payload[len(PREFIX) + 1 : end]
    return int(digits) if end > 0 and digits.isdigit() else None


@dataclass(slots=True)
class Msg:
    """What the simulator knows of one payload it tried to append."""

    tag: int
    payload: bytes
    id: int | None = None
    receipted: bool = False
    durable_by: str | None = None
    rejected: bool = False
    refused_run: int | None = None
    acked_unconfirmed: bool = False
    acked_durable: bool = False
    epoch: int = 0
    due_sent: int = 0  # the due time its SEND asked for
    due_run: int = 0  # the latest due time asked for in this run (the log knows it, synced or not)
    due_durable: int = 0  # the latest due time known on disk (wall time only grows: a max)
    count_durable: int = 0  # the delivery count the last durable rewrite of its record wrote
    dead_durable: bool = False  # its burial is on disk (and no later redrive is)
    revived_run: bool = False  # revived or redriven in this run (its count may be 0 again)
    revivals: int = 0  # revives and redrives asked for: rewrites asked before one no longer bind
    sent_ms: int = 0  # the simulated wall time it was appended at: its record's stamp

    @property
    def size(self) -> int:
        return record_size(len(self.payload))

    def must_survive(self) -> bool:
        """Known to be on disk and not taken by an ACK that may have reached the disk."""
        return (self.receipted or self.durable_by is not None) and not self.acked_durable and not self.acked_unconfirmed

    def promise(self, epoch: int) -> None:
        """Note the rot epoch of the latest promise made about this message (a receipt
        for it or its ACK): bit rot after it may break the promise, none before."""
        self.epoch = epoch


@dataclass(slots=True)
class Browsing:
    """A browse the simulator has open: its range, the messages live in it when it
    opened (by tag), and those it returned."""

    browse: Browse
    first: int
    last: int
    at_start: set[int]
    got: set[int] = field(default_factory=set)


class LogWorld(Protocol):
    """What the checker observes of the driver's world: the open log, the disk, the
    faults it met this run, the wall clock, and where to trace and note."""

    @property
    def core(self) -> LogCore: ...

    disk: SimDisk
    disk_faults: int
    fatal: str | None
    run: int

    def wall_ms(self) -> int: ...
    def trace(self, fmt: str, *args: object) -> None: ...
    def note(self, kind: str, detail: str) -> None: ...


class LogChecker:
    """The model, fed by the driver; every method raises SimFailure on a broken invariant."""

    def __init__(self, cfg: Config, world: LogWorld):
        self.cfg = cfg
        self.world = world
        self.messages: dict[int, Msg] = {}
        self.parked_ops: list[tuple[int, str, int, int]] = []  # (tag, kind, value, revivals) rewrites, in order
        self.id_floor = 0  # every id assigned so far, in this run or an earlier one, is at most this
        self.upto_durable = 0  # the highest watermark whose receipt came
        # ACKs up to an id since the last restart: (id, the messages it took that had to
        # survive a crash until then, rot epoch); a crash keeps all of them or none.
        self.open_uptos: list[tuple[int, list[int], int]] = []
        self.rot_epoch = 0
        # What this run of the log has done (`new_run` starts them over).
        self.live: dict[int, int] = {}  # live messages (queued, held, parked) by tag: their record sizes
        self.live_bytes = 0
        self.delivered: set[int] = set()
        self.waiting_appends: set[int] = set()
        self.waiting_durable = 0
        self.acks: list[int] = []
        self.confirmed = 0
        self.sends_covered = 0  # tags from here on are appended in this run
        self.parked_covered = 0
        self.parked_tags: set[int] = set()  # messages the log holds parked (delayed or dead), by the model
        self.dead_now: set[int] = set()  # dead letters, wherever they are
        self.exact = True
        self.new_run()

    # ------------------------------------------------------------ failures

    def fail(self, kind: str, detail: str) -> NoReturn:
        raise SimFailure(self.kind(kind), detail)

    def kind(self, kind: str) -> str:
        """Findings after bit rot are kinds of their own: the crash model promises less."""
        return f"after bit rot: {kind}" if self.rot_epoch else kind

    def note(self, kind: str, detail: str) -> None:
        """A broken invariant that leaves the log's state sound (a refusal stores
        nothing): noted, and the seed plays on."""
        self.world.note(self.kind(kind), detail)

    # ------------------------------------------------------------ runs of the log

    def new_run(self, keep_recovered: bool = False) -> None:
        """Forget connection state: after a crash every held message is rdy again.
        `keep_recovered`: the run reads lazily what the last one recovered, so the live
        messages and the parked ones stay as that recovery found them."""
        kept = (self.live, self.live_bytes, self.parked_tags, self.dead_now) if keep_recovered else None
        self.live = {}
        self.live_bytes = 0
        self.delivered = set()
        self.waiting_appends = set()
        self.waiting_durable = 0
        self.acks = []
        self.confirmed = 0
        self.sends_covered = len(self.messages)
        self.parked_covered = len(self.parked_ops)
        self.parked_tags = set()
        self.dead_now = set()
        for msg in self.messages.values():
            msg.due_run = 0
            msg.revived_run = False
        self.exact = True
        if kept is not None:
            self.live, self.live_bytes, self.parked_tags, self.dead_now = kept

    def check_fresh(self) -> None:
        core = self.world.core
        if core.end > self.cfg.cap:
            self.fail("file past the cap", f"end {core.end} > cap {self.cfg.cap}")
        if core.recovery.messages != 0:
            self.fail("recovery count", f"a new log recovered {core.recovery.messages} messages")

    def process_died(self, last_id: int) -> None:
        """The process dies: note the ids it assigned, which no later run may reuse."""
        self.id_floor = max(self.id_floor, last_id)

    def rotted(self) -> None:
        """The medium under the ring was damaged: promises made before are off (the
        record may be the one damaged), and the log's counts are estimates while the
        damage is in the ring; the rest holds."""
        self.rot_epoch += 1

    def check_watermark(self) -> None:
        core = self.world.core
        if core.acked_upto < self.upto_durable and not self.rot_epoch:
            self.fail(
                "receipted ACK up to an id undone",
                f"watermark {core.acked_upto} after restart, {self.upto_durable} was receipted",
            )

    def check_parked(self, rec: Record, state: int) -> int:
        """A parked record (delayed, dead) recovery found, checked like a delivery."""
        tag = self.check_payload(rec, None)
        msg = self.messages[tag]
        if rec.id != msg.id or (msg.acked_durable and msg.epoch == self.rot_epoch):
            self.fail("parked record is not a live message", f"#{tag} id {rec.id} (appended as {msg.id})")
        if not self.rot_epoch and not msg.revived_run:
            due = rec.due_ms if state == DELAYED else 0
            if state == DELAYED and due < msg.due_durable and msg.due_durable > self.world.wall_ms():
                self.fail("due time lost", f"#{tag} id {rec.id}: due {due} after restart, {msg.due_durable} on disk")
            if rec.deliveries < msg.count_durable:
                self.fail(
                    "delivery count went down",
                    f"#{tag} id {rec.id}: {rec.deliveries} after restart, {msg.count_durable} on disk",
                )
        return tag

    def recovered(self, found: list[tuple[Record, int]], parked: list[tuple[Record, int]]) -> None:
        """What a restart recovered: the queued messages (`found`, as next_ready handed
        them out) and the parked ones, checked against every promise made."""
        self.parked_tags = {tag for _, tag in parked}
        self.dead_now = {tag for rec, tag in parked if rec.dead}
        self._check_uptos_whole({tag for _, tag in found} | {tag for _, tag in parked})
        self._check_recovered(found, parked)

    def _check_uptos_whole(self, found: set[int]) -> None:
        """An ACK up to an id that a crash interrupted (in any slice of its walk) took all
        of its messages, if the watermark survived, or none: each that had to survive
        the crash before it is back."""
        watermark = self.world.core.acked_upto
        for upto, survivors, epoch in self.open_uptos:
            if epoch != self.rot_epoch:
                continue
            if watermark >= upto:
                back = [tag for tag in survivors if tag in found]
                if back:
                    self.fail(
                        "ACK up to an id partly undone", f"watermark {watermark} >= {upto}, yet #{back[0]} is back"
                    )
            else:
                lost = [tag for tag in survivors if tag not in found and not self.messages[tag].acked_durable]
                if lost:
                    self.fail(
                        "ACK up to an id partly durable",
                        f"watermark {watermark} < {upto}, yet #{lost[0]} (id {self.messages[lost[0]].id}) "
                        f"and {len(lost) - 1} more it took are gone",
                    )
        self.open_uptos.clear()

    def _check_recovered(self, found: list[tuple[Record, int]], parked: list[tuple[Record, int]]) -> None:
        tags = {tag for _, tag in found} | {tag for _, tag in parked}
        lost = [
            m for m in self.messages.values() if m.must_survive() and m.epoch == self.rot_epoch and m.tag not in tags
        ]
        if lost:
            first = next((m for m in lost if m.receipted), lost[0])
            kind = "receipted SEND lost" if first.receipted else f"SEND made durable by {first.durable_by} lost"
            self.fail(
                kind,
                f"{len(lost)} messages missing after restart, e.g. "
                + ", ".join(
                    f"#{m.tag} (id {m.id}, {m.size} B{', receipted' if m.receipted else ''})" for m in lost[:5]
                ),
            )
        dead = {rec.id for rec, _ in parked if rec.dead}
        for tag in tags:
            msg = self.messages[tag]
            msg.durable_by = msg.durable_by or "recovery"
            msg.acked_unconfirmed = msg.acked_durable = False
            msg.dead_durable = msg.id in dead  # what recovery found is on disk now
            msg.promise(self.rot_epoch)
            self.live[tag] = msg.size
            self.live_bytes += msg.size
        self.check_counts(len(found), sum(self.messages[tag].size for _, tag in found))

    def check_lazy_counts(self) -> None:
        """A run that reads lazily what the last recovered: recovery's counts are the
        rdy messages the model kept."""
        rdy = [tag for tag in self.live if tag not in self.parked_tags]
        self.check_counts(len(rdy), sum(self.live[tag] for tag in rdy))

    def check_counts(self, messages: int, live_bytes: int) -> None:
        rec = self.world.core.recovery
        if self.rot_epoch:
            return
        if rec.messages != messages or rec.live_bytes != live_bytes:
            self.fail(
                "recovery count",
                f"recovery reports {rec.messages} messages, "
                f"{rec.live_bytes} live bytes; the file holds {messages}, {live_bytes}",
            )

    # ------------------------------------------------------------ appends

    def new_message(self, size: int, due: int = 0) -> Msg:
        """A payload the caller is about to append, at the wall time now, due at `due`."""
        tag = len(self.messages)
        msg = Msg(tag, make_payload(tag, size), sent_ms=self.world.wall_ms())
        msg.due_sent = msg.due_run = due
        self.messages[tag] = msg
        return msg

    def append_callback(self, tag: int) -> Callable[[str | None], None]:
        """The done callback of an append with a receipt, which the model now waits for."""
        run = self.world.run
        self.waiting_appends.add(tag)
        return lambda reason: self._append_done(tag, run, reason)

    def refused(self, msg: Msg) -> None:
        """The append raised: nothing stored."""
        self.waiting_appends.discard(msg.tag)
        msg.rejected = True

    def too_large(self, msg: Msg) -> None:
        max_message = self.world.core.max_message
        if len(msg.payload) <= max_message:
            self.note(
                "TooLarge for a storable payload", f"#{msg.tag}: {len(msg.payload)} B <= max_message {max_message}"
            )

    def accepted(self, msg: Msg, rec: Record) -> None:
        max_message = self.world.core.max_message
        if len(msg.payload) > max_message:
            self.fail("accepted a payload larger than max_message", f"#{msg.tag}: {len(msg.payload)} B > {max_message}")
        if rec.id <= self.id_floor:
            self.fail(
                "message id reused", f"#{msg.tag} got id {rec.id}; ids up to {self.id_floor} were assigned before"
            )
        self.id_floor = rec.id
        msg.id = rec.id
        if msg.refused_run != self.world.run:
            self.live[msg.tag] = msg.size
            self.live_bytes += msg.size

    def _append_done(self, tag: int, run: int, reason: str | None) -> None:
        world = self.world
        if run != world.run:
            return
        msg = self.messages[tag]
        if tag not in self.waiting_appends:
            self.fail("append answered twice", f"#{tag} (id {msg.id}): {reason!r}")
        self.waiting_appends.discard(tag)
        world.trace("receipt #%d id %s: %s", tag, msg.id, reason or "stored")
        if reason is None:
            msg.receipted = True
            msg.due_durable = max(msg.due_durable, msg.due_sent)
            msg.promise(self.rot_epoch)
            return
        msg.refused_run = run
        if self.live.pop(tag, None) is not None:
            self.live_bytes -= msg.size
        if world.fatal is None and world.disk.faults == world.disk_faults:
            self.fail("accepted SEND refused later without a disk fault", f"#{tag}: {reason}")

    def check_queue_full(self, size: int) -> None:
        """QueueFull is the log's word that the live bytes leave no room: check it against
        the model's own count of live bytes (exact: the model saw every append and ACK),
        or the log's count once a disk fault refused appends the model cannot see or rot
        made recovery's count an estimate."""
        world = self.world
        core = world.core
        # While a walk is under way the log counts the messages an ACK up to an id took
        # until the walk passes them (`check_step`): the log's own count is the one to use.
        exact = self.exact and not self.rot_epoch and world.disk.faults == world.disk_faults and not core.walking
        live = self.live_bytes if exact else core.live_bytes
        ahead, headroom, capacity = core.admission.ahead_dead_bytes, core.admission.headroom(size), core.capacity
        if live + ahead + size + headroom <= capacity:
            self.note(
                "QueueFull with room",
                f"live {live} + ahead-dead {ahead} + record {size} + headroom {headroom} <= capacity {capacity}",
            )
        largest = max([size, *(self.messages[tag].size for tag in self.live)])
        if exact and live + ahead + size <= capacity // 4 and largest <= capacity // 16:
            # A quarter full of small messages leaves room for any headroom the log
            # may keep (three of its largest records): refusing here is a pinned ring.
            self.note(
                "QueueFull far from full",
                f"live {live}, record {size}, largest {largest}, "
                f"capacity {capacity} (headroom {headroom}, ahead-dead {ahead})",
            )

    # ------------------------------------------------------------ what the caller does with messages

    def acked(self, tag: int) -> None:
        """An ACK (of a held message or a dead letter), not yet durable."""
        msg = self.messages[tag]
        msg.acked_unconfirmed = True
        if self.live.pop(tag, None) is not None:
            self.live_bytes -= msg.size
        self.acks.append(tag)

    def dead_acked(self, tag: int) -> None:
        """An ACK of a dead letter: deleted for good, once durable."""
        self.acked(tag)
        self.dead_now.discard(tag)

    def op(self, tag: int, kind: str, value: int) -> None:
        """A rewrite of a message's record, durable once an on_durable after it answers."""
        self.parked_ops.append((tag, kind, value, self.messages[tag].revivals))

    def delayed_again(self, tag: int, due: int, deliveries: int) -> None:
        """A NACK with a delay: the log parks the message until `due`."""
        self.messages[tag].due_run = due
        self.delivered.discard(tag)  # parked again: its copy may come out of next_ready once due
        self.op(tag, "due", due)
        self.op(tag, "count", deliveries)

    def buried(self, tag: int, deliveries: int, browse: Browsing | None) -> None:
        self.op(tag, "bury", deliveries)
        self.dead_now.add(tag)
        if browse is not None:
            browse.at_start.discard(tag)  # not live all along: a browse may skip it

    def kept_dead(self, tag: int) -> None:
        """The caller handed a dead letter it buried to the log (`keep_dead`): the log
        holds it parked, and hands it out again (`next_dead`, or `due` after a redrive)."""
        self.parked_tags.add(tag)
        self.delivered.discard(tag)

    def revived(self, tag: int) -> None:
        """A revive or redrive asked for: the rewrite may reach the disk from now on (a
        kill keeps it unsynced), so the burial and the count on disk no longer bind."""
        msg = self.messages[tag]
        msg.revived_run = True
        msg.revivals += 1
        msg.dead_durable = False
        msg.count_durable = 0
        self.dead_now.discard(tag)

    def released(self, rec: Record) -> int:
        """A parked message the log gave back as due (a release, or a redrive's)."""
        tag = self.check_payload(rec, None)
        self.parked_tags.discard(tag)
        self.check_handout(rec, tag)
        self.messages[tag].due_run = 0
        self.delivered.add(tag)
        return tag

    def check_released_all(self) -> None:
        core, wall = self.world.core, self.world.wall_ms()
        soonest = core.next_due()
        if soonest is not None and soonest < wall and (core.release(wall, 1 << 62) or core.ready_waiting):
            self.fail("due message left parked", f"next_due {soonest} < wall {wall} after a release")

    def dead_taken(self, rec: Record) -> int:
        """A reader of the dead letters took this one."""
        tag = self.check_payload(rec, None)
        if not rec.dead:
            self.fail("dead letter without a reason", f"#{tag} id {rec.id}")
        self.parked_tags.discard(tag)
        self.delivered.add(tag)
        return tag

    def check_redrive(self, count: int | None, before: int, moved: int) -> None:
        if moved > before or (count is not None and moved > count):
            self.fail("redrive moved too many", f"{moved} of {before} (asked {count})")

    def redrive_moved(self, ids: list[int]) -> None:
        """The log says which dead letters a redrive moved (those it holds, found at
        start-up or kept since, oldest first): each is revived from now on, taken or not."""
        moved = set(ids)
        for tag in [t for t in self.parked_tags & self.dead_now if self.messages[t].id in moved]:
            self.revived(tag)

    def redriven(self, rec: Record, ids: list[int]) -> tuple[int, bool]:
        """A message back from the ready line after a redrive: its tag, and whether it
        is a dead letter the redrive moved (count 0)."""
        tag = self.check_payload(rec, None)
        msg = self.messages[tag]
        mine = rec.deliveries == 0 and rec.id in ids and tag in self.parked_tags
        self.parked_tags.discard(tag)
        self.check_handout(rec, tag)
        msg.due_run = 0
        self.delivered.add(tag)
        return tag, mine

    def check_redrive_lost(self, moved: int, mine: int) -> None:
        if mine < moved and not self.rot_epoch:
            self.fail("redrive lost a dead letter", f"{moved} moved, {mine} came back")

    # ------------------------------------------------------------ receipts for ACKs

    def durable_callback(self) -> Callable[[str | None], None]:
        """A RECEIPT for an ACK, NACK or DISCONNECT: on_durable covers every ACK so far,
        and every rewrite of a record (requeue with its delay and count, burial, redrive)."""
        upto, sent, run, ops = len(self.acks), len(self.messages), self.world.run, len(self.parked_ops)
        self.waiting_durable += 1
        return lambda reason: self._durable_done(upto, sent, run, reason, ops)

    def _durable_done(self, upto: int, sent: int, run: int, reason: str | None, ops: int = 0) -> None:
        world = self.world
        if run != world.run:
            return
        self.waiting_durable -= 1
        world.trace("ack receipt for %d acks: %s", upto, reason or "durable")
        if reason is not None:
            return
        for tag, kind, value, revivals in self.parked_ops[self.parked_covered : ops]:
            msg = self.messages[tag]
            if revivals != msg.revivals:
                continue  # a revive or redrive asked for since may have reached the disk too
            if kind == "due":
                msg.due_durable = max(msg.due_durable, value)
            elif kind == "count":
                msg.count_durable = value
            elif kind == "bury":
                msg.dead_durable, msg.count_durable = True, value
        self.parked_covered = max(self.parked_covered, ops)
        if world.disk.faults == world.disk_faults:  # else appends nobody waits for may be refused unseen
            for tag in range(self.sends_covered, sent):
                msg = self.messages[tag]
                if not msg.rejected and msg.refused_run != run:
                    msg.durable_by = msg.durable_by or "on_durable"
                    msg.due_durable = max(msg.due_durable, msg.due_sent)
                    msg.promise(self.rot_epoch)
        self.sends_covered = max(self.sends_covered, sent)
        for tag in self.acks[self.confirmed : upto]:
            self.messages[tag].acked_durable = True
            self.messages[tag].promise(self.rot_epoch)
        self.confirmed = max(self.confirmed, upto)

    # ------------------------------------------------------------ ACK up to an id, browses

    def ack_upto(self, upto: int) -> list[int]:
        """ACK up to an id: every live message up to it is gone at once, wherever it is.
        Returns the tags it took."""
        covered = [tag for tag in self.live if (self.messages[tag].id or 0) <= upto]
        survivors = [tag for tag in covered if self.messages[tag].must_survive()]
        self.open_uptos.append((upto, survivors, self.rot_epoch))
        for tag in covered:
            self.messages[tag].acked_unconfirmed = True
            self.live_bytes -= self.live.pop(tag)
        self.dead_now -= set(covered)
        self.parked_tags -= set(covered)
        return covered

    def upto_callback(self, upto: int, covered: list[int]) -> Callable[[str | None], None]:
        world, run = self.world, self.world.run
        self.waiting_durable += 1

        def done(reason: str | None) -> None:
            if run != world.run:
                return
            self.waiting_durable -= 1
            world.trace("ack up to %d receipt: %s", upto, reason or "durable")
            if reason is not None:
                return
            for tag in covered:
                self.messages[tag].acked_durable = True
                self.messages[tag].promise(self.rot_epoch)
            self.upto_durable = max(self.upto_durable, upto)

        return done

    def live_in(self, first: int, last: int) -> set[int]:
        """The live messages (not dead letters) with ids in first..last, by tag."""
        return {tag for tag in self.live if first <= (self.messages[tag].id or 0) <= last and tag not in self.dead_now}

    def browsed(self, b: Browsing, msg_id: int, payload: bytes) -> None:
        """A message the open browse returned: live, in range, ours byte for byte, and
        new to it."""
        world = self.world
        strict = self.exact and not self.rot_epoch and world.disk.faults == world.disk_faults
        tag = payload_tag(payload)
        msg = self.messages.get(tag) if tag is not None else None
        if tag is None or msg is None or msg.payload != payload or msg.id != msg_id:
            self.fail("browse returned a damaged record", f"id {msg_id}, {len(payload)} B {payload[:40]!r}")
        if not b.first <= msg_id <= b.last:
            self.fail("browse out of its range", f"id {msg_id} in a browse of {b.first}..{b.last}")
        if tag in b.got and not self.rot_epoch:
            self.fail("browsed twice", f"#{tag} id {msg_id}")
        if strict and (tag not in self.live or tag in self.dead_now):
            self.fail("browse returned a dead message", f"#{tag} id {msg_id}")
        b.got.add(tag)

    def browse_ended(self, b: Browsing) -> None:
        """At the browse's end, none live all along is missing."""
        world = self.world
        strict = self.exact and not self.rot_epoch and world.disk.faults == world.disk_faults
        missed = sorted(tag for tag in b.at_start if tag in self.live and tag not in b.got and tag not in self.dead_now)
        if missed and strict:
            self.fail(
                "browse missed a live message",
                f"{len(missed)} of the browse {b.first}..{b.last}, e.g. #{missed[0]} id {self.messages[missed[0]].id}",
            )

    # ------------------------------------------------------------ hand-outs

    def check_delivery(self, rec: Record, recovering: bool = False) -> int:
        """A record from next_ready: a payload we appended, byte for byte, under its own
        id, size and send stamp, not delivered before in this run, not taken by a receipted ACK."""
        tag = self.check_payload(rec, None)
        msg = self.messages[tag]
        if tag in self.delivered:
            self.fail("delivered twice in one run", f"#{tag} id {rec.id}")
        self.delivered.add(tag)
        if msg.acked_durable and msg.epoch == self.rot_epoch:
            self.fail("receipted ACK undone", f"#{tag} id {rec.id} was delivered again")
        if msg.rejected:
            self.fail("refused SEND stored", f"#{tag}: append raised, yet it was delivered as id {rec.id}")
        if rec.id != msg.id:
            self.fail("message id changed", f"#{tag} was appended as id {msg.id}, delivered as {rec.id}")
        if rec.size != msg.size:
            self.fail("record size", f"#{tag} id {rec.id}: size {rec.size}, expected {msg.size}")
        if rec.timestamp_ms != msg.sent_ms:
            self.fail("send stamp", f"#{tag} id {rec.id}: stamped {rec.timestamp_ms}, appended at {msg.sent_ms}")
        if not recovering and tag not in self.live:
            why = "refused with an error" if msg.refused_run == self.world.run else "not live in this run"
            self.fail("dead message delivered", f"#{tag} id {rec.id} ({why})")
        self.check_handout(rec, tag)
        return tag

    def check_handout(self, rec: Record, tag: int) -> None:
        """A message handed out to a consumer (next_ready, or back from `due`): never
        before a due time the log was told in this run or that was on disk, never a dead
        letter whose burial was on disk, with no fewer deliveries than the last rewrite
        of its record on disk counted."""
        msg = self.messages[tag]
        if self.rot_epoch:
            return  # the crash model promises less after bit rot
        due = max(msg.due_run, msg.due_durable)
        wall = self.world.wall_ms()
        if wall < due:
            self.fail("delivered before its due time", f"#{tag} id {rec.id}: due {due}, wall {wall}")
        if msg.revived_run:
            return
        if msg.dead_durable:
            self.fail("buried message delivered", f"#{tag} id {rec.id}: its burial was on disk")
        if rec.deliveries < msg.count_durable:
            self.fail(
                "delivery count went down",
                f"#{tag} id {rec.id}: {rec.deliveries} deliveries, {msg.count_durable} were on disk",
            )

    def check_payload(self, rec: Record, tag: int | None) -> int:
        payload = bytes(self.world.core.payload(rec))
        found = payload_tag(payload)
        msg = self.messages.get(found) if found is not None else None
        if found is None or msg is None or payload != msg.payload or (tag is not None and found != tag):
            self.fail(
                "damaged record delivered",
                f"id {rec.id}, {len(payload)} B starting {bytes(payload[:48])!r}"
                + (f", expected #{tag}" if tag is not None else ""),
            )
        return found

    # ------------------------------------------------------------ after every step, and at the end

    def check_step(self) -> None:
        world = self.world
        core = world.core
        size = world.disk.size()
        if size > self.cfg.cap or size > core.end:
            self.fail("file past the cap", f"size {size}, cap {self.cfg.cap}, end {core.end}")
        if world.disk.faults != world.disk_faults:
            self.exact = False
        # A walk in slices uncounts the messages an ACK up to an id took as it passes
        # them: until it is done the log may count more than the model, never less.
        walking = core.walking and core.live_bytes > self.live_bytes
        if (
            self.exact
            and not self.rot_epoch
            and world.fatal is None
            and core.live_bytes != self.live_bytes
            and not walking
        ):
            gap = core.live_bytes - self.live_bytes
            self.fail(
                "live bytes",
                f"log says {core.live_bytes}, model says {self.live_bytes}: "
                + (
                    "a message the log accepted and never refused is gone from its count"
                    if gap < 0
                    else "the log counts bytes of no live message"
                ),
            )
        if world.fatal is not None and (self.waiting_appends or self.waiting_durable):
            self.fail(
                "fatal error left callbacks unanswered",
                f"{len(self.waiting_appends)} appends, {self.waiting_durable} ack receipts",
            )

    def check_settled(self) -> None:
        """After SETTLE_ROUNDS rounds of (clock, flush, sync) every receipt is answered."""
        if self.waiting_appends or self.waiting_durable:
            fatal = self.world.fatal
            self.fail(
                "wedge",
                f"{len(self.waiting_appends)} appends (e.g. #{min(self.waiting_appends, default=-1)}) "
                f"and {self.waiting_durable} ack receipts unanswered after {SETTLE_ROUNDS} rounds"
                f"{'' if fatal is None else ' and a fatal error: ' + fatal}",
            )

    def check_dead_read(self) -> None:
        """At the end, once `next_dead` handed out all it would: every dead letter the
        log holds by the model (found at start-up, or kept since) came out."""
        missing = sorted(self.parked_tags & self.dead_now)
        if missing and not self.rot_epoch:
            msg = self.messages[missing[0]]
            self.fail("dead letter the log holds never handed out", f"{len(missing)}, e.g. #{msg.tag} id {msg.id}")

    def read_all(self, tags: Iterable[int]) -> None:
        """The end's full read also took these (dead letters held, parked ones)."""
        self.delivered.update(tags)

    def check_all_stored(self) -> None:
        """At the end, after a full read and a sync: every live message was handed out,
        and all of them must survive the power loss that follows."""
        missing = [tag for tag in self.live if tag not in self.delivered]
        if missing:
            self.fail(
                "accepted SEND never stored",
                f"{len(missing)} messages, e.g. #{missing[0]}, "
                f"not written after {SETTLE_ROUNDS} rounds of (clock, flush, sync)",
            )
        for tag in self.live:
            self.messages[tag].durable_by = "a full sync"
            self.messages[tag].promise(self.rot_epoch)
