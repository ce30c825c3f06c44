"""The simulator's driver: one seed's steps, its clock, its crashes and restarts.

    bin/crashsim --broker --seeds 20000 --jobs 2     # many seeds
    bin/crashsim --broker --seed S -v                # replay one seed with its trace

The world is the real thing, minus sockets and the event loop: a `LogCore` on a
`SimDisk`, the `Broker` over it with a `SimClock` for its timers (ack deadlines, due
times) and as the log's wall clock (due and expiry times), and one
`Session` per client, fed the frames' bytes and drained of its output, which the client
parses. The driver is the event loop and the transport: after every step it runs what
the broker scheduled, hands each session's output to its client (and the client's
news to the checker), closes the connections that asked to, and repeats until nothing
moves. The log writes and syncs only in the steps that say so (a loop pass, a write, a
sync), so receipts wait as they would for a slow disk. The clock moves only in jumps;
after each, the broker's due timers fire and every session past a heart-beat deadline
is ticked.

A crash (kill -9 or power loss between steps, or armed to strike within the next few
disk calls, amid recovery too) drops the world without closing anything, keeps what
`SimDisk.crash` says survives and builds a new world on it. After every restart a full
read of the log (a browse, and the log's dead letters) must hold every promised message
and no message a receipted ACK took; after every step the queue's counts must be the
checker's. A seed
ends by settling (every receipt answered), dropping every client, draining the queue
and then the dead letters, each with one consumer (it must get exactly the model's
messages there), ACKing all of them with receipts, and a power loss after which the
log must be empty.

Every choice comes from the seed's random stream, so the same seed with the same
--steps replays the same run; a failure prints the command that does so. The seeds,
the processes, the totals and the command line are the runner's (`sim.runner`), which
plays the log's workload (`sim.log_driver`) the same way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simclock import SimClock
from simdisk import Crashed, SimDisk

from curb import payload
from curb.broker import Broker, BrokerEvents
from curb.broker_config import BrokerConfig
from curb.conn import OPEN
from curb.frame import Frame, FrameParser, encode
from curb.log import LogCore, Record, max_message_for
from curb.log.cursor import RECORD_WORK, SLICE_WORK
from curb.redelivery import Redelivery
from curb.session import Session
from sim import runner
from sim.checker import Checker, Found, SimFailure, body_for, tag_of
from sim.workload import DEAD_ACK_TIMEOUTS, DELAYS_MS, Action, Config, Workload

STEPS = 300
START_MS = 1_000_000_000  # the simulated monotonic clock, in ms
SETTLE_ROUNDS = 20
ROUND_MS = 60
TRACE_KEEP = 80
QUEUE = "/queue/curb"
DRAIN_PREFETCH = 10_000
SETTLE_PASSES = 1000  # passes of settle_io before the broker counts as spinning
TIMERS_PER_PASS = 10
WALK_PASSES = 100_000  # loop passes a walk of the log may take, one slice each (far more than a log holds records)
SLICES = (1, 3 * RECORD_WORK, 64 * RECORD_WORK, SLICE_WORK, SLICE_WORK)  # a walk's slice: one record up to the default
# The share of NACKs that say curb-undelivered:true, as `curb router` does for a MESSAGE it
# had no client with credit for.
BOUNCE_SHARE = 0.3


def dead_records(log: LogCore) -> list[Record]:
    """Every dead letter the log holds, read now (as a browse of them reads them)."""
    last, kept = log.dead_letters()
    ids, _ = log.dead_after(0, last, 1 << 62)
    return [rec for mid in ids if (rec := log.read_dead(mid)) is not None] + kept


@dataclass(slots=True)
class Stats(runner.Stats):
    """What a run of seeds did, summed over seeds and processes for the totals line."""

    steps: int = 0
    kills: int = 0
    powers: int = 0
    mid_op: int = 0
    sends: int = 0
    refused: int = 0
    deliveries: int = 0
    redeliveries: int = 0
    acks: int = 0
    nacks: int = 0
    bounces: int = 0
    touches: int = 0
    late: int = 0
    deadlines: int = 0
    beats_lost: int = 0
    disconnects: int = 0
    delayed: int = 0
    expiring: int = 0
    redrives: int = 0
    dead_letters: int = 0
    uptos: int = 0
    browses: int = 0
    browsed: int = 0
    unsubscribes: int = 0
    faults: int = 0
    fatal: int = 0

    def line(self) -> str:
        return (
            f"seeds {self.seeds}, steps {self.steps}, crashes {self.kills + self.powers} "
            f"(kill {self.kills}, power {self.powers}; {self.mid_op} amid a step or a recovery), "
            f"sends {self.sends} (+{self.refused} refused), deliveries {self.deliveries} "
            f"({self.redeliveries} again), acks {self.acks}, nacks {self.nacks} ({self.bounces} undelivered), "
            f"touches {self.touches}, "
            f"late {self.late}, deadlines passed {self.deadlines}, heart-beats lost {self.beats_lost}, "
            f"disconnects {self.disconnects}, delayed SENDs {self.delayed}, expiring SENDs {self.expiring}, "
            f"dead letters delivered {self.dead_letters}, redrives {self.redrives}, "
            f"acks up to an id {self.uptos}, browses {self.browses} ({self.browsed} messages), "
            f"unsubscribes {self.unsubscribes}, disk faults {self.faults} ({self.fatal} broke the log), "
            f"failures {self.failures}"
        )


class World:
    """One run of the broker: its log recovered from the disk, the broker, and what the
    broker scheduled (run by `Sim.settle_io`)."""

    def __init__(self, disk: SimDisk, cfg: Config, clock: SimClock, slice_work: int = SLICE_WORK):
        events = BrokerEvents()
        self.log = LogCore(disk, cfg.cap, events=events, clock=clock.time, wall_ms=clock.wall_ms, slice_work=slice_work)
        self.later: list[Callable[[], None]] = []
        self.broker = Broker(
            self.log,
            BrokerConfig(
                heartbeat_ms=cfg.heartbeat_ms,
                ack_timeout=cfg.ack_timeout_ms / 1000,
                redelivery=Redelivery(
                    cfg.redelivery_delay_ms, cfg.redelivery_multiplier, cfg.redelivery_max_delay_ms, cfg.max_deliveries
                ),
            ),
            schedule=lambda delay, callback: self.later.append(callback),
            clock=clock.time,
            loop=clock,
        )
        events.broker = self.broker


def read_log(log: LogCore) -> list[Found]:
    """Every message in the log, in id order: the queued ones (delayed too) by a browse,
    then the dead letters by the log's list of them (as a restart finds them)."""
    found: list[Found] = []
    browse = log.browse(1, log.last_id)
    for _ in range(log.capacity):
        step = browse.step(1 << 40)
        found += [Found(msg_id, bytes(payload.split(memoryview(data))[1])) for msg_id, data in step.messages]
        if step.done:
            break
    else:
        raise SimFailure("log read after restart", "the browse never ended")
    log.end_browse(browse)
    for rec in dead_records(log):
        found.append(Found(rec.id, bytes(payload.split(memoryview(log.payload(rec)))[1]), rec.dead, rec.deliveries))
    return found


