"""What the log simulator's caller (the broker, as the log sees it) does next, drawn from
one seed: the seed's world (`Config`) and every choice of every step.

The driver asks the workload at each point where something is to be chosen, in the
order the step makes its calls, so that the choices interleave with the simulated disk's
own draws (its faults and what a power loss keeps come from the same stream) exactly as
they always have: a kept seed replays the run it was found in.

Four streams: the main one (the steps of the original workload, the crashes and the
faults, shared with the disk), the parked steps' (delayed SENDs, NACKs with a delay,
burials, releases, the wall clock's jumps, dead letters taken, settled and redriven),
the replay steps' (ACK up to an id, browses, the walks' slices and the marks' spacing)
and the kept dead letters' (whether a burial hands the dead letter to the log,
`keep_dead`, as the broker does, or the caller holds it). The three later ones are
seeded apart, so seeds kept from before they existed replay as they were found, or
(the kept dead letters) as close to it as the log's changed state lets them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from simdisk import CRASH_MODES, SECTOR

from curb.log.cursor import RECORD_WORK, SLICE_WORK
from curb.log.record import RING_START

KIB = 1024
WALL_JUMPS = (1, 10, 100, 1_000, 30_000, 3_600_000)
DELAYS = (1, 20, 500, 5_000, 60_000, 7_200_000)
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
# The parked steps, by the upper bound of their share of the stream's draw.
PARKED_STEPS = (
    (0.05, "send_delayed"),
    (0.09, "nack_delay"),
    (0.11, "bury"),
    (0.16, "release"),
    (0.20, "wall_jump"),
    (0.22, "dead_take"),
    (0.25, "dead_settle"),
    (0.26, "redrive"),
    (0.29, "ask_durable"),
)

T = TypeVar("T")


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


class LogWorkload:
    """Every choice of one seed. `rng` is the main stream, which the disk shares."""

    def __init__(self, seed: int, rng: random.Random):
        self.xrng = random.Random(f"replay steps of seed {seed}")
        self.prng = random.Random(f"parked steps of seed {seed}")
        self.krng = random.Random(f"kept dead letters of seed {seed}")
        self.rng = rng
        self.cfg = Config.draw(rng)
        self._actions = list(self.cfg.weights)
        self._cum_weights = list(itertools.accumulate(self.cfg.weights.values()))

    # ------------------------------------------------------------ the main stream

    def next_action(self) -> str:
        """The next step of the original workload (a key of BASE_WEIGHTS)."""
        return self.rng.choices(self._actions, cum_weights=self._cum_weights)[0]

    def crash_mode(self) -> str:
        return self.rng.choice(CRASH_MODES)

    def recovery_crash(self) -> int | None:
        """Whether a crash strikes amid the next recovery: after how many disk calls."""
        return self.rng.randint(0, 4) if self.rng.random() < self.cfg.recovery_crash else None

    def rots(self) -> bool:
        """Whether bit rot strikes the medium after this crash."""
        return self.cfg.rot and self.rng.random() < 0.5

    def rot_damage(self, size: int) -> list[tuple[str, int, int]]:
        """One to three damages of the ring of a file of `size` bytes: ("bit", offset,
        bit) or ("sector", sector, 0)."""
        rng = self.rng
        damage: list[tuple[str, int, int]] = []
        for _ in range(rng.randint(1, 3)):
            if size <= RING_START:
                break
            if rng.random() < 0.5:
                offset, bit = rng.randrange(RING_START, size), rng.randrange(8)
                damage.append(("bit", offset, bit))
            else:
                damage.append(("sector", rng.randrange(RING_START // SECTOR, -(-size // SECTOR)), 0))
        return damage

    def requeue_recovered(self) -> bool:
        """After a restart: hand the recovered messages to the caller's redelivery list
        (True), or crash once more and read them lazily between new appends."""
        return self.rng.random() < 0.5

    def size(self, max_message: int) -> int:
        """Mostly small payloads, some middling, some at or just past the largest."""
        rng = self.rng
        r = rng.random()
        if r < 0.6:
            return rng.randint(0, 150)
        if r < 0.85:
            return rng.randint(150, max(150, max_message // 4))
        if r < 0.97:
            return rng.randint(max_message // 2, max_message)
        if r < 0.99:
            return max_message
        return max_message + rng.randint(1, 64)

    def consumer(self) -> int:
        return self.rng.randrange(self.cfg.consumers)

    def holder(self, held: Sequence[list[T]]) -> list[T] | None:
        """A consumer holding messages, or None."""
        holding = [h for h in held if h]
        return self.rng.choice(holding) if holding else None

    def index(self, n: int) -> int:
        return self.rng.randrange(n)

    def ack_receipt(self) -> bool:
        return self.rng.random() < 0.5

    def nack_receipt(self) -> bool:
        return self.rng.random() < 0.3

    def disconnect_receipt(self) -> bool:
        return self.rng.random() < 0.5

    def clock_jump(self) -> float:
        return self.rng.choice((0.001, 0.005, 0.02, 0.05, 0.06, 0.2))

    def armed_crash(self) -> tuple[str, int]:
        """A crash armed for one of the next few disk calls: its mode and how many calls."""
        mode = self.rng.choice(CRASH_MODES)
        return mode, self.rng.randint(0, 6)

    # ------------------------------------------------------------ the parked steps

    def parked_step(self) -> str | None:
        x = self.prng.random()
        for upto, step in PARKED_STEPS:
            if x < upto:
                return step
        return None

    def delayed_size(self, max_message: int) -> int:
        return min(max_message, self.prng.choice((0, 40, 300, 2000)))

    def delay(self) -> int:
        return self.prng.choice(DELAYS)

    def delayed_receipt(self) -> bool:
        return self.prng.random() < 0.5

    def parked_take(self, held: Sequence[list[T]]) -> T | None:
        """A message some consumer holds, taken from its list, or None."""
        holding = [h for h in held if h]
        if not holding:
            return None
        chosen = self.prng.choice(holding)
        return chosen.pop(self.prng.randrange(len(chosen)))

    def burial_reason(self) -> str:
        return self.prng.choice(("max-deliveries", "expired"))

    def keeps_dead(self) -> bool:
        """Whether a dead letter just buried is handed to the log (`keep_dead`), as the
        broker does, rather than held by the caller (its dead letters' queue)."""
        return self.krng.random() < 0.5

    def wall_jump(self) -> int:
        return self.prng.choice(WALL_JUMPS)

    def dead_index(self, n: int) -> int:
        return self.prng.randrange(n)

    def dead_settlement(self) -> str:
        """What the reader of a dead letter does with it: ack, revive, or give it back."""
        x = self.prng.random()
        return "ack" if x < 0.4 else "revive" if x < 0.8 else "back"

    def redrive_count(self) -> int | None:
        return self.prng.choice((1, 3, None))

    # ------------------------------------------------------------ the replay steps

    def walk_shape(self) -> tuple[int, int | None]:
        """The slices a run's walks of the ring go in, and its marks' spacing."""
        slice_work = self.xrng.choice((1, 3 * RECORD_WORK, 64 * RECORD_WORK, SLICE_WORK))
        return slice_work, self.xrng.choice((1, 200, 1 << 40))

    def replay_step(self, browsing: bool) -> str | None:
        """An ACK up to an id, a browse opened (none open) or stepped on (one open)."""
        x = self.xrng.random()
        if x < 0.015:
            return "ack_upto"
        if not browsing:
            return "browse_open" if x < 0.06 else None
        return "browse_step" if x < 0.45 else None

    def upto(self, last: int, acked_upto: int) -> int:
        rng = self.xrng
        return rng.choice((rng.randint(0, last), last, acked_upto, rng.randint(max(0, last - 5), last)))

    def upto_receipt(self) -> bool:
        return self.xrng.random() < 0.7

    def browse_range(self, last: int) -> tuple[int, int]:
        rng = self.xrng
        first = rng.randint(0, last + 2)
        return first, rng.choice((last, last, rng.randint(first, last + 3), first - 1))

    def browse_budget(self) -> int:
        return self.xrng.choice((1, 300, 5000, 1 << 20))
