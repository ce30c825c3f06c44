"""The router simulator's driver: one `RouterCore` in front of several instances per seed,
its steps, its clock, its crashes and restarts.

    bin/crashsim --router --seeds 10000 --jobs 2     # many seeds
    bin/crashsim --router --seed S -v                # replay one seed with its trace

The world is the real thing minus sockets and event loops. Each instance is the broker
simulator's world (`sim.driver.World`: a `Broker` over a `LogCore` on a `SimDisk`, with
a `SimClock` of its own, all clocks moved together), started and restarted by the broker
simulator's own `recover` (crashes amid recovery included) and read after each restart
by its `read_log`. Each of the router's links is an in-memory pipe to a `Session` of its
instance (`Pipes`, the one place that moves a link's bytes); clients talk STOMP bytes to
the router's client side through `ClientSide`, the one place that knows what that side
is (the broker's own `Session`, with the router's core as its backend). The driver is
the event loop, and runs what the core schedules: after every step it
runs what the instances scheduled, moves every pipe's bytes and every client's output,
and applies the closes asked for, until nothing moves. The instances write and sync
only in the steps that say so, so receipts wait as they would for a slow disk.

Faults: a link dropped (the router reconnects it after the glue's pause, growing while
its instance is down); an instance killed or losing power between steps, or armed to
crash within its next few disk calls (amid a step), down for a while and then restarted
from its log; the router crashed (its clients and links drop, and a new `RouterCore`
starts with nothing: the router keeps nothing on disk); clock jumps past ack deadlines,
heart-beat tolerances and `link_wait`.

A seed ends by restarting every instance and settling (every receipt owed comes),
dropping every client, letting redelivery delays pass, checking the `./NAME/count`
watchers, then draining each destination with one consumer that ACKs everything with
receipts; every instance must then count nothing, and a power loss of each must leave an
empty log. The invariants are the checker's (`sim.router_checker`).

Every choice comes from the seed's random stream (browses from one of their own), so
the same seed with the same --steps and switches replays the same run; a failure prints
the command that does so. The switches (`Switches`: `--no-ack-timeouts`,
`--no-mixed-clients`, `--no-send-refusals`, `--no-bounce-loops`, `--no-browses`) each
take a feature out, to look past a finding in it; docs/testing.md lists what they found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from simclock import WALL_START_MS, SimClock
from simdisk import Crashed, SimDisk

from curb.conn import CLOSING
from curb.counts import COUNT_COALESCE_SECONDS
from curb.frame import Frame, FrameParser, encode
from curb.log.cursor import SLICE_WORK
from curb.router.config import RouterConfig as CoreConfig
from curb.router.core import RouterCore
from curb.router.glue import LINK_RETRY_FIRST, LINK_RETRY_MOST
from curb.router.links import BROWSES, CONSUMES, DOWN, UP, Link
from curb.router.placement import INDEX_BITS
from curb.router.routes import Address, Routes
from curb.session import Session
from sim import runner
from sim.checker import body_for, tag_of
from sim.driver import World, read_log, recover
from sim.router_checker import RouterChecker
from sim.router_workload import DESTS, PARTS, SOLO, RouterAction, RouterConfig, RouterWorkload

STEPS = 250
START_MS = 1_000_000_000
TRACE_KEEP = 80
SETTLE_PASSES = 1000
LOOP_PASSES = 200  # passes after which a link that handed back in a quarter of them is in a loop
TIMERS_PER_PASS = 10
SETTLE_ROUNDS = 20
ROUND_MS = 60
DRAIN_PREFETCH = 10_000
DRAIN_ROUNDS = 200  # rounds a drain, or the wait for redelivery delays, may take at most
T = TypeVar("T")


@dataclass(slots=True)
class Stats(runner.Stats):
    """What a run of seeds did, summed over seeds and processes for the totals line."""

    steps: int = 0
    sends: int = 0
    promised: int = 0
    refused: int = 0
    deliveries: int = 0
    again: int = 0
    acks: int = 0
    nacks: int = 0
    late: int = 0
    unconfirmed: int = 0
    lost_clients: int = 0
    link_drops: int = 0
    kills: int = 0
    powers: int = 0
    mid_op: int = 0
    router_crashes: int = 0
    duplicates: int = 0
    count_checks: int = 0
    browses: int = 0
    bounce_loops: int = 0

    def line(self) -> str:
        return (
            f"seeds {self.seeds}, steps {self.steps}, sends {self.sends} ({self.promised} promised, "
            f"{self.refused} refused), deliveries {self.deliveries} ({self.again} counted again), "
            f"acks {self.acks}, nacks {self.nacks}, late receipts {self.late}, unconfirmed {self.unconfirmed}, "
            f"clients lost {self.lost_clients}, "
            f"links dropped {self.link_drops}, instance crashes {self.kills + self.powers} (kill {self.kills}, "
            f"power {self.powers}; {self.mid_op} amid a step or a recovery), router crashes {self.router_crashes}, "
            f"copies stored twice {self.duplicates}, count checks {self.count_checks}, browses {self.browses}, "
            f"bounce loops cut {self.bounce_loops}, "
            f"failures {self.failures}"
        )


class Instance:
    """One instance of the routes: its disk and clock, and the broker running on them
    (`world`, None while it is down, until `down_until`)."""

    def __init__(self, index: int, dest: str, address: Address, disk: SimDisk, now: float):
        self.index = index
        self.dest = dest
        self.address = address
        self.disk = disk
        self.clock = SimClock(now)
        self.world: World | None = None
        self.down_until = 0  # ms
        self.armed = ("kill", 0)  # an armed crash's mode and how long it keeps the instance down


class ClientSide:
    """The router's client side as a simulated client reaches it: open a connection, feed
    it bytes, take the bytes written to it, whether it still reads its frames, whether it
    asked to close, lose it, and run its timers. Each connection is the broker's own
    `Session` with the router's core as its backend, as `curb router` serves it (the glue
    is `curb.server` and `curb.driver`, whose part this class plays); what the core
    schedules (a loop pass's output, browse steps) runs when `run` is called."""

    def __init__(self, core: RouterCore, later: list[Callable[[], None]]):
        self.core = core
        self.later = later
        self.now = 0.0

    def run(self) -> bool:
        """Run what the core scheduled; whether anything ran."""
        ran = bool(self.later)
        while self.later:
            self.later.pop(0)()
        return ran

    def open(self, peer: str, now: float) -> Session:
        self.now = now
        return Session(self.core, now, peer)

    def feed(self, conn: Session, data: bytes, now: float) -> None:
        self.now = now
        conn.receive_data(data, now)
        self.run()

    def take(self, conn: Session) -> bytes:
        self.run()
        return conn.data_to_send(self.now)

    def reading(self, conn: Session) -> bool:
        """Whether it still reads the connection's frames (not once it decided to close it)."""
        return not conn.gone and conn.state is not CLOSING

    def closing(self, conn: Session) -> bool:
        return conn.close_wanted is not None

    def lose(self, conn: Session) -> None:
        conn.connection_lost()
        self.run()

    def tick(self, now: float) -> None:
        """Time passed: the core's tick (the links' heart-beats, the SENDs parked for
        `link_wait`, ack deadlines) and each session's due timers (heart-beats), as the
        driver arms them."""
        self.now = now
        self.core.tick(now)
        for session in list(self.core.sessions):
            due = session.next_deadline  # type: ignore[attr-defined]
            if due is not None and due <= now:
                session.tick(now)  # type: ignore[attr-defined]
        self.run()


def carried(data: bytes) -> bytes:
    """What a link's connection carries of the bytes the router wrote to it: all of them
    (the simulator's own checks replace this with a faulty pipe)."""
    return data


class Pipe:
    """One link's connection: the instance's session at the other end, or None while down."""

    def __init__(self, link: Link, instance: Instance, now_ms: int):
        self.link = link
        self.instance = instance
        self.session: Session | None = None
        self.retry_at = now_ms
        self.pause_ms = round(LINK_RETRY_FIRST * 1000)
        self.handed_back = 0  # the router's NACKs curb-undelivered on it in this settle


class Pipes:
    """The router's links as in-memory pipes to sessions of their instances: what the core
    writes to a link is fed to its session, what the session writes goes back to
    `RouterCore.link_data`; closes on either side end both. A link down is connected
    again at its retry time (the glue's pause, doubling while its instance is down).
    `guard(instance, call)` runs instance code (a crash there is the driver's), and
    `lost(link)` hears of every connection that ended."""

    def __init__(
        self,
        core: RouterCore,
        instances: dict[Address, Instance],
        now_ms: int,
        guard: Callable[[Instance, Callable[[], Any]], Any],
        lost: Callable[[Link], None],
    ):
        self.core = core
        self.guard = guard
        self.lost = lost
        self.instances = instances
        self.pipes: list[Pipe] = []
        self.by_link: dict[Link, Pipe] = {}
        self.add(list(core.links.by_number.values()), now_ms)
        core.new_links = lambda links: self.add(links, now_ms)

    def add(self, links: list[Link], now_ms: int) -> None:
        """Links the core made (its routes, a browse's own): pipes for them."""
        for link in links:
            pipe = Pipe(link, self.instances[link.address], now_ms)
            self.pipes.append(pipe)
            self.by_link[link] = pipe

    def _forget_gone(self) -> None:
        """Pipes of links the core let go (a browse's, once over) go too."""
        kept = self.core.links.by_number
        for pipe in [p for p in self.pipes if kept.get(p.link.number) is not p.link and p.session is None]:
            self.pipes.remove(pipe)
            del self.by_link[pipe.link]

    def connect_due(self, now_ms: int) -> None:
        """Connect each link down whose retry time came; a link whose instance is down
        fails to connect and waits twice as long."""
        now = now_ms / 1000
        self._forget_gone()
        for pipe in list(self.pipes):
            if pipe.session is not None or pipe.retry_at > now_ms:
                continue
            world = pipe.instance.world
            if world is None:
                self.core.links.lost(pipe.link, "cannot connect: Connection refused (simulated)")
                pipe.pause_ms = min(round(LINK_RETRY_MOST * 1000), pipe.pause_ms * 2)
                pipe.retry_at = now_ms + pipe.pause_ms
                continue
            pipe.session = Session(world.broker, now, f"router-link-{pipe.link.number}")
            pipe.pause_ms = round(LINK_RETRY_FIRST * 1000)
            self.core.links.connected(pipe.link, now)

    def pump(self, now_ms: int) -> bool:
        """Move what waits in either direction and apply the closes; whether anything moved."""
        now = now_ms / 1000
        moved = False
        for endpoint in self.core.links.take_dirty(now):
            pipe = self.by_link.get(endpoint)
            if pipe is None:
                continue
            data = carried(b"".join(pipe.link.out))
            pipe.link.out.clear()
            session = pipe.session
            if session is None:
                continue
            moved = True
            if pipe.link.close_wanted:  # the router dropped the link: what it wrote last is lost
                self.cut(pipe, now_ms, "", by_router=True)
            elif data:
                pipe.handed_back += data.count(b"\ncurb-undelivered:true\n")
                self.guard(pipe.instance, partial(session.receive_data, data, now))
        for pipe in list(self.pipes):
            session = pipe.session
            if session is None:
                continue
            aborting = session.close_wanted == "abort"
            data = b"" if aborting else self.guard(pipe.instance, partial(session.data_to_send, now))
            if pipe.session is None:
                continue  # its instance crashed taking it
            if data:
                moved = True
                self.core.links.data(pipe.link, data, now)
            elif pipe.link.unhandled:  # the rest of an earlier read, after the other pipes' output
                moved = True
                self.core.links.handle(pipe.link)
            if session.close_wanted is not None and pipe.session is session:
                moved = True
                self.cut(pipe, now_ms, "the instance closed the connection")
        return moved

    def cut(self, pipe: Pipe, now_ms: int, why: str, by_router: bool = False) -> None:
        """The connection ends: both sides hear of it (the router, unless it ended it)."""
        session, pipe.session = pipe.session, None
        if session is None:
            return
        self.guard(pipe.instance, session.connection_lost)
        self._ended(pipe, now_ms, why, by_router)

    def instance_gone(self, instance: Instance, now_ms: int) -> None:
        """The instance died: its sessions vanish without a word, the router sees resets."""
        for pipe in self.pipes:
            if pipe.instance is instance and pipe.session is not None:
                pipe.session = None
                self._ended(pipe, now_ms, "connection lost: reset by peer (simulated)", False)

    def router_gone(self) -> None:
        """The router died: every instance sees its connections drop."""
        for pipe in self.pipes:
            session, pipe.session = pipe.session, None
            if session is not None:
                self.guard(pipe.instance, session.connection_lost)

    def _ended(self, pipe: Pipe, now_ms: int, why: str, by_router: bool) -> None:
        if not by_router and pipe.link.state is not DOWN:
            self.core.links.lost(pipe.link, why)
        pipe.retry_at = now_ms + pipe.pause_ms
        self.lost(pipe.link)

    def tick(self, now_ms: int) -> None:
        """The instances' sessions whose heart-beat deadline came are ticked."""
        now = now_ms / 1000
        for pipe in self.pipes:
            session = pipe.session
            if session is not None and (due := session.next_deadline) is not None and due <= now:
                self.guard(pipe.instance, partial(session.tick, now))

    def links(self, instance: Instance, role: str) -> list[Pipe]:
        """The instance's pipes: "sends", "consumes" or "both"."""
        return [p for p in self.pipes if p.instance is instance and role in ("both", p.link.role)]


class Client:
    """One connection as its client knows it: the handle of the router's client side, the
    ack ids it holds (in delivery order), its subscription and the frames it numbered."""

    def __init__(self, serial: int, conn: Session, side: ClientSide, beats: bool):
        self.serial = serial
        self.conn = conn
        self.side = side
        self.parser = FrameParser()
        self.beats = beats
        self.holding: dict[str, None] = {}
        self.ending = False
        self.seq = 0
        self.sub = ""  # its active subscription's id
        self.dest = ""  # and destination
        self.subs = itertools.count(1)
        self.counting = False
        self.browse_ids: set[str] = set()
        self.sent_to = ""  # the destination of its first SEND

    @property
    def open(self) -> bool:
        return not self.ending and not self.side.closing(self.conn)

    @property
    def held(self) -> list[str]:
        return list(self.holding)

    @property
    def subscribed(self) -> str:
        return self.dest

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


class RouterSim:
    """One seed's run."""

    def __init__(
        self,
        seed: int,
        steps: int = STEPS,
        verbose: bool = False,
        out: Callable[[str], None] = print,
        switches: Switches | None = None,
    ):
        self.switches = switches = switches or Switches()
        self.seed = seed
        self.steps = steps
        self.verbose = verbose
        self.out = out
        self.rng = random.Random(seed)
        self.cfg = RouterConfig.draw(self.rng, switches.ack_timeouts, switches.refusals, switches.dead_letters)
        self.stats = Stats(seeds=1)
        self.ms = START_MS
        homes = [SOLO] + [PARTS] * self.cfg.parts
        self.instances = [
            Instance(i, dest, (f"{dest}-{i}", 7000 + i), SimDisk(self.rng), self.now) for i, dest in enumerate(homes)
        ]
        self.by_address = {inst.address: inst for inst in self.instances}
        self.routes = Routes({dest: tuple(i.address for i in self.instances if i.dest == dest) for dest in DESTS})
        self.checker = RouterChecker(homes, self.cfg.ack_timeout_ms, self.ms)
        browse_rng = random.Random(f"browses of seed {seed}") if switches.browses else None
        # Delays have a stream of their own, so that without them the rest replays as before.
        self.delay_rng = random.Random(f"delays of seed {seed}") if switches.delays else None
        self.workload = RouterWorkload(self.rng, self.cfg, len(self.instances), browse_rng, switches.mixed)
        self.clients: list[Client | None] = [None] * self.cfg.slots
        self.tags = itertools.count(1)
        self.serials = itertools.count(1)
        self.step = -1
        self.trace_lines: deque[str] = deque(maxlen=TRACE_KEEP)
        # How many MESSAGEs of a read the router hands on before it reads elsewhere: a
        # stream of its own, so that the rest replays as it did before it was drawn.
        self.handle_each = random.Random(f"reads of seed {seed}").choice((1, 2, 5, 32))
        self.core, self.side, self.pipes = self._router()

    @property
    def now(self) -> float:
        return self.ms / 1000

    # ---------------------------------------------------------------- driving

    def play(self) -> None:
        self.trace(f"config {self.cfg}, instances {[i.address for i in self.instances]}")
        for inst in self.instances:
            self._start(inst)
        self.pipes.connect_due(self.ms)
        self.settle()
        for step in range(self.steps):
            self.step = step
            self.play_step(self.workload.next(self.clients))
            browse = self.workload.browse(self.clients)
            if browse is not None:
                self.play_step(browse)
        self.step = self.steps
        self.finish()

    def traced(self) -> list[str]:
        return list(self.trace_lines)

    def notes(self) -> list[runner.Finding]:
        """Findings that let the seed play on: none (each finding stops the seed)."""
        return []

    def trace(self, line: str) -> None:
        entry = f"  step {self.step:4d} t+{self.ms - START_MS:7d}ms: {line}"
        self.trace_lines.append(entry)
        if self.verbose:
            self.out(entry)

    def play_step(self, action: RouterAction) -> None:
        self.trace(str(action))
        getattr(self, "do_" + action.kind)(action)
        self.settle()
        self.stats.steps += 1
        for inst in self.instances:
            if inst.world is not None:
                self.checker.check_wip(inst.index, inst.world.broker.counts()["wip"])

    def settle(self) -> None:
        """Run what the instances scheduled, move every pipe's bytes and every client's
        output, and apply the closes asked for, until nothing moves."""
        for pipe in self.pipes.pipes:
            pipe.handed_back = 0
        for passes in range(SETTLE_PASSES):
            if passes and passes % LOOP_PASSES == 0 and not self.switches.bounce_loops:
                self._cut_bounce_loops()
            moved = self._run_instances()
            moved = self.side.run() or moved
            moved = self.pipes.pump(self.ms) or moved
            moved = self._clients() or moved
            if not moved:
                return
        raise runner.SimFailure("livelock", f"still busy after {SETTLE_PASSES} passes")

    def _cut_bounce_loops(self) -> None:
        """Without bounce loops (`--no-bounce-loops`): a link on which the router handed back
        (NACK curb-undelivered) in a quarter of the last LOOP_PASSES passes is in a loop, the
        instance delivering at once what the router hands back: it is dropped, which the
        model knows how to follow, and counted."""
        for pipe in self.pipes.pipes:
            handed_back, pipe.handed_back = pipe.handed_back, 0
            if handed_back > LOOP_PASSES // 4 and pipe.session is not None:
                self.trace(f"bounce loop on link {pipe.link.number}: {handed_back} hand-backs; the link is cut")
                self.stats.bounce_loops += 1
                self.checker.cut_amid(pipe.instance.index)
                self.pipes.cut(pipe, self.ms, "connection lost (cut: a loop of hand-backs)")

    def _clients(self) -> bool:
        """Hand each client what the router wrote to it, and lose those it closed (the
        router has let go of what they held: the checker hears of it before anything
        else moves); whether anything moved."""
        moved = False
        for slot, client in enumerate(self.clients):
            if client is None:
                continue
            moved = self._drain(client) or moved
            if self.side.closing(client.conn):
                moved = True
                self._gone(slot)
        return moved

    def _run_instances(self) -> bool:
        moved = False
        for inst in self.instances:
            world = inst.world
            if world is None:
                continue
            later, world.later = world.later, []
            for callback in later:
                self.guard(inst, callback)
            moved = moved or bool(later)
            if inst.world is not None:
                moved = bool(self.guard(inst, partial(inst.clock.fire_due, TIMERS_PER_PASS))) or moved
        return moved

    def guard(self, inst: Instance, call: Callable[[], T]) -> T | None:
        """Run instance code; an armed crash striking there crashes the instance (amid a step)."""
        try:
            return call()
        except Crashed:
            mode, down_ms = inst.armed
            self.stats.mid_op += 1
            self.crash_instance(inst, mode, down_ms, amid=True)
            return None

    def advance(self, ms: int) -> None:
        """The clock jumps: the checker lets go what deadlines passed, instances due come
        back up, links due are connected, and the router's and the instances' timers run."""
        self.ms += ms
        for inst in self.instances:
            inst.clock.now = self.now
        self.checker.advance(self.ms)
        for inst in self.instances:
            if inst.world is None and inst.down_until <= self.ms:
                self._start(inst)
        self.pipes.connect_due(self.ms)
        # A link the router drops for silence at this tick may have had a MESSAGE in its
        # pipe (one that came due in the jump): a cut amid a step, for the count's bound.
        up = [link for link in self._routed() if link.role is CONSUMES and link.state is UP]
        self.side.tick(self.now)
        for link in up:
            if link.state is not UP:
                self.checker.cut_amid(self.by_address[link.address].index)
        self._clients()
        self.pipes.tick(self.ms)

    def rounds(self, count: int) -> None:
        """`count` rounds of ROUND_MS, each a loop pass of every instance (write and sync)."""
        for _ in range(count):
            self.advance(ROUND_MS)
            for inst in self.instances:
                self._loop(inst)
            self.settle()

    def _loop(self, inst: Instance) -> None:
        world = inst.world
        if world is not None:
            self.guard(inst, world.log.flush)
        if inst.world is not None:
            self.guard(inst, inst.world.log.sync)

    # ---------------------------------------------------------------- clients

    def _feed(self, client: Client, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.side.feed(client.conn, encode(command, headers, body), self.now)

    def _client(self, a: RouterAction) -> Client:
        client = self.clients[a.slot]
        assert client is not None, f"the workload chose empty slot {a.slot}"
        return client

    def _heard(self, client: Client) -> bool:
        """Whether the router reads the client's next frame: once it decided to close the
        connection (an ERROR, a DISCONNECT) it drops every later frame unread, though the
        ERROR may still wait behind earlier receipts, so the client does not know yet.
        Such a frame changes nothing, and the checker never hears of it."""
        if self.side.reading(client.conn):
            return True
        self.trace("  dropped unread: the router closes this connection")
        return False

    def _drain(self, client: Client) -> bool:
        data = self.side.take(client.conn)
        for frame in client.parser.feed(data):
            self.received(client, frame)
        return bool(data)

    def _gone(self, slot: int) -> None:
        """The connection is lost; what the router wrote to it before is read first."""
        client = self.clients[slot]
        assert client is not None
        self._drain(client)
        self.clients[slot] = None
        self.side.lose(client.conn)
        self.checker.gone(client.serial)

    def received(self, client: Client, frame: Frame) -> None:
        headers = frame.headers
        sub = headers.get("subscription", "")
        if frame.command == "MESSAGE" and sub == "c":
            self.checker.count_update(client.serial, headers, json.loads(frame.body))
        elif frame.command == "MESSAGE" and sub in client.browse_ids:
            if headers.get("message-id") == "browse-end":
                client.browse_ids.discard(sub)
                self.stats.browses += 1
            else:
                self.checker.browsed(client.serial, sub, tag_of(frame.body), headers, frame.body)
        elif frame.command == "MESSAGE":
            key = headers.get("message-id", "")
            stable = int(key)  # the instance's id << INDEX_BITS | the instance's index
            msg_id, index = stable >> INDEX_BITS, stable & ((1 << INDEX_BITS) - 1)
            address = next(a for (_, a), i in self.core.placement.indexes.items() if i == index)
            inst = self.by_address[address]
            tag = tag_of(frame.body)
            count = headers.get("curb-deliveries", "1")
            self.trace(f"  #{tag} ({key}, instance {inst.index}) to connection {client.serial}, count {count}")
            self.checker.delivered(client.serial, sub, key, inst.index, int(msg_id), tag, headers, frame.body)
            self.stats.deliveries += 1
            self.stats.again += count != "1"
            if "ack" in headers:
                client.holding.pop(headers["ack"], None)  # delivered again: the newest now
                client.holding[headers["ack"]] = None
        elif frame.command == "RECEIPT":
            late = headers.get("curb-late") == "true"
            unconfirmed = headers.get("curb-unconfirmed") == "true"
            self.checker.receipt(client.serial, headers["receipt-id"], late, unconfirmed)
            self.stats.late += late
            self.stats.unconfirmed += unconfirmed
        elif frame.command == "ERROR":
            self.trace(f"connection {client.serial}: ERROR {headers.get('message')}")
            client.ending = True
            self.stats.refused += 1
            self.checker.error(client.serial, headers.get("message", ""))

    def do_connect(self, a: RouterAction) -> None:
        serial = next(self.serials)
        client = Client(serial, self.side.open(f"sim:{serial}", self.now), self.side, a.heartbeat_ms > 0)
        self.clients[a.slot] = client
        self.checker.connected(serial)
        self._feed(client, "CONNECT", {"accept-version": "1.2", "heart-beat": f"{a.heartbeat_ms},{a.heartbeat_ms}"})

    def do_subscribe(self, a: RouterAction, dead: bool = False) -> None:
        client = self._client(a)
        client.sub, client.dest = f"s{next(client.subs)}", a.dest
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        if self._heard(client):
            self.checker.subscribed(client.serial, seq, client.sub, a.dest, a.mode, receipt)
        headers = {
            "id": client.sub,
            "destination": f"./{a.dest}/dead" if dead else f"/queue/{a.dest}",
            "ack": a.mode,
            "prefetch-count": str(a.prefetch),
        }
        if receipt is not None:
            headers["receipt"] = receipt
        self._feed(client, "SUBSCRIBE", headers)

    def do_unsubscribe(self, a: RouterAction) -> None:
        client = self._client(a)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        if self._heard(client):
            self.checker.unsubscribed(client.serial, seq, client.sub, receipt)
        headers = {"id": client.sub} | ({"receipt": receipt} if receipt is not None else {})
        client.sub = client.dest = ""
        self._feed(client, "UNSUBSCRIBE", headers)

    def do_watch_counts(self, a: RouterAction) -> None:
        client = self._client(a)
        client.counting = True
        if self._heard(client):
            self.checker.watching(client.serial, a.dest)
        self._feed(client, "SUBSCRIBE", {"id": "c", "destination": f"./{a.dest}/count"})

    def do_send(self, a: RouterAction) -> None:
        client = self._client(a)
        client.sent_to = client.sent_to or a.dest
        tag = next(self.tags)
        body = body_for(tag, a.size)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        headers = {"destination": f"/queue/{a.dest}", "sim-tag": str(tag)}
        if a.key:
            headers["curb-partition-key"] = a.key
        if self.delay_rng is not None and self.delay_rng.random() < DELAY_SHARE:
            headers["curb-delay"] = str(self.delay_rng.choice(DELAYS_MS))
        if self.delay_rng is not None and self.switches.dead_letters and self.delay_rng.random() < TTL_SHARE:
            headers["curb-ttl"] = str(self.delay_rng.choice(TTLS_MS))
        if receipt is not None:
            headers["receipt"] = receipt
        if self._heard(client):
            self.checker.sent_frame(client.serial, seq, tag, a.dest, body, receipt)
        self.trace(f"  #{tag} sent")
        self.stats.sends += 1
        self._feed(client, "SEND", headers, body)

    def do_ack(self, a: RouterAction) -> None:
        self._settle(a, "ACK")
        self.stats.acks += 1

    def do_nack(self, a: RouterAction) -> None:
        self._settle(a, "NACK")
        self.stats.nacks += 1

    def _settle(self, a: RouterAction, kind: str) -> None:
        client = self._client(a)
        seq = client.next_seq()
        receipt = f"r{seq}" if a.receipt else None
        if self._heard(client):
            for key in self.checker.settle(client.serial, seq, kind, a.ack_id, receipt):
                del client.holding[key]
        headers = {"id": a.ack_id} | ({"receipt": receipt} if receipt is not None else {})
        if kind == "NACK" and self.delay_rng is not None and self.delay_rng.random() < DELAY_SHARE:
            headers["curb-delay"] = str(self.delay_rng.choice(DELAYS_MS))
        self._feed(client, kind, headers)

    def do_disconnect(self, a: RouterAction) -> None:
        client = self._client(a)
        if a.mode == "lost":
            self.stats.lost_clients += 1
            self._gone(a.slot)
            return
        client.ending = True
        seq = client.next_seq()
        receipt = f"r{seq}" if a.mode == "receipt" else None
        if self._heard(client):
            self.checker.disconnecting(client.serial, seq, receipt)
        self._feed(client, "DISCONNECT", {"receipt": receipt} if receipt is not None else {})

    def do_beat(self, a: RouterAction) -> None:
        self.side.feed(self._client(a).conn, b"\n", self.now)

    def do_browse(self, a: RouterAction) -> None:
        """A browse changes nothing: every instance's counts are the same after it."""
        client = self._client(a)
        sub = f"b{next(client.subs)}"
        client.browse_ids.add(sub)
        if self._heard(client):
            self.checker.browsing(client.serial, sub, a.dest)
        before = self._counts()
        self._feed(client, "SUBSCRIBE", {"id": sub, "destination": f"/queue/{a.dest}", "browser": "true"})
        self.settle()
        after = self._counts()
        if after != before:
            raise runner.SimFailure("browse changed something", f"counts {before} before it, {after} after")

    def _counts(self) -> dict[int, dict[str, int]]:
        return {i.index: i.world.broker.counts() for i in self.instances if i.world is not None}

    # ---------------------------------------------------------------- time, disks, faults

    def do_advance(self, a: RouterAction) -> None:
        self.advance(a.ms)

    def do_loop(self, a: RouterAction) -> None:
        for inst in self.instances:
            self._loop(inst)

    def do_flush(self, a: RouterAction) -> None:
        world = self.instances[a.instance].world
        if world is not None:
            self.guard(self.instances[a.instance], world.log.flush)

    def do_sync(self, a: RouterAction) -> None:
        world = self.instances[a.instance].world
        if world is not None:
            self.guard(self.instances[a.instance], world.log.sync)

    def do_quiet(self, a: RouterAction) -> None:
        """A quiet spell: a few rounds, then every ./count watcher says what the instances do."""
        self.rounds(3)
        self._check_count_views()

    def _check_count_views(self) -> None:
        """Each watcher's last counts are the instances' with a link up, once no instance
        has a ./count update pending (one waits at most COUNT_COALESCE_SECONDS)."""
        soon = self.now + COUNT_COALESCE_SECONDS
        if any(i.world is not None and i.clock.armed and i.clock.armed[0] <= soon for i in self.instances):
            return
        expected = {}
        for dest in DESTS:
            links = self.core.placement.dests[dest]
            up = [link for link in links if link.state is UP]
            counts = [self.by_address[link.address].world for link in up]
            expected[dest] = {
                "rdy": sum(w.broker.counts()["rdy"] for w in counts if w is not None),
                "wip": sum(w.broker.counts()["wip"] for w in counts if w is not None),
                "instances": len(links),
                "up": len(up),
            }
        # A connection the router decided to close (an ERROR owed behind its receipts) is
        # sent nothing more, though the client does not know it yet.
        ending = {c.serial for c in self.clients if c is not None and not self.side.reading(c.conn)}
        self.checker.check_count_views(expected, ending)
        self.stats.count_checks += 1

    def do_drop_link(self, a: RouterAction) -> None:
        inst = self.instances[a.instance]
        for pipe in self.pipes.links(inst, a.role):
            if pipe.session is not None:
                self.stats.link_drops += 1
                self.pipes.cut(pipe, self.ms, "connection lost (simulated drop)")

    def do_crash(self, a: RouterAction) -> None:
        inst = self.instances[a.instance]
        if inst.world is not None:
            self.crash_instance(inst, a.mode, a.ms, amid=False)

    def do_crash_mid_op(self, a: RouterAction) -> None:
        inst = self.instances[a.instance]
        if inst.world is not None:
            inst.armed = (a.mode, a.ms)
            inst.disk.arm_crash(a.ops)

    def do_crash_router(self, a: RouterAction) -> None:
        """The router dies: its clients and links drop, and a new one starts with nothing."""
        self.trace("CRASH router")
        self.stats.router_crashes += 1
        for slot, client in enumerate(self.clients):
            if client is not None:
                self.clients[slot] = None
                self.checker.gone(client.serial)
        self.pipes.router_gone()
        for inst in self.instances:
            self.checker.link_lost(inst.index)
        self.core, self.side, self.pipes = self._router()
        self.pipes.connect_due(self.ms)

    def _router(self) -> tuple[RouterCore, ClientSide, Pipes]:
        cfg = self.cfg
        later: list[Callable[[], None]] = []
        config = CoreConfig(
            heartbeat_ms=cfg.heartbeat_ms,
            ack_timeout=cfg.ack_timeout_ms / 1000,
            link_heartbeat_ms=cfg.link_heartbeat_ms,
            link_wait=cfg.link_wait_ms / 1000,
        )
        core = RouterCore(
            self.routes,
            config,
            schedule=lambda delay, callback: later.append(callback),
            wall_ms=lambda: WALL_START_MS + self.ms,
            clock=lambda: self.now,
        )
        core.links.handle_each = self.handle_each
        return core, ClientSide(core, later), Pipes(core, self.by_address, self.ms, self.guard, self._link_lost)

    def _routed(self) -> list[Link]:
        """The links of the routes (a browse's own come and go)."""
        return [link for link in self.core.links.by_number.values() if link.role is not BROWSES]

    def _link_lost(self, link: Link) -> None:
        inst = self.by_address[link.address]
        self.trace(f"link {link.number} ({link.role}) to instance {inst.index} lost")
        if link.role is CONSUMES:
            self.checker.link_lost(inst.index)

    def crash_instance(self, inst: Instance, mode: str, down_ms: int, amid: bool) -> None:
        self.trace(f"CRASH {mode} instance {inst.index}{' amid a step' if amid else ''}, down {down_ms} ms")
        self._count(mode)
        inst.world = None
        inst.clock.cancel_all()  # a dead broker's timers never fire
        inst.disk.arm_crash(None)
        inst.disk = inst.disk.crash(mode)
        self.pipes.instance_gone(inst, self.ms)
        self.checker.instance_crashed(inst.index, amid)
        inst.down_until = self.ms + down_ms
        if not down_ms:
            self._start(inst)

    def _count(self, mode: str) -> None:
        if mode == "kill":
            self.stats.kills += 1
        else:
            self.stats.powers += 1

    def _start(self, inst: Instance) -> None:
        """The instance recovers from its disk (maybe crashing amid recovery); a full read
        of its log is checked."""

        def crashed(mode: str) -> None:
            self.trace(f"CRASH {mode} instance {inst.index} amid recovery")
            self._count(mode)
            self.stats.mid_op += 1

        odds = self.cfg.broker.recovery_crash if self.step < self.steps else None
        world, inst.disk = recover(inst.disk, self.cfg.broker, inst.clock, SLICE_WORK, self.rng, odds, crashed=crashed)
        inst.world = world
        found = [(got.id, tag_of(got.body)) for got in read_log(world.log)]
        self.trace(f"instance {inst.index} open: {len(found)} messages")
        self.checker.restarted(inst.index, found)

    # ---------------------------------------------------------------- the end

    def finish(self) -> None:
        """Every instance up, settle, drop every client, let redelivery delays pass, check
        the count watchers, drain each destination, and lose power: logs empty."""
        self.trace("finish")
        for inst in self.instances:
            inst.disk.arm_crash(None)
            if inst.world is None:
                self._start(inst)
        self._links_up()
        self.rounds(SETTLE_ROUNDS)
        owed = self.checker.unanswered()
        if owed:
            raise runner.SimFailure(
                "wedge", f"{len(owed)} receipts unanswered after {SETTLE_ROUNDS} rounds, e.g. {owed[:3]}"
            )
        self._check_count_views()
        for slot, client in enumerate(self.clients):
            if client is not None:
                self._gone(slot)
        self.settle()
        for _ in range(DRAIN_ROUNDS):
            if not any(c["delayed"] for c in self._counts().values()):
                break
            self.rounds(1)
        for dest in DESTS:
            self._empty(dest)
        for inst in self.instances:
            counts = inst.world.broker.counts() if inst.world is not None else None
            if counts is None or counts["rdy"] or counts["wip"] or counts["delayed"] or counts["dead"]:
                raise runner.SimFailure("left after the drain", f"instance {inst.index} counts {counts}")
            self.crash_instance(inst, "power", 0, amid=False)
            left = read_log(inst.world.log) if inst.world is not None else []
            if left:
                raise runner.SimFailure(
                    "ACKed messages back", f"instance {inst.index} holds {len(left)} after a power loss"
                )

    def _links_up(self) -> None:
        """Rounds until every link is up again (the glue's pause grows to LINK_RETRY_MOST
        while an instance is down)."""
        for _ in range(DRAIN_ROUNDS):
            if all(link.state is UP for link in self._routed()):
                return
            self.rounds(1)
        down = [link.name for link in self._routed() if link.state is not UP]
        raise runner.SimFailure("links stay down", f"{down} after {DRAIN_ROUNDS} rounds with every instance up")

    def _empty(self, dest: str) -> None:
        """One consumer with credit for everything (and, with dead letters, one of the
        destination's `./NAME/dead`): they get every promised SEND of the destination (the
        checker sees each MESSAGE as ever) and ACK all of it with receipts, none late."""
        self._links_up()
        slots = (0, 1) if self.switches.dead_letters else (0,)
        for slot in slots:
            self.do_connect(RouterAction("connect", slot))
            action = RouterAction("subscribe", slot, dest=dest, mode="client-individual", prefetch=DRAIN_PREFETCH)
            self.do_subscribe(action, dead=slot == 1)
        drains = [self.clients[slot] for slot in slots]
        last = -1
        for _ in range(DRAIN_ROUNDS):
            self.rounds(1)
            held = sum(len(drain.holding) for drain in drains if drain is not None)
            if held == last and not any(i.world and i.world.log.walking for i in self.instances):
                break
            last = held
        got = [
            self.checker.conns[drain.serial].holding[key].copy
            for drain in drains
            if drain is not None
            for key in drain.holding
        ]
        tags = {copy.tag for copy in got}
        self.stats.duplicates += len(got) - len(tags)
        missing = self.checker.missing(dest, tags)
        if missing:
            raise runner.SimFailure(
                "receipted SEND lost", f"{dest}: {len(missing)} promised and never consumed, e.g. {sorted(missing)[:5]}"
            )
        for slot, drain in zip(slots, drains, strict=True):
            assert drain is not None
            for key in drain.held:
                self.do_ack(RouterAction("ack", slot, ack_id=key, receipt=True))
                self.settle()
        self.rounds(SETTLE_ROUNDS // 2)
        owed = self.checker.unanswered()
        if owed:
            raise runner.SimFailure("wedge", f"{len(owed)} ACK receipts unanswered at the end, e.g. {owed[:3]}")
        for slot in slots:
            self._gone(slot)
        self.settle()


# ---------------------------------------------------------------- running seeds


# Each switch's flag and help: `--no-...` to turn off what is on by default.
SWITCH_FLAGS = {
    "ack_timeouts": ("--no-ack-timeouts", "give the router no ack deadline (-ack-timeout 0)"),
    "mixed": (
        "--no-mixed-clients",
        "a client only produces (to one destination) or only consumes, and UNSUBSCRIBEs before it DISCONNECTs",
    ),
    "refusals": ("--no-send-refusals", "the router's -link-wait is an hour: no parked SEND is refused"),
    "bounce_loops": (
        "--no-bounce-loops",
        "a loop of the router handing back what an instance delivers again at once is cut by dropping "
        "that link (and counted) instead of failing the seed as a livelock",
    ),
    "browses": ("--no-browses", "no browse steps (SUBSCRIBE browser:true through the router, which change nothing)"),
    "delays": (
        "--delays",
        "SENDs and NACKs with curb-delay (a share of them: 0 to 3000 ms); with --dead-letters, some SENDs "
        "with curb-ttl too",
    ),
    "dead_letters": (
        "--dead-letters",
        "give the instances a delivery limit (2 or 3), and drain each destination's ./NAME/dead at the end too",
    ),
}
# The switches that are off unless their flag turns them on.
OFF_BY_DEFAULT = frozenset({"dead_letters", "delays"})
DELAY_SHARE = 0.25  # with --delays: the share of SENDs and NACKs that carry curb-delay
DELAYS_MS = (0, 20, 500, 3000)
TTL_SHARE = 0.1  # with --delays and --dead-letters: the share of SENDs with curb-ttl (expired: dead)
TTLS_MS = (1, 200, 2000, 60_000)


@dataclass(frozen=True, slots=True)
class Switches:
    """What a seed plays with: every feature by default. Each `--no-<feature>` takes one
    out, so that a run can look past a finding in it for others (the simulator found the
    router bugs that docs/testing.md lists this way)."""

    ack_timeouts: bool = True  # the router has an ack deadline (drawn per seed)
    mixed: bool = True  # a client may both produce and consume, and DISCONNECT subscribed
    refusals: bool = True  # the router's link_wait is drawn (else an hour: no SEND is refused)
    bounce_loops: bool = True  # a loop of hand-backs is a finding (else its link is cut)
    browses: bool = True  # browse steps: they must change nothing
    dead_letters: bool = False  # the instances have a delivery limit: dead letters
    delays: bool = False  # SENDs and NACKs with curb-delay

    def flags(self) -> str:
        """The command line's flags for these switches."""
        return "".join(f" {flag}" for name, (flag, _) in SWITCH_FLAGS.items() if not getattr(self, name))


def run_seed(
    seed: int,
    steps: int = STEPS,
    verbose: bool = False,
    out: Callable[[str], None] = print,
    ignore: frozenset[str] = frozenset(),
    **switches: bool,
) -> runner.Outcome[Stats]:
    """The runner's way to play one seed: `switches` as its options (`Switches`' fields)."""
    return play_seed(seed, Switches(**switches), steps, verbose, out, ignore)


def play_seed(
    seed: int,
    switches: Switches,
    steps: int = STEPS,
    verbose: bool = False,
    out: Callable[[str], None] = print,
    ignore: frozenset[str] = frozenset(),
) -> runner.Outcome[Stats]:
    """Play one seed with these switches; a broken invariant or an exception from the code
    under test is its failure."""
    sim = RouterSim(seed, steps, verbose, out, switches)
    outcome = runner.play(sim, seed, "bin/crashsim --router" + switches.flags(), ignore)
    outcome.stats.promised = sum(s.promised for s in sim.checker.sent.values())
    return outcome


def run_many(start: int, count: int, switches: Switches, steps: int = STEPS, jobs: int = 1) -> runner.Totals[Stats]:
    """Play `count` seeds over `jobs` processes."""
    options = tuple((name, getattr(switches, name)) for name in SWITCH_FLAGS)
    return runner.run_many(TARGET, start, count, steps, jobs, frozenset(), options)


def _add_options(parser: argparse.ArgumentParser) -> None:
    for name, (flag, text) in SWITCH_FLAGS.items():
        parser.add_argument(
            flag, dest=name, action="store_true" if name in OFF_BY_DEFAULT else "store_false", help=text
        )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in SWITCH_FLAGS}


TARGET = runner.Target(
    name="crashsim --router",
    description="Crash-simulate a router in front of several instances over many seeds.",
    steps=STEPS,
    run_seed=run_seed,
    stats=Stats,
    add_options=_add_options,
    options=_options,
)
