"""The log's crash simulator: seeded random workloads, crashes and disk faults against
curb.log.LogCore on a SimDisk, with the crash model's invariants checked after every step.

    bin/crashsim --seeds 2000 [--start S] [--steps K] [--jobs N]
    bin/crashsim --seed S -v      # replay one seed exactly, printing its trace
    bin/crashsim ... --no-replay-steps   # without ACK up to an id and browses

It is the log's workload of the one simulator (`sim.runner` plays its seeds, as it
plays the whole broker's), kept in three parts:
- `log_workload`: every choice of a seed (the world, the next step, its arguments);
- `log_checker`: the model of what the log promised, and the invariants (listed there);
- this driver: the steps against the real LogCore, the clock, the crashes and restarts.

One seed decides everything: the cap (16 KiB to 1 MiB, so the ring wraps many times), the
disk (a free-space limit, EIO on writes or syncs, bit rot), the workload (appends with and
without receipt, tiny to the largest payload; consumers taking, ACKing with and without
receipt, NACKing, disconnecting; the clock, flushes and syncs) and the crashes: kill -9 or
power loss between two steps, between two disk calls of one step, or in the middle of
recovery. A crash drops the LogCore without closing it, keeps what `SimDisk.crash` says
survives, and starts a new LogCore on it, which must recover at once.

With the replay steps (on unless --no-replay-steps), ACKs up to an id and browses are
played too; walks of the ring go in slices of one record, a few, or many (drawn per run,
so crashes and other steps fall between slices), and browses start at marks spaced from
every record to none. The parked steps send delayed messages, NACK with a delay, bury
messages as dead letters (some then handed to the log with `keep_dead`, as the broker
does, the rest held), take, ACK, give back and revive dead letters, redrive them and
jump the wall clock ahead. Both draw from random streams of their own, so a seed
without them (the kept regression seeds) replays exactly as before they existed.

Every seed ends by settling, reading everything and syncing, and then a power loss must
keep exactly the live messages. A broken invariant stops the seed, except a wrong
refusal (which stores nothing): that is noted once per kind and the seed plays on.
Either way the report names the seed and the step; the same seed with the same --steps
replays it exactly.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from simdisk import Crashed, SimDisk

from curb.log import LogCore, LogError, QueueFull, Record, TooLarge
from curb.log.cursor import SLICE_WORK
from curb.log.events import NoEvents
from curb.log.pacing import ByHand
from curb.log.parked import DELAYED, EXP, MAX
from curb.log.record import PAD_SIZE
from sim import runner
from sim.log_checker import SETTLE_ROUNDS, Browsing, LogChecker, Msg
from sim.log_workload import LogWorkload

STEPS = 300
ROUND_SECONDS = 0.06
TRACE_KEEP = 40
START_TIME = 1_700_000_000.0


class FatalEvents(NoEvents):
    """What the simulator hears from the log: the fatal error that stopped it."""

    def __init__(self, fatal: Callable[[str], None]) -> None:
        self._fatal = fatal

    def fatal(self, reason: str) -> None:
        self._fatal(reason)


@dataclass(slots=True)
class Stats(runner.Stats):
    """What a run of seeds did, summed over seeds and processes for the totals line."""

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

    def line(self) -> str:
        return (
            f"seeds {self.seeds}, steps {self.steps}, crashes {self.kills + self.powers} "
            f"(kill {self.kills}, power {self.powers}; {self.mid_op} amid a batch or a recovery), "
            f"restarts {self.restarts}, "
            f"appends {self.appends} (+{self.refused} refused), acks {self.acks}, "
            f"acks up to an id {self.uptos}, browses {self.browses} ({self.browsed} messages), "
            f"disk faults {self.faults}, failures {self.failures}"
        )


class Sim:
    """One seed's run: the steps the workload draws, played against the log, each
    checked by the model; the crashes and restarts."""

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
        self.wall_skew = 0  # ms the parked steps jumped the wall clock ahead of `now`
        self.steps = steps
        self.verbose = verbose
        self.out = out
        self.rng = random.Random(seed)
        self.workload = LogWorkload(seed, self.rng)
        self.cfg = self.workload.cfg
        self.stats = Stats(seeds=1)
        self.now = START_TIME
        self.step = -1
        self.trace_lines: deque[tuple] = deque(maxlen=TRACE_KEEP)
        self._notes: dict[str, tuple[int, str, list[str]]] = {}
        self.run = 0
        self.disk = SimDisk(self.rng, free_bytes=self.cfg.free_bytes)
        self.disk_faults = self.disk.faults
        self.fatal: str | None = None
        self._core: LogCore | None = None
        self.faults_on = True
        self.armed_mode = "kill"
        self.model = LogChecker(self.cfg, self)

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
        self.model.check_fresh()
        for step in range(self.steps):
            self.step = step
            if self.fatal is not None:
                self.crash(self.workload.crash_mode())
            action = self.workload.next_action()
            try:
                getattr(self, "do_" + action)()
            except Crashed:
                self.stats.mid_op += 1
                self.crash(self.armed_mode)
            self.stats.steps += 1
            self.model.check_step()
            if self.replay_steps:
                try:
                    self.replay_step()
                except Crashed:
                    self.stats.mid_op += 1
                    self.crash(self.armed_mode)
                self.model.check_step()
                try:
                    self.parked_step()
                except Crashed:
                    self.stats.mid_op += 1
                    self.crash(self.armed_mode)
                self.model.check_step()
        self.step = self.steps
        self.finish()

    def clock(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        """The simulated time as the log's wall clock (epoch ms, START_TIME on), plus the
        jumps of the parked steps: it never goes back."""
        return int(self.now * 1000) + self.wall_skew

    def trace(self, fmt: str, *args: object) -> None:
        entry = (self.step, self.run, fmt, args)
        self.trace_lines.append(entry)
        if self.verbose:
            self.out(_format_trace(entry))

    def traced(self) -> list[str]:
        return [_format_trace(e) for e in self.trace_lines]

    def note(self, kind: str, detail: str) -> None:
        """A broken invariant that leaves the log's state sound (a refusal stores
        nothing): keep the first of each kind, with its trace, and play on."""
        if kind not in self._notes:
            self._notes[kind] = (self.step, f"{kind}: {detail}", self.traced())

    def notes(self) -> list[runner.Finding]:
        return [runner.Finding(kind, step, text, trace) for kind, (step, text, trace) in self._notes.items()]

    # ------------------------------------------------------------ runs of the log

    def _reset_run(self, keep_recovered: bool = False) -> None:
        """Forget connection state: after a crash every held message is rdy again."""
        self.run += 1
        self.held: list[list[tuple[Record, int]]] = [[] for _ in range(self.cfg.consumers)]
        self.redeliver: deque[tuple[Record, int]] = deque()
        self.dead_held: list[tuple[Record, int]] = []  # dead letters the caller holds (its ./dead queue)
        self.fatal = None
        self.disk_faults = self.disk.faults
        self.browse: Browsing | None = None
        self.model.new_run(keep_recovered)

    def _open(self) -> LogCore:
        """A LogCore recovering from the disk, with faults off during recovery (a start-up
        that fails must be the log's doing, not an injected fault's) but maybe a crash in
        the middle of it, after which recovery starts over on what that crash left."""
        slice_work: int = SLICE_WORK
        mark_spacing: int | None = None
        if self.replay_steps:
            # Walks of the ring in slices of a record or a few (so that crashes and other
            # steps come between them), or in one go; browses start at marks, or at the tail.
            slice_work, mark_spacing = self.workload.walk_shape()
        while True:
            disk = self.disk
            disk.write_eio = disk.sync_eio = 0.0
            if self.faults_on:
                ops = self.workload.recovery_crash()
                if ops is not None:
                    disk.arm_crash(ops)
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
                    events=FatalEvents(self._on_fatal),
                )
                break
            except Crashed:
                mode = self.workload.crash_mode()
                self.trace("CRASH %s during recovery", mode)
                self._count_crash(mode, mid_op=True)
                self.disk = disk.crash(mode)
            except LogError as err:
                self.model.fail("start-up refused the file", str(err))
        disk.arm_crash(None)
        if self.faults_on:
            disk.write_eio, disk.sync_eio = self.cfg.write_eio, self.cfg.sync_eio
        rec = core.recovery
        self.trace("open: recovered %d messages, %d live bytes, torn %r", rec.messages, rec.live_bytes, rec.torn)
        return core

    def _on_fatal(self, reason: str) -> None:
        self.trace("fatal: %s", reason)
        self.fatal = reason

    def crash(self, mode: str) -> None:
        """Drop the log without closing it; keep what the crash leaves; start again."""
        self.trace(
            "CRASH %s (%d appends and %d ack receipts unanswered)",
            mode,
            len(self.model.waiting_appends),
            self.model.waiting_durable,
        )
        self.stats.faults += self.disk.faults - self.disk_faults
        self._count_crash(mode)
        self._drop_core()
        self.disk = self.disk.crash(mode)
        if self.workload.rots():
            self._rot()
        self.restart()

    def _drop_core(self) -> None:
        """The process dies: the model notes the ids it assigned, which no later run may reuse."""
        if self._core is not None:
            self.model.process_died(self._core.last_id)
        self._core = None

    def _count_crash(self, mode: str, mid_op: bool = False) -> None:
        if mode == "kill":
            self.stats.kills += 1
        else:
            self.stats.powers += 1
        self.stats.mid_op += mid_op

    def _rot(self) -> None:
        """Damage the medium under the ring (never the header): a flipped bit or a zeroed
        sector."""
        self.model.rotted()
        for kind, at, bit in self.workload.rot_damage(self.disk.size()):
            if kind == "bit":
                self.trace("ROT: bit %d of byte %d flipped", bit, at)
                self.disk.flip_bit(at, bit)
            else:
                self.trace("ROT: sector %d zeroed", at)
                self.disk.zero_sector(at)

    def restart(self) -> None:
        """Open the log, read every message it recovered and check them against the model.
        Then either hand them all to the caller's redelivery list, or crash once more
        (kill) and leave the next run to read them lazily between new appends."""
        self._reset_run()
        self.stats.restarts += 1
        self._core = self._open()
        self.model.check_watermark()
        found = [(rec, self.model.check_delivery(rec, recovering=True)) for rec in self._ready()]
        self.model.recovered(found, self._recovered_parked())
        if self.workload.requeue_recovered():
            for rec, tag in found:
                self.core.requeue(rec)
                self.redeliver.append((rec, tag))
            return
        self.trace("CRASH kill, to read the recovered messages lazily")
        self.stats.kills += 1
        self.stats.restarts += 1
        self._drop_core()
        self.disk = self.disk.crash("kill")
        self._reset_run(keep_recovered=True)
        self._core = self._open()
        self.model.check_lazy_counts()

    def _recovered_parked(self) -> list[tuple[Record, int]]:
        """The parked records the log recovered (delayed, dead), read without changing
        anything (white box: the log's own index), each checked like a delivery's."""
        core = self.core
        index = core._parked
        out = []
        for at, state in enumerate(index.states):
            if state not in (DELAYED, MAX, EXP):
                continue
            rec = core._kept.read_parked(index.base + at)
            if rec is None:
                continue  # damage the log reported (bit rot)
            out.append((rec, self.model.check_parked(rec, state)))
        return out

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
                self.model.fail("walk makes no progress", f"{slices} slices without a message handed out")
            else:
                slices += 1
                core.flush()

    def _dead(self) -> Iterator[Record]:
        """Every dead letter next_dead hands out, granting the log its slices of reading."""
        core = self.core
        while True:
            rec = core.next_dead()
            if rec is not None:
                yield rec
            elif core.walking and core.broken is None:
                core.flush()
            else:
                return

    # ------------------------------------------------------------ actions

    def do_send_receipt(self) -> None:
        self.append(receipt=True)

    def do_send_plain(self) -> None:
        self.append(receipt=False)

    def append(self, receipt: bool) -> None:
        core = self.core
        msg = self.model.new_message(self.workload.size(core.max_message))
        done = self.model.append_callback(msg.tag) if receipt else None
        try:
            rec = core.append(msg.payload, done, urgent=receipt)
        except TooLarge:
            self._refused(msg, "TooLarge")
            self.model.too_large(msg)
            return
        except QueueFull:
            self._refused(msg, "QueueFull")
            self.model.check_queue_full(msg.size)
            return
        self._accepted(msg, rec, receipt)

    def _refused(self, msg: Msg, why: str) -> None:
        self.model.refused(msg)
        self.stats.refused += 1
        self.trace("append #%d (%d B): %s", msg.tag, len(msg.payload), why)

    def _accepted(self, msg: Msg, rec: Record, receipt: bool) -> None:
        self.model.accepted(msg, rec)
        self.stats.appends += 1
        self.trace("append #%d id %d (%d B)%s", msg.tag, rec.id, msg.size, " with receipt" if receipt else "")

    def do_take(self) -> None:
        """A consumer takes a message: a requeued one first, as the queue would."""
        consumer = self.workload.consumer()
        if self.redeliver:
            rec, tag = self.redeliver.popleft()
            self.model.check_handout(rec, tag)
            self.core.delivered(rec)
            self.model.check_payload(rec, tag)
            self.trace("consumer %d retakes #%d id %d", consumer, tag, rec.id)
        else:
            ready = self.core.next_ready()
            if ready is None:
                return
            rec = ready
            tag = self.model.check_delivery(rec)
            self.core.delivered(rec)
            self.trace("consumer %d takes #%d id %d", consumer, tag, rec.id)
        self.held[consumer].append((rec, tag))

    def do_ack(self) -> None:
        held = self.workload.holder(self.held)
        if held is None:
            return
        rec, tag = held.pop(self.workload.index(len(held)))
        self.core.ack(rec)
        self.stats.acks += 1
        self.model.acked(tag)
        receipt = self.workload.ack_receipt()
        self.trace("ack #%d id %d%s", tag, rec.id, " with receipt" if receipt else "")
        if receipt:
            self.ask_durable()

    def do_nack(self) -> None:
        held = self.workload.holder(self.held)
        if held is None:
            return
        rec, tag = held.pop(self.workload.index(len(held)))
        self._requeue(rec, tag)
        if self.workload.nack_receipt():
            self.ask_durable()

    def do_disconnect(self) -> None:
        held = self.workload.holder(self.held)
        if held is None:
            return
        self.trace("disconnect: %d held messages back", len(held))
        for rec, tag in held:
            self._requeue(rec, tag)
        held.clear()
        if self.workload.disconnect_receipt():
            self.ask_durable()

    def _requeue(self, rec: Record, tag: int) -> None:
        self.core.requeue(rec)
        self.model.op(tag, "count", rec.deliveries)
        self.redeliver.append((rec, tag))
        self.trace("requeue #%d id %d", tag, rec.id)

    def ask_durable(self) -> None:
        """A RECEIPT for an ACK, NACK or DISCONNECT (the log's on_durable)."""
        self.core.on_durable(self.model.durable_callback())

    # ------------------------------------------------------------ parked steps

    def parked_step(self) -> None:
        """Maybe one step of delays, burials and redrives, drawn from a random stream of
        their own (so that seeds kept without them replay as before)."""
        step = self.workload.parked_step()
        if step is not None:
            getattr(self, "do_" + step)()

    def do_send_delayed(self) -> None:
        core = self.core
        size = self.workload.delayed_size(core.max_message)
        msg = self.model.new_message(size, self.wall_ms() + self.workload.delay())
        receipt = self.workload.delayed_receipt()
        done = self.model.append_callback(msg.tag) if receipt else None
        try:
            rec = core.append(msg.payload, done, urgent=receipt, due_ms=msg.due_sent)
        except (TooLarge, QueueFull) as err:
            self._refused(msg, type(err).__name__)
            return
        self._accepted(msg, rec, receipt)
        self.trace("  (delayed to wall %d)", msg.due_sent)

    def do_nack_delay(self) -> None:
        """A NACK with a delay: the log parks the message until its due time."""
        got = self.workload.parked_take(self.held)
        if got is None:
            return
        rec, tag = got
        due = self.wall_ms() + self.workload.delay()
        self.core.requeue(rec, due)
        self.model.delayed_again(tag, due, rec.deliveries)
        self.trace("nack #%d id %d with a delay to wall %d (%d deliveries)", tag, rec.id, due, rec.deliveries)

    def do_bury(self) -> None:
        got = self.workload.parked_take(self.held)
        if got is None:
            return
        rec, tag = got
        self.core.bury(rec, self.workload.burial_reason())
        self.model.buried(tag, rec.deliveries, self.browse)
        if self.workload.keeps_dead():
            self.core.keep_dead(rec)  # the log's from now on: next_dead hands it out again
            self.model.kept_dead(tag)
            self.trace("bury #%d id %d (%d deliveries), kept by the log", tag, rec.id, rec.deliveries)
            return
        self.dead_held.append((rec, tag))
        self.trace("bury #%d id %d (%d deliveries)", tag, rec.id, rec.deliveries)

    def do_release(self) -> None:
        """The broker's timer: every parked message due by now comes back, none early."""
        back = self.core_due()
        for rec in back:
            tag = self.model.released(rec)
            if rec.dead:
                self.model.fail("dead letter released as due", f"#{tag} id {rec.id}")
            self.redeliver.append((rec, tag))
        if back:
            self.trace("release at wall %d: %d messages", self.wall_ms(), len(back))
        self.model.check_released_all()

    def do_wall_jump(self) -> None:
        self.wall_skew += self.workload.wall_jump()

    def do_dead_take(self) -> None:
        """A reader of the dead letters takes the next one the log holds."""
        rec = self.core.next_dead()
        if rec is None:
            return
        tag = self.model.dead_taken(rec)
        self.dead_held.append((rec, tag))
        self.trace("dead letter #%d id %d taken (%s)", tag, rec.id, rec.dead)

    def do_dead_settle(self) -> None:
        """A dead letter the caller holds: ACKed for good, revived, or kept."""
        if not self.dead_held:
            return
        rec, tag = self.dead_held.pop(self.workload.dead_index(len(self.dead_held)))
        what = self.workload.dead_settlement()
        if what == "ack":
            self.core.ack(rec)
            self.model.dead_acked(tag)
            self.trace("dead letter #%d id %d acked", tag, rec.id)
        elif what == "revive":
            self.core.revive(rec)
            self.model.revived(tag)
            self.redeliver.append((rec, tag))
            self.trace("dead letter #%d id %d revived", tag, rec.id)
        else:
            self.core.requeue(rec)  # given back: still dead, still held
            self.dead_held.append((rec, tag))

    def do_redrive(self) -> None:
        """A redrive of the dead letters the log holds: each comes back from `due` at once."""
        count = self.workload.redrive_count()
        before = self.core.dead
        ids = self.core.redrive(1 << 62 if count is None else count)
        moved = len(ids)
        self.model.check_redrive(count, before, moved)
        self.model.redrive_moved(ids)  # before a flush may write their rewrites
        mine = 0
        for rec in self.core_due():
            tag, moved_here = self.model.redriven(rec, ids)
            mine += moved_here
            self.redeliver.append((rec, tag))
        if self.fatal is None:  # a write that failed meanwhile stopped the log: it hands out no more
            self.model.check_redrive_lost(moved, mine)
        self.trace("redrive of %s: %d moved", count, moved)

    def core_due(self) -> list[Record]:
        """Every message due by now, taken from the log's ready line (as a broker's
        consumers would, the ready line first)."""
        core = self.core
        core.release(self.wall_ms(), 1 << 62)
        taken = []
        while core.ready_waiting:
            rec = core.next_ready()
            if rec is not None:
                taken.append(rec)
            elif core.walking and core.broken is None:
                core.flush()  # the slice's reading is spent: the next one
            else:
                break
        return taken

    def do_ask_durable(self) -> None:
        self.ask_durable()

    # ------------------------------------------------------------ replay steps

    def replay_step(self) -> None:
        """Maybe one step of the replayable reads, drawn from their own random stream:
        an ACK up to an id, or a browse opened or stepped on."""
        step = self.workload.replay_step(self.browse is not None)
        if step is not None:
            getattr(self, "do_" + step)()

    def do_ack_upto(self) -> None:
        """ACK up to an id: every live message up to it is gone at once, wherever it is."""
        core = self.core
        upto = self.workload.upto(core.last_id, core.acked_upto)
        covered = self.model.ack_upto(upto)
        self.held = [[(rec, tag) for rec, tag in held if rec.id > upto] for held in self.held]
        self.redeliver = deque((rec, tag) for rec, tag in self.redeliver if rec.id > upto)
        self.dead_held = [(rec, tag) for rec, tag in self.dead_held if rec.id > upto]
        self.stats.uptos += 1
        receipt = self.workload.upto_receipt()
        self.trace("ack up to %d (%d live messages)%s", upto, len(covered), " with receipt" if receipt else "")
        if not receipt:
            core.ack_upto(upto)
            return
        core.ack_upto(upto, self.model.upto_callback(upto, covered))

    def do_browse_open(self) -> None:
        core = self.core
        first, to = self.workload.browse_range(core.last_id)
        at_start = self.model.live_in(first, to)
        self.browse = Browsing(core.browse(first, to), first, to, at_start)
        self.trace("browse %d..%d opened (%d live in range)", first, to, len(at_start))

    def do_browse_step(self) -> None:
        """A step of the open browse, each message it returns checked; at its end, the
        model checks that none live all along is missing."""
        b = self.browse
        assert b is not None
        step = b.browse.step(self.workload.browse_budget())
        for msg_id, payload in step.messages:
            self.model.browsed(b, msg_id, payload)
            self.stats.browsed += 1
        self.trace("browse step: %d messages%s", len(step.messages), ", done" if step.done else "")
        if not step.done:
            return
        self.model.browse_ended(b)
        self.core.end_browse(b.browse)
        self.browse = None
        self.stats.browses += 1

    def do_clock(self) -> None:
        self.now += self.workload.clock_jump()

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
        self.crash(self.workload.crash_mode())

    def do_crash_mid_op(self) -> None:
        """Arm a crash for one of the next few disk calls, wherever the log makes them:
        between two writes of a batch, between a write and its sync."""
        self.armed_mode, ops = self.workload.armed_crash()
        self.disk.arm_crash(ops)
        self.trace("crash (%s) armed", self.armed_mode)

    def settle(self, min_rounds: int) -> None:
        """Rounds of (clock, flush, sync) until every append and ack receipt is answered;
        more than SETTLE_ROUNDS of them is a wedge."""
        model = self.model
        for n in range(SETTLE_ROUNDS + 1):
            if n >= min_rounds and not model.waiting_appends and not model.waiting_durable:
                return
            if n == SETTLE_ROUNDS or self.fatal is not None:
                break
            self.now += ROUND_SECONDS
            self.core.flush()
            self.core.sync()
        model.check_settled()

    # ------------------------------------------------------------ the end

    def finish(self) -> None:
        """Quiesce and prove it: settle, read every message, sync; then a power loss must
        keep exactly the live messages, receipted or not. Faults stop first, and a run
        whose model went inexact (a disk fault refused appends nobody waited for) is
        crashed and recovered, so that the model knows the live messages again."""
        self.trace("finish")
        self.faults_on = False
        self.disk.write_eio = self.disk.sync_eio = 0.0
        self.disk.arm_crash(None)
        if self.fatal is not None or not self.model.exact:
            self.crash("kill")
        self.ask_durable()
        self.settle(SETTLE_ROUNDS)
        self.model.check_step()
        for rec in self._ready():
            self.model.check_delivery(rec)
        self.wall_skew += 10**10  # every delayed message is due: each comes back, once
        self.do_release()
        for rec in self._ready():
            self.model.check_delivery(rec)
        for dead in self._dead():
            self.model.dead_taken(dead)
        self.model.check_dead_read()
        self.model.read_all(tag for _, tag in self.dead_held)
        self.model.read_all(self.model.parked_tags)
        self.core.flush()
        self.core.sync()
        if self.fatal is not None or self.disk.faults != self.disk_faults:
            return
        self.model.check_all_stored()
        self.stats.faults += self.disk.faults - self.disk_faults
        self.stats.powers += 1
        self._drop_core()
        self.disk = self.disk.crash("power")
        self.restart()


def _format_trace(entry: tuple) -> str:
    step, run, fmt, args = entry
    return f"  step {step:4d} run {run:2d}: " + (fmt % args)


# ---------------------------------------------------------------- running seeds


def run_seed(
    seed: int,
    steps: int = STEPS,
    verbose: bool = False,
    out: Callable[[str], None] = print,
    ignore: frozenset[str] = frozenset(),
    replay_steps: bool = True,
) -> runner.Outcome[Stats]:
    """Play one seed; a broken invariant or an exception from the log is its failure.
    Kinds in `ignore` are dropped (to hunt past a known failure that notes, not stops).
    replay_steps=False plays it as before ACK up to an id and browses existed."""
    replay = "bin/crashsim" + ("" if replay_steps else " --no-replay-steps")
    return runner.play(Sim(seed, steps, verbose, out, replay_steps), seed, replay, ignore)


def run_many(
    start: int,
    count: int,
    steps: int = STEPS,
    jobs: int = 1,
    ignore: frozenset[str] = frozenset(),
    replay_steps: bool = True,
) -> runner.Totals[Stats]:
    """Play `count` seeds over `jobs` processes."""
    return runner.run_many(TARGET, start, count, steps, jobs, ignore, (("replay_steps", replay_steps),))


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-replay-steps",
        dest="replay_steps",
        action="store_false",
        help="play without ACK up to an id and browses (as seeds found before they existed)",
    )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"replay_steps": args.replay_steps}


TARGET = runner.Target(
    name="crashsim",
    description="Crash-simulate curb's log over many seeds.",
    steps=STEPS,
    run_seed=run_seed,
    stats=Stats,
    show=10,
    add_options=_add_options,
    options=_options,
)

if __name__ == "__main__":
    sys.exit(runner.main(sys.argv[1:]))
