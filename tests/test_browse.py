"""Browse (SUBSCRIBE browser:true): the frames a client gets, in memory over a real
LogCore, and the browse reader's exactly-once rule while compaction moves records and
SENDs, deliveries and ACKs go on."""

from __future__ import annotations

import random

import pytest
from memworld import MemPeer, MemWorld

from curb.access import permission_needed
from curb.frame import Frame
from curb.log import QueueFull, Record
from curb.log.browse import Browse
from curb.redelivery import Redelivery
from curb.render import BROWSE_END
from curb.single_queue import SingleQueue

# An instance's backend judges the destinations.
INSTANCE = SingleQueue()


def browse(peer: MemPeer, **headers: str) -> list[Frame]:
    peer.send("SUBSCRIBE", b"", id="b", destination="/queue/curb", browser="true", **headers)
    return peer.frames()


def ids(frames: list[Frame]) -> list[str]:
    return [f.headers["message-id"] for f in frames if f.command == "MESSAGE"]


@pytest.fixture
def world() -> MemWorld:
    return MemWorld()


@pytest.mark.parametrize(
    ("headers", "expected", "last"),
    [
        ({}, [str(i) for i in range(1, 11)], "10"),
        ({"curb_from_id": "3"}, [str(i) for i in range(3, 11)], "10"),
        ({"curb_to_id": "4"}, ["1", "2", "3", "4"], "4"),
        ({"curb_from_id": "3", "curb_to_id": "5"}, ["3", "4", "5"], "5"),
        ({"curb_from_id": "7", "curb_to_id": "7"}, ["7"], "7"),
        ({"curb_from_id": "0", "curb_to_id": "2"}, ["1", "2"], "2"),
        ({"curb_from_id": "11"}, [], "10"),
        ({"curb_from_id": str(1 << 62)}, [], "10"),  # Client.last_id: beyond every id there can be
        ({"curb_from_id": str((1 << 64) - 1)}, [], "10"),
        ({"curb_from_id": "6", "curb_to_id": "5"}, [], "5"),
        ({"curb_to_id": "99"}, [str(i) for i in range(1, 11)], "99"),
    ],
)
def test_browse_range(world: MemWorld, headers: dict[str, str], expected: list[str], last: str) -> None:
    peer = world.peer()
    peer.produce([b"body %d" % i for i in range(1, 11)])
    frames = browse(peer, **headers)
    assert ids(frames) == [*expected, BROWSE_END]
    end = frames[-1]
    assert end.headers["browser"] == "end"
    assert end.headers["curb-last-id"] == last
    assert end.headers["subscription"] == "b"
    assert end.body == b""
    for frame in frames[:-1]:
        assert frame.body == b"body %s" % frame.headers["message-id"].encode()
        assert frame.headers["subscription"] == "b"
        assert frame.headers["destination"] == "/queue/curb"
        assert "ack" not in frame.headers


def test_browse_keeps_producer_headers_and_changes_no_state(world: MemWorld) -> None:
    peer = world.peer()
    peer.send("SEND", b"x", destination="/queue/curb", color="blue")
    peer.produce([b"y"])
    before = world.broker.counts()
    frames = browse(peer)
    assert [f.headers.get("color") for f in frames] == ["blue", None, None]
    assert world.broker.counts() == before
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    got = consumer.frames()
    assert [(f.headers["message-id"], f.headers.get("redelivered")) for f in got] == [("1", None), ("2", None)]


def test_browse_sees_wip_and_requeued_but_not_acked(world: MemWorld) -> None:
    peer = world.peer()
    peer.produce([b"m%d" % i for i in range(1, 7)])
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual", prefetch_count="3")
    assert ids(consumer.frames()) == ["1", "2", "3"]
    consumer.send("ACK", id="1")
    consumer.send("NACK", id="2")
    world.settle()
    consumer.frames()
    assert ids(browse(peer)) == ["2", "3", "4", "5", "6", BROWSE_END]


def test_empty_queue_answers_only_the_end_marker(world: MemWorld) -> None:
    peer = world.peer()
    frames = browse(peer, receipt="r")
    assert [f.command for f in frames] == ["RECEIPT", "MESSAGE"]
    assert frames[1].headers["curb-last-id"] == "0"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("curb-from-id", "abc"),
        ("curb-from-id", "-1"),
        ("curb-to-id", "1.5"),
        ("curb-to-id", ""),
        ("curb-from-id", "٣"),
        ("curb-to-id", "9" * 5000),
        ("curb-from-id", str(1 << 64)),  # above the largest bound an id range may name
    ],
)
def test_bad_range_header_is_an_error_naming_it(world: MemWorld, header: str, value: str) -> None:
    peer = world.peer()
    peer.send("SUBSCRIBE", b"", id="b", browser="true", **{header.replace("-", "_"): value})
    [error] = peer.frames()
    assert error.command == "ERROR"
    assert header in error.headers["message"]
    assert peer.session.close_wanted == "close"


