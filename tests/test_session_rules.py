"""The session rules, in memory: the sans-I/O Session and the Broker over a fake log, a
fake scheduler and a fake clock. No sockets, no event loop, no files."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable

import pytest
from simclock import SimClock

from curb import heartbeat
from curb.broker import Broker, BrokerEvents
from curb.broker_config import BrokerConfig
from curb.frame import Frame, FrameParser, encode
from curb.log import QueueFull
from curb.log.browse import Browse
from curb.log.cursor import Record
from curb.redelivery import Redelivery
from curb.session import Session

Done = Callable[[str | None], None]


class FakeLog:
    """The log's public surface, in memory: appends are readable at once, and the
    answers (RECEIPTs) wait until the test calls sync(). Delayed messages and dead
    letters are kept as the log keeps them (curb.log's API): parked until due by its
    wall clock (the SimClock's); dead letters found at start-up
    (`dead_rdy`, which a test fills) handed out one at a time to the dead letters' queue,
    those buried since held by the broker."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self.parked: dict[int, tuple[int, Record]] = {}  # id -> (due ms, record)
        self.dead_rdy: collections.deque[Record] = collections.deque()  # found at start-up, not handed out
        self.events = BrokerEvents()  # its World names the broker
        self.hold_flush = False
        self.ready: collections.deque[Record] = collections.deque()
        self.waiting: list[Done] = []
        self.acked: list[int] = []
        self.requeued: list[int] = []
        self.full = False
        self.next_id = 1
        self.end = 1 << 20
        self.live_bytes = self.file_bytes = 0

    @property
    def unread(self) -> int:
        return len(self.ready)

    def wall_ms(self) -> int:
        return self.clock.wall_ms()

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> Record:
        if self.full:
            raise QueueFull("queue full now (fake)")
        rec = Record(self.next_id, 0, len(payload), 0, 0, payload)
        rec.due_ms, rec.expires_ms = due_ms, expires_ms
        self.next_id += 1
        if due_ms > self.wall_ms():
            self.parked[rec.id] = (due_ms, rec)
        else:
            self.ready.append(rec)
        if done is not None:
            self.waiting.append(done)
        return rec

    def ack(self, rec: Record) -> None:
        self.acked.append(rec.id)

    def requeue(self, rec: Record, due_ms: int = 0) -> None:
        self.requeued.append(rec.id)
        if not rec.dead and due_ms > self.wall_ms():
            rec.due_ms = due_ms
            self.parked[rec.id] = (due_ms, rec)

    def bury(self, rec: Record, reason: str) -> None:
        rec.dead = reason

    def revive(self, rec: Record) -> None:
        rec.dead, rec.deliveries = "", 0

    def keep_dead(self, rec: Record) -> None:
        self.dead_rdy.append(rec)

    def next_dead(self) -> Record | None:
        return self.dead_rdy.popleft() if self.dead_rdy else None

    def dead_letters(self) -> tuple[int, list[Record]]:
        return 0, list(self.dead_rdy)

    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]:
        return [], None

    def read_dead(self, mid: int) -> Record | None:
        raise AssertionError("the fake log keeps its dead letters as records")

    def redrive(self, count: int) -> list[int]:
        moved = list(self.dead_rdy)[:count]
        for rec in moved:
            self.dead_rdy.popleft()
            self.revive(rec)
        self.ready.extendleft(reversed(moved))
        return [rec.id for rec in moved]

    def release(self, now_ms: int) -> bool:
        """Due messages go to the front of the line, as the log's ready line goes first."""
        due = sorted(i for i, (at, _) in self.parked.items() if at <= now_ms)
        self.ready.extendleft(reversed([self.parked.pop(i)[1] for i in due]))
        return False

    def next_due(self) -> int | None:
        return min((at for at, _ in self.parked.values()), default=None)

    @property
    def delayed(self) -> int:
        return len(self.parked)

    @property
    def dead(self) -> int:
        return len(self.dead_rdy)

    @property
    def last_id(self) -> int:
        return self.next_id - 1

    @property
    def durable_id(self) -> int:
        return self.next_id - 1

    def ack_upto(self, upto: int, done: Done | None = None) -> None:
        raise AssertionError("ACK curb-upto is tested over a real LogCore (tests/test_ack_upto.py)")

    def browse(self, from_id: int, to_id: int) -> Browse:
        raise AssertionError("browses are tested over a real LogCore (tests/test_browse.py)")

    def end_browse(self, browse: Browse) -> None:
        raise AssertionError("browses are tested over a real LogCore (tests/test_browse.py)")

    def on_durable(self, done: Done) -> None:
        self.waiting.append(done)

    def payload(self, rec: Record) -> bytes | memoryview:
        assert rec.payload is not None
        return rec.payload

    def delivered(self, rec: Record) -> None:
        rec.deliveries += 1

    def next_ready(self) -> Record | None:
        return self.ready.popleft() if self.ready else None

    def flush(self) -> None:
        self.events.written()

    def sync(self, err: str | None = None) -> None:
        waiting, self.waiting = self.waiting, []
        for done in waiting:
            done(err)
        self.events.answered()


class World:
    """A broker over a FakeLog; scheduled callbacks run when the test says. A message
    that comes back is rdy again at once (-redelivery-delay 0), so that a test steps
    through returns one by one; the default backoff is tested where it is the subject
    (tests/test_redelivery.py, tests/test_broker_policy.py)."""

    def __init__(self, heartbeat_ms: int = 0, prefetch: int = 100, **options) -> None:
        options.setdefault("redelivery", Redelivery(delay_ms=0))
        self.clock = SimClock()
        self.log = FakeLog(self.clock)
        self.later: list[Callable[[], None]] = []
        self.broker = Broker(
            self.log,
            BrokerConfig(prefetch=prefetch, heartbeat_ms=heartbeat_ms, **options),
            schedule=lambda delay, callback: self.later.append(callback),
            clock=self.clock.time,
            loop=self.clock,
        )
        self.log.events.broker = self.broker

    def run_scheduled(self) -> None:
        while self.later or self.clock.fire_due():
            later, self.later = self.later, []
            for callback in later:
                callback()

    def session(self, now: float = 0.0) -> Peer:
        return Peer(self, Session(self.broker, now, "test"))


class Peer:
    """One client's view: frames in, frames (and raw bytes) out."""

    def __init__(self, world: World, session: Session) -> None:
        self.world, self.session = world, session
        self.parser = FrameParser()

    def send(self, command: str, now: float = 0.0, body: bytes = b"", **headers: str) -> None:
        self.feed(encode(command, {k.replace("_", "-"): v for k, v in headers.items()}, body), now)

    def feed(self, data: bytes, now: float = 0.0) -> None:
        self.session.receive_data(data, now)

    def raw(self, now: float = 0.0) -> bytes:
        self.world.run_scheduled()
        return self.session.data_to_send(now)

    def frames(self, now: float = 0.0) -> list[Frame]:
        return self.parser.feed(self.raw(now))

    def connect(self, heart_beat: str = "0,0") -> Frame:
        self.feed(encode("CONNECT", {"accept-version": "1.2", "heart-beat": heart_beat}))
        [connected] = self.frames()
        assert connected.command == "CONNECTED"
        return connected


def commands(frames: list[Frame]) -> list[str]:
    return [f.command for f in frames]


def receipts(frames: list[Frame]) -> list[str]:
    return [f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"]


# ---------------------------------------------------------------- every command in every state

ALL_COMMANDS = [
    "CONNECT",
    "STOMP",
    "SEND",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACK",
    "NACK",
    "DISCONNECT",
    "BEGIN",
    "COMMIT",
    "ABORT",
    "FROB",
]
# Headers that make each command valid in the connected state set up below (a ./count
# subscription "c" exists, so "count-1" is an id an ACK or NACK may name).
VALID_HEADERS = {
    "CONNECT": {"accept-version": "1.2"},
    "STOMP": {"accept-version": "1.2"},
    "SEND": {"destination": "/queue/curb"},
    "SUBSCRIBE": {"id": "s", "destination": "/queue/curb"},
    "UNSUBSCRIBE": {"id": "c"},
    "ACK": {"id": "count-1"},
    "NACK": {"id": "count-1"},
    "DISCONNECT": {},
    "BEGIN": {"transaction": "t"},
    "COMMIT": {"transaction": "t"},
    "ABORT": {"transaction": "t"},
    "FROB": {},
}


def in_state(state: str) -> Peer:
    peer = World().session()
    if state != "new":
        peer.connect()
        peer.send("SUBSCRIBE", id="c", destination="./count")
        assert commands(peer.frames()) == ["MESSAGE"]
    if state == "closing":
        peer.send("DISCONNECT")
        assert peer.raw() == b""
        assert peer.session.close_wanted == "close"
    return peer


# state -> command -> what the peer gets: a frame command, "ERROR <words in its message>", or None
EXPECTED: dict[str, dict[str, str | None]] = {
    "new": {
        "CONNECT": "CONNECTED",
        "STOMP": "CONNECTED",
        **{c: f"ERROR {c} not allowed before CONNECT" for c in ALL_COMMANDS[2:-1]},
        "FROB": "ERROR unknown command 'FROB' before CONNECT",
    },
    "open": {
        "CONNECT": "ERROR CONNECT not allowed after CONNECT",
        "STOMP": "ERROR STOMP not allowed after CONNECT",
        "SEND": "RECEIPT",
        "SUBSCRIBE": "RECEIPT",
        "UNSUBSCRIBE": "RECEIPT",
        "ACK": "RECEIPT",
        "NACK": "RECEIPT",
        "DISCONNECT": "RECEIPT",
        "BEGIN": "ERROR transactions are not supported",
        "COMMIT": "ERROR transactions are not supported",
        "ABORT": "ERROR transactions are not supported",
        "FROB": "ERROR unknown command 'FROB' after CONNECT",
    },
    "closing": dict.fromkeys(ALL_COMMANDS),
}
CASES = [(state, command) for state in EXPECTED for command in ALL_COMMANDS]


@pytest.mark.parametrize(("state", "command"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_every_command_in_every_state(state, command):
    peer = in_state(state)
    peer.feed(encode(command, {**VALID_HEADERS[command], "receipt": "r"}))
    peer.world.log.sync()
    got = [f for f in peer.frames() if f.headers.get("subscription") != "c"]  # ./count updates aside
    expected = EXPECTED[state][command]
    if expected is None:
        assert got == [], "frames after DISCONNECT are dropped unread"
        return
    assert len(got) == 1, got
    [frame] = got
    if expected.startswith("ERROR"):
        assert frame.command == "ERROR"
        assert frame.headers["message"] == expected[len("ERROR ") :]
        assert frame.headers["receipt-id"] == "r"
        assert peer.session.close_wanted == "close"
        assert not peer.session.reading
    else:
        assert frame.command == expected
        if expected == "RECEIPT":
            assert frame.headers["receipt-id"] == "r"
        assert peer.session.close_wanted == ("close" if command == "DISCONNECT" else None)


def test_frames_after_an_error_in_the_same_bytes_are_not_handled():
    world = World()
    peer = world.session()
    peer.feed(b"SEND\n\nearly\0CONNECT\naccept-version:1.2\n\n\0")
    assert commands(peer.frames()) == ["ERROR"]
    assert world.log.unread == 0


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\nno-colon\n\nx\0",
        b"SEND\nx:a\\tb\n\nx\0",
        b"SEND\ncontent-length:1\n\nhello\0",
        b"SEND\ncontent-length:-1\n\nx\0",
    ],
    ids=["no colon", "undefined escape", "no NUL at content-length", "negative length"],
)
def test_bad_bytes_get_one_error_and_a_close(data):
    world = World()
    peer = world.session()
    peer.connect()
    peer.feed(data)
    [error] = peer.frames()
    assert error.command == "ERROR" and error.headers["message"]
    assert peer.session.close_wanted == "close"
    assert world.broker.metrics.protocol_errors == 1
    peer.feed(b"SEND\n\nlater\0")
    assert peer.frames() == [] and world.log.unread == 0


@pytest.mark.parametrize(("accept", "answer"), [(None, "ERROR"), ("1.0,1.1", "ERROR"), ("1.1,1.2", "CONNECTED")])
def test_connect_needs_version_1_2(accept, answer):
    peer = World().session()
    peer.send("CONNECT", **({} if accept is None else {"accept_version": accept}))
    [frame] = peer.frames()
    assert frame.command == answer
    if answer == "ERROR":
        assert frame.headers["version"] == "1.2"


# ---------------------------------------------------------------- receipts


def test_receipts_leave_in_frame_order_even_when_some_wait_for_the_sync():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", receipt="send-1", body=b"one")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual", receipt="subscribe")
    peer.send("SEND", receipt="send-2", body=b"two")
    got = peer.frames()
    assert receipts(got) == [], "SUBSCRIBE's receipt must wait behind send-1's"
    peer.send("UNSUBSCRIBE", id="s", receipt="unsubscribe")
    world.log.sync()
    got += peer.frames()
    assert receipts(got) == ["send-1", "subscribe", "send-2", "unsubscribe"]
    assert [f.body for f in got if f.command == "MESSAGE"] == [b"one", b"two"]


def test_a_disconnect_receipt_comes_last_and_then_the_close():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", receipt="s", body=b"x")
    peer.send("DISCONNECT", receipt="bye")
    assert peer.frames() == [] and peer.session.close_wanted is None
    world.log.sync()
    assert receipts(peer.frames()) == ["s", "bye"]
    assert peer.session.close_wanted == "close"


def test_a_send_the_log_loses_gets_an_error_not_a_receipt():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", receipt="s", body=b"x")
    world.log.sync("fdatasync failed")
    [error] = peer.frames()
    assert error.command == "ERROR"
    assert (error.headers["message"], error.headers["receipt-id"]) == ("message not stored", "s")


def test_a_full_queue_is_an_error_and_nothing_is_stored():
    world = World()
    peer = world.session()
    peer.connect()
    world.log.full = True
    peer.send("SEND", receipt="s", body=b"x")
    [error] = peer.frames()
    assert error.headers["message"] == "queue full" and error.headers["receipt-id"] == "s"
    assert world.broker.metrics.refused_full == 1 and world.broker.metrics.sent == 0


# ---------------------------------------------------------------- the queue's steps through the broker


def test_ack_and_nack_reach_the_log_through_the_broker():
    world = World()
    peer = world.session()
    peer.connect()
    for body in (b"a", b"b"):
        peer.send("SEND", body=body)
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    first, second = peer.frames()
    peer.send("ACK", id=first.headers["ack"])
    peer.send("NACK", id=second.headers["ack"])
    assert world.log.acked == [int(first.headers["ack"])]
    assert world.log.requeued == [int(second.headers["ack"])]
    [again] = peer.frames()
    assert again.body == b"b" and again.headers["redelivered"] == "true"


def test_a_lost_connection_returns_its_wip_to_the_log():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", body=b"a")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    [message] = peer.frames()
    peer.session.connection_lost()
    assert world.log.requeued == [int(message.headers["ack"])]
    assert not world.broker.sessions


def test_stored_headers_come_back_on_the_message():
    peer = World().session()
    peer.connect()
    peer.send("SEND", body=b"x", content_type="text/plain", x_tag="a:b", receipt="r")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb")
    [message] = [f for f in peer.frames() if f.command == "MESSAGE"]
    assert message.headers["content-type"] == "text/plain" and message.headers["x-tag"] == "a:b"
    assert "receipt" not in message.headers and "ack" not in message.headers


# ---------------------------------------------------------------- auto-ack and flow control


def test_an_auto_message_is_done_only_once_handed_to_the_transport():
    world = World()
    peer = world.session()
    peer.connect()
    for i in range(10):
        peer.send("SEND", body=b"%d" % i)
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="auto", prefetch_count="2")
    world.run_scheduled()
    assert world.log.acked == [], "nothing was handed to the transport yet"
    assert world.broker.queue.wip_count == 2, "prefetch bounds auto subscriptions too"
    peer.session.set_writable(False)
    assert peer.session.reading, "frames are still read while little output waits"
    assert [f.body for f in peer.frames()] == [b"0", b"1"]
    assert world.log.acked == [1, 2]
    world.run_scheduled()
    assert peer.raw() == b"" and world.log.unread == 8, "nothing more while the transport is full"
    peer.session.set_writable(True)
    assert [f.body for f in peer.frames()] == [b"2", b"3"]


