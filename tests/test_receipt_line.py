"""The line of owed receipts and the ERROR in it, in memory: whatever the frames, wherever a
bad one comes and whenever the log answers, an ERROR never overtakes the RECEIPTs of the
frames before it, nothing follows it, and a RECEIPT only ever promises what is durable.

`test_the_error_takes_its_place_in_the_line` is a property over random frame sequences
(hypothesis) with a fake log that answers durability in any order, or fails;
`test_a_crash_after_a_receipt_keeps_the_frames_effect` runs the same kind of sequence
over the real log on a simulated disk and crashes it at random.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from memworld import MemPeer, MemWorld
from simclock import SimClock
from simdisk import Crashed, SimDisk
from test_frame_props import settings  # its profiles: quick by default, CURB_HYPOTHESIS_PROFILE=thorough
from test_session_rules import FakeLog

from curb.broker import Broker
from curb.broker_config import BrokerConfig
from curb.commands import Handler, unexpected
from curb.conn import CLOSING, NEW, OPEN, Conn
from curb.frame import Frame, FrameParser, encode
from curb.log import QueueFull
from curb.log.cursor import Record
from curb.payload import split as split_payload
from curb.session import Session

Done = Callable[[str | None], None]
MESSAGES = 24  # delivered to the peer before its frames, for its ACKs and NACKs
FULL = b"full"  # a SEND body the fake log refuses with "queue full"

# Frames that draw an ERROR; each may carry a receipt (where its head can be read).
BAD = {
    "no colon": b"SEND\nno-colon\n\nx\0",
    "unknown command": b"FROB\nreceipt:r%d\n\n\0",
    "transaction": b"BEGIN\ntransaction:t\nreceipt:r%d\n\n\0",
    "unknown ack id": b"ACK\nid:999999\nreceipt:r%d\n\n\0",
    "SUBSCRIBE without id": b"SUBSCRIBE\ndestination:/queue/curb\nreceipt:r%d\n\n\0",
    "second CONNECT": b"CONNECT\naccept-version:1.2\nreceipt:r%d\n\n\0",
    "queue full": b"SEND\ndestination:/queue/curb\nreceipt:r%d\n\n" + FULL + b"\0",
}
GOOD = ("SEND", "ACK", "NACK", "SUBSCRIBE", "DISCONNECT")


class LaggingLog(FakeLog):
    """A fake log whose durability answers come when the test says, in any order, or as
    failures; once broken it fails every later wait at once, as the real log does."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[str, Done]] = []
        self.outcome: dict[str, str | None] = {}  # tag -> None (durable) or the failure
        self.broken: str | None = None
        self.durable_waits = 0
        self.closed: Callable[[], bool] = lambda: False  # whether the connection ended already
        self.late: set[str] = set()  # answered once it had ended: no ERROR can follow

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> Record:
        if payload.endswith(FULL):
            raise QueueFull("queue full now (test): retry once consumers have caught up")
        rec = super().append(payload, None, urgent, due_ms=due_ms, expires_ms=expires_ms)
        if done is not None:
            self._wait("SEND " + payload.rsplit(b"\n", 1)[-1].decode(), done)
        return rec

    def on_durable(self, done: Done) -> None:
        self.durable_waits += 1
        self._wait(f"durable {self.durable_waits}", done)

    def _wait(self, tag: str, done: Done) -> None:
        if self.broken is not None:
            self.outcome[tag] = self.broken
            done(self.broken)
            return
        self.pending.append((tag, done))

    def answer(self, index: int, err: str | None) -> None:
        tag, done = self.pending.pop(index % len(self.pending))
        self.outcome[tag] = err
        if self.closed():
            self.late.add(tag)
        done(err)
        self.events.answered()

    def break_down(self, err: str) -> None:
        self.broken = err
        while self.pending:
            self.answer(0, err)


@dataclass
class Step:
    """One frame of the peer's: its index, command, whether it asks a receipt, its bytes."""

    index: int
    command: str
    receipt: bool
    data: bytes
    bad: str | None = None
    wait: str | None = None  # the fake log's tag for its durability, once known