def test_same_id_while_running_is_an_error_and_reusable_after_the_end(world: MemWorld) -> None:
    peer = world.peer()
    peer.produce([b"a"])
    assert ids(browse(peer)) == ["1", BROWSE_END]
    assert ids(browse(peer)) == ["1", BROWSE_END]
    peer.send("SUBSCRIBE", id="b", browser="true")
    peer.send("SUBSCRIBE", id="b", browser="true")
    [error] = peer.frames()
    assert error.command == "ERROR"
    assert "still running" in error.headers["message"]


def test_browse_beside_a_normal_subscription_of_the_same_connection(world: MemWorld) -> None:
    peer = world.peer()
    peer.produce([b"a", b"b"])
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client")
    peer.send("SUBSCRIBE", id="b", destination="/queue/curb", browser="true")
    frames = peer.frames()
    by_sub = {sub: [f.headers["message-id"] for f in frames if f.headers["subscription"] == sub] for sub in "sb"}
    assert by_sub == {"s": ["1", "2"], "b": ["1", "2", BROWSE_END]}


def test_unsubscribe_stops_a_browse_early() -> None:
    world = MemWorld(cap=1 << 20)
    peer = world.peer()
    peer.produce([b"x" * 1000] * 600)
    peer.send("SUBSCRIBE", id="b", destination="/queue/curb", browser="true")
    peer.send("UNSUBSCRIBE", id="b", receipt="u")
    frames = peer.frames()
    assert [f.command for f in frames] == ["RECEIPT"]
    assert not world.log.browses.active  # the log no longer tells it of copies


def test_an_unsubscribe_that_crosses_the_end_marker_is_no_error(world: MemWorld) -> None:
    """The browse ended (its end marker on the wire) as the client, having seen enough,
    sent UNSUBSCRIBE: the client could not know, so it gets its RECEIPT, not an ERROR.
    Once: a second UNSUBSCRIBE of that id names nothing."""
    peer = world.peer()
    peer.produce([b"a"])
    assert ids(browse(peer)) == ["1", BROWSE_END]
    peer.send("UNSUBSCRIBE", id="b", receipt="u")
    assert [f.command for f in peer.frames()] == ["RECEIPT"]
    peer.send("UNSUBSCRIBE", id="b")
    [error] = peer.frames()
    assert error.command == "ERROR" and "no active subscription" in error.headers["message"]


def test_browse_streams_only_while_the_transport_takes_output() -> None:
    world = MemWorld(cap=1 << 20)
    peer = world.peer()
    peer.produce([b"x" * 1000] * 600)
    peer.send("SUBSCRIBE", id="b", destination="/queue/curb", browser="true")
    one_pass, world.later = world.later, []
    for callback in one_pass:
        callback()
    peer.session.set_writable(False)
    first = peer.frames()
    assert 0 < len(first) < 600  # one step's worth was made before the transport filled
    world.run_scheduled()
    assert peer.frames() == []
    peer.session.set_writable(True)
    rest = []
    while more := peer.frames():  # a step at a time: the session's output is bounded
        rest += more
    assert ids(first + rest) == [str(i) for i in range(1, 601)] + [BROWSE_END]


def test_browse_waits_for_accepted_messages_not_yet_written(world: MemWorld) -> None:
    log = world.log
    log.append(b"\na")
    log.flush()
    log.append(b"\nb")  # accepted (id 2), not yet written
    b = log.browse(1, log.last_id)
    step = b.step(1 << 20)
    assert ([m for m, _ in step.messages], step.done, step.waiting) == ([1], False, True)
    log.flush()
    step = b.step(1 << 20)
    assert ([m for m, _ in step.messages], step.done) == ([2], True)