def recover(
    disk: SimDisk,
    cfg: Config,
    clock: SimClock,
    slice_work: int,
    rng: random.Random,
    odds: float | None,
    prepare: Callable[[SimDisk], None] = lambda disk: None,
    crashed: Callable[[str], None] = lambda mode: None,
) -> tuple[World, SimDisk]:
    """A broker recovered from `disk`, and the disk it runs on. Each try first calls
    `prepare` with the disk; with `odds` (None: no draw) a crash strikes within its first
    few disk calls, `crashed` hears of its mode, and recovery starts over on what that
    crash left (the dead try's timers never fire)."""
    while True:
        prepare(disk)
        if odds is not None and rng.random() < odds:
            disk.arm_crash(rng.randint(0, 4))
        try:
            world = World(disk, cfg, clock, slice_work)
            break
        except Crashed:
            mode = rng.choice(("kill", "power"))
            clock.cancel_all()
            crashed(mode)
            disk = disk.crash(mode)
    disk.arm_crash(None)
    return world, disk


class Client:
    """One connection as its client knows it: the session it talks to, what it holds
    (ack id -> tag, in delivery order) and the frames it numbered."""

    def __init__(self, serial: int, session: Session, beats: bool):
        self.serial = serial
        self.session = session
        self.parser = FrameParser()
        self.beats = beats
        self.ack_mode = ""
        self.dead = False  # subscribed to ./dead
        self.holding: dict[str, int] = {}
        self.ending = False
        self.seq = 0
        self.subscribed = ""  # its active subscription: "queue", "dead" or ""
        self.browse: str | None = None  # the id of its browse under way
        self.browses = itertools.count(1)
        self.counting = False  # subscribed to ./count

    @property
    def open(self) -> bool:
        return not self.ending and self.session.state is OPEN

    @property
    def held(self) -> list[str]:
        return list(self.holding)

    @property
    def browsing(self) -> bool:
        return self.browse is not None

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


