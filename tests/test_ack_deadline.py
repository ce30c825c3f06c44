"""Ack deadlines through the session and the broker, in memory: a real LogCore on a
SimDisk, sessions without sockets, and a simulated clock whose timers fire when the test
moves it (tests/memworld.py). The queue's own tables are in tests/test_queue.py; the
real broker with stomp.py is in tests/test_ack_deadline_e2e.py."""

from __future__ import annotations

import pytest
from memworld import MemPeer, MemWorld

from curb.frame import Frame

QUEUE = "/queue/curb"


def at(world: MemWorld, now: float) -> None:
    """Move the clock to `now` and run what is due (timers, flushes)."""
    world.now = now
    world.run_scheduled()


def synced(world: MemWorld) -> None:
    """The log writes and syncs what it holds, with no time passing: receipts that wait
    for the frames before them to be on disk go out."""
    world.log.flush()
    world.log.sync()
    world.run_scheduled()


def consumer(world: MemWorld, sub_id: str = "s", prefetch: int = 10, **headers: str) -> MemPeer:
    peer = world.peer()
    peer.send(
        "SUBSCRIBE", b"", id=sub_id, destination=QUEUE, ack="client-individual", prefetch_count=str(prefetch), **headers
    )
    return peer


def messages(frames: list[Frame]) -> list[tuple[bytes, str | None, str | None]]:
    """(body, redelivered, curb-deliveries) of each MESSAGE."""
    return [(f.body, f.headers.get("redelivered"), f.headers.get("curb-deliveries")) for f in frames]


def receipts(frames: list[Frame]) -> list[tuple[str, str | None]]:
    """(receipt-id, curb-late) of each RECEIPT."""
    return [(f.headers["receipt-id"], f.headers.get("curb-late")) for f in frames if f.command == "RECEIPT"]


def held_past_deadline(world: MemWorld) -> tuple[MemPeer, MemPeer, dict[bytes, str]]:
    """A hung consumer got a and b at 0 and touched b; at 1.0 (the deadline) a went to
    the worker. Returns (hung, worker, ack id by body)."""
    world.peer().produce([b"a", b"b"])
    start = world.now
    hung = consumer(world, "h", prefetch=2)
    got = hung.frames()
    acks = {f.body: f.headers["ack"] for f in got}
    assert messages(got) == [(b"a", None, "1"), (b"b", None, "1")]
    hung.send("NACK", id=acks[b"b"], curb_touch="5000")
    worker = consumer(world, "w")
    assert worker.frames() == []
    at(world, start + 0.999)
    assert worker.frames() == []
    at(world, start + 1.0)
    assert messages(worker.frames()) == [(b"a", "true", "2")]
    return hung, worker, acks


def test_a_hung_consumers_message_goes_to_a_consumer_with_credit_and_nothing_else_changes():
    world = MemWorld(ack_timeout=1.0)
    hung, _, acks = held_past_deadline(world)
    assert hung.frames() == [] and hung.session.close_wanted is None
    hung.send("ACK", id=acks[b"b"], receipt="b-done")  # the touched one is still its to ACK
    world.settle()
    assert receipts(hung.frames()) == [("b-done", None)]
    assert world.broker.metrics.ack_timeouts == 1
    assert world.broker.counts() == {"rdy": 0, "wip": 1, "delayed": 0, "dead": 0, "subscriptions": 2}


@pytest.mark.parametrize(
    "command, headers",
    [("ACK", {}), ("NACK", {}), ("NACK", {"curb_touch": "60000"})],
)
@pytest.mark.parametrize("receipt", [True, False])
def test_a_late_ack_nack_or_touch_changes_nothing_and_keeps_the_connection(command, headers, receipt):
    world = MemWorld(ack_timeout=1.0)
    hung, worker, acks = held_past_deadline(world)
    extra = {"receipt": "late"} if receipt else {}
    hung.send(command, b"", id=acks[b"a"], **headers, **extra)
    world.settle()
    assert receipts(hung.frames()) == ([("late", "true")] if receipt else [])
    assert hung.session.close_wanted is None
    assert world.broker.metrics.late_acks == 1
    assert world.broker.counts()["wip"] == 2, "the worker still holds a, the hung consumer b"
    worker.send("ACK", id=acks[b"a"], receipt="a-done")  # the new holder's delivery is intact
    world.settle()
    assert receipts(worker.frames()) == [("a-done", None)]
    at(world, world.now + 10.0)
    again = hung.frames() + worker.frames()
    assert [f.body for f in again] == [b"b"], "a is acked for good; b came back at its touched deadline"


