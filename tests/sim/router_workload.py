"""What the router simulator's clients and faults do, drawn from one seed: the seed's world
(`RouterConfig`: the routes, the instances' and the router's flags) and, step by step,
the next `RouterAction`.

The world: a destination on one instance (`solo`) and one partitioned over two or three
(`parts`), each instance a broker of its own on a simulated disk, and one router in
front of them. The instances' flags (cap, heart-beat, redelivery delay) and the
router's (ack timeout, client and link heart-beats, `link_wait`) are drawn per seed; no
instance has a delivery limit: the workload plays no dead letters (the whole-broker
simulator does).

Steps: a client connects (heart-beating or not), SUBSCRIBEs to a destination (ack
client-individual, client or auto, prefetch 1 to 16) or to its `./NAME/count`, SENDs to
a destination with or without receipt (some with `curb-partition-key`), ACKs or NACKs a
message it holds (with or without receipt), UNSUBSCRIBEs, DISCONNECTs (with or without
receipt) or is lost; the clock jumps (past ack deadlines, heart-beat tolerances and
`link_wait`); the instances write and sync (a loop pass, or one instance's write or
sync); a link drops; an instance crashes (kill -9 or power loss, between steps or armed
to strike within its next few disk calls, and stays down for a while); the router
crashes; a quiet spell lets every count settle. A browse of a destination is drawn from
a stream of its own, and only when browses are switched on. Without mixed clients
(`--no-mixed-clients`) a client only produces, to one destination, or only consumes, and
UNSUBSCRIBEs before it DISCONNECTs.

The workload knows only what a client could know (what it holds, what it subscribed), so
a client that ACKs a message whose link was lost meanwhile happens as it would for real.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sim.workload import Config

KIB = 1024
SOLO, PARTS = "solo", "parts"
DESTS = (SOLO, PARTS)
ACK_MODES = ("client-individual", "client-individual", "client", "auto")
PREFETCHES = (1, 1, 2, 3, 5, 16)
KEYS = ("k0", "k1", "k2", "k3", "k4")
SIZES = (0, 1, 10, 60, 200, 700)
JUMPS_MS = (1, 5, 20, 60, 60, 250, 1000, 3000, 8000, 60_000)
DOWN_MS = (0, 0, 50, 1000, 8000)  # how long a crashed instance stays down
BASE_WEIGHTS = {
    "connect": 5.0,
    "subscribe": 4.0,
    "watch_counts": 0.7,
    "send_receipt": 14.0,
    "send_plain": 8.0,
    "ack": 12.0,
    "nack": 3.0,
    "unsubscribe": 0.8,
    "disconnect": 2.0,
    "beat": 3.0,
    "advance": 8.0,
    "loop": 10.0,
    "flush": 2.0,
    "sync": 2.0,
    "quiet": 1.0,
    "drop_link": 1.5,
    "crash": 0.8,
    "crash_mid_op": 0.6,
    "crash_router": 0.4,
}


@dataclass(slots=True)
class RouterConfig:
    """One seed's world: how many instances `parts` spreads over, the instances' flags (a
    broker simulator `Config`, for its World), the router's, and the workload's mix."""

    parts: int  # instances of the partitioned destination
    broker: Config = field(repr=False)
    slots: int
    heartbeat_ms: int  # the router's heart-beat offer to clients; 0: none
    link_heartbeat_ms: int  # what the router asks of the instances; 0: none
    link_wait_ms: int  # how long a SEND waits for an instance of its destination
    ack_timeout_ms: int  # the router's -ack-timeout (the instances' too, which the router asks to ignore)
    instance_heartbeat_ms: int  # the instances' -heartbeat (idem)
    redelivery_delay_ms: int  # the instances' -redelivery-delay (idem)
    weights: dict[str, float] = field(repr=False)

    @classmethod
    def draw(cls, rng: random.Random, ack_timeouts: bool, refusals: bool, dead_letters: bool = False) -> RouterConfig:
        """Without `ack_timeouts` there is no deadline; without `refusals` the router's
        link_wait is an hour (the draws are made all the same, so the rest replays); with
        `dead_letters` the instances have a delivery limit (drawn last, so that the rest
        replays as without)."""
        ack_timeout = rng.choice((0, 0, 500, 2000, 30 * 60_000))
        beat = rng.choice((0, 1000, 5000))
        delay = rng.choice((0, 0, 20, 700))
        broker = Config(
            cap=rng.choice((32, 64, 128, 256)) * KIB,
            slots=0,
            ack_timeout_ms=ack_timeout if ack_timeouts else 0,
            heartbeat_ms=beat,
            large_share=0.0,
            recovery_crash=rng.choice((0.0, 0.0, 0.1, 0.3)),
            max_deliveries=0,
            redelivery_delay_ms=delay,
            redelivery_multiplier=rng.choice((1.0, 2.0)),
            redelivery_max_delay_ms=rng.choice((100, 5000)),
            delay_share=0.0,
            ttl_share=0.0,
            nack_delay_share=0.0,
            weights={},
        )
        config = cls(
            parts=rng.choice((2, 3)),
            broker=broker,
            slots=rng.randint(2, 6),
            heartbeat_ms=rng.choice((0, 2000, 10_000)),
            link_heartbeat_ms=rng.choice((0, 2000)),
            link_wait_ms=rng.choice((0, 500, 5000)) if refusals else 3_600_000,
            ack_timeout_ms=broker.ack_timeout_ms,
            instance_heartbeat_ms=beat,
            redelivery_delay_ms=delay,
            weights={name: base * rng.uniform(0.3, 2.0) for name, base in BASE_WEIGHTS.items()},
        )
        if dead_letters:
            config.broker = dataclasses.replace(broker, max_deliveries=rng.choice((2, 3)))
        return config


@dataclass(slots=True)
class RouterAction:
    """One step: `kind` (a key of BASE_WEIGHTS, or browse), the client slot it concerns
    (-1: none), and its arguments."""

    kind: str
    slot: int = -1
    dest: str = ""  # subscribe, send, watch_counts, browse
    receipt: bool = False
    ack_id: str = ""  # ack, nack: the MESSAGE's ack header
    mode: str = ""  # subscribe: the ack mode; disconnect: receipt, plain or lost; crash: kill or power
    prefetch: int = 0
    heartbeat_ms: int = 0  # connect: the heart-beats this client sends and wants
    key: str = ""  # send: curb-partition-key
    size: int = 0  # send: the body's length
    ms: int = 0  # advance: the jump; crash: how long the instance stays down
    instance: int = -1  # flush, sync, drop_link, crash, crash_mid_op
    role: str = ""  # drop_link: which of the instance's two links
    ops: int = 0  # crash_mid_op: disk calls before it strikes

    def __str__(self) -> str:
        shown = {"slot": self.slot} if self.slot >= 0 else {}
        shown |= {"instance": self.instance} if self.instance >= 0 else {}
        for name in (
            "dest",
            "receipt",
            "ack_id",
            "mode",
            "prefetch",
            "heartbeat_ms",
            "key",
            "size",
            "ms",
            "role",
            "ops",
        ):
            value = getattr(self, name)
            if value not in (False, "", 0):
                shown[name] = value
        return self.kind + " " + " ".join(f"{k}={v}" for k, v in shown.items())


class RouterClientView(Protocol):
    """What a client knows of itself."""

    @property
    def open(self) -> bool:
        """Connected and able to send frames (not ending)."""

    @property
    def beats(self) -> bool: ...
    @property
    def held(self) -> Sequence[str]:
        """The ack ids of the MESSAGEs it got and has not settled, in delivery order."""

    @property
    def subscribed(self) -> str:
        """The destination it consumes from, or ""."""

    @property
    def counting(self) -> bool:
        """Subscribed to a ./NAME/count."""

    @property
    def sent_to(self) -> str:
        """The destination of its first SEND, or "" (none yet)."""


class RouterWorkload:
    """The next action, from the seed's random stream and what the clients know; browses
    (`browse`) from a stream of their own, so switching them on changes no other choice.
    Without `mixed` clients, a client only produces (to one destination) or only consumes,
    and a consumer UNSUBSCRIBEs before it DISCONNECTs: no client ever closes with a
    subscription while earlier receipts wait, nor has SENDs of two destinations parked."""

    def __init__(
        self,
        rng: random.Random,
        cfg: RouterConfig,
        instances: int,
        browse_rng: random.Random | None,
        mixed: bool = True,
    ):
        self.rng = rng
        self.cfg = cfg
        self.instances = instances
        self.browse_rng = browse_rng
        self.mixed = mixed
        self._kinds = list(cfg.weights)
        self._cum = list(itertools.accumulate(cfg.weights.values()))

    def next(self, clients: Sequence[RouterClientView | None]) -> RouterAction:
        rng = self.rng
        kind = rng.choices(self._kinds, cum_weights=self._cum)[0]
        opened = [i for i, c in enumerate(clients) if c is not None and c.open]
        if kind == "connect":
            empty = [i for i, c in enumerate(clients) if c is None]
            if not empty:
                return RouterAction("loop")
            beats = rng.choice((0, 0, 300, 1000)) if self.cfg.heartbeat_ms else 0
            return RouterAction("connect", rng.choice(empty), heartbeat_ms=beats)
        if kind in ("subscribe", "watch_counts", "unsubscribe"):
            return self._subscription(kind, clients, opened)
        if kind in ("send_receipt", "send_plain"):
            if not self.mixed:
                opened = [i for i in opened if not clients[i].subscribed]  # type: ignore[union-attr]
            if not opened:
                return RouterAction("loop")
            slot = rng.choice(opened)
            dest = rng.choice(DESTS)
            if not self.mixed:
                dest = clients[slot].sent_to or dest  # type: ignore[union-attr]
            key = rng.choice(KEYS) if rng.random() < 0.3 else ""
            return RouterAction(
                "send", slot, dest=dest, receipt=kind == "send_receipt", key=key, size=rng.choice(SIZES)
            )
        if kind in ("ack", "nack"):
            holding = [i for i in opened if clients[i].held]  # type: ignore[union-attr]
            if not holding:
                return RouterAction("advance", ms=rng.choice(JUMPS_MS))
            slot = rng.choice(holding)
            held = clients[slot].held  # type: ignore[union-attr]
            pick = rng.random()
            ack_id = held[0] if pick < 0.5 else held[-1] if pick < 0.7 else rng.choice(held)
            return RouterAction(kind, slot, ack_id=ack_id, receipt=rng.random() < 0.6)
        if kind == "disconnect":
            if not opened:
                return RouterAction("loop")
            slot, mode = rng.choice(opened), rng.choice(("receipt", "plain", "lost", "lost"))
            if not self.mixed and mode != "lost" and clients[slot].subscribed:  # type: ignore[union-attr]
                return RouterAction("unsubscribe", slot)
            return RouterAction("disconnect", slot, mode=mode)
        if kind == "beat":
            beating = [i for i in opened if clients[i].beats]  # type: ignore[union-attr]
            return RouterAction("beat", rng.choice(beating)) if beating else RouterAction("loop")
        if kind == "advance":
            return RouterAction("advance", ms=rng.choice(JUMPS_MS))
        if kind in ("flush", "sync"):
            return RouterAction(kind, instance=rng.randrange(self.instances))
        if kind == "drop_link":
            return RouterAction(
                "drop_link", instance=rng.randrange(self.instances), role=rng.choice(("sends", "consumes", "both"))
            )
        if kind == "crash":
            return RouterAction(
                "crash",
                instance=rng.randrange(self.instances),
                mode=rng.choice(("kill", "power")),
                ms=rng.choice(DOWN_MS),
            )
        if kind == "crash_mid_op":
            return RouterAction(
                "crash_mid_op",
                instance=rng.randrange(self.instances),
                mode=rng.choice(("kill", "power")),
                ms=rng.choice(DOWN_MS),
                ops=rng.randint(0, 6),
            )
        return RouterAction(kind)

    def _subscription(self, kind: str, clients: Sequence[RouterClientView | None], opened: list[int]) -> RouterAction:
        rng = self.rng
        if kind == "subscribe":
            free = [i for i in opened if not clients[i].subscribed]  # type: ignore[union-attr]
            if not self.mixed:
                free = [i for i in free if not clients[i].sent_to]  # type: ignore[union-attr]
            if not free:
                return RouterAction("loop")
            return RouterAction(
                "subscribe",
                rng.choice(free),
                dest=rng.choice(DESTS),
                mode=rng.choice(ACK_MODES),
                prefetch=rng.choice(PREFETCHES),
                receipt=rng.random() < 0.3,
            )
        if kind == "watch_counts":
            free = [i for i in opened if not clients[i].counting]  # type: ignore[union-attr]
            return (
                RouterAction("watch_counts", rng.choice(free), dest=rng.choice(DESTS)) if free else RouterAction("loop")
            )
        subscribed = [i for i in opened if clients[i].subscribed]  # type: ignore[union-attr]
        if not subscribed:
            return RouterAction("loop")
        return RouterAction("unsubscribe", rng.choice(subscribed), receipt=rng.random() < 0.5)

    def browse(self, clients: Sequence[RouterClientView | None]) -> RouterAction | None:
        """Maybe a browse of a destination by an open client (only with browses on)."""
        rng = self.browse_rng
        if rng is None or rng.random() >= 0.08:
            return None
        opened = [i for i, c in enumerate(clients) if c is not None and c.open]
        if not opened:
            return None
        return RouterAction("browse", rng.choice(opened), dest=rng.choice(DESTS))
