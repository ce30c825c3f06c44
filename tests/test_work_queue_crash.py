"""Delays, dead letters, redrives and delivery counts across a crash of the whole broker:
sessions over a real LogCore on a SimDisk (tests/memworld.py), crashed by kill -9 or by
a power loss after the RECEIPT, then restarted with the clock where it was. What a
RECEIPT covered must survive: a delayed message is neither lost nor delivered early, a
message NACKed past the delivery limit stays dead, a redrive stays done, and the count
the limit reads does not go down."""

from __future__ import annotations

import pytest
from memworld import MemPeer, MemWorld

from curb.frame import Frame, encode
from curb.redelivery import Redelivery

QUEUE = "/queue/curb"
MODES = ["kill", "power"]


def at(world: MemWorld, now: float) -> None:
    world.now = now
    world.run_scheduled()


def consumer(world: MemWorld, destination: str = QUEUE, sub_id: str = "s") -> MemPeer:
    peer = world.peer()
    peer.send("SUBSCRIBE", id=sub_id, destination=destination, ack="client-individual")
    return peer


def bodies(frames: list[Frame]) -> list[tuple[bytes, str | None]]:
    return [(f.body, f.headers.get("curb-deliveries")) for f in frames if f.command == "MESSAGE"]


def receipted(world: MemWorld, peer: MemPeer, command: str, headers: dict[str, str], body: bytes = b"") -> list[Frame]:
    """Send a frame with a receipt and wait for it: what it did is on disk. Returns the
    other frames that came meanwhile."""
    peer.session.receive_data(encode(command, {**headers, "receipt": "r"}, body), world.now)
    world.settle()
    frames = peer.frames()
    assert [f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"] == ["r"]
    return [f for f in frames if f.command != "RECEIPT"]


@pytest.mark.parametrize("mode", MODES)
def test_a_delayed_send_is_neither_lost_nor_early_after_a_crash(mode):
    world = MemWorld()
    receipted(world, world.peer(), "SEND", {"destination": QUEUE, "curb-delay": "5000"}, b"later")
    world = world.crash(mode)
    peer = consumer(world)
    assert peer.frames() == [] and world.broker.counts()["delayed"] == 1
    at(world, 4.999)
    assert peer.frames() == []
    at(world, 5.001)  # a delay counts from the clock's next millisecond
    assert bodies(peer.frames()) == [(b"later", "1")]


@pytest.mark.parametrize("mode", MODES)
def test_a_nack_with_a_delay_keeps_its_due_time_and_count_after_a_crash(mode):
    world = MemWorld()
    world.peer().produce([b"job"])
    peer = consumer(world)
    [job] = peer.frames()
    nacked = world.now
    receipted(world, peer, "NACK", {"id": job.headers["ack"], "curb-delay": "3000"})
    world = world.crash(mode)
    peer = consumer(world)
    at(world, nacked + 2.999)
    assert peer.frames() == []
    at(world, nacked + 3.002)  # counted from the next millisecond (and clear of float rounding)
    assert bodies(peer.frames()) == [(b"job", "2")]


@pytest.mark.parametrize("mode", MODES)
def test_a_dead_letter_stays_dead_and_a_redrive_stays_done_after_a_crash(mode):
    world = MemWorld(redelivery=Redelivery(delay_ms=0, max_deliveries=2))
    world.peer().produce([b"poison", b"next"])
    peer = world.peer()
    peer.send("SUBSCRIBE", id="s", destination=QUEUE, ack="client-individual", prefetch_count="1")
    [poison] = peer.frames()
    [poison] = receipted(world, peer, "NACK", {"id": poison.headers["ack"]})
    assert bodies(receipted(world, peer, "NACK", {"id": poison.headers["ack"]})) == [(b"next", "1")]
    world = world.crash(mode)
    assert world.broker.counts()["dead"] == 1
    reader = consumer(world, "./dead", "d")
    [dead] = reader.frames()
    assert (dead.body, dead.headers["curb-dead-reason"], dead.headers["curb-deliveries"]) == (
        b"poison",
        "max-deliveries",
        "2",
    )
    reader.send("NACK", id=dead.headers["ack"])  # it stays dead: a dead letter's NACK changes nothing
    assert bodies(reader.frames()) == [(b"poison", "2")]
    reader.session.connection_lost()  # a reader's dead letters are not redriven while it holds them
    world.broker.gone(reader.session)
    receipted(world, world.peer(), "SEND", {"destination": "./redrive"})
    world = world.crash(mode)
    assert world.broker.counts()["dead"] == 0
    worker = consumer(world)
    # "next" was in flight at the first crash: that delivery is what a crash may lose.
    assert sorted(bodies(worker.frames())) == [(b"next", "1"), (b"poison", "1")]


@pytest.mark.parametrize("mode", MODES)
def test_the_delivery_limit_counts_deliveries_before_a_crash(mode):
    world = MemWorld(redelivery=Redelivery(delay_ms=0, max_deliveries=3))
    world.peer().produce([b"job"])
    for _ in range(2):  # two consumers crash on it
        peer = consumer(world)
        assert len(peer.frames()) == 1
        peer.session.connection_lost()
        world.broker.gone(peer.session)
        world.settle()
    world = world.crash(mode)
    peer = consumer(world)
    [job] = peer.frames()
    assert job.headers["curb-deliveries"] == "3"
    receipted(world, peer, "NACK", {"id": job.headers["ack"]})
    assert world.broker.counts()["dead"] == 1


def test_a_message_at_the_limit_when_the_broker_stopped_is_dead_not_delivered_again():
    """Shutdown puts wip back without the limit; the next delivery attempt finds the count
    (kept on disk) at the limit and dead-letters it instead."""
    world = MemWorld(redelivery=Redelivery(delay_ms=0, max_deliveries=2))
    world.peer().produce([b"job"])
    peer = consumer(world)
    [job] = peer.frames()
    receipted(world, peer, "NACK", {"id": job.headers["ack"]})  # back after delivery 1; delivery 2 follows
    world.broker.stop_delivering()  # delivery 2 comes back at shutdown: rdy, not dead
    world.settle()
    world = world.crash("kill")
    worker = consumer(world)
    assert worker.frames() == []
    assert world.broker.counts()["dead"] == 1