def test_the_default_range_ends_at_the_last_message_on_disk(world: MemWorld) -> None:
    """A range planned from `curb-last-id` holds only fsynced messages, so a power loss
    cannot take back a message a reader has seen in it."""
    peer = world.peer()
    peer.produce([b"a", b"b"])
    peer.send("SEND", b"c", destination="/queue/curb")
    world.log.flush()  # id 3 is written, not yet synced
    frames = browse(peer)
    assert ids(frames) == ["1", "2", BROWSE_END]
    assert frames[-1].headers["curb-last-id"] == "2"
    world.log.sync()
    peer.send("SUBSCRIBE", b"", id="b2", destination="/queue/curb", browser="true", curb_from_id="3")
    assert [f.headers["message-id"] for f in peer.frames()] == ["3", BROWSE_END]


def test_messages_after_an_error_stop_the_browse(world: MemWorld) -> None:
    peer = world.peer()
    peer.produce([b"a"])
    peer.send("SUBSCRIBE", id="b", browser="true")
    peer.send("FROB")
    assert [f.command for f in peer.frames()] == ["ERROR"]
    assert not world.log.browses.active


def steps(log_browse: Browse) -> list[int]:
    got: list[int] = []
    while True:
        step = log_browse.step(1 << 20)
        got += [mid for mid, _ in step.messages]
        if step.done:
            return got


def test_a_browse_of_a_late_range_starts_at_a_mark_near_it() -> None:
    world = MemWorld(cap=1 << 20)
    log = world.log
    log.marks.spacing = 16 * 70  # about every 16th record
    for n in range(1, 2001):
        log.append(b"\n%d" % n)
        if n % 100 == 0:
            log.flush()
    world.settle()
    late = log.browse(1900, 1910)
    assert late.pos > log._cursor.tail()  # not a walk from the oldest message
    assert steps(late) == list(range(1900, 1911))
    assert steps(log.browse(1, 3)) == [1, 2, 3]


def test_marks_in_reused_space_are_not_trusted() -> None:
    world = MemWorld(cap=64 * 1024)
    log = world.log
    log.marks.spacing = 1
    for round_ in range(6):  # laps of the ring: old marks' bytes are overwritten
        for _ in range(200):
            log.append(b"\n" + b"r%d" % round_ * 20)
        world.settle()
        log.ack_upto(log.last_id - 50)
        world.settle()
    live = list(range(log.last_id - 49, log.last_id + 1))
    for first in (1, 100, 700, live[0], live[10]):
        assert steps(log.browse(first, log.last_id)) == [i for i in live if i >= first]


def test_marks_past_the_pad_that_ended_a_lap_are_not_trusted() -> None:
    """The end of a lap after its pad holds an older lap's records, intact and inside the
    live region's span: a browse must not start at a mark there, or it skips every live
    record from the tail to that pad."""
    world = MemWorld(cap=64 * 1024)
    log, ring = world.log, world.log._ring
    log.marks.spacing = 1

    def fill(upto: int, fill: bytes) -> None:
        while ring.head < upto:
            log.append(b"\n" + fill * 200)
            world.settle()

    fill(log.end - 2500, b"a")  # a first lap, all acked: its last records end the ring
    stale = log.last_id
    log.ack_upto(stale)
    world.settle()
    log.append(b"\n" + b"w" * 2400)  # the next lap, from the ring's start
    world.settle()
    assert ring.head < log.end // 2
    fill(log.end - 12000, b"b")
    log.ack_upto(log.last_id)
    world.settle()
    first_live = log.last_id + 1
    fill(log.end - 4000, b"c")
    log.append(b"\n" + b"d" * 4100)  # ends the lap early, before the first lap's last records
    world.settle()
    assert ring.head < log.end // 2
    assert steps(log.browse(stale, log.last_id)) == list(range(first_live, log.last_id + 1))


# ---------------------------------------------------------------- the reader under churn


