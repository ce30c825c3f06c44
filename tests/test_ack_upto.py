"""ACK curb-upto:<n>: the frames and the durable watermark, in memory over a real LogCore
on a SimDisk (crashes included)."""

from __future__ import annotations

import random

import pytest
from memworld import MemPeer, MemWorld
from simdisk import SimDisk

from curb.frame import Frame
from curb.log import LogCore, QueueFull
from curb.log import record as fmt
from curb.redelivery import Redelivery
from curb.render import BROWSE_END


def ids(frames: list[Frame]) -> list[str]:
    return [f.headers["message-id"] for f in frames if f.command == "MESSAGE"]


def browsed(peer: MemPeer) -> list[str]:
    peer.send("SUBSCRIBE", id="b", destination="/queue/curb", browser="true")
    got = ids(peer.frames())
    assert got[-1] == BROWSE_END
    return got[:-1]


def world_with(n: int, cap: int = 256 * 1024, seed: int = 3) -> tuple[MemWorld, MemPeer]:
    world = MemWorld(cap, SimDisk(random.Random(seed)))
    peer = world.peer()
    peer.produce([b"m%d" % i for i in range(1, n + 1)])
    return world, peer


def test_upto_acks_never_delivered_messages_and_counts_follow() -> None:
    world, peer = world_with(10)
    before = world.log.live_bytes
    peer.send("ACK", curb_upto="4", receipt="u")
    assert world.broker.counts()["rdy"] == 6
    assert world.log.unread == 6
    assert world.log.live_bytes < before
    world.settle()
    assert [f.headers.get("receipt-id") for f in peer.frames()] == ["u"]
    assert browsed(peer) == ["5", "6", "7", "8", "9", "10"]
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb")
    assert ids(consumer.frames()) == ["5", "6", "7", "8", "9", "10"]


def test_upto_acks_wip_on_every_connection_and_the_holders_ack_is_an_unknown_id() -> None:
    world, peer = world_with(6)
    a, b = world.peer(), world.peer()
    a.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual", prefetch_count="2")
    b.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client", prefetch_count="2")
    held = {"a": ids(a.frames()), "b": ids(b.frames())}
    assert sorted(held["a"] + held["b"]) == ["1", "2", "3", "4"]
    peer.send("ACK", curb_upto="3")
    world.settle()
    assert world.broker.counts()["wip"] == 1 + 2  # id 4 held, and 5 and 6 delivered on freed credit
    holder_of_1 = a if "1" in held["a"] else b
    holder_of_1.send("ACK", id="1")
    [error] = holder_of_1.frames()[-1:]
    assert error.command == "ERROR"
    assert error.headers["message"] == "message 1 is not awaiting ACK or NACK on this connection"


def test_upto_removes_messages_waiting_for_redelivery() -> None:
    world, peer = world_with(4)
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual", prefetch_count="1")
    assert ids(consumer.frames()) == ["1"]
    consumer.send("UNSUBSCRIBE", id="s")
    consumer.send("NACK", id="1")  # rdy again, in the redelivery list
    assert world.broker.queue.redeliver_count == 1
    peer.send("ACK", curb_upto="2")
    assert world.broker.queue.redeliver_count == 0
    assert world.broker.counts() == {"rdy": 2, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("11", "above the highest message id so far (10)"),
        ("x", "bad curb-upto"),
        ("-1", "bad curb-upto"),
        ("", "bad curb-upto"),
        ("1" * 5000, "bad curb-upto"),  # more digits than int() converts: an ERROR, not a crash
    ],
)
def test_bad_upto_is_an_error(value: str, words: str) -> None:
    world, peer = world_with(10)
    peer.send("ACK", curb_upto=value, receipt="u")
    [error] = peer.frames()
    assert error.command == "ERROR"
    assert words in error.headers["message"]
    assert error.headers["receipt-id"] == "u"
    assert world.log.acked_upto == 0


def test_receipt_waits_for_the_checkpoint_and_keeps_frame_order() -> None:
    world, peer = world_with(5)
    peer.send("ACK", curb_upto="2", receipt="u")
    peer.send("SUBSCRIBE", id="c", destination="./count", receipt="after")
    assert [f.command for f in peer.frames()] == ["MESSAGE"]  # counts; the receipt waits behind the ACK's
    world.log.flush()
    world.log.sync()  # the checkpoint carrying the watermark is written now, synced next
    world.log.flush()
    world.log.sync()
    world.run_scheduled()
    assert [f.headers.get("receipt-id") for f in peer.frames() if f.command == "RECEIPT"] == ["u", "after"]
    assert world.log._checkpoints.durable.acked_upto == 2


def test_upto_zero_and_repeats_are_harmless_and_the_watermark_never_goes_down() -> None:
    world, peer = world_with(5)
    for value in ("3", "0", "2", "3"):
        peer.send("ACK", curb_upto=value, receipt=value)
    world.settle()
    assert [f.headers["receipt-id"] for f in peer.frames()] == ["3", "0", "2", "3"]
    assert world.log.acked_upto == 3
    assert browsed(peer) == ["4", "5"]


# ---------------------------------------------------------------- durability


@pytest.mark.parametrize("mode", ["kill", "power"])
def test_receipted_upto_survives_a_crash_and_ids_go_on(mode: str) -> None:
    world, peer = world_with(8)
    peer.send("ACK", curb_upto="8", receipt="u")
    world.settle()
    assert [f.headers.get("receipt-id") for f in peer.frames()] == ["u"]
    after = world.crash(mode)
    assert after.log.acked_upto == 8
    assert after.log.unread == 0 and after.log.live_bytes == 0
    assert after.log.next_ready() is None
    again = after.peer()
    assert browsed(again) == []
    again.produce([b"new"])
    assert after.log.last_id > 8  # never reused, also with every message gone


