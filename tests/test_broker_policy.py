"""The broker's one policy point and the work-queue frames, in memory: sessions over a
Broker over the fake log (tests/test_session_rules.py's, which keeps delayed messages
and dead letters as the log's API does) and a simulated clock. Where a message that
came back goes (at once, after the asked delay, after the default backoff, dead past
the delivery limit) for every way back; delayed SENDs; expiry; ./dead and ./redrive;
the counts. The real broker with stomp.py: tests/test_work_queue_e2e.py."""

from __future__ import annotations

import json
import math

import pytest
from simclock import WALL_START_MS
from test_session_rules import Peer, World

from curb.frame import Frame, encode
from curb.redelivery import Redelivery

QUEUE = "/queue/curb"


def at(world: World, now: float) -> None:
    """The clock moves to `now`; due timers and scheduled work run."""
    world.clock.now = now
    world.run_scheduled()


def consumer(world: World, sub_id: str = "s", destination: str = QUEUE, prefetch: int = 10, **headers: str) -> Peer:
    peer = world.session()
    peer.connect()
    subscribe = {"id": sub_id, "destination": destination, "ack": "client-individual", "prefetch-count": str(prefetch)}
    peer.feed(encode("SUBSCRIBE", {**subscribe, **headers}))
    return peer


def producer(world: World, *bodies: bytes, **headers: str) -> Peer:
    """SENDs of `bodies`; header names as given (AMQ_SCHEDULED_DELAY keeps its underscores)."""
    peer = world.session()
    peer.connect()
    for body in bodies:
        peer.feed(encode("SEND", {"destination": QUEUE, **headers}, body))
    return peer


def got(peer: Peer) -> list[tuple[bytes, str | None, str | None]]:
    """(body, curb-deliveries, curb-dead-reason) of each MESSAGE."""
    return [
        (f.body, f.headers.get("curb-deliveries"), f.headers.get("curb-dead-reason"))
        for f in peer.frames()
        if f.command == "MESSAGE"
    ]


def one(peer: Peer) -> Frame:
    [frame] = peer.frames()
    assert frame.command == "MESSAGE", frame
    return frame


# ---------------------------------------------------------------- where a returning message goes

# (policy, NACK headers, seconds after the NACK) -> redelivered by then?
DELAYS = {
    "default: not at once": (Redelivery(), {}, 0.999, False),
    "default: a second": (Redelivery(), {}, 1.001, True),
    "-redelivery-delay 0: at once": (Redelivery(delay_ms=0), {}, 0.0, True),
    "asked delay: not a millisecond early": (Redelivery(), {"curb-delay": "1500"}, 1.499, False),
    "asked delay: within a millisecond": (Redelivery(), {"curb-delay": "1500"}, 1.501, True),
    "asked 0 overrides the policy": (Redelivery(delay_ms=5000), {"curb-delay": "0"}, 0.0, True),
    "policy delay: early": (Redelivery(delay_ms=2000), {}, 1.999, False),
    "policy delay: within a millisecond": (Redelivery(delay_ms=2000), {}, 2.001, True),
}


@pytest.mark.parametrize("name", list(DELAYS))
def test_a_nacked_message_comes_back_after_the_asked_or_default_delay(name):
    policy, headers, after, back = DELAYS[name]
    world = World(redelivery=policy)
    producer(world, b"job")
    peer = consumer(world)
    first = one(peer)
    peer.feed(encode("NACK", {"id": first.headers["ack"], **headers}))
    if after:
        assert peer.frames() == []
    at(world, after)
    assert got(peer) == ([(b"job", "2", None)] if back else [])


def test_the_default_delay_grows_with_each_delivery_up_to_its_maximum():
    world = World(redelivery=Redelivery(delay_ms=100, multiplier=3, max_delay_ms=500, max_deliveries=0))
    producer(world, b"job")
    peer = consumer(world)
    waits = []
    now = 0.0
    for _ in range(4):
        frame = one(peer)
        peer.send("NACK", id=frame.headers["ack"])
        due = world.log.next_due()
        assert due is not None
        waits.append(due - world.log.wall_ms())
        now = (due - WALL_START_MS) / 1000
        at(world, now)
    assert waits == [101, 301, 501, 501], "each counted from the clock's next millisecond"
    assert world.broker.metrics.delayed_requeues == 4


