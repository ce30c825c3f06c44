"""curb.driver with a recording Link instead of a socket: whole frames for a framed link
(WebSocket's shape), writes only while the link is not paused, a graceful finish after an
ERROR, and heart-beats from the driver's own timer."""

from __future__ import annotations

import asyncio
import dataclasses

from memworld import MemWorld

from curb.driver import Driver
from curb.frame import FrameParser, encode
from curb.render import VIEW_BODY

CONNECT = encode("CONNECT", {"accept-version": "1.2"})
SUBSCRIBE = encode("SUBSCRIBE", {"id": "s", "destination": "/queue/q", "ack": "client-individual"})


class RecordingLink:
    """A Link that keeps every write; `room` writes fit before it pauses the driver."""

    def __init__(self, room: int = 1_000_000) -> None:
        self.driver: Driver
        self.writes: list[bytes] = []
        self.room = room
        self.reading = True
        self.finished = self.aborted = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        if len(self.writes) >= self.room:
            self.driver.pause_writing()

    def drain(self) -> None:
        self.room = len(self.writes) + 1
        self.driver.resume_writing()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def finish(self) -> None:
        self.finished = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.finished or self.aborted


def queue(world: MemWorld, bodies: list[bytes]) -> None:
    for body in bodies:
        world.broker.accept({}, body)
    world.settle()


def drive(world: MemWorld, link: RecordingLink, framed: bool) -> Driver:
    link.driver = Driver(world.broker, link, "127.0.0.1:1", framed=framed)
    return link.driver


def test_a_framed_link_gets_one_whole_frame_per_write_however_large_its_body():
    bodies = [b"a" * (VIEW_BODY + 10), b"small", b"b" * (VIEW_BODY * 2)]

    async def run() -> list[bytes]:
        world = MemWorld(cap=4 << 20)
        queue(world, bodies)
        link = RecordingLink()
        driver = drive(world, link, framed=True)
        driver.received(CONNECT + SUBSCRIBE)
        world.run_scheduled()
        return link.writes

    writes = asyncio.run(run())
    frames = [FrameParser(max_frame_bytes=1 << 20).feed(write) for write in writes]
    assert [[f.command for f in one] for one in frames] == [["CONNECTED"], ["MESSAGE"], ["MESSAGE"], ["MESSAGE"]]
    assert [one[0].body for one in frames[1:]] == bodies


def test_an_unframed_link_gets_small_frames_joined():
    async def run() -> list[bytes]:
        world = MemWorld()
        queue(world, [b"one", b"two", b"three"])
        link = RecordingLink()
        drive(world, link, framed=False).received(CONNECT + SUBSCRIBE)
        world.run_scheduled()
        return link.writes

    writes = asyncio.run(run())
    assert len(writes) == 1 and writes[0].count(b"MESSAGE\n") == 3


def test_nothing_is_written_to_a_paused_link_until_it_resumes():
    async def run() -> tuple[int, int, int]:
        world = MemWorld(cap=4 << 20)
        queue(world, [b"m%d" % i for i in range(5)])
        link = RecordingLink(room=2)
        driver = drive(world, link, framed=True)
        driver.received(CONNECT + SUBSCRIBE)
        world.run_scheduled()
        paused = len(link.writes)
        world.run_scheduled()
        still = len(link.writes)
        link.room = 100
        driver.resume_writing()
        world.run_scheduled()
        return paused, still, len(link.writes)

    assert asyncio.run(run()) == (2, 2, 6)


def test_after_an_error_the_link_finishes_gracefully_and_gets_nothing_more():
    async def run() -> RecordingLink:
        world = MemWorld()
        link = RecordingLink()
        driver = drive(world, link, framed=True)
        driver.received(CONNECT + b"FROB\n\n\0")
        world.run_scheduled()
        driver.received(encode("SEND", {"destination": "/q", "receipt": "r"}, b"late"))
        world.run_scheduled()
        return link

    link = asyncio.run(run())
    assert [w.split(b"\n", 1)[0] for w in link.writes] == [b"CONNECTED", b"ERROR"]
    assert link.finished and not link.aborted


def test_the_driver_sends_heart_beats_as_frames_of_their_own():
    async def run() -> list[bytes]:
        world = MemWorld()
        world.broker.config = dataclasses.replace(world.broker.config, heartbeat_ms=50)
        link = RecordingLink()
        driver = drive(world, link, framed=True)
        driver.received(encode("CONNECT", {"accept-version": "1.2", "heart-beat": "0,50"}))
        world.run_scheduled()
        await asyncio.sleep(0.2)
        world.run_scheduled()
        driver.lost()
        return link.writes

    writes = asyncio.run(run())
    assert writes[0].startswith(b"CONNECTED") and writes[1:] and set(writes[1:]) == {b"\n"}
