"""A broker over a real LogCore on a SimDisk, driven by hand: sessions, scheduled
callbacks, flushes and syncs happen when a test says. No sockets, no event loop; the
log's wall clock is the SimClock's."""

from __future__ import annotations

import random
from collections.abc import Callable

from simclock import SimClock
from simdisk import SimDisk

from curb.broker import Broker, BrokerEvents
from curb.broker_config import BrokerConfig
from curb.frame import Frame, FrameParser, encode
from curb.log import LogCore
from curb.redelivery import Redelivery
from curb.session import Session

CAP = 256 * 1024


class MemWorld:
    """One broker, its log on a SimDisk, a list of scheduled callbacks and a clock whose
    timers (the broker's ack deadlines) fire when scheduled work runs after their time."""

    def __init__(self, cap: int = CAP, disk: SimDisk | None = None, now: float = 0.0, **broker_options) -> None:
        # A message that comes back is rdy again at once (-redelivery-delay 0) unless the
        # test says otherwise, so that it steps through returns one by one.
        broker_options.setdefault("redelivery", Redelivery(delay_ms=0))
        self.cap = cap
        self.disk = disk if disk is not None else SimDisk(random.Random(3))
        self.clock = SimClock(now)
        self.broker_options = broker_options
        self.events = BrokerEvents()
        self.log = LogCore(self.disk, cap, events=self.events, clock=self.clock.time, wall_ms=self.clock.wall_ms)
        self.later: list[Callable[[], None]] = []
        self.broker = Broker(
            self.log,
            BrokerConfig(**{"heartbeat_ms": 0, **broker_options}),
            schedule=lambda delay, callback: self.later.append(callback),
            clock=self.clock.time,
            loop=self.clock,
        )
        self.events.broker = self.broker

    @property
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, now: float) -> None:
        self.clock.now = now

    def run_scheduled(self) -> None:
        """Run every scheduled callback and due timer, and those they schedule, until none is left."""
        while self.later or self.clock.fire_due():
            later, self.later = self.later, []
            for callback in later:
                callback()

    def settle(self, rounds: int = 4) -> None:
        """Time passes, the log writes and syncs, answers go out."""
        for _ in range(rounds):
            self.now += 0.06
            self.log.flush()
            self.log.sync()
            self.run_scheduled()

    def peer(self) -> MemPeer:
        peer = MemPeer(self, Session(self.broker, self.now, "test"))
        peer.send("CONNECT", accept_version="1.2")
        [connected] = peer.frames()
        assert connected.command == "CONNECTED"
        return peer

    def crash(self, mode: str = "kill") -> MemWorld:
        """The broker after a crash: its disk as the crash left it, the same flags, and
        the clock where it was (a restart takes no time)."""
        return MemWorld(self.cap, self.disk.crash(mode), self.now, **self.broker_options)


class MemPeer:
    """One client's view: frames in, frames out (only when the test takes them)."""

    def __init__(self, world: MemWorld, session: Session) -> None:
        self.world, self.session = world, session
        self.parser = FrameParser()

    def send(self, command: str, body: bytes = b"", **headers: str) -> None:
        frame = encode(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)
        self.session.receive_data(frame, self.world.now)

    def frames(self) -> list[Frame]:
        """What the session has written so far, once scheduled work has run."""
        self.world.run_scheduled()
        return self.parser.feed(self.session.data_to_send(self.world.now))

    def produce(self, bodies: list[bytes]) -> None:
        for body in bodies:
            self.send("SEND", body, destination="/queue/curb")
        self.world.settle()
