"""What the simulated clients do, drawn from one seed: the seed's world (`Config`) and,
step by step, the next `Action`.

The workload knows only what a client could know: which clients are connected, what
each believes it holds (the MESSAGEs it got and has not ACKed or NACKed, including those
whose ack deadline passed unseen), and whether it heart-beats. It never looks at the
broker or the checker, so a client that holds a message past its deadline and then ACKs
it (a late ACK) happens as it would for a real client.

Actions: connect (producer, consumer in one of the ack modes with a prefetch, its own
ack timeout or the broker's, heart-beats or none; or a consumer of the dead letters,
`./dead`), SEND with or without receipt (small bodies mostly, some near the largest the
cap allows; some delayed by `curb-delay`, `AMQ_SCHEDULED_DELAY` or `AMQ_SCHEDULED_TIME`,
some expiring by `curb-ttl` or `expires`), ACK / NACK (some with `curb-delay`) / touch of
a held message with or without receipt (the oldest, the newest or any), DISCONNECT with
or without receipt, a connection lost, a heart-beat, a redrive of the dead letters, time
passing (a millisecond to a minute, past ack deadlines, heart-beat tolerances, due and
expiry times), a loop pass (the log writes and syncs), a write or a sync alone, and
crashes: kill -9 or power loss between steps, or armed to strike within the next few
disk calls. The broker's redelivery policy (delivery limit, redelivery delay and its
growth) is drawn per seed.

The extra steps (`Extra`, on unless a seed is played as it was found before them) draw
from a random stream of their own, so the seeds kept from before them replay exactly:
a redrive with `curb-count` (with or without receipt), `./dead` SUBSCRIBEs with their
own `curb-ack-timeout` and touches of dead letters, UNSUBSCRIBE of the queue's or the
dead letters' subscription (the client still ACKs and NACKs what it holds), ACK with
`curb-upto` (an id the clients saw, the highest, or one above every id), a browse of the
queue (`browser:true`, from and to ids the clients saw, the highest, past it, or none)
or of `./dead`, and a `./count` subscription; and the disk's faults, drawn per seed: a
free-space limit (ENOSPC when the log must grow), or EIO on writes or syncs, which
break the log (its broker then stops, and the simulator restarts it).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

KIB = 1024
ACK_MODES = ("client-individual", "client-individual", "client-individual", "client", "auto")
PREFETCHES = (1, 1, 2, 4, 16)
# Jumps of the clock, ms: within a loop pass, a few passes, past short deadlines and
# heart-beat tolerances, past every deadline a seed draws.
JUMPS_MS = (1, 1, 5, 20, 60, 250, 1000, 3000, 60_000)
TOUCH_MS = (1, 50, 400, 2000, 10_000)
DELAYS_MS = (1, 30, 500, 3000, 60_000)  # SEND delays; NACK delays are these or 0
TTLS_MS = (1, 100, 1000, 10_000, 120_000)
DUE_HEADERS = ("curb-delay", "curb-delay", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME")
EXPIRY_HEADERS = ("curb-ttl", "expires")
BASE_WEIGHTS = {
    "connect": 5.0,
    "send_receipt": 14.0,
    "send_plain": 9.0,
    "ack": 14.0,
    "nack": 3.5,
    "touch": 2.0,
    "disconnect": 1.5,
    "redrive": 0.8,
    "beat": 4.0,
    "advance": 9.0,
    "loop": 10.0,
    "flush": 3.0,
    "sync": 3.0,
    "crash": 0.7,
    "crash_mid_op": 0.5,
}


@dataclass(slots=True)
class Config:
    """One seed's world: the log's cap, how many client slots, the broker's flags, and the
    workload's mix."""

    cap: int
    slots: int
    ack_timeout_ms: int  # the broker's -ack-timeout; 0: none
    heartbeat_ms: int  # the broker's heart-beat offer; 0: none
    large_share: float  # the share of SENDs with a body near the largest allowed
    recovery_crash: float  # the odds of a crash amid each recovery
    max_deliveries: int  # the broker's -max-deliveries; 0: no limit
    redelivery_delay_ms: int  # -redelivery-delay
    redelivery_multiplier: float  # -redelivery-multiplier
    redelivery_max_delay_ms: int  # -redelivery-max-delay
    delay_share: float  # SENDs with a due time
    ttl_share: float  # SENDs with an expiry time
    nack_delay_share: float  # NACKs with curb-delay
    weights: dict[str, float] = field(repr=False)

    @classmethod
    def draw(cls, rng: random.Random) -> Config:
        cap = rng.choice((16, 16, 24, 32, 64, 128, 256)) * KIB
        return cls(
            cap=cap,
            slots=rng.randint(2, 5),
            ack_timeout_ms=rng.choice((0, 100, 500, 2000, 30 * 60_000)),
            heartbeat_ms=rng.choice((0, 0, 500, 2000)),
            large_share=rng.choice((0.0, 0.02, 0.1)),
            recovery_crash=rng.choice((0.0, 0.0, 0.1, 0.3)),
            max_deliveries=rng.choice((0, 1, 2, 3, 5, 20)),
            redelivery_delay_ms=rng.choice((0, 0, 0, 20, 700)),
            redelivery_multiplier=rng.choice((1.0, 2.0, 3.5)),
            redelivery_max_delay_ms=rng.choice((100, 5000)),
            delay_share=rng.choice((0.0, 0.1, 0.3)),
            ttl_share=rng.choice((0.0, 0.1, 0.3)),
            nack_delay_share=rng.choice((0.0, 0.3)),
            weights={name: base * rng.uniform(0.3, 2.0) for name, base in BASE_WEIGHTS.items()},
        )