def test_auto_messages_the_transport_never_took_are_rdy_again():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", body=b"x")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="auto")
    world.run_scheduled()
    peer.session.discard_output()
    peer.session.connection_lost()
    assert world.log.acked == [] and world.log.requeued == [1]


def test_count_updates_wait_while_the_peer_does_not_read_and_only_the_latest_is_sent():
    world = World()
    watcher, producer = world.session(), world.session()
    watcher.connect()
    producer.connect()
    watcher.send("SUBSCRIBE", id="c", destination="./count")
    assert json.loads(watcher.frames()[0].body)["rdy"] == 0
    watcher.session.set_writable(False)
    for _ in range(3):
        producer.send("SEND", body=b"x")
        world.run_scheduled()
    assert watcher.raw() == b""
    watcher.session.set_writable(True)
    [update] = watcher.frames()
    assert json.loads(update.body)["rdy"] == 3


# ---------------------------------------------------------------- heart-beats on a fake clock


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        ((0, 0), (1000, 1000), (0.0, 0.0)),
        ((200, 200), (0, 0), (0.0, 0.0)),
        ((200, 200), (1000, 500), (0.5, 1.0)),
        ((200, 200), (100, 100), (0.2, 0.2)),
        ((0, 200), (100, 100), (0.0, 0.2)),
        ((200, 0), (100, 100), (0.2, 0.0)),
    ],
)
def test_heart_beat_negotiation(ours, theirs, expected):
    assert heartbeat.negotiate(ours, theirs) == expected