def make_frames(kinds: list[tuple[str, bool]]) -> list[Step]:
    """Frames from (kind, receipt) pairs: a good command or a BAD name. Every ACK and NACK
    names a message the peer holds, each a different one."""
    steps, held = [], iter(range(1, MESSAGES + 1))
    for index, (kind, receipt) in enumerate(kinds):
        headers = {"x-i": str(index)}
        if receipt:
            headers["receipt"] = f"r{index}"
        if kind in BAD:
            command, rest = BAD[kind].split(b"\n", 1)
            data = b"%s\nx-i:%d\n%s" % (command, index, rest.replace(b"%d", b"%d" % index))
            steps.append(Step(index, kind, receipt=b"receipt:" in data, data=data, bad=kind))
            continue
        body = b""
        if kind == "SEND":
            headers["destination"] = "/queue/curb"
            body = b"f%d" % index
        elif kind in ("ACK", "NACK"):
            headers["id"] = str(next(held))
        elif kind == "SUBSCRIBE":
            headers.update({"id": "c", "destination": "./count"})
        steps.append(Step(index, kind, receipt, encode(kind, headers, body)))
    return steps


class Rig:
    """A connected peer subscribed with client-individual acks, holding MESSAGES
    messages, over a LaggingLog; it records which of its frames the session handled."""

    def __init__(self) -> None:
        self.log = LaggingLog()
        self.later: list[Callable[[], None]] = []
        self.broker = Broker(
            self.log,
            BrokerConfig(heartbeat_ms=0),
            schedule=lambda delay, callback: self.later.append(callback),
            loop=SimClock(),
        )
        self.log.events.broker = self.broker
        self.session = Session(self.broker, 0.0, "test")
        self.log.closed = lambda: self.session.close_wanted is not None
        self.parser = FrameParser()
        self.out: list[Frame] = []
        self.handled: list[int] = []  # the frames the session handled, or answered as unparsable
        self.closing_after: dict[int, bool] = {}
        self.feed(b"CONNECT\naccept-version:1.2\n\n\0SUBSCRIBE\nid:s\ndestination:/q\nack:client-individual\n\n\0")
        for n in range(MESSAGES):
            self.log.append(b"\nm%d" % n)
        self.broker.pump()
        self.collect()
        assert [f.command for f in self.out] == ["CONNECTED"] + ["MESSAGE"] * MESSAGES
        self.out.clear()
        # Every (state, command) the frames can meet, those of no rule with the session's
        # `unexpected`, each noting its frame as handled.
        rules = self.session.rules
        commands = {command for _, command in rules} | {"FROB"}
        self.session.rules = {
            (state, command): self.recording(rules.get((state, command), unexpected))
            for state in (NEW, OPEN)
            for command in commands
        }

    def recording(self, rule: Handler) -> Handler:
        """`rule` (a frame's handler) noting the frame as handled, and whether the
        connection was closing after it."""

        def handle(session: Conn, frame: Frame) -> None:
            index = int(frame.headers.get("x-i", -1))
            self.handled.append(index)
            try:
                rule(session, frame)
            except Exception:
                self.closing_after[index] = True  # the session answers it with an ERROR
                raise
            self.closing_after[index] = session.state is CLOSING

        return handle

    def feed(self, data: bytes) -> None:
        self.session.receive_data(data, 0.0)

    def read(self, read: list[Step]) -> None:
        """Feed one read of whole frames; a frame that does not parse counts as handled
        when the session reached it still open (the frames before it in the read handled)."""
        open_before = self.session.state is not CLOSING
        self.feed(b"".join(step.data for step in read))
        for n, step in enumerate(read):
            if step.bad == "no colon":
                earlier = read[:n]
                if all(s.index in self.handled for s in earlier) and (
                    not self.closing_after[earlier[-1].index] if earlier else open_before
                ):
                    self.handled.append(step.index)
                return

    def collect(self) -> list[Frame]:
        """What the session wrote since the last call (scheduled work run first)."""
        while self.later:
            later, self.later = self.later, []
            for callback in later:
                callback()
        new = self.parser.feed(self.session.data_to_send(0.0))
        self.out += new
        return new