def sub_millisecond_world(**options) -> World:
    """A World whose wall clock reads whole milliseconds rounded down, as the log's does
    (time.time_ns() // 1_000_000): the true time runs ahead of a reading by up to a
    millisecond. At true time 0 a message is sent 3 s delayed, and at 0.8 ms the clock
    is left, still reading 0: the earlier message's due timer comes first."""
    world = World(**options)
    clock = world.clock
    clock.wall_ms = lambda: WALL_START_MS + math.floor(clock.now * 1_000_000) // 1000  # type: ignore[method-assign]
    producer(world, b"earlier", **{"curb-delay": "3000"})
    clock.now = 0.0008
    return world


def send_delayed(world: World, header: str, value: str) -> Peer:
    producer(world, b"job", **{header: value})
    return consumer(world)


def nack_delayed(world: World, header: str, value: str) -> Peer:
    producer(world, b"job")
    peer = consumer(world)
    asked = {header: value} if header else {}
    peer.feed(encode("NACK", {"id": one(peer).headers["ack"], **asked}))
    return peer


# how the message is delayed by 3 s from true time 0.8 ms -> (the step, its header and value, policy)
NEVER_EARLY = {
    "SEND curb-delay": (send_delayed, "curb-delay", "3000", Redelivery()),
    "SEND AMQ_SCHEDULED_DELAY": (send_delayed, "AMQ_SCHEDULED_DELAY", "3000", Redelivery()),
    "SEND AMQ_SCHEDULED_TIME": (send_delayed, "AMQ_SCHEDULED_TIME", str(WALL_START_MS + 3001), Redelivery()),
    "NACK curb-delay": (nack_delayed, "curb-delay", "3000", Redelivery()),
    "redelivery backoff": (nack_delayed, "", "", Redelivery(delay_ms=3000)),
}


@pytest.mark.parametrize("name", list(NEVER_EARLY))
def test_a_due_time_is_never_early_even_by_a_fraction_of_a_millisecond(name):
    step, header, value, policy = NEVER_EARLY[name]
    world = sub_millisecond_world(redelivery=policy)
    peer = step(world, header, value)
    at(world, 3.0006)  # 0.2 ms before the true due time; the clock reads its millisecond
    arrived = [body for body, _, _ in got(peer)]
    assert b"job" not in arrived, "delivered before its due time"
    at(world, 3.0018)  # at most a millisecond late
    assert b"job" in arrived + [body for body, _, _ in got(peer)]


def nack(world: World, peer: Peer) -> None:
    peer.send("NACK", id=one(peer).headers["ack"])


def disconnect(world: World, peer: Peer) -> None:
    one(peer)
    peer.send("DISCONNECT")
    world.broker.gone(peer.session)


def connection_lost(world: World, peer: Peer) -> None:
    one(peer)
    peer.session.connection_lost()
    world.broker.gone(peer.session)


def deadline(world: World, peer: Peer) -> None:
    one(peer)
    at(world, world.clock.now + 1.0)


WAYS_BACK = {"NACK": nack, "DISCONNECT": disconnect, "crash": connection_lost, "ack deadline": deadline}


@pytest.mark.parametrize("way", list(WAYS_BACK))
def test_a_message_delivered_the_limit_times_that_comes_back_once_more_is_dead_whatever_brought_it(way):
    world = World(redelivery=Redelivery(delay_ms=0, max_deliveries=3), ack_timeout=1.0)
    producer(world, b"poison", b"next")
    stays = way in ("NACK", "ack deadline")  # the message comes back to the same consumer
    peer = consumer(world, prefetch=1, **{"curb-ack-timeout": "1000"})
    for n in range(3):
        if n and not stays:
            peer = consumer(world, prefetch=1, **{"curb-ack-timeout": "1000"})
        WAYS_BACK[way](world, peer)
        assert world.broker.counts()["dead"] == (1 if n == 2 else 0)
    assert world.broker.metrics.dead_lettered["max-deliveries"] == 1
    rest = got(peer) if stays else got(consumer(world))
    assert rest == [(b"next", "1", None)], "the poison message no longer blocks the queue"
    reader = consumer(world, "d", destination="./dead")
    assert got(reader) == [(b"poison", "3", "max-deliveries")]