@pytest.mark.parametrize("value", ["1", "a,b", "-1,0", "1,2,3", ""])
def test_a_bad_heart_beat_header_is_refused(value):
    with pytest.raises(ValueError):
        heartbeat.parse(value)
    peer = World(heartbeat_ms=200).session()
    peer.send("CONNECT", accept_version="1.2", heart_beat=value)
    [error] = peer.frames()
    assert error.headers["message"] == "bad heart-beat header"


def test_no_heart_beats_means_no_deadline():
    peer = World(heartbeat_ms=200).session()
    peer.connect(heart_beat="0,0")
    assert peer.session.next_deadline is None


def test_heart_beat_deadlines_follow_the_clock():
    world = World(heartbeat_ms=200)
    peer = world.session(now=0.0)
    connected = peer.connect(heart_beat="1000,500")
    assert connected.headers["heart-beat"] == "200,200"
    session = peer.session
    # We send every 0.5 s (a little early), and expect the peer within tolerance(1.0) = 2 s.
    assert session.next_deadline == pytest.approx(0.45)
    session.tick(0.45)
    assert peer.raw(0.45) == b"\n"
    assert session.next_deadline == pytest.approx(0.9)
    session.tick(0.5)
    assert peer.raw(0.5) == b"", "no beat before it is due"
    peer.feed(b"\n", now=1.5)
    session.tick(3.4)
    assert session.close_wanted is None, "the peer was heard 1.9 s ago: still within tolerance"
    assert peer.raw(3.4) == b"\n"
    assert session.next_deadline == pytest.approx(3.5)
    session.tick(3.6)
    assert session.close_wanted == "abort", "silent for longer than twice its interval"