EXTRA_WEIGHTS = {
    "redrive_count": 1.0,
    "unsubscribe": 0.8,
    "ack_upto": 0.8,
    "browse": 2.0,
    "browse_dead": 1.0,
    "watch_counts": 0.6,
}
# The ./dead subscriptions' ack deadline (docs/guide.md: Dead letters): curb-ack-timeout on a
# ./dead SUBSCRIBE, else the broker's -ack-timeout. With it on, the extra steps ask for
# one on some ./dead SUBSCRIBEs and touch some dead letters held, and the checker
# (Checker.subscribed, Checker.advance) puts a dead letter held past it back among the
# dead letters.
DEAD_ACK_TIMEOUTS = True
DEAD_TIMEOUTS_MS = (30, 400, 3000)


@dataclass(slots=True)
class Extra:
    """The extra steps' share of the steps and mix, and the disk's faults, drawn from
    their own stream."""

    share: float  # the odds of an extra step after each step
    free_bytes: int | None  # the file system's room for the log file; None: no limit
    write_eio: float  # the odds of EIO on each write
    sync_eio: float  # the odds of EIO on each sync
    weights: dict[str, float] = field(repr=False)

    @classmethod
    def draw(cls, rng: random.Random, cap: int) -> Extra:
        free_bytes, write_eio, sync_eio = None, 0.0, 0.0
        fault = rng.random()
        if fault < 0.1:
            free_bytes = rng.randint(cap // 4, cap)
        elif fault < 0.16:
            write_eio = rng.choice((0.002, 0.01))
        elif fault < 0.22:
            sync_eio = rng.choice((0.005, 0.02))
        return cls(
            share=rng.choice((0.1, 0.2, 0.35)),
            free_bytes=free_bytes,
            write_eio=write_eio,
            sync_eio=sync_eio,
            weights={name: base * rng.uniform(0.3, 2.0) for name, base in EXTRA_WEIGHTS.items()},
        )


@dataclass(slots=True)
class Action:
    """One step: `kind` (a key of BASE_WEIGHTS), the client slot it concerns (-1: none),
    and its arguments."""

    kind: str
    slot: int = -1
    receipt: bool = False
    ack_id: str = ""  # the MESSAGE's ack header (ack, nack, touch)
    size: int = 0  # send: the body's length
    ms: int = 0  # advance: the jump; touch: the new deadline from now
    mode: str = ""  # connect: the ack mode ("" for a producer, "dead" for ./dead); disconnect: how; crash
    delay_ms: int | None = None  # send: the due time's header asks for this; nack: curb-delay
    due_header: str = ""  # send: which header says when it is due
    ttl_ms: int = 0  # send: expires this long from now
    expiry_header: str = ""  # send: which header says when it expires
    prefetch: int = 0
    ack_timeout_ms: int | None = None  # connect: curb-ack-timeout, None for the broker's
    heartbeat_ms: int = 0  # connect: the heart-beats this client sends and wants; 0: none
    ops: int = 0  # crash_mid_op: disk calls before it strikes
    count: int | None = None  # redrive: curb-count
    upto: int = 0  # ack_upto: curb-upto
    first: int | None = None  # browse: curb-from-id
    last: int | None = None  # browse: curb-to-id

    def __str__(self) -> str:
        shown = {"slot": self.slot} if self.slot >= 0 else {}
        for name in (
            "receipt",
            "ack_id",
            "size",
            "ms",
            "mode",
            "prefetch",
            "ack_timeout_ms",
            "heartbeat_ms",
            "ops",
            "delay_ms",
            "due_header",
            "ttl_ms",
            "expiry_header",
            "count",
            "upto",
            "first",
            "last",
        ):
            value = getattr(self, name)
            if value not in (False, "", 0, None) or (name in ("ack_timeout_ms", "delay_ms") and value == 0):
                shown[name] = value
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in shown.items())