def test_shutdown_puts_wip_back_at_once_and_never_counts_against_the_limit():
    world = World(redelivery=Redelivery(delay_ms=5000, max_deliveries=1))
    producer(world, b"job")
    peer = consumer(world)
    one(peer)
    world.broker.stop_delivering()
    assert world.broker.counts()["dead"] == 0 and world.log.delayed == 0
    assert world.log.requeued == [1] and world.broker.counts()["rdy"] == 1


def test_no_limit_means_never_dead():
    world = World(redelivery=Redelivery(delay_ms=0, max_deliveries=0))
    producer(world, b"job")
    peer = consumer(world)
    for _ in range(50):
        nack(world, peer)
    assert got(peer) == [(b"job", "51", None)]
    assert world.broker.counts()["dead"] == 0


# ---------------------------------------------------------------- delayed SEND


@pytest.mark.parametrize(
    "headers",
    [
        {"curb-delay": "2000"},
        {"AMQ_SCHEDULED_DELAY": "2000"},
        {"AMQ_SCHEDULED_TIME": str(WALL_START_MS + 2000)},
    ],
    ids=["curb-delay", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME"],
)
def test_a_delayed_send_is_delivered_when_due_and_not_before(headers):
    world = World()
    peer = consumer(world)
    producer(world, b"later", **headers)
    producer(world, b"now")
    assert got(peer) == [(b"now", "1", None)]
    assert world.broker.counts()["delayed"] == 1
    at(world, 1.999)
    assert got(peer) == []
    at(world, 2.001)  # a delay counts from the clock's next millisecond
    assert got(peer) == [(b"later", "1", None)]
    assert world.broker.counts()["delayed"] == 0


def test_a_scheduled_time_in_the_past_is_delivered_at_once():
    world = World()
    peer = consumer(world)
    producer(world, b"late", AMQ_SCHEDULED_TIME=str(WALL_START_MS - 10))
    assert got(peer) == [(b"late", "1", None)]


# ---------------------------------------------------------------- expiry


@pytest.mark.parametrize("drop", [False, True])
def test_an_expired_message_is_never_delivered_and_is_dead_or_dropped(drop):
    world = World(drop_expired=drop)
    producer(world, b"stale", **{"curb-ttl": "1000"})
    producer(world, b"gone", expires=str(WALL_START_MS - 1))
    producer(world, b"never", expires="0")
    producer(world, b"fresh", **{"curb-ttl": "60000"})
    at(world, 1.0)
    peer = consumer(world)
    assert got(peer) == [(b"never", "1", None), (b"fresh", "1", None)]
    assert world.broker.metrics.expired == 2
    if drop:
        assert world.log.acked == [1, 2] and world.broker.counts()["dead"] == 0
    else:
        assert world.broker.metrics.dead_lettered["expired"] == 2
        reader = consumer(world, "d", destination="./dead")
        assert got(reader) == [(b"stale", "0", "expired"), (b"gone", "0", "expired")]


def test_a_message_that_expires_while_held_is_not_delivered_again():
    world = World()
    producer(world, b"job", **{"curb-ttl": "1000"})
    peer = consumer(world)
    frame = one(peer)
    at(world, 1.0)
    peer.send("NACK", id=frame.headers["ack"])
    assert got(peer) == []
    assert world.broker.counts()["dead"] == 1


# ---------------------------------------------------------------- ./dead and ./redrive


def dead_world(count: int = 3, **options) -> World:
    """`count` messages, each NACKed once past a delivery limit of 1."""
    world = World(redelivery=Redelivery(delay_ms=0, max_deliveries=1), **options)
    producer(world, *(b"m%d" % n for n in range(count)))
    peer = consumer(world, prefetch=count)
    for frame in peer.frames():
        peer.send("NACK", id=frame.headers["ack"])
    peer.session.connection_lost()
    world.broker.gone(peer.session)
    assert world.broker.counts()["dead"] == count
    return world


def test_dead_letters_are_read_as_a_queue_ack_deletes_nack_keeps():
    world = dead_world(2)
    reader = consumer(world, "d", destination="./dead", prefetch=1)
    first = one(reader)
    assert (first.body, first.headers["curb-dead-reason"]) == (b"m0", "max-deliveries")
    reader.send("NACK", id=first.headers["ack"])
    again = one(reader)
    assert again.body == b"m0", "a NACKed dead letter stays dead and comes first"
    reader.send("ACK", id=again.headers["ack"])
    assert got(reader) == [(b"m1", "1", "max-deliveries")]
    assert world.log.acked == [1] and world.broker.metrics.dead_acked == 1
    assert world.broker.counts()["dead"] == 1


def test_a_dead_letter_held_by_a_reader_that_goes_is_dead_again():
    world = dead_world(1)
    reader = consumer(world, "d", destination="./dead")
    one(reader)
    world.broker.gone(reader.session)
    assert world.broker.counts()["dead"] == 1 and world.broker.counts()["dead"] == 1
    assert got(consumer(world, "d", destination="./dead")) == [(b"m0", "1", "max-deliveries")]


def test_a_browse_of_dead_letters_changes_nothing():
    world = dead_world(2)
    peer = world.session()
    peer.connect()
    peer.send("SUBSCRIBE", id="b", destination="./dead", browser="true")
    frames = peer.frames()
    assert [(f.body, f.headers.get("curb-dead-reason")) for f in frames] == [
        (b"m0", "max-deliveries"),
        (b"m1", "max-deliveries"),
        (b"", None),
    ]
    assert frames[-1].headers["browser"] == "end"
    assert world.broker.counts()["dead"] == 2 and world.log.acked == []


# ./dead ack deadlines: -ack-timeout (s), the SUBSCRIBE's curb-ack-timeout, ack mode ->
# when the dead letter delivered at 0 goes back (None: never).
DEAD_DEADLINES = [
    (1.0, None, "client-individual", 1.0),  # -ack-timeout, as for the queue
    (1.0, "250", "client-individual", 0.25),  # the subscription's own
    (1.0, "0", "client", None),  # ... or none
    (0.0, None, "client", None),  # -ack-timeout 0
    (0.0, "250", "client", 0.25),
    (1.0, "250", "auto", None),  # an auto subscription's dead letters are deleted once sent
]


@pytest.mark.parametrize("flag, header, ack, deadline", DEAD_DEADLINES)
def test_a_dead_letters_deadline_is_the_subscriptions_or_the_flags(flag, header, ack, deadline):
    world = dead_world(1, ack_timeout=flag)
    extra = {} if header is None else {"curb-ack-timeout": header}
    reader = consumer(world, "d", destination="./dead", ack=ack, **extra)
    assert got(reader) == [(b"m0", "1", "max-deliveries")]
    if deadline is not None:
        at(world, deadline - 0.001)
        assert world.broker.metrics.ack_timeouts == 0
        at(world, deadline)
        assert got(reader) == [(b"m0", "1", "max-deliveries")], "back, and to the reader again"
    at(world, 100_000.0)
    assert world.broker.metrics.ack_timeouts == (0 if deadline is None else 2)


def test_a_dead_letter_held_past_its_deadline_is_dead_again_never_queued():
    world = dead_world(2, ack_timeout=1.0)
    worker = consumer(world)
    hung = consumer(world, "d", destination="./dead", prefetch=1)
    assert got(hung) == [(b"m0", "1", "max-deliveries")]
    at(world, 0.999)
    assert world.broker.metrics.ack_timeouts == 0
    at(world, 1.0)
    assert got(worker) == [], "a dead letter never goes to a queue subscriber"
    assert got(hung) == [(b"m0", "1", "max-deliveries")], "back first among the dead, its count unchanged"
    assert world.broker.metrics.ack_timeouts == 1
    assert world.broker.counts()["dead"] == 2 and world.log.acked == []
    at(world, 2.0)
    assert world.broker.counts()["dead"] == 2 and world.broker.counts()["rdy"] == 0


def test_one_timer_keeps_the_queues_and_the_dead_letters_deadlines():
    world = dead_world(1, ack_timeout=5.0)
    producer(world, b"job")
    peer = consumer(world, prefetch=1)
    dead = {"id": "d", "destination": "./dead", "ack": "client", "prefetch-count": "1", "curb-ack-timeout": "1000"}
    peer.feed(encode("SUBSCRIBE", dead))
    assert [f.body for f in peer.frames()] == [b"job", b"m0"]
    other = consumer(world, "o", prefetch=1)
    reader = consumer(world, "d", destination="./dead")
    at(world, 1.0)
    assert got(reader) == [(b"m0", "1", "max-deliveries")] and got(other) == []
    at(world, 4.999)
    assert world.broker.metrics.ack_timeouts == 1
    at(world, 5.0)  # job comes back past the delivery limit of 1: a dead letter
    assert world.broker.metrics.ack_timeouts == 2 and world.broker.counts()["dead"] == 2


def held_past_dead_deadline() -> tuple[World, Peer, str]:
    """A ./dead reader held m0 past its 1 s deadline; another reader holds it now.
    Returns (world, the late reader, m0's ack id)."""
    world = dead_world(1, ack_timeout=1.0)
    late = consumer(world, "d", destination="./dead", prefetch=1)
    ack_id = one(late).headers["ack"]
    other = consumer(world, "d", destination="./dead")
    at(world, 1.0)
    assert one(other).headers["ack"] == ack_id
    return world, late, ack_id


@pytest.mark.parametrize(
    "command, headers",
    [("ACK", {}), ("NACK", {}), ("NACK", {"curb_touch": "60000"})],
)
def test_a_late_ack_nack_or_touch_of_a_dead_letter_changes_nothing(command, headers):
    world, late, ack_id = held_past_dead_deadline()
    late.send(command, id=ack_id, receipt="late", **headers)
    world.log.sync()
    world.run_scheduled()
    assert [(f.command, f.headers.get("curb-late")) for f in late.frames()] == [("RECEIPT", "true")]
    assert late.session.close_wanted is None
    assert world.broker.metrics.late_acks == 1
    assert world.log.acked == [] and world.broker.metrics.dead_acked == 0, "the dead letter is not deleted"
    assert world.broker.counts()["dead"] == 1


def test_a_touch_keeps_a_dead_letter_past_its_deadline_until_the_new_one():
    world = dead_world(1, ack_timeout=1.0)
    holder = consumer(world, "d", destination="./dead", prefetch=1)
    ack_id = one(holder).headers["ack"]
    at(world, 0.5)
    holder.send("NACK", id=ack_id, curb_touch="3000")
    other = consumer(world, "d2", destination="./dead")
    at(world, 3.499)
    assert got(other) == [] and world.broker.metrics.ack_timeouts == 0
    at(world, 3.5)
    assert got(other) == [(b"m0", "1", "max-deliveries")]


@pytest.mark.parametrize("value", ["soon", "-1", "1.5", "", "86400001"])
def test_a_bad_ack_timeout_on_dead_is_the_queues_error(value):
    world = dead_world(1)
    peer = world.session()
    peer.connect()
    peer.send("SUBSCRIBE", id="d", destination="./dead", ack="client", receipt="r", curb_ack_timeout=value)
    [error] = peer.frames()
    assert error.command == "ERROR" and error.headers["message"] == "bad curb-ack-timeout header"
    assert error.headers["receipt-id"] == "r" and b"from 0 (no deadline) to 86400000 (a day)" in error.body
    assert world.broker.dead.subscription_count == 0 and world.broker.counts()["dead"] == 1


@pytest.mark.parametrize("count, moved", [(None, 3), ("2", 2), ("0", 0), ("9", 3)])
def test_a_redrive_moves_the_oldest_dead_letters_back_with_their_count_reset(count, moved):
    world = dead_world(3)
    admin = world.session()
    admin.connect()
    headers = {"receipt": "r"} if count is None else {"receipt": "r", "curb_count": count}
    admin.send("SEND", destination="./redrive", **headers)
    assert admin.frames() == [], "the RECEIPT waits until the move is durable"
    world.log.sync()
    assert [(f.headers["receipt-id"], f.headers["curb-moved"]) for f in admin.frames()] == [("r", str(moved))]
    assert world.broker.metrics.redriven == moved and world.broker.counts()["dead"] == 3 - moved
    worker = consumer(world)
    assert got(worker) == [(b"m%d" % n, "1", None) for n in range(moved)]


# A SEND's destination -> whether it is stored as an ordinary job (docs/guide.md: Dead letters).
DESTINATIONS = {
    "/queue/work": True,
    "/queue/redrive-report": True,
    "jobs": True,
    "./dead": False,
    "./count": False,
    "./purge": False,
    "./Redrive": False,
    "./redrive ": False,
    "/queue/redrive": False,
    "/queue/REDRIVE": False,
    "redrive": False,
}


@pytest.mark.parametrize("destination", list(DESTINATIONS))
def test_a_send_to_a_reserved_or_misspelt_name_is_an_error_never_a_job(destination):
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", destination=destination, receipt="r")
    world.log.sync()
    frames = peer.frames()
    if DESTINATIONS[destination]:
        assert [f.command for f in frames] == ["RECEIPT"] and world.broker.counts()["rdy"] == 1
    else:
        assert [f.command for f in frames] == ["ERROR"] and world.broker.counts()["rdy"] == 0
        assert world.log.next_id == 1 and world.broker.metrics.redriven == 0, "nothing stored, nothing moved"


# A SUBSCRIBE's destination -> whether it is a subscription (docs/guide.md: Dead letters).
SUBSCRIBE_DESTINATIONS = {
    "/queue/work": True,
    "/queue/dead": True,
    "jobs": True,
    "./dead": True,
    "./count": True,
    "./Dead": False,
    "./dead ": False,
    "./counts": False,
    "./COUNT": False,
    "./redrive": False,
    "./purge": False,
    "./": False,
}


# ... and a browse of a refused one is refused too (browses of the others: tests/test_browse.py).
SUBSCRIBES = [(name, False) for name in SUBSCRIBE_DESTINATIONS] + [
    (name, True) for name, ok in SUBSCRIBE_DESTINATIONS.items() if not ok
]


@pytest.mark.parametrize("destination, browse", SUBSCRIBES)
def test_a_subscribe_to_an_unknown_local_name_is_an_error_never_a_consumer(destination, browse):
    world = dead_world(1)
    producer(world, b"job")
    peer = world.session()
    peer.connect()
    headers = {"id": "s", "destination": destination, "receipt": "r"}
    if browse:
        headers["browser"] = "true"
    peer.feed(encode("SUBSCRIBE", headers))
    commands = [f.command for f in peer.frames()]
    if SUBSCRIBE_DESTINATIONS[destination]:
        assert "ERROR" not in commands
    else:
        assert commands == ["ERROR"] and peer.session.close_wanted == "close"
        counts = world.broker.counts()
        assert (counts["rdy"], counts["dead"], counts["subscriptions"]) == (1, 1, 0), "nothing taken"


# SEND headers that would change what a SEND does, and are refused rather than ignored.
REFUSED_HEADERS = {
    "./redrive with curb-delay": ("./redrive", {"curb-delay": "1000"}, b""),
    "./redrive with AMQ_SCHEDULED_DELAY": ("./redrive", {"AMQ_SCHEDULED_DELAY": "1000"}, b""),
    "./redrive with a body": ("./redrive", {}, b"redrive everything"),
    "AMQ_SCHEDULED_REPEAT": (QUEUE, {"AMQ_SCHEDULED_REPEAT": "5"}, b"job"),
    "AMQ_SCHEDULED_PERIOD": (QUEUE, {"AMQ_SCHEDULED_PERIOD": "60000"}, b"job"),
}


@pytest.mark.parametrize("name", list(REFUSED_HEADERS))
def test_a_send_whose_headers_curb_cannot_honour_is_refused_and_changes_nothing(name):
    destination, headers, body = REFUSED_HEADERS[name]
    world = dead_world(1)
    peer = producer(world, body, destination=destination, **headers)
    [error] = peer.frames()
    assert error.command == "ERROR", error
    counts = world.broker.counts()
    assert (counts["rdy"], counts["delayed"], counts["dead"], world.broker.metrics.redriven) == (0, 0, 1, 0)


def test_counts_show_delayed_and_dead():
    world = dead_world(1)
    producer(world, b"later", **{"curb-delay": "5000"})
    counts = world.broker.counts()
    assert (counts["delayed"], counts["dead"], counts["rdy"]) == (1, 1, 0)
    peer = world.session()
    peer.connect()
    peer.send("SUBSCRIBE", id="c", destination="./count")
    [frame] = peer.frames()
    assert json.loads(frame.body) == counts
    assert (frame.headers["delayed"], frame.headers["dead"]) == ("1", "1")


def recovered_dead(world: World, *bodies: bytes) -> None:
    """Dead letters the log found at start-up (older than any the broker buries)."""
    for body in bodies:
        rec = world.log.append(b"\n" + body)
        world.log.ready.remove(rec)
        rec.dead, rec.deliveries = "expired", 4
        world.log.dead_rdy.append(rec)


def test_dead_letters_from_an_earlier_run_come_first_in_reads_browses_and_redrives():
    world = World(redelivery=Redelivery(delay_ms=0, max_deliveries=1))
    recovered_dead(world, b"old0", b"old1")
    producer(world, b"new")
    peer = consumer(world)
    peer.send("NACK", id=one(peer).headers["ack"])
    peer.session.connection_lost()
    world.broker.gone(peer.session)
    assert world.broker.counts()["dead"] == 3

    browser = world.session()
    browser.connect()
    browser.send("SUBSCRIBE", id="b", destination="./dead", browser="true")
    assert [(f.body, f.headers.get("curb-dead-reason")) for f in browser.frames()] == [
        (b"old0", "expired"),
        (b"old1", "expired"),
        (b"new", "max-deliveries"),
        (b"", None),
    ]
    admin = world.session()
    admin.connect()
    admin.send("SEND", destination="./redrive", curb_count="2")
    assert world.broker.counts()["dead"] == 1
    worker = consumer(world)
    assert got(worker) == [(b"old0", "1", None), (b"old1", "1", None)]
    admin.send("SEND", destination="./redrive")
    assert got(worker) == [(b"new", "1", None)] and world.broker.counts()["dead"] == 0


def test_an_auto_reader_of_dead_letters_deletes_them_once_handed_to_the_transport():
    world = dead_world(2)
    reader = world.session()
    reader.connect()
    reader.send("SUBSCRIBE", id="d", destination="./dead")
    assert [f.body for f in reader.frames()] == [b"m0", b"m1"]
    world.run_scheduled()
    assert world.log.acked == [1, 2] and world.broker.counts()["dead"] == 0


@pytest.mark.parametrize("limit", [1, 3])
def test_a_nack_with_curb_undelivered_is_rdy_at_once_and_its_delivery_uncounted(limit):
    """A router that has no client with credit for a MESSAGE hands it back: its NACK says
    curb-undelivered:true. Counted as a delivery, 66 of 20,000 messages reached their
    first client as redeliveries and, at -max-deliveries 1, became dead letters no
    client saw. Uncounted, it is rdy at once and its next MESSAGE is its first delivery."""
    world = World(redelivery=Redelivery(delay_ms=5000, max_deliveries=limit))
    producer(world, b"job")
    peer = consumer(world)
    for _ in range(4):  # more than the limit: none of them counts, and none waits
        frame = one(peer)
        assert (frame.headers["curb-deliveries"], frame.headers.get("redelivered")) == ("1", None)
        peer.feed(encode("NACK", {"id": frame.headers["ack"], "curb-undelivered": "true"}))
    assert world.broker.metrics.bounced == 4 and world.broker.metrics.nacked == 0
    assert world.broker.counts()["dead"] == 0
    frame = one(peer)
    peer.feed(encode("NACK", {"id": frame.headers["ack"]}))  # a NACK of its own counts, as ever
    at(world, 5.001)
    assert got(peer) == [(b"job", "2", None)] if limit > 1 else world.broker.counts()["dead"] == 1
