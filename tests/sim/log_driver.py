"""The log's crash simulator: seeded random workloads, crashes and disk faults against
curb.log.LogCore on a SimDisk, with the crash model's invariants checked after every step.

    bin/crashsim --seeds 2000 [--start S] [--steps K] [--jobs N]
    bin/crashsim --seed S -v      # replay one seed exactly, printing its trace
    bin/crashsim ... --no-replay-steps   # without ACK up to an id and browses

One seed decides everything: the cap (16 KiB to 1 MiB, so the ring wraps many times), the
disk (a free-space limit, EIO on writes or syncs, bit rot), the workload (appends with and
without receipt, tiny to the largest payload; consumers taking, ACKing with and without
receipt, NACKing, disconnecting; the clock, flushes and syncs) and the crashes: kill -9 or
power loss between two steps, between two disk calls of one step, or in the middle of
recovery. A crash drops the LogCore without closing it, keeps what `SimDisk.crash` says
survives, and starts a new LogCore on it, which must recover at once.

The invariants, from the crash model in the design notes:
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
- with the replay steps (on unless --no-replay-steps): an ACK up to an id takes every
  message up to it at once (never delivered, held, or rdy again), its receipt is never
  undone (the watermark never goes back), a crash at any point of the walk it starts
  keeps all of it or none (each message it took that had to survive is back, or none
  is), ids are never reused across crashes, and a browse returns each message live in
  its range from its start to its end exactly once, and nothing that is not live. Walks
  of the ring go in slices of one record, a few, or many (drawn per run, so crashes
  and other steps fall between slices), and browses start at marks spaced from every
  record to none; the log's live count may trail an ACK up to an id only while its
  walk is under way.

The replay steps draw from a random stream of their own, so a seed without them (the
kept regression seeds) replays exactly as before they existed.

The model knows the live messages exactly (it saw every append, refusal and ACK) until a
disk fault refuses an append nobody waits for; then the next restart makes it exact again.
After bit rot only what must hold whatever the file holds is checked (start-up, nothing
damaged or refused delivered, nothing twice in a run). Every seed ends by settling, reading
everything and syncing, and then a power loss must keep exactly the live messages.

A broken invariant stops the seed, except a wrong refusal (which stores nothing): that is
noted once per kind and the seed plays on. Either way the report names the seed and the
step; the same seed with the same --steps replays it exactly.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import random
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import NoReturn

from simdisk import CRASH_MODES, SECTOR, Crashed, SimDisk

from curb.log import LogCore, LogError, QueueFull, Record, TooLarge
from curb.log.browse import Browse
from curb.log.cursor import RECORD_WORK, SLICE_WORK
from curb.log.pacing import ByHand
from curb.log.parked import DELAYED, EXP, MAX
from curb.log.record import PAD_SIZE, RING_START, record_size

KIB = 1024
STEPS = 300
SETTLE_ROUNDS = 20
ROUND_SECONDS = 0.06
TRACE_KEEP = 40
PREFIX = b"content-type:x\n\n"
START_TIME = 1_700_000_000.0
WALL_JUMPS = (1, 10, 100, 1_000, 30_000, 3_600_000)
DELAYS = (1, 20, 500, 5_000, 60_000, 7_200_000)


class SimFailure(Exception):
    """An invariant broke. `kind` groups failures of one sort across seeds."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


# ---------------------------------------------------------------- configuration