def answers(frames: list[Frame]) -> list[str]:
    """RECEIPTs and ERRORs as 'r<frame index>' and 'ERROR' (MESSAGEs aside)."""
    return [f.headers["receipt-id"] if f.command == "RECEIPT" else "ERROR" for f in frames if f.command != "MESSAGE"]


kind_strategy = st.tuples(st.sampled_from([*GOOD, *GOOD, *GOOD, *BAD]), st.booleans())
# A log step between reads: ("ok", i) answers a pending wait, ("fail", i) fails one
# (a disk full or a lost write), ("break",) fails them all for good (EIO on fdatasync).
log_step = st.one_of(
    st.tuples(st.just("ok"), st.integers(0, 50)),
    st.tuples(st.just("ok"), st.integers(0, 50)),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.just(("break",)),
)


@settings(deadline=None)
# Found by the thorough profile: a refused SEND took an earlier, equal place out of the line.
@example(kinds=[("SEND", True), ("queue full", False)], cuts=[], log_steps=[], failures=False)
@given(
    kinds=st.lists(kind_strategy, min_size=1, max_size=14),
    cuts=st.lists(st.integers(1, 14), max_size=6),
    log_steps=st.lists(st.lists(log_step, max_size=4), max_size=8),
    failures=st.booleans(),
)
def test_the_error_takes_its_place_in_the_line(kinds, cuts, log_steps, failures):
    steps = make_frames(kinds)
    rig = Rig()
    log = rig.log
    # Whole frames, grouped into reads at the cuts: frames before a bad one share its read.
    reads, start = [], 0
    for cut in sorted(set(cuts)):
        if start < cut < len(steps):
            reads.append(steps[start:cut])
            start = cut
    reads.append(steps[start:])
    seen_end = False
    for n, read in enumerate(reads):
        rig.read(read)
        for action in log_steps[n] if n < len(log_steps) else ():
            if not failures and action[0] != "ok":
                continue
            if action[0] == "break":
                log.break_down("fdatasync failed (test)")
            elif log.pending:
                log.answer(action[1], None if action[0] == "ok" else "disk full (test)")
            seen_end = check_step(rig, steps, seen_end)
        seen_end = check_step(rig, steps, seen_end)
    while log.pending:
        log.answer(0, None)
        seen_end = check_step(rig, steps, seen_end)
    check_final(rig, steps)


def tag_waits(rig: Rig, steps: list[Step]) -> None:
    """Which durability wait of the fake log is which handled frame's: a SEND's append is
    named by its body; on_durable is called once per receipted ACK, NACK and DISCONNECT,
    in frame order."""
    waits = 0
    for index in rig.handled:
        step = steps[index]
        if step.bad is None and step.command == "SEND":
            step.wait = f"SEND f{index}"
        elif step.bad is None and step.receipt and step.command in ("ACK", "NACK", "DISCONNECT"):
            waits += 1
            step.wait = f"durable {waits}"


def check_step(rig: Rig, steps: list[Step], seen_end: bool) -> bool:
    """After any step: no output once the ERROR (or the DISCONNECT's RECEIPT) was written,
    a RECEIPT only for a frame whose effect the log reported durable, and the close
    asked for exactly when the line's end is written. Returns whether it was."""
    new = rig.collect()
    tag_waits(rig, steps)
    if seen_end:
        assert new == [], f"written after the connection's last frame: {new}"
        return True
    for frame in new:
        if frame.command == "RECEIPT":
            step = steps[int(frame.headers["receipt-id"][1:])]
            if step.wait is not None:
                assert rig.log.outcome.get(step.wait, "not yet") is None, f"RECEIPT before durable: {step}"
    last = [f for f in new if f.command != "MESSAGE"][-1:]
    end = bool(last) and (
        last[0].command == "ERROR" or steps[int(last[0].headers["receipt-id"][1:])].command == "DISCONNECT"
    )
    if end:
        assert rig.session.close_wanted == "close", "the line's end is written: the connection closes"
        assert new[-1] is last[0], f"written after the line's end: {new}"
    elif rig.session.close_wanted is not None:
        # Only a DISCONNECT without receipt ends the line with nothing to write.
        assert any(steps[i].command == "DISCONNECT" and not steps[i].receipt for i in rig.handled)
    return end or rig.session.close_wanted is not None