class ClientView(Protocol):
    """What a client knows of itself."""

    @property
    def open(self) -> bool:
        """Connected and able to send frames (not ending)."""

    @property
    def dead(self) -> bool:
        """Subscribed to the dead letters (./dead)."""

    @property
    def beats(self) -> bool: ...
    @property
    def held(self) -> Sequence[str]:
        """The ack ids of the MESSAGEs it got and has not settled, in delivery order."""

    @property
    def subscribed(self) -> str:
        """Its active subscription: "queue", "dead", or "" (none, or unsubscribed)."""

    @property
    def browsing(self) -> bool:
        """A browse of its runs."""

    @property
    def counting(self) -> bool:
        """Subscribed to ./count."""


class Workload:
    """The next action, from the seed's random stream and what the clients know."""

    def __init__(self, rng: random.Random, cfg: Config, max_body: int, xrng: random.Random | None = None):
        self.rng = rng
        self.cfg = cfg
        self.max_body = max_body
        self._kinds = list(cfg.weights)
        self._cum = list(itertools.accumulate(cfg.weights.values()))
        # The extra steps and the disk's faults, from a stream of their own (None: none).
        self.xrng = xrng or random.Random(0)
        self.extra_cfg = None if xrng is None else Extra.draw(xrng, cfg.cap)
        weights = self.extra_cfg.weights if self.extra_cfg is not None else EXTRA_WEIGHTS
        self._extra_kinds = list(weights)
        self._extra_cum = list(itertools.accumulate(weights.values()))

    def next(self, clients: Sequence[ClientView | None]) -> Action:
        rng = self.rng
        kind = rng.choices(self._kinds, cum_weights=self._cum)[0]
        opened = [i for i, c in enumerate(clients) if c is not None and c.open]
        if kind == "connect":
            empty = [i for i, c in enumerate(clients) if c is None]
            return self._connect(rng.choice(empty)) if empty else Action("loop")
        if kind in ("send_receipt", "send_plain"):
            if not opened:
                return Action("loop")
            return self._send(rng.choice(opened), kind == "send_receipt")
        if kind in ("ack", "nack", "touch"):
            holding = [i for i in opened if clients[i].held]  # type: ignore[union-attr]
            if not holding:
                return Action("advance", ms=rng.choice(JUMPS_MS))
            slot = rng.choice(holding)
            held = clients[slot].held  # type: ignore[union-attr]
            pick = rng.random()
            ack_id = held[0] if pick < 0.5 else held[-1] if pick < 0.7 else rng.choice(held)
            receipt = rng.random() < 0.5
            if kind == "touch" and not clients[slot].dead:  # type: ignore[union-attr]
                return Action("touch", slot, receipt=receipt, ack_id=ack_id, ms=rng.choice(TOUCH_MS))
            if kind == "touch" and DEAD_ACK_TIMEOUTS and self.extra_cfg is not None:
                # A dead letter's touch, drawn from the extra stream (before it, a NACK).
                return Action("touch", slot, receipt=receipt, ack_id=ack_id, ms=self.xrng.choice(TOUCH_MS))
            if kind == "ack":
                return Action("ack", slot, receipt=receipt, ack_id=ack_id)
            dead = clients[slot].dead  # type: ignore[union-attr]
            delay = rng.choice((0, *DELAYS_MS)) if not dead and rng.random() < self.cfg.nack_delay_share else None
            return Action("nack", slot, receipt=receipt, ack_id=ack_id, delay_ms=delay)
        if kind == "disconnect":
            if not opened:
                return Action("loop")
            return Action("disconnect", rng.choice(opened), mode=rng.choice(("receipt", "plain", "lost", "lost")))
        if kind == "beat":
            beating = [i for i in opened if clients[i].beats]  # type: ignore[union-attr]
            return Action("beat", rng.choice(beating)) if beating else Action("loop")
        if kind == "redrive":
            if not opened:
                return Action("loop")
            return Action("redrive", rng.choice(opened), receipt=rng.random() < 0.8)
        if kind == "advance":
            return Action("advance", ms=rng.choice(JUMPS_MS))
        if kind == "crash":
            return Action("crash", mode=rng.choice(("kill", "power")))
        if kind == "crash_mid_op":
            return Action("crash_mid_op", mode=rng.choice(("kill", "power")), ops=rng.randint(0, 6))
        return Action(kind)

    def extra(self, clients: Sequence[ClientView | None], known: Sequence[int]) -> Action | None:
        """Maybe one extra step, from the extra stream; `known`: the message ids the
        clients saw (MESSAGEs, browse end markers), in the order they saw them."""
        rng, extra = self.xrng, self.extra_cfg
        if extra is None or rng.random() >= extra.share:
            return None
        kind = rng.choices(self._extra_kinds, cum_weights=self._extra_cum)[0]
        opened = [i for i, c in enumerate(clients) if c is not None and c.open]
        if kind == "unsubscribe":
            opened = [i for i in opened if clients[i].subscribed]  # type: ignore[union-attr]
        elif kind in ("browse", "browse_dead"):
            opened = [i for i in opened if not clients[i].browsing]  # type: ignore[union-attr]
        elif kind == "watch_counts":
            opened = [i for i in opened if not clients[i].counting]  # type: ignore[union-attr]
        if not opened:
            return None
        slot = rng.choice(opened)
        top = max(known, default=0)
        seen = rng.choice(known) if known else 0
        if kind == "redrive_count":
            return Action("redrive", slot, receipt=rng.random() < 0.6, count=rng.choice((0, 1, 1, 2, 3, 5)))
        if kind == "unsubscribe":
            return Action("unsubscribe", slot, receipt=rng.random() < 0.5)
        if kind == "ack_upto":
            upto = rng.choice((top, top, seen, seen, 0, top + rng.randint(1, 3)))
            return Action("ack_upto", slot, receipt=rng.random() < 0.7, upto=upto)
        if kind == "browse":
            first = rng.choice((None, 1, seen, seen, top, top + 1))
            last = rng.choice((None, None, seen, top, top + 5))
            return Action("browse", slot, first=first, last=last)
        if kind == "browse_dead":
            return Action("browse_dead", slot)
        return Action("watch_counts", slot)

    def _connect(self, slot: int) -> Action:
        rng = self.rng
        beats = rng.choice((0, 0, 300, 1000)) if self.cfg.heartbeat_ms else 0
        if rng.random() < 0.35:
            return Action("connect", slot, heartbeat_ms=beats)
        if (self.cfg.max_deliveries or self.cfg.ttl_share) and rng.random() < 0.15:
            dead_timeout = None
            if DEAD_ACK_TIMEOUTS and self.extra_cfg is not None and self.xrng.random() < 0.5:
                dead_timeout = self.xrng.choice(DEAD_TIMEOUTS_MS)
            return Action(
                "connect",
                slot,
                mode="dead",
                prefetch=rng.choice(PREFETCHES),
                heartbeat_ms=beats,
                ack_timeout_ms=dead_timeout,
            )
        timeout = rng.choice((None, None, 0, 30, 150, 1000, 5000))
        return Action(
            "connect",
            slot,
            mode=rng.choice(ACK_MODES),
            prefetch=rng.choice(PREFETCHES),
            ack_timeout_ms=timeout,
            heartbeat_ms=beats,
        )

    def _send(self, slot: int, receipt: bool) -> Action:
        rng, cfg = self.rng, self.cfg
        action = Action("send", slot, receipt=receipt, size=self._size())
        if rng.random() < cfg.delay_share:
            action.delay_ms, action.due_header = rng.choice(DELAYS_MS), rng.choice(DUE_HEADERS)
        if rng.random() < cfg.ttl_share:
            action.ttl_ms, action.expiry_header = rng.choice(TTLS_MS), rng.choice(EXPIRY_HEADERS)
        return action

    def _size(self) -> int:
        rng = self.rng
        if rng.random() < self.cfg.large_share:
            return rng.randint(self.max_body // 2, self.max_body)
        return rng.choice((0, 1, 10, 60, 200, 700, 2000))