@dataclass(slots=True)
class Config:
    """One seed's world: the log's size limits, the disk's faults, the workload's mix."""

    cap: int
    max_payload: int
    consumers: int
    free_bytes: int | None
    write_eio: float
    sync_eio: float
    weights: dict[str, float]
    recovery_crash: float
    rot: bool

    @classmethod
    def draw(cls, rng: random.Random) -> Config:
        kib = rng.choice((16, 16, 20, 24, 32, 48, 64, 128, 256)) if rng.random() < 0.95 else rng.choice((512, 1024))
        cap = kib * KIB + rng.choice((0, 0, 0, 700, 4095))
        max_payload = 16 << 20 if rng.random() < 0.85 else rng.randint(64, 3000)
        free_bytes, write_eio, sync_eio = None, 0.0, 0.0
        fault = rng.random()
        if fault < 0.08:
            free_bytes = rng.randint(cap // 4, cap)
        elif fault < 0.13:
            write_eio = rng.choice((0.002, 0.01, 0.03))
        elif fault < 0.18:
            sync_eio = rng.choice((0.005, 0.02, 0.06))
        weights = {name: base * rng.uniform(0.3, 2.0) for name, base in BASE_WEIGHTS.items()}
        recovery_crash = rng.choice((0.0, 0.0, 0.1, 0.3))
        return cls(
            cap,
            max_payload,
            rng.randint(1, 3),
            free_bytes,
            write_eio,
            sync_eio,
            weights,
            recovery_crash,
            rng.random() < 0.05,
        )


BASE_WEIGHTS = {
    "send_receipt": 20.0,
    "send_plain": 12.0,
    "take": 22.0,
    "ack": 15.0,
    "nack": 3.0,
    "disconnect": 1.2,
    "clock": 8.0,
    "flush": 5.0,
    "sync": 4.0,
    "loop_pass": 8.0,
    "settle": 0.8,
    "crash": 1.0,
    "crash_mid_op": 0.6,
}


# ---------------------------------------------------------------- the model


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
class Stats:
    """What a run of seeds did, summed over seeds and processes for the totals line."""

    seeds: int = 0
    steps: int = 0
    kills: int = 0
    powers: int = 0
    mid_op: int = 0
    restarts: int = 0
    appends: int = 0
    refused: int = 0
    acks: int = 0
    faults: int = 0
    uptos: int = 0
    browses: int = 0
    browsed: int = 0
    failures: int = 0

    def add(self, other: Stats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def line(self) -> str:
        return (
            f"seeds {self.seeds}, steps {self.steps}, crashes {self.kills + self.powers} "
            f"(kill {self.kills}, power {self.powers}; {self.mid_op} amid a batch or a recovery), "
            f"restarts {self.restarts}, "
            f"appends {self.appends} (+{self.refused} refused), acks {self.acks}, "
            f"acks up to an id {self.uptos}, browses {self.browses} ({self.browsed} messages), "
            f"disk faults {self.faults}, failures {self.failures}"
        )


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
class Browsing:
    """A browse the simulator has open: its range, the messages live in it when it
    opened (by tag), and those it returned."""

    browse: Browse
    first: int
    last: int
    at_start: set[int]
    got: set[int] = field(default_factory=set)


# ---------------------------------------------------------------- one seed


class Sim:
    """One seed's run: the workload, the crashes, and the model that checks the log."""

    def __init__(
        self,
        seed: int,
        steps: int = STEPS,
        verbose: bool = False,
        out: Callable[[str], None] = print,
        replay_steps: bool = True,
    ):
        self.seed = seed
        self.replay_steps = replay_steps
        self.xrng = random.Random(f"replay steps of seed {seed}")
        self.prng = random.Random(f"parked steps of seed {seed}")
        self.wall_skew = 0  # ms the parked steps jumped the wall clock ahead of `now`
        self.parked_ops: list[tuple[int, str, int, int]] = []  # (tag, kind, value, revivals) rewrites, in order
        self.id_floor = 0  # every id assigned so far, in this run or an earlier one, is at most this
        self.upto_durable = 0  # the highest watermark whose receipt came
        # ACKs up to an id since the last restart: (id, the messages it took that had to
        # survive a crash until then, rot epoch); a crash keeps all of them or none.
        self.open_uptos: list[tuple[int, list[int], int]] = []
        self.steps = steps
        self.verbose = verbose
        self.out = out
        self.rng = random.Random(seed)
        self.cfg = Config.draw(self.rng)
        self.stats = Stats(seeds=1)
        self.now = START_TIME
        self.step = -1
        self.trace_lines: deque[tuple] = deque(maxlen=TRACE_KEEP)
        self.notes: dict[str, tuple[int, str, list[str]]] = {}
        self.messages: dict[int, Msg] = {}
        self.run = 0
        self.disk = SimDisk(self.rng, free_bytes=self.cfg.free_bytes)
        self._core: LogCore | None = None
        self.faults_on = True
        self.rot_epoch = 0
        self.armed_mode = "kill"
        self._actions = list(self.cfg.weights)
        self._cum_weights = list(itertools.accumulate(self.cfg.weights.values()))

    @property
    def core(self) -> LogCore:
        """The open log; only asked for between an open and the next crash."""
        assert self._core is not None, "the log is not open"
        return self._core

    # ------------------------------------------------------------ driving

    def play(self) -> None:
        self.trace("config %s", self.cfg)
        self._reset_run()
        self._core = self._open()
        self._check_fresh_log()
        for step in range(self.steps):
            self.step = step
            if self.fatal is not None:
                self.crash(self.rng.choice(CRASH_MODES))
            action = self.rng.choices(self._actions, cum_weights=self._cum_weights)[0]
            try:
                getattr(self, "do_" + action)()
            except Crashed:
                self.stats.mid_op += 1
                self.crash(self.armed_mode)
            self.stats.steps += 1
            self.check_step()
            if self.replay_steps:
                try:
                    self.replay_step()
                except Crashed:
                    self.stats.mid_op += 1
                    self.crash(self.armed_mode)
                self.check_step()
                try:
                    self.parked_step()
                except Crashed:
                    self.stats.mid_op += 1
                    self.crash(self.armed_mode)
                self.check_step()
        self.step = self.steps
        self.finish()

    def clock(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        """The simulated time as the log's wall clock (epoch ms, START_TIME on), plus the
        jumps of the parked steps: it never goes back."""
        return int(self.now * 1000) + self.wall_skew

    def trace(self, fmt: str, *args) -> None:
        entry = (self.step, self.run, fmt, args)
        self.trace_lines.append(entry)
        if self.verbose:
            self.out(_format_trace(entry))

    def fail(self, kind: str, detail: str) -> NoReturn:
        raise SimFailure(self._kind(kind), detail)

    def _kind(self, kind: str) -> str:
        """Findings after bit rot are kinds of their own: the crash model promises less."""
        return f"after bit rot: {kind}" if self.rot_epoch else kind

    def note(self, kind: str, detail: str) -> None:
        """A broken invariant that leaves the log's state sound (a refusal stores
        nothing): keep the first of each kind, with its trace, and play on."""
        kind = self._kind(kind)
        if kind not in self.notes:
            self.notes[kind] = (self.step, f"{kind}: {detail}", [_format_trace(e) for e in self.trace_lines])

    # ------------------------------------------------------------ runs of the log

    def _reset_run(self) -> None:
        """Forget connection state: after a crash every held message is rdy again."""
        self.run += 1
        self.live: dict[int, int] = {}
        self.live_bytes = 0
        self.delivered: set[int] = set()
        self.held: list[list[tuple[Record, int]]] = [[] for _ in range(self.cfg.consumers)]
        self.redeliver: deque[tuple[Record, int]] = deque()
        self.waiting_appends: set[int] = set()
        self.waiting_durable = 0
        self.acks: list[int] = []
        self.confirmed = 0
        self.sends_covered = len(self.messages)  # tags from here on are appended in this run
        self.parked_covered = len(getattr(self, "parked_ops", ()))
        self.dead_held: list[tuple[Record, int]] = []  # dead letters the caller holds (its ./dead queue)
        self.parked_tags: set[int] = set()  # messages the log holds parked (delayed or dead), by the model
        self.dead_now: set[int] = set()  # dead letters, wherever they are
        for msg in getattr(self, "messages", {}).values():
            msg.due_run = 0
            msg.revived_run = False
        self.fatal: str | None = None
        self.disk_faults = self.disk.faults
        self.exact = True
        self.browse: Browsing | None = None

    def _open(self) -> LogCore:
        """A LogCore recovering from the disk, with faults off during recovery (a start-up
        that fails must be the log's doing, not an injected fault's) but maybe a crash in
        the middle of it, after which recovery starts over on what that crash left."""
        slice_work, mark_spacing = SLICE_WORK, None
        if self.replay_steps:
            # Walks of the ring in slices of a record or a few (so that crashes and other
            # steps come between them), or in one go; browses start at marks, or at the tail.
            slice_work = self.xrng.choice((1, 3 * RECORD_WORK, 64 * RECORD_WORK, SLICE_WORK))
            mark_spacing = self.xrng.choice((1, 200, 1 << 40))
        while True:
            disk = self.disk
            disk.write_eio = disk.sync_eio = 0.0
            if self.faults_on and self.rng.random() < self.cfg.recovery_crash:
                disk.arm_crash(self.rng.randint(0, 4))
            try:
                core = LogCore(
                    disk,
                    self.cfg.cap,
                    max_payload=self.cfg.max_payload,
                    clock=self.clock,
                    wall_ms=self.wall_ms,
                    slice_work=slice_work,
                    mark_spacing=mark_spacing,
                    pacer=ByHand(),  # the steps flush and sync (and settle proves none is missed)
                )
                break
            except Crashed:
                mode = self.rng.choice(CRASH_MODES)
                self.trace("CRASH %s during recovery", mode)
                self._count_crash(mode, mid_op=True)
                self.disk = disk.crash(mode)
            except LogError as err:
                self.fail("start-up refused the file", str(err))
        disk.arm_crash(None)
        if self.faults_on:
            disk.write_eio, disk.sync_eio = self.cfg.write_eio, self.cfg.sync_eio
        core.on_fatal = self._on_fatal
        rec = core.recovery
        self.trace("open: recovered %d messages, %d live bytes, torn %r", rec.messages, rec.live_bytes, rec.torn)
        return core

    def _check_fresh_log(self) -> None:
        core = self.core
        if core.end > self.cfg.cap:
            self.fail("file past the cap", f"end {core.end} > cap {self.cfg.cap}")
        if core.recovery.messages != 0:
            self.fail("recovery count", f"a new log recovered {core.recovery.messages} messages")

    def _on_fatal(self, reason: str) -> None:
        self.trace("fatal: %s", reason)
        self.fatal = reason

    def crash(self, mode: str) -> None:
        """Drop the log without closing it; keep what the crash leaves; start again."""
        self.trace(
            "CRASH %s (%d appends and %d ack receipts unanswered)",
            mode,
            len(self.waiting_appends),
            self.waiting_durable,
        )
        self.stats.faults += self.disk.faults - self.disk_faults
        self._count_crash(mode)
        self._drop_core()
        self.disk = self.disk.crash(mode)
        if self.cfg.rot and self.rng.random() < 0.5:
            self._rot()
        self.restart()

    def _drop_core(self) -> None:
        """The process dies: note the ids it assigned, which no later run may reuse."""
        if self._core is not None:
            self.id_floor = max(self.id_floor, self._core.last_id)
        self._core = None

    def _count_crash(self, mode: str, mid_op: bool = False) -> None:
        if mode == "kill":
            self.stats.kills += 1
        else:
            self.stats.powers += 1
        self.stats.mid_op += mid_op

    def _rot(self) -> None:
        """Damage the medium under the ring (never the header): a flipped bit or a zeroed
        sector. Promises made before it are off (the record may be the one damaged), and
        the log's counts are estimates while the damage is in the ring; the rest holds."""
        self.rot_epoch += 1
        size = self.disk.size()
        for _ in range(self.rng.randint(1, 3)):
            if size <= RING_START:
                return
            if self.rng.random() < 0.5:
                offset, bit = self.rng.randrange(RING_START, size), self.rng.randrange(8)
                self.trace("ROT: bit %d of byte %d flipped", bit, offset)
                self.disk.flip_bit(offset, bit)
            else:
                sector = self.rng.randrange(RING_START // SECTOR, -(-size // SECTOR))
                self.trace("ROT: sector %d zeroed", sector)
                self.disk.zero_sector(sector)

    def restart(self) -> None:
        """Open the log, read every message it recovered and check them against the model.
        Then either hand them all to the caller's redelivery list, or crash once more
        (kill) and leave the next run to read them lazily between new appends."""
        self._reset_run()
        self.stats.restarts += 1
        self._core = self._open()
        if self.core.acked_upto < self.upto_durable and not self.rot_epoch:
            self.fail(
                "receipted ACK up to an id undone",
                f"watermark {self.core.acked_upto} after restart, {self.upto_durable} was receipted",
            )
        found = self._drain_recovered()
        parked = self._recovered_parked()
        self._check_uptos_whole({tag for _, tag in found} | {tag for _, tag in parked})
        self._check_recovered(found, parked)
        if self.rng.random() < 0.5:
            for rec, tag in found:
                self.core.requeue(rec)
                self.redeliver.append((rec, tag))
            return
        self.trace("CRASH kill, to read the recovered messages lazily")
        self.stats.kills += 1
        self.stats.restarts += 1
        self._drop_core()
        self.disk = self.disk.crash("kill")
        live, live_bytes, parked_tags, dead_now = self.live, self.live_bytes, self.parked_tags, self.dead_now
        self._reset_run()
        self.live, self.live_bytes, self.parked_tags, self.dead_now = live, live_bytes, parked_tags, dead_now
        self._core = self._open()
        rdy = [tag for tag in live if tag not in parked_tags]
        self._check_counts(len(rdy), sum(live[tag] for tag in rdy))

    def _recovered_parked(self) -> list[tuple[Record, int]]:
        """The parked records the log recovered (delayed, dead), read without changing
        anything (white box: the log's own index), each checked like a delivery's."""
        core = self.core
        index = core._parked
        out = []
        for at, state in enumerate(index.states):
            if state not in (DELAYED, MAX, EXP):
                continue
            rec = core._read_parked(index.base + at)
            if rec is None:
                continue  # damage the log reported (bit rot)
            tag = self._check_payload(rec, None)
            msg = self.messages[tag]
            if rec.id != msg.id or (msg.acked_durable and msg.epoch == self.rot_epoch):
                self.fail("parked record is not a live message", f"#{tag} id {rec.id} (appended as {msg.id})")
            if not self.rot_epoch and not msg.revived_run:
                due = rec.due_ms if state == DELAYED else 0
                if state == DELAYED and due < msg.due_durable and msg.due_durable > self.wall_ms():
                    self.fail(
                        "due time lost", f"#{tag} id {rec.id}: due {due} after restart, {msg.due_durable} on disk"
                    )
                if rec.deliveries < msg.count_durable:
                    self.fail(
                        "delivery count went down",
                        f"#{tag} id {rec.id}: {rec.deliveries} after restart, {msg.count_durable} on disk",
                    )
            out.append((rec, tag))
        self.parked_tags = {tag for _, tag in out}
        self.dead_now = {tag for rec, tag in out if rec.dead}
        return out

    def _drain_recovered(self) -> list[tuple[Record, int]]:
        return [(rec, self.check_delivery(rec, recovering=True)) for rec in self._ready()]

    def _ready(self) -> Iterator[Record]:
        """Every message next_ready hands out, granting the log's walk its slices; a
        walk that goes on for more slices than the ring has records is stuck."""
        core = self.core
        slices = 0
        while True:
            rec = core.next_ready()
            if rec is not None:
                slices = 0
                yield rec
            elif not core.walking:
                return
            elif slices > core.capacity // PAD_SIZE:
                self.fail("walk makes no progress", f"{slices} slices without a message handed out")
            else:
                slices += 1
                core.flush()

    def _check_uptos_whole(self, found: set[int]) -> None:
        """An ACK up to an id that a crash interrupted (in any slice of its walk) took all
        of its messages, if the watermark survived, or none: each that had to survive
        the crash before it is back."""
        watermark = self.core.acked_upto
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
        self._check_counts(len(found), sum(self.messages[tag].size for _, tag in found))

    def _check_counts(self, messages: int, live_bytes: int) -> None:
        rec = self.core.recovery
        if self.rot_epoch:
            return
        if rec.messages != messages or rec.live_bytes != live_bytes:
            self.fail(
                "recovery count",
                f"recovery reports {rec.messages} messages, "
                f"{rec.live_bytes} live bytes; the file holds {messages}, {live_bytes}",
            )

    # ------------------------------------------------------------ actions

    def do_send_receipt(self) -> None:
        self.append(receipt=True)

    def do_send_plain(self) -> None:
        self.append(receipt=False)

    def append(self, receipt: bool) -> None:
        core = self.core
        tag = len(self.messages)
        msg = Msg(tag, make_payload(tag, self._draw_size(core.max_message)), sent_ms=self.wall_ms())
        self.messages[tag] = msg
        done = self._append_callback(tag) if receipt else None
        if receipt:
            self.waiting_appends.add(tag)
        try:
            rec = core.append(msg.payload, done, urgent=receipt)
        except TooLarge:
            self.waiting_appends.discard(tag)
            self._refused(msg, "TooLarge")
            if len(msg.payload) <= core.max_message:
                self.note(
                    "TooLarge for a storable payload", f"#{tag}: {len(msg.payload)} B <= max_message {core.max_message}"
                )
            return
        except QueueFull:
            self.waiting_appends.discard(tag)
            self._refused(msg, "QueueFull")
            self._check_queue_full(msg.size)
            return
        self._accepted(msg, rec, receipt)

    def _draw_size(self, max_message: int) -> int:
        """Mostly small payloads, some middling, some at or just past the largest."""
        r = self.rng.random()
        if r < 0.6:
            return self.rng.randint(0, 150)
        if r < 0.85:
            return self.rng.randint(150, max(150, max_message // 4))
        if r < 0.97:
            return self.rng.randint(max_message // 2, max_message)
        if r < 0.99:
            return max_message
        return max_message + self.rng.randint(1, 64)

    def _refused(self, msg: Msg, why: str) -> None:
        msg.rejected = True
        self.stats.refused += 1
        self.trace("append #%d (%d B): %s", msg.tag, len(msg.payload), why)

    def _accepted(self, msg: Msg, rec: Record, receipt: bool) -> None:
        if len(msg.payload) > self.core.max_message:
            self.fail(
                "accepted a payload larger than max_message",
                f"#{msg.tag}: {len(msg.payload)} B > {self.core.max_message}",
            )
        if rec.id <= self.id_floor:
            self.fail(
                "message id reused", f"#{msg.tag} got id {rec.id}; ids up to {self.id_floor} were assigned before"
            )
        self.id_floor = rec.id
        msg.id = rec.id
        self.stats.appends += 1
        if msg.refused_run != self.run:
            self.live[msg.tag] = msg.size
            self.live_bytes += msg.size
        self.trace("append #%d id %d (%d B)%s", msg.tag, rec.id, msg.size, " with receipt" if receipt else "")

    def _append_callback(self, tag: int) -> Callable[[str | None], None]:
        run = self.run
        return lambda reason: self._append_done(tag, run, reason)

    def _append_done(self, tag: int, run: int, reason: str | None) -> None:
        if run != self.run:
            return
        msg = self.messages[tag]
        if tag not in self.waiting_appends:
            self.fail("append answered twice", f"#{tag} (id {msg.id}): {reason!r}")
        self.waiting_appends.discard(tag)
        self.trace("receipt #%d id %s: %s", tag, msg.id, reason or "stored")
        if reason is None:
            msg.receipted = True
            msg.due_durable = max(msg.due_durable, msg.due_sent)
            msg.promise(self.rot_epoch)
            return
        msg.refused_run = run
        if self.live.pop(tag, None) is not None:
            self.live_bytes -= msg.size
        if self.fatal is None and self.disk.faults == self.disk_faults:
            self.fail("accepted SEND refused later without a disk fault", f"#{tag}: {reason}")

    def _check_queue_full(self, size: int) -> None:
        """QueueFull is the log's word that the live bytes leave no room: check it against
        the model's own count of live bytes (exact: the model saw every append and ACK),
        or the log's count once a disk fault refused appends the model cannot see or rot
        made recovery's count an estimate."""
        core = self.core
        # While a walk is under way the log counts the messages an ACK up to an id took
        # until the walk passes them (`check_step`): the log's own count is the one to use.
        exact = self.exact and not self.rot_epoch and self.disk.faults == self.disk_faults and not core.walking
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

    def do_take(self) -> None:
        """A consumer takes a message: a requeued one first, as the queue would."""
        consumer = self.rng.randrange(len(self.held))
        if self.redeliver:
            rec, tag = self.redeliver.popleft()
            self._check_handout(rec, tag)
            self.core.delivered(rec)
            self._check_payload(rec, tag)
            self.trace("consumer %d retakes #%d id %d", consumer, tag, rec.id)
        else:
            ready = self.core.next_ready()
            if ready is None:
                return
            rec = ready
            tag = self.check_delivery(rec)
            self.core.delivered(rec)
            self.trace("consumer %d takes #%d id %d", consumer, tag, rec.id)
        self.held[consumer].append((rec, tag))

    def do_ack(self) -> None:
        held = self._some_held()
        if held is None:
            return
        rec, tag = held.pop(self.rng.randrange(len(held)))
        self.core.ack(rec)
        self.stats.acks += 1
        msg = self.messages[tag]
        msg.acked_unconfirmed = True
        if self.live.pop(tag, None) is not None:
            self.live_bytes -= msg.size
        self.acks.append(tag)
        receipt = self.rng.random() < 0.5
        self.trace("ack #%d id %d%s", tag, rec.id, " with receipt" if receipt else "")
        if receipt:
            self._ask_durable()

    def do_nack(self) -> None:
        held = self._some_held()
        if held is None:
            return
        rec, tag = held.pop(self.rng.randrange(len(held)))
        self._requeue(rec, tag)
        if self.rng.random() < 0.3:
            self._ask_durable()

    def do_disconnect(self) -> None:
        held = self._some_held()
        if held is None:
            return
        self.trace("disconnect: %d held messages back", len(held))
        for rec, tag in held:
            self._requeue(rec, tag)
        held.clear()
        if self.rng.random() < 0.5:
            self._ask_durable()

    def _requeue(self, rec: Record, tag: int) -> None:
        self.core.requeue(rec)
        self._op(tag, "count", rec.deliveries)
        self.redeliver.append((rec, tag))
        self.trace("requeue #%d id %d", tag, rec.id)

    def _some_held(self) -> list[tuple[Record, int]] | None:
        holding = [h for h in self.held if h]
        return self.rng.choice(holding) if holding else None

    def _ask_durable(self) -> None:
        """A RECEIPT for an ACK, NACK or DISCONNECT: on_durable covers every ACK so far,
        and every rewrite of a record (requeue with its delay and count, burial, redrive)."""
        upto, sent, run, ops = len(self.acks), len(self.messages), self.run, len(self.parked_ops)
        self.waiting_durable += 1
        self.core.on_durable(lambda reason: self._durable_done(upto, sent, run, reason, ops))

    def _durable_done(self, upto: int, sent: int, run: int, reason: str | None, ops: int = 0) -> None:
        if run != self.run:
            return
        self.waiting_durable -= 1
        self.trace("ack receipt for %d acks: %s", upto, reason or "durable")
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
        if self.disk.faults == self.disk_faults:  # else appends nobody waits for may be refused unseen
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

    # ------------------------------------------------------------ parked steps

    def parked_step(self) -> None:
        """Maybe one step of delays, burials and redrives, drawn from a random stream of
        their own (so that seeds kept without them replay as before)."""
        x = self.prng.random()
        steps = (
            (0.05, self.do_send_delayed),
            (0.09, self.do_nack_delay),
            (0.11, self.do_bury),
            (0.16, self.do_release),
            (0.20, self.do_wall_jump),
            (0.22, self.do_dead_take),
            (0.25, self.do_dead_settle),
            (0.26, self.do_redrive),
            (0.29, self._ask_durable),
        )
        for upto, step in steps:
            if x < upto:
                step()
                return

    def do_send_delayed(self) -> None:
        core, rng = self.core, self.prng
        tag = len(self.messages)
        msg = Msg(tag, make_payload(tag, min(core.max_message, rng.choice((0, 40, 300, 2000)))), sent_ms=self.wall_ms())
        msg.due_sent = msg.due_run = self.wall_ms() + rng.choice(DELAYS)
        self.messages[tag] = msg
        receipt = rng.random() < 0.5
        done = self._append_callback(tag) if receipt else None
        if receipt:
            self.waiting_appends.add(tag)
        try:
            rec = core.append(msg.payload, done, urgent=receipt, due_ms=msg.due_sent)
        except (TooLarge, QueueFull) as err:
            self.waiting_appends.discard(tag)
            self._refused(msg, type(err).__name__)
            return
        self._accepted(msg, rec, receipt)
        self.trace("  (delayed to wall %d)", msg.due_sent)

    def _take_held(self) -> tuple[Record, int] | None:
        holding = [h for h in self.held if h]
        if not holding:
            return None
        held = self.prng.choice(holding)
        return held.pop(self.prng.randrange(len(held)))

    def do_nack_delay(self) -> None:
        """A NACK with a delay: the log parks the message until its due time."""
        got = self._take_held()
        if got is None:
            return
        rec, tag = got
        due = self.wall_ms() + self.prng.choice(DELAYS)
        self.core.requeue(rec, due)
        self.messages[tag].due_run = due
        self.delivered.discard(tag)  # parked again: its copy may come out of next_ready once due
        self._op(tag, "due", due)
        self._op(tag, "count", rec.deliveries)
        self.trace("nack #%d id %d with a delay to wall %d (%d deliveries)", tag, rec.id, due, rec.deliveries)

    def do_bury(self) -> None:
        got = self._take_held()
        if got is None:
            return
        rec, tag = got
        self.core.bury(rec, self.prng.choice(("max-deliveries", "expired")))
        self._op(tag, "bury", rec.deliveries)
        self.dead_held.append((rec, tag))
        self.dead_now.add(tag)
        if self.browse is not None:
            self.browse.at_start.discard(tag)  # not live all along: a browse may skip it
        self.trace("bury #%d id %d (%d deliveries)", tag, rec.id, rec.deliveries)

    def do_release(self) -> None:
        """The broker's timer: every parked message due by now comes back, none early."""
        back = self.core.due(self.wall_ms())
        for rec, tag in [(rec, self._check_payload(rec, None)) for rec in back]:
            msg = self.messages[tag]
            if tag in self.parked_tags:
                self.parked_tags.discard(tag)
            self._check_handout(rec, tag)
            if rec.dead:
                self.fail("dead letter released as due", f"#{tag} id {rec.id}")
            msg.due_run = 0
            self.delivered.add(tag)
            self.redeliver.append((rec, tag))
        if back:
            self.trace("release at wall %d: %d messages", self.wall_ms(), len(back))
        soonest = self.core.next_due()
        if soonest is not None and soonest < self.wall_ms() and self.core.due(self.wall_ms()):
            self.fail("due message left parked", f"next_due {soonest} < wall {self.wall_ms()} after a release")

    def do_wall_jump(self) -> None:
        self.wall_skew += self.prng.choice(WALL_JUMPS)

    def do_dead_take(self) -> None:
        """A reader of the dead letters takes the next one the log holds."""
        rec = self.core.next_dead()
        if rec is None:
            return
        tag = self._check_payload(rec, None)
        if not rec.dead:
            self.fail("dead letter without a reason", f"#{tag} id {rec.id}")
        self.parked_tags.discard(tag)
        self.delivered.add(tag)
        self.dead_held.append((rec, tag))
        self.trace("dead letter #%d id %d taken (%s)", tag, rec.id, rec.dead)

    def do_dead_settle(self) -> None:
        """A dead letter the caller holds: ACKed for good, revived, or kept."""
        if not self.dead_held:
            return
        rec, tag = self.dead_held.pop(self.prng.randrange(len(self.dead_held)))
        msg = self.messages[tag]
        x = self.prng.random()
        if x < 0.4:
            self.core.ack(rec)
            msg.acked_unconfirmed = True
            if self.live.pop(tag, None) is not None:
                self.live_bytes -= msg.size
            self.acks.append(tag)
            self.dead_now.discard(tag)
            self.trace("dead letter #%d id %d acked", tag, rec.id)
        elif x < 0.8:
            self.core.revive(rec)
            self._revived(msg)
            self.redeliver.append((rec, tag))
            self.dead_now.discard(tag)
            self.trace("dead letter #%d id %d revived", tag, rec.id)
        else:
            self.core.requeue(rec)  # given back: still dead, still held
            self.dead_held.append((rec, tag))

    def _op(self, tag: int, kind: str, value: int) -> None:
        """A rewrite of a message's record, durable once an on_durable after it answers."""
        self.parked_ops.append((tag, kind, value, self.messages[tag].revivals))

    def _revived(self, msg: Msg) -> None:
        """A revive or redrive asked for: the rewrite may reach the disk from now on (a
        kill keeps it unsynced), so the burial and the count on disk no longer bind."""
        msg.revived_run = True
        msg.revivals += 1
        msg.dead_durable = False
        msg.count_durable = 0

    def do_redrive(self) -> None:
        """A redrive of the dead letters the log holds: each comes back from `due` at once."""
        count = self.prng.choice((1, 3, None))
        before = self.core.dead
        moved = self.core.redrive(count, None)
        if moved > before or (count is not None and moved > count):
            self.fail("redrive moved too many", f"{moved} of {before} (asked {count})")
        back = self.core.due(self.wall_ms())
        mine = []
        for rec in back:
            tag = self._check_payload(rec, None)
            msg = self.messages[tag]
            if rec.deliveries == 0 and tag in self.parked_tags and msg.dead_durable:
                mine.append(tag)
                self.dead_now.discard(tag)
                self._revived(msg)
            self.parked_tags.discard(tag)
            self._check_handout(rec, tag)
            msg.due_run = 0
            self.delivered.add(tag)
            self.redeliver.append((rec, tag))
        if len(mine) < moved and not self.rot_epoch:
            self.fail("redrive lost a dead letter", f"{moved} moved, {len(mine)} came back")
        self.trace("redrive of %s: %d moved", count, moved)

    # ------------------------------------------------------------ replay steps

    def replay_step(self) -> None:
        """Maybe one step of the replayable reads, drawn from their own random stream:
        an ACK up to an id, or a browse opened or stepped on."""
        x = self.xrng.random()
        if x < 0.015:
            self.do_ack_upto()
        elif self.browse is None:
            if x < 0.06:
                self.do_browse_open()
        elif x < 0.45:
            self.do_browse_step()

    def do_ack_upto(self) -> None:
        """ACK up to an id: every live message up to it is gone at once, wherever it is."""
        core, rng = self.core, self.xrng
        last = core.last_id
        upto = rng.choice((rng.randint(0, last), last, core.acked_upto, rng.randint(max(0, last - 5), last)))
        covered = [tag for tag in self.live if (self.messages[tag].id or 0) <= upto]
        survivors = [tag for tag in covered if self.messages[tag].must_survive()]
        self.open_uptos.append((upto, survivors, self.rot_epoch))
        for tag in covered:
            self.messages[tag].acked_unconfirmed = True
            self.live_bytes -= self.live.pop(tag)
        self.held = [[(rec, tag) for rec, tag in held if rec.id > upto] for held in self.held]
        self.redeliver = deque((rec, tag) for rec, tag in self.redeliver if rec.id > upto)
        self.dead_held = [(rec, tag) for rec, tag in self.dead_held if rec.id > upto]
        self.dead_now -= set(covered)
        self.parked_tags -= set(covered)
        self.stats.uptos += 1
        receipt = rng.random() < 0.7
        self.trace("ack up to %d (%d live messages)%s", upto, len(covered), " with receipt" if receipt else "")
        if not receipt:
            core.ack_upto(upto)
            return
        run = self.run
        self.waiting_durable += 1

        def done(reason: str | None) -> None:
            if run != self.run:
                return
            self.waiting_durable -= 1
            self.trace("ack up to %d receipt: %s", upto, reason or "durable")
            if reason is not None:
                return
            for tag in covered:
                self.messages[tag].acked_durable = True
                self.messages[tag].promise(self.rot_epoch)
            self.upto_durable = max(self.upto_durable, upto)

        core.ack_upto(upto, done)

    def do_browse_open(self) -> None:
        core, rng = self.core, self.xrng
        last = core.last_id
        first = rng.randint(0, last + 2)
        to = rng.choice((last, last, rng.randint(first, last + 3), first - 1))
        at_start = {
            tag for tag in self.live if first <= (self.messages[tag].id or 0) <= to and tag not in self.dead_now
        }
        self.browse = Browsing(core.browse(first, to), first, to, at_start)
        self.trace("browse %d..%d opened (%d live in range)", first, to, len(at_start))

    def do_browse_step(self) -> None:
        """A step of the open browse: each message it returns is live, in range, ours byte
        for byte, and new to it; at its end, none live all along is missing."""
        b = self.browse
        assert b is not None
        step = b.browse.step(self.xrng.choice((1, 300, 5000, 1 << 20)))
        strict = self.exact and not self.rot_epoch and self.disk.faults == self.disk_faults
        for msg_id, payload in step.messages:
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
            self.stats.browsed += 1
        self.trace("browse step: %d messages%s", len(step.messages), ", done" if step.done else "")
        if not step.done:
            return
        missed = sorted(tag for tag in b.at_start if tag in self.live and tag not in b.got and tag not in self.dead_now)
        if missed and strict:
            self.fail(
                "browse missed a live message",
                f"{len(missed)} of the browse {b.first}..{b.last}, e.g. #{missed[0]} id {self.messages[missed[0]].id}",
            )
        self.core.end_browse(b.browse)
        self.browse = None
        self.stats.browses += 1

    def do_clock(self) -> None:
        self.now += self.rng.choice((0.001, 0.005, 0.02, 0.05, 0.06, 0.2))

    def do_flush(self) -> None:
        self.core.flush()

    def do_sync(self) -> None:
        self.core.sync()

    def do_loop_pass(self) -> None:
        self.now += 0.002
        self.core.flush()
        self.core.sync()

    def do_settle(self) -> None:
        self.trace("settle")
        self.settle(0)

    def do_crash(self) -> None:
        self.crash(self.rng.choice(CRASH_MODES))

    def do_crash_mid_op(self) -> None:
        """Arm a crash for one of the next few disk calls, wherever the log makes them:
        between two writes of a batch, between a write and its sync."""
        self.armed_mode = self.rng.choice(CRASH_MODES)
        self.disk.arm_crash(self.rng.randint(0, 6))
        self.trace("crash (%s) armed", self.armed_mode)

    def settle(self, min_rounds: int) -> None:
        """Rounds of (clock, flush, sync) until every append and ack receipt is answered;
        more than SETTLE_ROUNDS of them is a wedge."""
        for n in range(SETTLE_ROUNDS + 1):
            if n >= min_rounds and not self.waiting_appends and not self.waiting_durable:
                return
            if n == SETTLE_ROUNDS or self.fatal is not None:
                break
            self.now += ROUND_SECONDS
            self.core.flush()
            self.core.sync()
        if self.waiting_appends or self.waiting_durable:
            self.fail(
                "wedge",
                f"{len(self.waiting_appends)} appends (e.g. #{min(self.waiting_appends, default=-1)}) "
                f"and {self.waiting_durable} ack receipts unanswered after {SETTLE_ROUNDS} rounds"
                f"{'' if self.fatal is None else ' and a fatal error: ' + self.fatal}",
            )

    # ------------------------------------------------------------ checks

    def check_delivery(self, rec: Record, recovering: bool = False) -> int:
        """A record from next_ready: a payload we appended, byte for byte, under its own
        id, size and send stamp, not delivered before in this run, not taken by a receipted ACK."""
        tag = self._check_payload(rec, None)
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
            why = "refused with an error" if msg.refused_run == self.run else "not live in this run"
            self.fail("dead message delivered", f"#{tag} id {rec.id} ({why})")
        self._check_handout(rec, tag)
        return tag

    def _check_handout(self, rec: Record, tag: int) -> None:
        """A message handed out to a consumer (next_ready, or back from `due`): never
        before a due time the log was told in this run or that was on disk, never a dead
        letter whose burial was on disk, with no fewer deliveries than the last rewrite
        of its record on disk counted."""
        msg = self.messages[tag]
        if self.rot_epoch:
            return  # the crash model promises less after bit rot
        due = max(msg.due_run, msg.due_durable)
        if self.wall_ms() < due:
            self.fail("delivered before its due time", f"#{tag} id {rec.id}: due {due}, wall {self.wall_ms()}")
        if msg.revived_run:
            return
        if msg.dead_durable:
            self.fail("buried message delivered", f"#{tag} id {rec.id}: its burial was on disk")
        if rec.deliveries < msg.count_durable:
            self.fail(
                "delivery count went down",
                f"#{tag} id {rec.id}: {rec.deliveries} deliveries, {msg.count_durable} were on disk",
            )

    def _check_payload(self, rec: Record, tag: int | None) -> int:
        payload = bytes(self.core.payload(rec))
        found = payload_tag(payload)
        msg = self.messages.get(found) if found is not None else None
        if found is None or msg is None or payload != msg.payload or (tag is not None and found != tag):
            self.fail(
                "damaged record delivered",
                f"id {rec.id}, {len(payload)} B starting {bytes(payload[:48])!r}"
                + (f", expected #{tag}" if tag is not None else ""),
            )
        return found

    def check_step(self) -> None:
        size = self.disk.size()
        if size > self.cfg.cap or size > self.core.end:
            self.fail("file past the cap", f"size {size}, cap {self.cfg.cap}, end {self.core.end}")
        if self.disk.faults != self.disk_faults:
            self.exact = False
        # A walk in slices uncounts the messages an ACK up to an id took as it passes
        # them: until it is done the log may count more than the model, never less.
        walking = self.core.walking and self.core.live_bytes > self.live_bytes
        if (
            self.exact
            and not self.rot_epoch
            and self.fatal is None
            and self.core.live_bytes != self.live_bytes
            and not walking
        ):
            gap = self.core.live_bytes - self.live_bytes
            self.fail(
                "live bytes",
                f"log says {self.core.live_bytes}, model says {self.live_bytes}: "
                + (
                    "a message the log accepted and never refused is gone from its count"
                    if gap < 0
                    else "the log counts bytes of no live message"
                ),
            )
        if self.fatal is not None and (self.waiting_appends or self.waiting_durable):
            self.fail(
                "fatal error left callbacks unanswered",
                f"{len(self.waiting_appends)} appends, {self.waiting_durable} ack receipts",
            )

    def finish(self) -> None:
        """Quiesce and prove it: settle, read every message, sync; then a power loss must
        keep exactly the live messages, receipted or not. Faults stop first, and a run
        whose model went inexact (a disk fault refused appends nobody waited for) is
        crashed and recovered, so that the model knows the live messages again."""
        self.trace("finish")
        self.faults_on = False
        self.disk.write_eio = self.disk.sync_eio = 0.0
        self.disk.arm_crash(None)
        if self.fatal is not None or not self.exact:
            self.crash("kill")
        self._ask_durable()
        self.settle(SETTLE_ROUNDS)
        self.check_step()
        for rec in self._ready():
            self.check_delivery(rec)
        self.wall_skew += 10**10  # every delayed message is due: each comes back, once
        self.do_release()
        for rec in self._ready():
            self.check_delivery(rec)
        while self.core.next_dead() is not None:
            pass
        self.delivered.update(tag for _, tag in self.dead_held)
        self.delivered.update(self.parked_tags)
        self.core.flush()
        self.core.sync()
        if self.fatal is not None or self.disk.faults != self.disk_faults:
            return
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
        self.stats.faults += self.disk.faults - self.disk_faults
        self.stats.powers += 1
        self._drop_core()
        self.disk = self.disk.crash("power")
        self.restart()


def _format_trace(entry: tuple) -> str:
    step, run, fmt, args = entry
    return f"  step {step:4d} run {run:2d}: " + (fmt % args)


# ---------------------------------------------------------------- running seeds


@dataclass(slots=True)
class Finding:
    """One broken invariant of one seed: where, what, and the trace leading to it."""

    kind: str
    step: int
    text: str
    trace: list[str]


@dataclass(slots=True)
class Outcome:
    seed: int
    stats: Stats
    findings: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def report(self, steps: int, trace: bool = True) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"seed {self.seed} step {f.step}: {f.text}")
            lines += f.trace if trace else []
        lines.append(f"  replay: bin/crashsim --seed {self.seed} --steps {steps} -v")
        return "\n".join(lines)


def run_seed(
    seed: int,
    steps: int = STEPS,
    verbose: bool = False,
    out: Callable[[str], None] = print,
    ignore: frozenset[str] = frozenset(),
    replay_steps: bool = True,
) -> Outcome:
    """Play one seed; a broken invariant or an exception from the log is its failure.
    Kinds in `ignore` are dropped (to hunt past a known failure that notes, not stops).
    replay_steps=False plays it as before ACK up to an id and browses existed."""
    sim = Sim(seed, steps, verbose, out, replay_steps)
    outcome = Outcome(seed, sim.stats)
    try:
        sim.play()
    except SimFailure as err:
        outcome.findings.append(_finding(sim, err.kind, str(err)))
    except Exception as err:  # the log raising is a finding, reported like the others
        text = f"exception from the log: {err!r}\n" + traceback.format_exc(limit=-6)
        outcome.findings.append(_finding(sim, f"exception {type(err).__name__}", text))
    outcome.findings += [Finding(kind, step, text, trace) for kind, (step, text, trace) in sim.notes.items()]
    outcome.findings = [f for f in outcome.findings if f.kind not in ignore]
    sim.stats.failures = int(outcome.failed)
    return outcome


def _finding(sim: Sim, kind: str, text: str) -> Finding:
    return Finding(kind, sim.step, text, [_format_trace(e) for e in sim.trace_lines])


@dataclass(slots=True)
class Totals:
    stats: Stats = field(default_factory=Stats)
    failed: list[Outcome] = field(default_factory=list)

    def add(self, other: Totals) -> None:
        self.stats.add(other.stats)
        self.failed += other.failed


def run_range(
    start: int, count: int, steps: int = STEPS, ignore: frozenset[str] = frozenset(), replay_steps: bool = True
) -> Totals:
    """Play seeds start .. start+count-1 in this process."""
    totals = Totals()
    for seed in range(start, start + count):
        outcome = run_seed(seed, steps, ignore=ignore, replay_steps=replay_steps)
        totals.stats.add(outcome.stats)
        if outcome.failed:
            totals.failed.append(outcome)
    return totals


def _run_block(args: tuple[int, int, int, frozenset[str], bool]) -> Totals:
    return run_range(*args)


def run_many(
    start: int,
    count: int,
    steps: int,
    jobs: int,
    ignore: frozenset[str] = frozenset(),
    progress: Callable[[Totals, float], None] | None = None,
    replay_steps: bool = True,
) -> Totals:
    """Play `count` seeds over `jobs` processes, calling `progress` now and then."""
    block = max(1, min(200, count // (jobs * 4) or 1))
    blocks = [
        (s, min(block, start + count - s), steps, ignore, replay_steps) for s in range(start, start + count, block)
    ]
    totals = Totals()
    began = last = time.monotonic()
    for part in _map(blocks, jobs):
        totals.add(part)
        now = time.monotonic()
        if progress is not None and now - last >= 5.0:
            progress(totals, now - began)
            last = now
    return totals


def _map(blocks: list[tuple[int, int, int, frozenset[str], bool]], jobs: int) -> Iterator[Totals]:
    if jobs <= 1:
        yield from map(_run_block, blocks)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap_unordered(_run_block, blocks)


# ---------------------------------------------------------------- command line


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Crash-simulate curb's log over many seeds.")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to play (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, help="play just this seed (replay a failure)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per seed (default {STEPS})")
    parser.add_argument("--jobs", type=int, default=1, help="processes to fan out over (default 1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the trace of every step")
    parser.add_argument(
        "--no-replay-steps",
        dest="replay_steps",
        action="store_false",
        help="play without ACK up to an id and browses (as seeds found before they existed)",
    )
    parser.add_argument("--show", type=int, default=10, help="failures to print in full (default 10)")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="KIND",
        help="drop findings of this kind (as printed after FAILED); repeatable",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    if args.seed is not None:
        return _replay(args.seed, args.steps, args.verbose, frozenset(args.ignore), args.replay_steps)
    began = time.monotonic()
    totals = run_many(
        args.start,
        args.seeds,
        args.steps,
        max(1, args.jobs),
        frozenset(args.ignore),
        _progress(args.seeds),
        args.replay_steps,
    )
    _summarize(totals, args, time.monotonic() - began)
    return 1 if totals.failed else 0


def _replay(seed: int, steps: int, verbose: bool, ignore: frozenset[str], replay_steps: bool) -> int:
    began = time.monotonic()
    outcome = run_seed(seed, steps, verbose, ignore=ignore, replay_steps=replay_steps)
    print(f"seed {seed}: {outcome.stats.line()}, {time.monotonic() - began:.2f} s")
    if not outcome.failed:
        print("ok")
        return 0
    print(outcome.report(steps, trace=not verbose))
    return 1


def _progress(total: int) -> Callable[[Totals, float], None]:
    def show(totals: Totals, seconds: float) -> None:
        done = totals.stats.seeds
        print(
            f"crashsim: {done}/{total} seeds, {len(totals.failed)} failed, {done / seconds:.0f} seeds/s",
            file=sys.stderr,
            flush=True,
        )

    return show


def _summarize(totals: Totals, args: argparse.Namespace, seconds: float) -> None:
    for outcome in sorted(totals.failed, key=lambda o: o.seed)[: args.show]:
        print(outcome.report(args.steps), end="\n\n")
    kinds: dict[str, list[int]] = {}
    for outcome in totals.failed:
        for kind in {f.kind for f in outcome.findings}:
            kinds.setdefault(kind, []).append(outcome.seed)
    for kind, seeds in sorted(kinds.items()):
        seeds.sort()
        print(f"FAILED {kind}: {len(seeds)} seeds, e.g. {seeds[:8]}")
    print(
        f"crashsim: seeds {args.start}..{args.start + args.seeds - 1}: {totals.stats.line()}, "
        f"{seconds:.1f} s with {max(1, args.jobs)} jobs"
    )


if __name__ == "__main__":
    sys.exit(main())