def test_touch_keeps_a_message_past_its_deadline_until_the_new_one():
    world = MemWorld(ack_timeout=1.0)
    world.peer().produce([b"job"])
    start = world.now
    holder = consumer(world, prefetch=1)
    [got] = holder.frames()
    at(world, start + 0.5)
    holder.send("NACK", id=got.headers["ack"], curb_touch="3000", receipt="touched")
    synced(world)
    assert receipts(holder.frames()) == [("touched", None)]
    worker = consumer(world, "w")
    at(world, start + 3.499)
    assert worker.frames() == [] and world.broker.metrics.ack_timeouts == 0
    at(world, start + 3.5)
    assert messages(worker.frames()) == [(b"job", "true", "2")]
    assert world.broker.metrics.nacked == 0, "a touch is not a NACK"


def test_an_expired_message_goes_back_in_the_log_as_a_nack_would_keeping_its_count():
    world = MemWorld(ack_timeout=1.0)
    world.peer().produce([b"job"])
    holder = consumer(world, prefetch=1)
    holder.frames()
    at(world, world.now + 1.0)
    world.settle()  # the returned record's state is written and synced
    again = world.crash().peer()
    again.send("SUBSCRIBE", id="s", destination=QUEUE, ack="client-individual")
    assert messages(again.frames()) == [(b"job", "true", "2")]


@pytest.mark.parametrize(
    "flag, header, deadline",
    [
        (1.0, None, 1.0),  # -ack-timeout
        (1.0, "250", 0.25),  # the subscription's own, shorter
        (1.0, "7200000", 7200.0),  # ... or longer
        (1.0, "0", None),  # ... or none
        (0.0, None, None),  # -ack-timeout 0
        (0.0, "250", 0.25),
    ],
)
def test_the_deadline_is_the_subscriptions_or_the_flags(flag, header, deadline):
    world = MemWorld(ack_timeout=flag)
    world.peer().produce([b"job"])
    start = world.now
    extra = {} if header is None else {"curb_ack_timeout": header}
    consumer(world, prefetch=1, **extra).frames()
    assert world.clock.armed == ([] if deadline is None else [pytest.approx(start + deadline)])
    at(world, start + 100_000.0)
    assert world.broker.metrics.ack_timeouts == (0 if deadline is None else 1)


def test_an_auto_subscription_has_no_deadline():
    world = MemWorld(ack_timeout=1.0)
    world.peer().produce([b"job"])
    peer = world.peer()
    peer.send("SUBSCRIBE", id="s", destination=QUEUE, curb_ack_timeout="5")
    assert messages(peer.frames()) == [(b"job", None, "1")]
    assert world.clock.armed == []


def test_an_unsubscribed_subscriptions_wip_still_has_its_deadline():
    world = MemWorld(ack_timeout=1.0)
    world.peer().produce([b"job"])
    start = world.now
    paused = consumer(world, prefetch=1)
    paused.frames()
    paused.send("UNSUBSCRIBE", id="s")
    worker = consumer(world, "w")
    at(world, start + 1.0)
    assert messages(worker.frames()) == [(b"job", "true", "2")]


def test_one_timer_is_armed_for_the_earliest_deadline_and_moved_only_sooner():
    world = MemWorld(ack_timeout=10.0)
    world.peer().produce([b"m%d" % n for n in range(300)])
    start = world.now
    consumers = [consumer(world, f"c{n}", prefetch=100) for n in range(3)]
    for peer in consumers:
        assert len(peer.frames()) == 100
    assert world.clock.armed == [pytest.approx(start + 10.0)]
    quick = world.peer()
    world.peer().produce([b"quick"])
    quick.send("SUBSCRIBE", id="q", destination=QUEUE, ack="client", curb_ack_timeout="500")
    [got] = quick.frames()
    assert world.clock.armed == [pytest.approx(world.now + 0.5)], "a sooner deadline re-arms the one timer"
    quick.send("NACK", id=got.headers["ack"], curb_touch="100")
    assert world.clock.armed == [pytest.approx(world.now + 0.1)]
    quick.send("NACK", id=got.headers["ack"], curb_touch="60000")
    assert world.clock.armed == [pytest.approx(world.now + 0.1)], "a later deadline leaves it (it fires early)"
    at(world, world.now + 0.1)
    assert world.broker.metrics.ack_timeouts == 0
    assert world.clock.armed == [pytest.approx(start + 10.0)]