def run_churn(seed: int) -> None:
    """A browse stepped in small budgets while messages are sent, taken, ACKed, NACKed
    and compaction copies held ones (a small cap): every message live from the browse's
    start to its end comes exactly once, nothing comes that was never live in range."""
    rng = random.Random(seed)
    world = MemWorld(cap=32 * 1024)
    log = world.log
    log.marks.spacing = rng.choice((1, 300, 1 << 40))  # browses start at marks, or at the tail
    live: dict[int, bytes] = {}
    held: list[Record] = []

    def send(n: int) -> None:
        for _ in range(n):
            body = b"%d:" % rng.randrange(10**6) + b"y" * rng.randrange(10, 400)
            try:
                rec = log.append(b"\n" + body)
            except QueueFull:
                return
            live[rec.id] = b"\n" + body
            if first <= rec.id <= last:
                ever_live.add(rec.id)
        log.flush()

    first, last = rng.randrange(1, 40), 40 + rng.choice([0, 5, -3])
    ever_live: set[int] = set()
    send(40)
    world.settle()
    sticky = [log.next_ready() for _ in range(rng.randrange(1, 4))]  # held all along: they pin the tail
    b = log.browse(first, last)
    at_start = {i for i in live if first <= i <= last}
    got: list[int] = []
    while True:
        step = b.step(rng.choice([1, 1, 1, 300]))
        for mid, payload in step.messages:
            assert payload == live.get(mid, payload), f"seed {seed}: message {mid} with another payload"
            got.append(mid)
        if step.done:
            break
        op = rng.random()
        if op < 0.4:
            send(rng.randrange(1, 9))
        elif op < 0.7:
            for _ in range(rng.randrange(1, 6)):
                rec = log.next_ready()
                if rec is None:
                    break
                if rng.random() < 0.85:
                    log.ack(rec)
                    live.pop(rec.id, None)
                else:
                    held.append(rec)
        elif op < 0.8 and held:
            rec = held.pop(rng.randrange(len(held)))
            log.ack(rec)
            live.pop(rec.id, None)
        elif op < 0.85 and held:
            rec = held.pop(rng.randrange(len(held)))
            log.requeue(rec)  # rdy again: it stays live where it is
        elif op < 0.87:
            upto = rng.randrange(0, log.last_id + 1)
            log.ack_upto(upto)
            for i in [i for i in live if i <= upto]:
                del live[i]
            held = [r for r in held if r.id > upto]
        world.now += rng.choice([0.0, 0.06, 0.2])
        log.flush()
        if rng.random() < 0.7:
            log.sync()
    assert all(r is not None for r in sticky)
    assert len(got) == len(set(got)), f"seed {seed}: browsed twice: {sorted(got)}"
    still = {i for i in at_start if i in live}
    assert still <= set(got), f"seed {seed}: live throughout but not browsed: {sorted(still - set(got))}"
    assert set(got) <= ever_live, f"seed {seed}: browsed what was never live in range"
    log.sync()


@pytest.mark.parametrize("seed", range(60))
def test_browse_exactly_once_under_churn(seed: int) -> None:
    run_churn(seed)


@pytest.mark.parametrize(
    ("command", "headers"),
    [
        ("SUBSCRIBE", {"id": "b", "destination": "/queue/curb", "browser": "true", "curb-from-id": "5"}),
        ("ACK", {"curb-upto": "5"}),
        ("ACK", {"curb-upto": "5", "receipt": "r"}),
    ],
)
def test_browse_and_ack_upto_need_the_consume_permission(command: str, headers: dict[str, str]) -> None:
    assert permission_needed(INSTANCE, Frame(command, headers, b"")) == "consume"


def test_a_delayed_message_is_browsed_with_its_due_time_and_a_ready_one_without(world: MemWorld) -> None:
    """A browse lists delayed messages among the others (in id order): each carries
    `curb-due` (ms since the epoch), so a reader such as the console can tell "due at"
    from "next", and one whose due time passed carries none."""
    peer = world.peer()
    peer.send("SEND", b"later", destination="/queue/curb", **{"curb-delay": "60000", "receipt": "r1"})
    peer.produce([b"now"])
    world.log.flush()
    frames = browse(peer)
    later, now = (f for f in frames if f.command == "MESSAGE" and f.headers["message-id"] != BROWSE_END)
    assert later.body == b"later" and int(later.headers["curb-due"]) >= world.clock.wall_ms() + 59_000
    assert now.body == b"now" and "curb-due" not in now.headers
    world.now += 61.0
    assert [f.headers.get("curb-due") for f in browse(peer) if f.command == "MESSAGE"] == [None, None, None]


def test_after_a_failed_write_no_browse_ends_and_nothing_is_delivered() -> None:
    """A NACKed message with a redelivery delay is copied into the parked index at the
    next flush; when that write fails, the log's memory names copies that are not on
    disk. A browse read then would miss both messages and still end, so once the log
    failed no browse is stepped and no message handed out: the connections close as
    the broker stops."""
    world = MemWorld(redelivery=Redelivery(delay_ms=60_000))
    peer = world.peer()
    peer.produce([b"m%d" % i for i in range(1, 4)])
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    assert ids(consumer.frames()) == ["1", "2", "3"]
    world.disk.write_eio = 1.0
    consumer.send("NACK", id="1")
    consumer.send("NACK", id="2")
    assert world.log.broken is not None
    assert browse(peer) == []
    late = world.peer()
    late.send("SUBSCRIBE", id="s", destination="/queue/curb")
    assert late.frames() == []