def test_output_moves_the_send_deadline():
    world = World(heartbeat_ms=1000)
    peer = world.session()
    peer.connect(heart_beat="0,1000")
    peer.send("SEND", now=0.8, body=b"x", receipt="r")
    world.log.sync()
    assert receipts(peer.frames(now=0.8)) == ["r"]
    assert peer.session.next_deadline == pytest.approx(0.8 + 0.9)


def test_deadlines_changes_only_when_a_deadline_may_come_sooner():
    """The transport re-reads next_deadline only when `deadlines` changes: at the CONNECT
    that agrees heart-beats, not for the bytes that follow, which only move it later."""
    world = World(heartbeat_ms=1000)
    peer = world.session(now=0.0)
    before = peer.session.deadlines
    peer.connect(heart_beat="1000,1000")
    agreed = peer.session.deadlines
    assert agreed != before
    armed = peer.session.next_deadline
    assert armed is not None
    peer.send("SEND", now=0.3, body=b"x", receipt="r")
    world.log.sync()
    peer.frames(now=0.4)
    assert peer.session.deadlines == agreed
    assert peer.session.next_deadline is not None and peer.session.next_deadline >= armed


def test_shutdown_stops_reading_for_good_and_returns_the_wip():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", body=b"x")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    assert [f.body for f in peer.frames()] == [b"x"]
    world.broker.stop_delivering()
    assert not peer.session.reading and world.log.requeued == [1]
    peer.session.set_writable(False)
    peer.session.set_writable(True)
    assert not peer.session.reading, "a drained transport does not undo the shutdown"
    world.broker.close_sessions()
    assert peer.raw() == b"" and peer.session.close_wanted == "close"


def test_each_delivery_is_counted_by_the_log_and_shown_to_the_consumer():
    world = World()
    peer = world.session()
    peer.connect()
    peer.send("SEND", body=b"a")
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    seen = []
    for _ in range(3):
        [message] = peer.frames()
        seen.append((message.headers.get("redelivered"), message.headers.get("curb-deliveries")))
        peer.send("NACK", id=message.headers["ack"])
    assert seen == [(None, "1"), ("true", "2"), ("true", "3")]