def crash_during_upto(cut: int, mode: str, seed: int) -> str:
    """Crash (kill or power) after `cut` disk calls of an ACK's way to its receipt: the
    watermark after restart is the old or the new one, the new one once the receipt
    left, and never lower than a watermark that was receipted before. Returns what
    happened."""
    world, peer = world_with(12, seed=seed)
    peer.send("ACK", curb_upto="3", receipt="first")
    world.settle()
    assert [f.headers["receipt-id"] for f in peer.frames()] == ["first"]
    world.disk.arm_crash(cut)
    answered: list[str | None] = []
    try:
        world.log.ack_upto(9, answered.append)
        for _ in range(4):
            world.log.flush()
            world.log.sync()
    except BaseException as err:  # simdisk.Crashed
        assert type(err).__name__ == "Crashed"
    after = LogCore(world.disk.crash(mode), world.cap)
    assert after.acked_upto in (3, 9)
    if answered == [None]:
        assert after.acked_upto == 9
    assert after.last_id >= 12
    seen = []
    while (rec := after.next_ready()) is not None:
        seen.append(rec.id)
    assert seen == list(range(after.acked_upto + 1, 13))
    return f"receipted {answered == [None]}, watermark {after.acked_upto}"


def test_upto_at_any_crash_point_is_all_or_nothing_and_never_undone() -> None:
    outcomes = {
        crash_during_upto(cut, mode, seed) for cut in range(10) for mode in ("kill", "power") for seed in range(4)
    }
    assert outcomes == {"receipted False, watermark 3", "receipted False, watermark 9", "receipted True, watermark 9"}


@pytest.mark.parametrize("mode", ["kill", "power"])
@pytest.mark.parametrize("seed", range(6))
def test_ids_are_never_reused_after_a_crash_lost_them(mode: str, seed: int) -> None:
    """Messages written (or only accepted) after the last checkpoint, some of them
    delivered and so seen by a client, then a crash: the ids after restart are above
    every id assigned before, even when the crash lost those messages."""
    disk = SimDisk(random.Random(seed))
    log = LogCore(disk, 64 * 1024, clock=lambda: 0.0)
    for _ in range(5):
        log.append(b"\nkept")
    log.flush()
    log.sync()
    for _ in range(5):
        log.append(b"\nwritten, not synced")
    log.flush()
    assert log.next_ready() is not None  # a client saw id 1 at least
    log.append(b"\naccepted, not written")
    seen = log.last_id
    after = LogCore(disk.crash(mode), 64 * 1024, clock=lambda: 0.0)
    assert after.append(b"\nnew").id > seen


def test_ids_go_on_without_a_gap_after_a_clean_stop() -> None:
    disk = SimDisk(random.Random(1))
    log = LogCore(disk, 64 * 1024)
    for _ in range(3):
        log.append(b"\nm")
    log.final_checkpoint()
    after = LogCore(disk.crash("power"), 64 * 1024)
    assert after.append(b"\nnext").id == 4


def test_using_up_the_reserved_ids_refuses_for_a_moment_and_never_wedges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("curb.log.recovery.ID_RESERVE", 4)  # start-up's reservation
    monkeypatch.setattr("curb.log.core.ID_RESERVE", 4)  # and every checkpoint's after it
    now = [0.0]
    log = LogCore(SimDisk(random.Random(1)), 64 * 1024, clock=lambda: now[0])
    accepted = refused = 0
    for _ in range(40):
        try:
            log.append(b"\nm")
            accepted += 1
        except QueueFull as err:
            assert "retry" in str(err)
            refused += 1
            log.flush()  # what the driver's scheduled flush does: a checkpoint at once
            log.sync()
    assert refused > 0 and accepted > 20
    assert log.last_id < log._checkpoints.id_limit


def test_checkpoint_slots_of_the_older_layout_still_recover() -> None:
    old = fmt.Checkpoint(5, fmt.RING_START, fmt.RING_START, 42, 7)
    body = b"ckpt %016x %016x %016x %016x %016x" % (5, fmt.RING_START, fmt.RING_START, 42, 7)
    line = body + b" %08x\n" % __import__("zlib").crc32(body)
    assert fmt.Checkpoint.decode(line) == old
    assert old.acked_upto == 0
    header = bytearray(fmt.initial_header(64 * 1024))
    header[fmt.SLOT_OFFSETS[1] : fmt.SLOT_OFFSETS[1] + len(line)] = line
    disk = SimDisk(random.Random(1), image=bytes(header))
    log = LogCore(disk, 64 * 1024)
    assert (log.last_id, log.acked_upto) == (41, 0)
    assert fmt.Checkpoint.decode(fmt.Checkpoint(6, 512, 512, 3, 4, 2).encode()) == fmt.Checkpoint(6, 512, 512, 3, 4, 2)


def test_upto_finishes_dead_letters_and_delayed_messages_too() -> None:
    world, peer = world_with(3)
    peer.send("SEND", b"later", destination="/queue/curb", curb_delay="60000")
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    world.broker.returns.redelivery = Redelivery(delay_ms=0, max_deliveries=1)  # the first NACK makes a dead letter
    for frame in consumer.frames():
        consumer.send("NACK", id=frame.headers["ack"])
    assert world.broker.counts()["dead"] == 3 and world.broker.counts()["delayed"] == 1
    peer.send("ACK", curb_upto="4", receipt="u")
    world.settle()
    assert world.broker.counts() == {"rdy": 0, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 1}
    reader = world.peer()
    reader.send("SUBSCRIBE", id="d", destination="./dead", ack="client-individual")
    assert reader.frames() == []