@pytest.mark.parametrize(
    "header, value",
    [
        ("curb-ack-timeout", "soon"),
        ("curb-ack-timeout", "-1"),
        ("curb-ack-timeout", "1.5"),
        ("curb-ack-timeout", ""),
        ("curb-ack-timeout", "86400001"),
    ],
)
def test_a_bad_ack_timeout_header_is_an_error_that_states_the_bounds(header, value):
    world = MemWorld()
    peer = world.peer()
    peer.send(
        "SUBSCRIBE", b"", id="s", destination=QUEUE, ack="client", receipt="r", **{header.replace("-", "_"): value}
    )
    [error] = peer.frames()
    assert error.command == "ERROR" and error.headers["message"] == f"bad {header} header"
    assert error.headers["receipt-id"] == "r"
    assert b"from 0 (no deadline) to 86400000 (a day)" in error.body
    assert peer.session.close_wanted == "close"
    assert world.broker.counts()["subscriptions"] == 0


@pytest.mark.parametrize("value", ["0", "later", "-5", "86400001"])
def test_a_bad_touch_is_an_error_that_states_the_bounds_and_leaves_the_message_held(value):
    world = MemWorld(ack_timeout=1.0)
    world.peer().produce([b"job"])
    holder = consumer(world, prefetch=1)
    [got] = holder.frames()
    holder.send("NACK", id=got.headers["ack"], curb_touch=value)
    [error] = holder.frames()
    assert error.command == "ERROR" and error.headers["message"] == "bad curb-touch header"
    assert b"from 1 to 86400000 (a day)" in error.body
    assert b"from 0" not in error.body, "the body states one rule, the one that holds"
    assert world.broker.metrics.nacked == 0


def test_a_touch_of_a_message_never_held_is_the_error_of_an_unknown_id():
    world = MemWorld(ack_timeout=1.0)
    peer = consumer(world)
    peer.send("NACK", id="7", curb_touch="1000")
    [error] = peer.frames()
    assert error.command == "ERROR" and "not awaiting ACK or NACK" in error.headers["message"]


def test_expiries_and_late_acks_are_logged_at_most_once_per_interval():
    world = MemWorld(ack_timeout=1.0)
    lines: list[tuple[str, dict]] = []
    world.broker.refusals.events = lambda event, text, **fields: lines.append((event, fields))
    world.peer().produce([b"a", b"b", b"c"])
    holder = consumer(world, prefetch=1)
    for _ in range(3):  # each comes back to the holder and expires again, a second apart
        at(world, world.now + 1.0)
    at(world, world.now + 10.0)  # the next line is due: it counts what had no line
    expiries = [fields["count"] for event, fields in lines if event == "ack_timeout"]
    assert sum(expiries) == world.broker.metrics.ack_timeouts and expiries[0] == 1 and len(expiries) == 2
    assert holder.session.close_wanted is None


def test_a_touch_or_late_receipt_comes_once_the_frames_before_it_are_on_disk():
    """Like a plain NACK's RECEIPT: a SEND without receipt sent before it is on disk first."""
    world = MemWorld(ack_timeout=1.0)
    hung, _, acks = held_past_deadline(world)  # a went to the worker; b is touched
    hung.send("SEND", b"unreceipted", destination="/queue/curb")
    hung.send("NACK", id=acks[b"b"], curb_touch="5000", receipt="touched")
    hung.send("SEND", b"unreceipted too", destination="/queue/curb")
    hung.send("ACK", id=acks[b"a"], receipt="late")
    assert receipts(hung.frames()) == [], "the SENDs before them are not on disk yet"
    synced(world)
    assert receipts(hung.frames()) == [("touched", None), ("late", "true")]