class Sim:
    """One seed's run."""

    def __init__(
        self,
        seed: int,
        steps: int = STEPS,
        verbose: bool = False,
        out: Callable[[str], None] = print,
        extra: bool = True,
        slices: bool = True,
        bounces: bool = True,
    ):
        self.seed = seed
        self.steps = steps
        self.verbose = verbose
        self.out = out
        self.rng = random.Random(seed)
        self.cfg = Config.draw(self.rng)
        self.stats = Stats(seeds=1)
        self.ms = START_MS
        self.clock = SimClock(self.ms / 1000)
        self.disk = SimDisk(self.rng)
        self.checker = Checker(self.cfg, self.ms, self.clock.wall_ms)
        self.clients: list[Client | None] = [None] * self.cfg.slots
        self.tags = itertools.count(1)
        self.serials = itertools.count(1)
        self.step = -1
        self.run = 0
        self.armed_mode = "kill"
        self.trace_lines: deque[str] = deque(maxlen=TRACE_KEEP)
        xrng = random.Random(f"extra steps of seed {seed}") if extra else None
        self.workload = Workload(self.rng, self.cfg, max_message_for(self.cfg.cap) - 40, xrng)
        self.extra = self.workload.extra_cfg
        # The work of a slice of the log's walks (reading for delivery, ACK up to an id,
        # browses): small ones make every walk span loop passes, as a large log's do.
        # Drawn from a stream of its own, so that the other choices replay as before.
        self.slice_work = random.Random(f"slices of seed {seed}").choice(SLICES) if extra and slices else SLICE_WORK
        # Which NACKs say curb-undelivered:true (a router's hand-back): drawn from a stream
        # of their own too.
        self.bounce_rng = random.Random(f"bounces of seed {seed}") if extra and bounces else None
        self.checker.dead_timeouts = DEAD_ACK_TIMEOUTS
        self.known: list[int] = []  # the message ids the clients saw, in the order they saw them
        self.faults_on = True
        self.faults_seen = 0  # the disk's faults the checker was told of
        self._world: World | None = None

    @property
    def world(self) -> World:
        """The broker's current run; only asked for between an open and the next crash."""
        assert self._world is not None, "the broker is not running"
        return self._world

    # ---------------------------------------------------------------- driving

    def play(self) -> None:
        self.trace(f"config {self.cfg}")
        if self.extra is not None:
            self.trace(f"extra {self.extra}, slice work {self.slice_work}")
        self._world = self._open()
        for step in range(self.steps):
            self.step = step
            self.play_step(self.workload.next(self.clients))
            extra = self.workload.extra(self.clients, self.known)
            if extra is not None:
                self.play_step(extra)
        self.step = self.steps
        self.finish()

    def traced(self) -> list[str]:
        return list(self.trace_lines)

    def notes(self) -> list[runner.Finding]:
        """Findings that let the seed play on: the whole broker's checker has none (each
        of its findings stops the seed)."""
        return []

    def play_step(self, action: Action) -> None:
        """One step, what it set off, and the checks after it; a disk fault that broke
        the log stops the broker, which the simulator then restarts (a kill: the page
        cache outlives the process)."""
        self.trace(str(action))
        try:
            self.do(action)
            self._faults()
            self.settle_io()
            self._faults()
        except Crashed:
            self.stats.mid_op += 1
            self.crash(self.armed_mode)
        self.stats.steps += 1
        if self.world.log.broken is not None:
            self.trace(f"the log broke: {self.world.log.broken}")
            self.stats.fatal += 1
            self.crash("kill")
        counts = self.world.broker.counts()
        self.checker.check_counts(counts, self.world.log.walking)
        # A session that can take no output owes its ./count update until it can (README).
        owed = {c.serial for c in self.clients if c is not None and c.session.messages.counts_owed}
        self.checker.check_count_views(counts, owed)

    def _faults(self) -> None:
        """Tell the checker of a disk fault (a refusal or an ERROR "... not stored" may follow)."""
        if self.disk.faults != self.faults_seen:
            self.stats.faults += self.disk.faults - self.faults_seen
            self.faults_seen = self.disk.faults
            self.checker.disk_fault()

    def trace(self, line: str) -> None:
        entry = f"  step {self.step:4d} run {self.run:2d} t+{self.ms - START_MS:7d}ms: {line}"
        self.trace_lines.append(entry)
        if self.verbose:
            self.out(entry)

    def do(self, action: Action) -> None:
        getattr(self, "do_" + action.kind)(action)

    def do_connect(self, a: Action) -> None:
        serial = next(self.serials)
        session = Session(self.world.broker, self.now, f"sim:{serial}")
        client = Client(serial, session, a.heartbeat_ms > 0)
        self.clients[a.slot] = client
        self.checker.connected(serial)
        beats = f"{a.heartbeat_ms},{a.heartbeat_ms}"
        self.feed(client, "CONNECT", {"accept-version": "1.2", "heart-beat": beats})
        if a.mode == "dead":
            client.ack_mode, client.dead, client.subscribed = "client-individual", True, "dead"
            self.checker.subscribed(serial, client.ack_mode, a.ack_timeout_ms, dead=True)
            headers = {"id": "d", "destination": "./dead", "ack": client.ack_mode, "prefetch-count": str(a.prefetch)}
            if a.ack_timeout_ms is not None:
                headers["curb-ack-timeout"] = str(a.ack_timeout_ms)
            self.feed(client, "SUBSCRIBE", headers)
        elif a.mode:
            client.ack_mode, client.subscribed = a.mode, "queue"
            headers = {"id": "s", "destination": QUEUE, "ack": a.mode, "prefetch-count": str(a.prefetch)}
            if a.ack_timeout_ms is not None:
                headers["curb-ack-timeout"] = str(a.ack_timeout_ms)
            self.checker.subscribed(serial, a.mode, a.ack_timeout_ms)
            self.feed(client, "SUBSCRIBE", headers)

    def do_send(self, a: Action) -> None:
        client = self._client(a)
        tag = next(self.tags)
        body = body_for(tag, a.size)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        headers = {"destination": QUEUE, "sim-tag": str(tag)}
        wall = self.checker.wall
        due = expires = 0
        if a.delay_ms is not None:
            due = wall + a.delay_ms
            headers[a.due_header] = str(due if a.due_header == "AMQ_SCHEDULED_TIME" else a.delay_ms)
        if a.ttl_ms:
            expires = wall + a.ttl_ms
            headers[a.expiry_header] = str(expires if a.expiry_header == "expires" else a.ttl_ms)
        self.checker.sent(client.serial, seq, tag, body, receipt, due, expires)
        self.trace(f"  #{tag} sent" + (f", due in {due - wall} ms" if due else ""))
        self.stats.delayed += bool(due)
        self.stats.expiring += bool(expires)
        if receipt is not None:
            headers["receipt"] = receipt
        self.feed(client, "SEND", headers, body)
        self.stats.sends += 1
        if client.session.state is not OPEN:
            self.trace(f"#{tag} refused")
            self.stats.refused += 1
            self.checker.refused(client.serial, tag, receipt, self.world.log.broken is not None)
            client.ending = True
        else:
            self.checker.assigned(tag, self.world.log.last_id)

    def do_ack(self, a: Action) -> None:
        self._settle(a, "ACK")
        self.stats.acks += 1

    def do_nack(self, a: Action) -> None:
        if self.bounce_rng is not None and self.bounce_rng.random() < BOUNCE_SHARE:
            self._settle(a, "bounce")
            self.stats.bounces += 1
        else:
            self._settle(a, "NACK")
        self.stats.nacks += 1

    def do_touch(self, a: Action) -> None:
        self._settle(a, "touch")
        self.stats.touches += 1

    def _settle(self, a: Action, kind: str) -> None:
        client = self._client(a)
        tag = client.holding[a.ack_id]
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        delay_ms = None if kind == "bounce" else a.delay_ms
        self.checker.settle(client.serial, seq, kind, tag, receipt, a.ms, delay_ms)
        if kind != "touch":
            held = client.held
            for ack_id in held[: held.index(a.ack_id) + 1] if client.ack_mode == "client" else [a.ack_id]:
                del client.holding[ack_id]
        headers = {"id": a.ack_id}
        if receipt is not None:
            headers["receipt"] = receipt
        if kind == "touch":
            headers["curb-touch"] = str(a.ms)
        if delay_ms is not None:
            headers["curb-delay"] = str(delay_ms)
        if kind == "bounce":
            headers["curb-undelivered"] = "true"
        self.feed(client, "NACK" if kind in ("touch", "bounce") else kind, headers)

    def do_disconnect(self, a: Action) -> None:
        client = self._client(a)
        self.stats.disconnects += 1
        if a.mode == "lost":
            self._gone(a.slot)
            return
        client.ending = True
        if a.mode == "receipt":
            seq = client.next_seq()
            self.checker.disconnecting(client.serial, seq, f"r{seq}")
            self.feed(client, "DISCONNECT", {"receipt": f"r{seq}"})
        else:
            self.checker.disconnecting(client.serial, 0, None)
            self.feed(client, "DISCONNECT", {})

    def do_redrive(self, a: Action) -> None:
        client = self._client(a)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        headers = {"destination": "./redrive"}
        if receipt is not None:
            headers["receipt"] = receipt
        if a.count is not None:
            headers["curb-count"] = str(a.count)
        # Which dead letters a redrive moves is the broker's to know (the oldest first; and
        # a message the checker has queued may be a dead letter already, met at the limit
        # or expired): the simulator sees which it moved, the checker whether it may have.
        before = self._dead_ids()
        try:
            self.feed(client, "SEND", headers)
        except Crashed:
            self.checker.redrive_interrupted()
            raise
        moved = before - self._dead_ids()
        self.trace(f"  redrive moved {sorted(moved)}")
        self.checker.redrive(client.serial, seq, receipt, a.count, moved)
        self.stats.redrives += 1

    def _dead_ids(self) -> set[int]:
        """The ids of every dead letter the broker has: the log's (by its index, unread: a
        disk fault that broke the log amid the redrive may leave a record unreadable, yet
        not moved) and its dead letters' queue's. A redrive's deliveries, made before such
        a break, are then of the letters it moved."""
        log, broker = self.world.log, self.world.broker
        last, kept = log.dead_letters()
        ids, _ = log.dead_after(0, last, 1 << 62)
        return set(ids) | {rec.id for rec in kept} | {rec.id for rec in broker.dead.messages()}

    def do_unsubscribe(self, a: Action) -> None:
        client = self._client(a)
        which, client.subscribed = client.subscribed, ""
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        self.checker.unsubscribed(client.serial, seq, receipt, which)
        headers = {"id": "d" if which == "dead" else "s"}
        if receipt is not None:
            headers["receipt"] = receipt
        self.feed(client, "UNSUBSCRIBE", headers)
        self.stats.unsubscribes += 1

    def do_ack_upto(self, a: Action) -> None:
        client = self._client(a)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        self.checker.ack_upto(client.serial, seq, a.upto, receipt, self.world.log.last_id)
        headers = {"curb-upto": str(a.upto)}
        if receipt is not None:
            headers["receipt"] = receipt
        self.feed(client, "ACK", headers)
        self.stats.uptos += 1

    def do_browse(self, a: Action) -> None:
        client = self._client(a)
        sub = client.browse = f"b{next(client.browses)}"
        headers = {"id": sub, "destination": QUEUE, "browser": "true"}
        if a.first is not None:
            headers["curb-from-id"] = str(a.first)
        if a.last is not None:
            headers["curb-to-id"] = str(a.last)
        last = self.world.log.durable_id if a.last is None else a.last
        self.checker.browse_started(client.serial, sub, 1 if a.first is None else a.first, last)
        self.feed(client, "SUBSCRIBE", headers)

    def do_browse_dead(self, a: Action) -> None:
        client = self._client(a)
        sub = client.browse = f"b{next(client.browses)}"
        self.checker.dead_browse_started(client.serial, sub)
        self.feed(client, "SUBSCRIBE", {"id": sub, "destination": "./dead", "browser": "true"})

    def do_watch_counts(self, a: Action) -> None:
        client = self._client(a)
        client.counting = True
        self.feed(client, "SUBSCRIBE", {"id": "c", "destination": "./count"})

    def do_beat(self, a: Action) -> None:
        self._client(a).session.receive_data(b"\n", self.now)

    def do_advance(self, a: Action) -> None:
        self.advance(a.ms)

    def do_loop(self, a: Action) -> None:
        self.world.log.flush()
        self.world.log.sync()
        if self.world.log.broken is None:  # a failed write or sync breaks the log: nothing was synced
            self.checker.synced()

    def do_flush(self, a: Action) -> None:
        self.world.log.flush()

    def do_sync(self, a: Action) -> None:
        self.world.log.sync()

    def do_crash(self, a: Action) -> None:
        self.crash(a.mode)

    def do_crash_mid_op(self, a: Action) -> None:
        self.armed_mode = a.mode
        self.disk.arm_crash(a.ops)

    def _client(self, a: Action) -> Client:
        client = self.clients[a.slot]
        assert client is not None, f"the workload chose empty slot {a.slot}"
        return client

    # ---------------------------------------------------------------- the transport

    @property
    def now(self) -> float:
        return self.ms / 1000

    def feed(self, client: Client, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        client.session.receive_data(encode(command, headers, body), self.now)

    def advance(self, ms: int) -> None:
        """The clock jumps: deadlines due are released (in the checker first, so that the
        broker's redeliveries meet a model that expects them), timers fire, and sessions
        past a heart-beat deadline are ticked."""
        self.ms += ms
        self.clock.now = self.now
        self.checker.advance(self.ms)
        for client in self.clients:
            if client is not None:
                due = client.session.next_deadline
                if due is not None and due <= self.now:
                    client.session.tick(self.now)

    def settle_io(self) -> None:
        """Run what was scheduled and due, deliver every session's output to its client,
        close the connections that asked to, until nothing moves."""
        world = self.world
        moved = True
        for _ in range(SETTLE_PASSES):
            if not moved:
                return
            later, world.later = world.later, []
            for callback in later:
                callback()
            moved = bool(later) or self.clock.fire_due(TIMERS_PER_PASS) > 0
            for slot, client in enumerate(self.clients):
                if client is None:
                    continue
                moved = self._drain(client) or moved
                if client.session.close_wanted is not None:
                    moved = True
                    if client.session.close_wanted == "abort":
                        self.trace(f"connection {client.serial} lost its heart-beat")
                        self.stats.beats_lost += 1
                    self._gone(slot)
        raise SimFailure("livelock", f"still busy after {SETTLE_PASSES} passes of running what is due")

    def _drain(self, client: Client) -> bool:
        """Hand the session's output to its client; whether there was any."""
        data = client.session.data_to_send(self.now)
        for frame in client.parser.feed(data):
            self.received(client, frame)
        return bool(data)

    def _gone(self, slot: int) -> None:
        """The connection is lost. What the session wrote before is read first: a
        MESSAGE in it counted as a delivery, as it would on a socket that died after
        the write, and a RECEIPT in it is a promise made."""
        client = self.clients[slot]
        assert client is not None
        self._drain(client)
        self.clients[slot] = None
        client.session.connection_lost()
        self.checker.gone(client.serial)

    def received(self, client: Client, frame: Frame) -> None:
        headers = frame.headers
        sub = headers.get("subscription", "")
        if frame.command == "MESSAGE" and sub == "c":
            self.checker.count_update(client.serial, headers, json.loads(frame.body))
        elif frame.command == "MESSAGE" and sub == client.browse:
            if headers.get("message-id") == "browse-end":
                last = int(headers["curb-last-id"])
                self.trace(f"  browse {sub} of connection {client.serial} ended at {last}")
                self.checker.browse_ended(client.serial, sub, last)
                self.known.append(last)
                client.browse = None
                self.stats.browses += 1
                return
            msg_id = int(headers["message-id"])
            self.checker.browsed(client.serial, sub, tag_of(frame.body), msg_id, headers, frame.body)
            self.stats.browsed += 1
        elif frame.command == "MESSAGE":
            msg_id = int(headers["message-id"])
            tag = tag_of(frame.body)
            self.trace(
                f"  #{tag} (message {msg_id}) to connection {client.serial} at slot {self.clients.index(client)}"
                f", count {headers.get('curb-deliveries', 1)}"
            )
            self.checker.delivered(client.serial, tag, msg_id, headers, frame.body)
            self.known.append(msg_id)
            self.stats.deliveries += 1
            self.stats.dead_letters += client.dead
            self.stats.redeliveries += "redelivered" in headers
            if client.ack_mode != "auto":
                client.holding.pop(headers["ack"], None)
                client.holding[headers["ack"]] = tag if tag is not None else -1
        elif frame.command == "RECEIPT":
            self.checker.receipt(client.serial, headers["receipt-id"], headers.get("curb-late") == "true")
            self.stats.late += headers.get("curb-late") == "true"
        elif frame.command == "ERROR":
            self.trace(f"connection {client.serial}: ERROR {headers.get('message')}")
            self._faults()  # a fault in this pass comes before the ERROR it caused
            self.checker.error(client.serial, headers.get("message", ""))

    # ---------------------------------------------------------------- crashes

    def _open(self) -> World:
        """A new world on the disk, with maybe a crash amid its recovery, after which
        recovery starts over on what that crash left; then a full read, checked."""
        self.run += 1

        def prepare(disk: SimDisk) -> None:
            self.disk = disk
            self._set_faults(False)
            if self.extra is not None and self.extra.free_bytes is not None:
                disk.free_bytes = self.extra.free_bytes  # a full disk stays full at start-up

        def crashed(mode: str) -> None:
            self.trace(f"CRASH {mode} amid recovery")
            self._count(mode)
            self.stats.mid_op += 1

        odds = self.cfg.recovery_crash if self.step < self.steps else None
        world, self.disk = recover(self.disk, self.cfg, self.clock, self.slice_work, self.rng, odds, prepare, crashed)
        found = self._read_all(world.log)
        self.trace(f"open: {len(found)} messages")
        self.checker.restarted(found, world.log.acked_upto)
        self._set_faults(self.faults_on)
        return world

    def _set_faults(self, on: bool) -> None:
        """The disk's faults, on (as the seed drew them) or off (recovery, the end)."""
        extra, disk = self.extra, self.disk
        if extra is None:
            return
        disk.free_bytes = extra.free_bytes if on else None
        disk.write_eio, disk.sync_eio = (extra.write_eio, extra.sync_eio) if on else (0.0, 0.0)
        self.faults_seen = disk.faults

    def _read_all(self, log: LogCore) -> dict[int, Found]:
        """Every message in the log, by tag (`read_log`); a tag twice, or none, is damage."""
        found: dict[int, Found] = {}
        for got in read_log(log):
            tag = tag_of(got.body)
            if tag is None or tag in found:
                raise SimFailure("log read after restart", f"message {got.id} {got.body[:32]!r} damaged or twice")
            found[tag] = got
        return found

    def crash(self, mode: str) -> None:
        self.trace(f"CRASH {mode}")
        self._count(mode)
        self.stats.deadlines += self.world.broker.metrics.ack_timeouts
        self.checker.crash()
        self.clock.cancel_all()  # a dead broker's timers never fire
        self.clients = [None] * self.cfg.slots
        self.disk.arm_crash(None)
        self.disk = self.disk.crash(mode)
        self._world = None
        self._world = self._open()

    def _count(self, mode: str) -> None:
        if mode == "kill":
            self.stats.kills += 1
        else:
            self.stats.powers += 1

    # ---------------------------------------------------------------- the end

    def rounds(self, count: int) -> None:
        """`count` rounds of ROUND_MS, each a loop pass that flushes and syncs, and as
        many more passes as a walk of the log stalled for its next slice takes (the
        broker's event loop grants one a pass)."""
        for _ in range(count):
            self.advance(ROUND_MS)
            self._loop_pass()
            for _ in range(WALK_PASSES):
                if not self.world.log.walking:
                    break
                self._loop_pass()
            else:
                raise SimFailure("walk makes no progress", f"the log still walks after {WALK_PASSES} loop passes")

    def _loop_pass(self) -> None:
        self.world.log.flush()
        self.world.log.sync()
        if self.world.log.broken is None:
            self.checker.synced()
        self.settle_io()

    def finish(self) -> None:
        """Settle (every receipt owed comes), drop every client, let every due time pass,
        drain the queue and then the dead letters with one consumer each (each gets
        exactly what the model has there), ACK all of it with receipts, lose power: the
        log must be empty."""
        self.trace("finish")
        self.disk.arm_crash(None)
        self.faults_on = False
        self._set_faults(False)
        if self.world.log.broken is not None:
            self.crash("kill")
        self.rounds(SETTLE_ROUNDS)
        owed = self.checker.unanswered()
        if owed:
            raise SimFailure("wedge", f"{len(owed)} receipts unanswered after {SETTLE_ROUNDS} rounds, e.g. {owed[:3]}")
        for slot, client in enumerate(self.clients):
            if client is not None:
                self._gone(slot)
        self.advance(max(DELAYS_MS) + ROUND_MS)
        self.settle_io()
        expired, spent, unsure = self.checker.expired(), self.checker.spent(), self.checker.unsure()
        got = self._empty(
            "client-individual", self.checker.queued() - expired, "accepted SEND never delivered", spent | unsure
        )
        self._empty("dead", self.checker.dead() | expired | (spent - got), "dead letter never delivered", unsure)
        self.checker.check_counts(self.world.broker.counts())
        self.crash("power")
        left = self.checker.queued() | self.checker.dead()
        if left:
            raise SimFailure("ACKed messages back", f"{len(left)} messages in the log after the last ACKs")

    def _empty(self, mode: str, want: set[int], kind: str, maybe: frozenset[int] | set[int] = frozenset()) -> set[int]:
        """One consumer (of the queue, or of ./dead) with credit for everything: it must
        get exactly `want` (of `maybe`, any), and ACKs each with a receipt. Returns what
        it got."""
        self.do_connect(Action("connect", 0, mode=mode, prefetch=DRAIN_PREFETCH, ack_timeout_ms=0))
        self.rounds(3)
        drain = self.clients[0]
        assert drain is not None
        got = set(drain.holding.values())
        if got - maybe != want - maybe:
            raise SimFailure(
                kind,
                f"{mode}: expected {len(want)}, got {len(got)}; missing {sorted(want - got)[:5]}, "
                f"unexpected {sorted(got - want)[:5]}",
            )
        for ack_id in drain.held:
            self.do_ack(Action("ack", 0, receipt=True, ack_id=ack_id))
            self.settle_io()
        self.rounds(SETTLE_ROUNDS // 2)
        owed = self.checker.unanswered()
        if owed:
            raise SimFailure("wedge", f"{len(owed)} ACK receipts unanswered at the end, e.g. {owed[:3]}")
        self._gone(0)
        self.settle_io()
        return got


# ---------------------------------------------------------------- running seeds


def run_seed(
    seed: int,
    steps: int = STEPS,
    verbose: bool = False,
    out: Callable[[str], None] = print,
    ignore: frozenset[str] = frozenset(),
    extra: bool = True,
    slices: bool = True,
    bounces: bool = True,
) -> runner.Outcome[Stats]:
    """Play one seed; a broken invariant or an exception from the broker is its failure.
    extra=False plays it as before the extra steps and the disk's faults existed;
    slices=False with the default slice of the log's walks, as before slices were drawn;
    bounces=False with no NACK curb-undelivered, as before those were drawn."""
    replay = (
        "bin/crashsim --broker"
        + ("" if extra else " --no-extra-steps")
        + ("" if slices else " --no-slices")
        + ("" if bounces else " --no-bounces")
    )
    return runner.play(Sim(seed, steps, verbose, out, extra, slices, bounces), seed, replay, ignore)


def run_many(
    start: int,
    count: int,
    steps: int = STEPS,
    jobs: int = 1,
    ignore: frozenset[str] = frozenset(),
    extra: bool = True,
    slices: bool = True,
    bounces: bool = True,
) -> runner.Totals[Stats]:
    """Play `count` seeds over `jobs` processes."""
    options = (("extra", extra), ("slices", slices), ("bounces", bounces))
    return runner.run_many(TARGET, start, count, steps, jobs, ignore, options)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-extra-steps",
        dest="extra",
        action="store_false",
        help="play without the extra steps (redrives of some, UNSUBSCRIBE, ACK up to an id, browses, ./count) "
        "and the disk's faults, as seeds found before they existed",
    )
    parser.add_argument(
        "--no-slices",
        dest="slices",
        action="store_false",
        help="play with the default slice of the log's walks, as seeds found before slices were drawn",
    )
    parser.add_argument(
        "--no-bounces",
        dest="bounces",
        action="store_false",
        help="play with no NACK curb-undelivered (a router's hand-back), as seeds found before those were drawn",
    )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"extra": args.extra, "slices": args.slices, "bounces": args.bounces}


TARGET = runner.Target(
    name="crashsim --broker",
    description="Crash-simulate the whole broker (sessions, broker, queue, log) over many seeds.",
    steps=STEPS,
    run_seed=run_seed,
    stats=Stats,
    add_options=_add_options,
    options=_options,
)