def failed(rig: Rig, step: Step) -> bool:
    """Whether a handled frame draws an ERROR: a bad one, or one the log lost while the
    connection lasted."""
    wait = step.wait
    return step.bad is not None or (
        wait is not None and rig.log.outcome.get(wait) is not None and wait not in rig.log.late
    )


def check_final(rig: Rig, steps: list[Step]) -> None:
    """Everything answered: receipts in frame order, only for what succeeded, every one
    owed before the first failure sent ahead of the one ERROR, which comes last."""
    tag_waits(rig, steps)
    got = answers(rig.out)
    handled = [steps[i] for i in rig.handled]
    fails = [step.index for step in handled if failed(rig, step)]
    first_fail = fails[0] if fails else None
    receipts = [int(a[1:]) for a in got if a != "ERROR"]
    assert receipts == sorted(receipts), f"receipts out of frame order: {got}"
    for index in receipts:
        assert index in rig.handled and not failed(rig, steps[index]), f"RECEIPT r{index} for a failed frame: {got}"
    owed = [
        step.index
        for step in handled
        if step.receipt and not failed(rig, step) and (first_fail is None or step.index < first_fail)
    ]
    assert set(owed) <= set(receipts), f"receipts owed {owed} before the ERROR, got {got}"
    if first_fail is None:
        assert "ERROR" not in got
        if any(step.command == "DISCONNECT" for step in handled):
            assert rig.session.close_wanted == "close"
    else:
        assert got.count("ERROR") == 1 and got[-1] == "ERROR", f"one ERROR, last: {got}"
        assert rig.out[-1].command == "ERROR", "nothing after the ERROR"
        assert rig.out[-1].body.strip(), "an ERROR has a body"
        assert rig.session.close_wanted == "close", "the line ended: the connection closes"
    rig.session.connection_lost()


# ---------------------------------------------------------------- over the real log, with crashes


def crash_after_receipts(seed: int) -> tuple[int, int]:
    """Pipeline receipted SENDs and ACKs and a bad frame in one read over the real log on
    a SimDisk, let the log work a random number of disk calls, crash (kill or power) and
    recover: every SEND that got its RECEIPT is there unless acked, and every message
    whose ACK got its RECEIPT is gone. Returns (receipts seen, frames sent)."""
    rng = random.Random(seed)
    world = MemWorld(disk=SimDisk(rng))
    producer = world.peer()
    producer.produce([b"old %d" % n for n in range(6)])
    consumer = world.peer()
    consumer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    held = {int(f.headers["ack"]): f.body for f in consumer.frames() if f.command == "MESSAGE"}
    assert len(held) == 6
    data, sends, acks = b"", {}, {}
    for n in range(rng.randrange(1, 12)):
        if rng.random() < 0.5 and held:
            msg_id = rng.choice(list(held))
            acks[f"a{n}"] = held.pop(msg_id)
            data += encode("ACK", {"id": str(msg_id), "receipt": f"a{n}"})
        else:
            sends[f"s{n}"] = b"new %d" % n
            data += encode("SEND", {"destination": "/queue/curb", "receipt": f"s{n}"}, sends[f"s{n}"])
    data += BAD[rng.choice([kind for kind in BAD if kind != "queue full"])].replace(b"%d", b"0")  # not full here
    world.disk.arm_crash(rng.randrange(12))
    got: list[Frame] = []
    try:
        consumer.session.receive_data(data, world.now)
        for _ in range(6):
            got += consumer.frames()
            world.settle(1)
        got += consumer.frames()
    except Crashed:
        got += consumer.parser.feed(consumer.session.data_to_send(world.now))  # written before the crash
    receipted = [f.headers["receipt-id"] for f in got if f.command == "RECEIPT"]
    answered = [f.command for f in got if f.command != "MESSAGE"]
    assert "ERROR" not in answered[:-1], f"an ERROR before a RECEIPT: {answered}"
    after = world.crash(rng.choice(["kill", "power"]))
    bodies = set()
    while (rec := after.log.next_ready()) is not None:
        bodies.add(split_payload(bytes(after.log.payload(rec)))[1])
    for receipt in receipted:
        if receipt in sends:
            assert sends[receipt] in bodies, f"{receipt} got its RECEIPT and was lost in the crash"
        else:
            assert acks[receipt] not in bodies, f"{receipt} got its RECEIPT and its message came back"
    return len(receipted), len(sends) + len(acks)


@pytest.mark.parametrize("block", range(4))
def test_a_crash_after_a_receipt_keeps_the_frames_effect(block):
    seen = sent = 0
    for seed in range(block * 50, block * 50 + 50):
        receipts, frames = crash_after_receipts(seed)
        seen, sent = seen + receipts, sent + frames
    assert 0 < seen < sent, "the crashes should fall both before and after some receipts"


# ---------------------------------------------------------------- a DISCONNECT after a SEND with no receipt


def producer_with_a_send_waiting_for_room() -> tuple[MemWorld, MemPeer, list[bytes]]:
    """A producer whose last SEND, with no receipt, waits for room in the ring: every
    message before it is ACKed, but their room comes back only with a synced checkpoint."""
    world = MemWorld(cap=64 * 1024)
    log = world.log
    while True:
        try:
            log.append(b"\nold".ljust(1500, b"o"))
        except QueueFull:
            break
    world.settle(1)
    while (rec := log.next_ready()) is not None:
        log.ack(rec)
    producer, sent = world.peer(), list[bytes]()
    while not log._pending:  # until a SEND is not written at once
        sent.append(b"new %d ".ljust(log.max_message - 100, b"n") % len(sent))
        producer.send("SEND", sent[-1], destination="/queue/curb")
        log.flush()
    return world, producer, sent


def test_a_disconnect_receipt_waits_for_a_receiptless_send_still_waiting_for_room():
    world, producer, sent = producer_with_a_send_waiting_for_room()
    producer.send("DISCONNECT", receipt="bye")
    for _ in range(30):
        got = [f.command for f in producer.frames()]
        if got:
            break
        world.settle(1)
    assert got == ["RECEIPT"]
    for mode in ("kill", "power"):
        after, bodies = world.crash(mode), []
        while (rec := after.log.next_ready()) is not None:
            bodies.append(split_payload(bytes(after.log.payload(rec)))[1])
        assert bodies == sent, "the RECEIPT left before every SEND before it was on disk"


@pytest.mark.parametrize("command", ["DISCONNECT", "NACK"])
def test_a_receipt_after_a_receiptless_send_that_is_refused_is_message_not_stored(command):
    world = MemWorld(cap=1 << 20, disk=SimDisk(random.Random(3), free_bytes=8192))
    producer = world.peer()
    producer.send("SEND", b"held", destination="/queue/curb")
    world.settle(1)
    producer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    [held] = producer.frames()
    producer.send("SEND", b"x" * 8000, destination="/queue/curb")  # the file cannot grow for it
    if command == "NACK":
        producer.send("NACK", id=held.headers["ack"], receipt="r")
    else:
        producer.send("DISCONNECT", receipt="r")
    world.settle(2)
    [error] = producer.frames()
    assert error.command == "ERROR" and error.headers["message"] == "message not stored"
    assert b"disk full" in error.body
