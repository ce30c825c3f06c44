"""Promises the log file keeps, each a regression test for a failure seen against the real
broker process (docs/log-format.md):

- a: the ring wraps at the end of a lap without wedging the broker;
- b: one message held unacked does not pin the ring;
- c: a restart after ACKs that no checkpoint names yet answers SENDs, and SIGTERM still stops it;
- d: damage skipped at start-up does not stop the delivery of the intact messages;
- e: start-up on a damaged file says what it skipped, or exits with one line, never a traceback;
- f: on a small file system SENDs are stored while there is room, refused as "disk full" when
  there is none, and stored again once room comes back.

The damage helpers find a record by its body and read its header line as docs/log-format.md documents
it: one line `state deliveries id wseq time length crc` right before the payload, which for a
SEND without headers of its own is a blank line and the body.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import stomp

from curb.client import Client, StompError
from curb.spawn import BrokerProcess, StartError

QUEUE = "/queue/work"
ANSWER_S = 3.0  # a SEND's RECEIPT or ERROR; a healthy broker needs milliseconds
STOP_S = 2.5  # SIGTERM to exit when nothing is left to drain
STARTUP_S = 15.0
SKIPPED = re.compile(r"skip|damage|torn|truncat|drop", re.IGNORECASE)


def body(n: int, size: int, tag: bytes = b"m") -> bytes:
    """`size` bytes that name their message, b'm-000042-xxx...', unique in the file."""
    head = b"%s-%06d-" % (tag, n)
    return head + b"x" * (size - len(head))


def assert_no_crash(stderr: str) -> None:
    assert "Traceback" not in stderr and "FormatError" not in stderr, f"the broker crashed:\n{stderr}"


def tail_of(text: str, lines: int = 12) -> str:
    return "\n".join(text.splitlines()[-lines:])


def store(producer: Client, payload: bytes, receipt: str, broker, headers: dict[str, str] | None = None) -> None:
    """SEND with a receipt and wait for it; fail naming the SEND and what the broker said."""
    producer.send(payload, headers=headers, receipt=receipt)
    try:
        producer.wait_receipt(receipt)
    except StompError as err:
        pytest.fail(
            f"SEND {receipt} ({len(payload)} bytes) got no RECEIPT: {err}\n"
            f"broker stderr:\n{tail_of(broker.stderr_text())}"
        )


def store_all(broker, bodies: Sequence[bytes], headers: dict[str, str] | None = None) -> None:
    """SEND each body with a receipt, one at a time, as a careful producer does."""
    with Client("127.0.0.1", broker.port, timeout=ANSWER_S) as producer:
        for i, payload in enumerate(bodies):
            store(producer, payload, f"s{i}", broker, headers)


class Acker(stomp.ConnectionListener):
    """ACKs every MESSAGE as it arrives (client-individual), like a worker keeping up."""

    def __init__(self, conn: stomp.Connection12):
        self.conn = conn

    def on_message(self, frame) -> None:
        self.conn.ack(frame.headers["ack"])


def subscribe(
    stomp_conn,
    port: int,
    prefetch: int,
    *,
    sub_id: str = "worker",
    acking: bool = True,
    stderr: Callable[[], str] = lambda: "",
):
    """A consumer whose SUBSCRIBE the broker has taken (its RECEIPT came): (conn, inbox).
    Fails at once, with the broker's `stderr()`, if the broker drops the connection instead."""
    conn, inbox = stomp_conn(port, auto_decode=False)
    if acking:
        conn.set_listener("acker", Acker(conn))
    receipt = f"sub-{sub_id}"
    conn.subscribe(
        QUEUE, id=sub_id, ack="client-individual", headers={"prefetch-count": str(prefetch), "receipt": receipt}
    )
    inbox.wait_for(lambda box: receipt in box.receipts or box.disconnected or bool(box.errors), receipt)
    if receipt not in inbox.receipts:
        pytest.fail(
            f"SUBSCRIBE got no RECEIPT (errors {[e.headers for e in inbox.errors]}, "
            f"disconnected={inbox.disconnected})\nbroker stderr:\n{tail_of(stderr())}"
        )
    return conn, inbox


def received(inbox, count: int, stderr: Callable[[], str]) -> list:
    """The first `count` MESSAGEs; fails at once, with the broker's `stderr()`, if the
    connection ends or gets an ERROR first."""
    inbox.wait_for(lambda box: len(box.messages) >= count or box.disconnected or bool(box.errors), f"{count} messages")
    if len(inbox.messages) < count:
        pytest.fail(
            f"{len(inbox.messages)} of {count} messages came, then errors "
            f"{[e.headers for e in inbox.errors]}, disconnected={inbox.disconnected}\n"
            f"broker stderr:\n{tail_of(stderr())}"
        )
    return inbox.messages[:count]


# ---------------------------------------------------------------- a: the end of a lap

LAP_END = [932] * 64 + [933] * 64
MIXED = random.Random(1).choices(range(100, 30000), k=300)


@pytest.mark.parametrize(
    "cap, sizes", [("64KiB", LAP_END), ("1MiB", MIXED)], ids=["64KiB-932-then-933", "1MiB-mixed-sizes-several-laps"]
)
def test_a_the_end_of_a_ring_lap_does_not_wedge_the_broker(curb_broker, stomp_conn, raw, cap, sizes):
    """With content-type:text/plain a 932-byte body makes a record of exactly 1 KiB, so the
    933-byte ones end the next lap a little further on: the lap's end is read where the last
    lap left other bytes. Mixed sizes end laps at scattered places."""
    broker = curb_broker(cap=cap)
    _, inbox = subscribe(stomp_conn, broker.port, prefetch=1, stderr=broker.stderr_text)
    bodies = [body(i, size) for i, size in enumerate(sizes)]
    store_all(broker, bodies, headers={"content-type": "text/plain"})
    assert [m.body for m in received(inbox, len(bodies), broker.stderr_text)] == bodies
    raw(broker.port).connect()
    assert_no_crash(broker.stderr_text())


# ---------------------------------------------------------------- b: a held message

HELD_ROUNDS = 400  # 400 records of 1068 bytes: more than six laps of a 64KiB ring


def test_b_one_held_message_does_not_pin_the_ring(curb_broker, stomp_conn):
    """Lock-step: each SEND is received and its ACK receipted before the next, so at most the
    held message and one other are live (about 2 KB): "queue full" can only be the log's fault."""
    broker = curb_broker(cap="64KiB")
    holder, held = subscribe(
        stomp_conn, broker.port, prefetch=1, sub_id="holder", acking=False, stderr=broker.stderr_text
    )
    kept = b"held: delivered once, never acked"
    with Client("127.0.0.1", broker.port, timeout=ANSWER_S) as producer:
        store(producer, kept, "held", broker)
        assert received(held, 1, broker.stderr_text)[0].body == kept
        worker, inbox = subscribe(stomp_conn, broker.port, prefetch=1, acking=False, stderr=broker.stderr_text)
        for i in range(HELD_ROUNDS):
            payload = body(i, 1000)
            store(producer, payload, f"s{i}", broker)
            message = received(inbox, i + 1, broker.stderr_text)[i]
            assert message.body == payload
            worker.ack(message.headers["ack"], receipt=f"a{i}")
            inbox.wait_receipt(f"a{i}")
    assert len(held.messages) == 1, "the holder's prefetch of 1 was exceeded"
    holder.send_frame("DISCONNECT", {"receipt": "bye"})  # its wip goes back to rdy
    held.wait_receipt("bye")
    assert received(inbox, HELD_ROUNDS + 1, broker.stderr_text)[-1].body == kept, "the held message was lost"
    assert_no_crash(broker.stderr_text())


# ---------------------------------------------------------------- c: restart after unrecorded ACKs


def fill_then_ack_everything(client: Client) -> None:
    """Fill the 64KiB ring to the last live byte it allows, ACK the first two messages each
    in the same write as a new SEND (so the head runs further than any checkpoint's tail),
    then ACK the rest with receipts. Returns at the last ACK's RECEIPT; raises StompError
    with the ERROR frame if the broker refuses a SEND (a log that packs the ring otherwise)."""
    acks: list[str] = []

    def collect(frames) -> None:
        assert None not in frames, f"only {len(acks)} messages came"
        acks.extend(f.headers["ack"] for f in frames if f.command == "MESSAGE")

    client.subscribe("fill", ack="client-individual", prefetch=1000)
    fill = [body(i, 1000) for i in range(56)] + [body(56, 950)]  # 56 x 1068 + 1018 record bytes
    for i, payload in enumerate(fill):
        client.send(payload, receipt=f"f{i}")
    collect(client.wait_receipt(f"f{len(fill) - 1}"))
    for k in range(2):
        while len(acks) <= k:
            collect([client.receive(timeout=ANSWER_S)])
        client.ack(acks[k])
        client.send(body(100 + k, 1000), receipt=f"g{k}")
        collect(client.wait_receipt(f"g{k}"))
    while len(acks) < len(fill) + 2:
        collect([client.receive(timeout=ANSWER_S)])
    for k, ack in enumerate(acks[2:]):
        client.ack(ack, receipt=f"a{k}")
    client.wait_receipt(f"a{len(acks) - 3}")


def answer(port: int, payload: bytes, receipt: str, opened: list[Client]) -> str:
    """'RECEIPT', 'ERROR: ...' or 'nothing' for one SEND on a new connection, left open."""
    client = Client("127.0.0.1", port, timeout=ANSWER_S)
    opened.append(client)
    client.connect()
    client.send(payload, receipt=receipt)
    try:
        client.wait_receipt(receipt)
    except StompError as err:
        return f"ERROR: {err}" if err.frame is not None else f"nothing within {ANSWER_S}s ({err})"
    return "RECEIPT"


def test_c_restart_after_acks_no_checkpoint_names_answers_sends_and_stops(curb_broker):
    """kill -9 within milliseconds of the last ACK's RECEIPT, so the newest checkpoint still
    names the old tail. After the restart a consumer reconnects, then a SEND of the largest
    record the cap allows needs room that only those ACKs freed."""
    broker = curb_broker(cap="64KiB")
    client = Client("127.0.0.1", broker.port, timeout=ANSWER_S)
    client.connect()
    try:
        fill_then_ack_everything(client)
    except StompError as err:
        if err.frame is None:  # no answer at all, not a refusal: that is the failure itself
            raise
    finally:
        broker.kill()
        client.close()
    broker.start()
    opened: list[Client] = []
    try:
        consumer = Client("127.0.0.1", broker.port, timeout=ANSWER_S)
        opened.append(consumer)
        consumer.connect()
        consumer.subscribe("after", ack="client-individual", prefetch=1, headers={"receipt": "sub"})
        consumer.wait_receipt("sub")
        answers = [answer(broker.port, body(200, 1964), "big", opened), answer(broker.port, b"tiny", "tiny", opened)]
        stopped = stop_within(broker.proc, STOP_S)
    finally:
        for c in opened:
            c.close()
    answered = all(a.startswith(("RECEIPT", "ERROR")) for a in answers)
    assert answered and stopped, (
        f"SENDs after the restart got {answers}; SIGTERM: {stopped or 'no exit'}\n"
        f"broker stderr:\n{tail_of(broker.stderr_text())}"
    )
    assert_no_crash(broker.stderr_text())


def stop_within(proc: subprocess.Popen, seconds: float) -> str:
    """SIGTERM, then 'exit N after Ts', or '' if it did not exit within `seconds` (the
    fixture kills it at the end of the test)."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return ""
    return f"exit {code} after {time.monotonic() - started:.1f}s"


# ---------------------------------------------------------------- d, e: damage in the file


def header_fields(data: bytes | bytearray, marker: bytes) -> list[tuple[int, int]]:
    """(start, end) in the file of each field of the header line of the record whose body
    starts with `marker`."""
    newline = data.find(b"\n\n" + marker)
    assert newline > 0, f"no record with body {marker!r} in the file"
    start = data.rfind(b"\n", 0, newline) + 1
    fields = [(start + m.start(), start + m.end()) for m in re.finditer(rb"\S+", data[start:newline])]
    assert len(fields) == 10 and data[start : start + 3] in (b"rdy", b"ack"), (
        f"not a record header line: {bytes(data[start:newline])!r}; the log format changed, update this test"
    )
    return fields


LENGTH, ID, CRC = 8, 4, 9


def flip(data: bytearray, at: int) -> None:
    """Flip the lowest bit of one byte: a hex digit stays a hex digit or stops being one."""
    data[at] ^= 1


def test_d_damage_skipped_at_start_up_leaves_every_intact_message_deliverable(curb_broker, stomp_conn):
    broker = curb_broker()
    bodies = [body(i, 90, b"d") for i in range(40)]
    store_all(broker, bodies)
    assert broker.stop() == 0
    data = bytearray(broker.file.read_bytes())
    marker = [b[:9] for b in bodies]
    flip(data, data.find(b"\n\n" + marker[5]) + 2 + 40)  # a payload byte
    flip(data, header_fields(data, marker[12])[LENGTH][1] - 1)  # the length's last digit
    flip(data, header_fields(data, marker[20])[ID][1] - 1)  # the id's last digit
    flip(data, header_fields(data, marker[27])[CRC][0])  # the CRC's first digit
    broker.file.write_bytes(data)
    seen = len(broker.stderr_text())
    broker.start()
    start_up = broker.stderr_text()[seen:]
    assert SKIPPED.search(start_up), f"start-up does not say it skipped damage:\n{start_up}"
    _, inbox = subscribe(stomp_conn, broker.port, prefetch=100, stderr=broker.stderr_text)
    intact = [b for i, b in enumerate(bodies) if i not in (5, 12, 20, 27)]
    received(inbox, len(intact), broker.stderr_text)
    assert [m.body for m in inbox.quiet()] == intact
    assert not inbox.errors and not inbox.disconnected
    assert_no_crash(broker.stderr_text())


@dataclass
class Started:
    """A broker started on a file that may make it refuse to start."""

    child: BrokerProcess
    exited: bool  # it refused to start; its status and output say why

    def stderr(self) -> str:
        return self.child.output()


@pytest.fixture
def start_on() -> Iterator[Callable[..., Started]]:
    """Factory: `start_on(broker, name)` runs the broker's command again and returns once it
    listens or exits (killed at the end of the test)."""
    children: list[BrokerProcess] = []

    def start(broker, name: str) -> Started:
        child = BrokerProcess(cwd=broker.cwd, env=broker.env, output=broker.cwd / f"{name}.stderr", timeout=STARTUP_S)
        children.append(child)
        try:
            child.start(broker.flags())
        except StartError:
            return Started(child, exited=True)
        return Started(child, exited=False)

    yield start
    for child in children:
        child.kill()


def wrap_the_live_region(broker) -> list[bytes]:
    """40 messages, the first 35 consumed, 40 more: the live region runs from late in the
    ring past its end and on from its start. Returns the bodies still queued."""
    first = [body(i, 1000, b"a") for i in range(40)]
    second = [body(i, 1000, b"b") for i in range(40)]
    store_all(broker, first)
    with Client("127.0.0.1", broker.port, timeout=ANSWER_S) as consumer:
        consumer.subscribe("early", ack="client-individual", prefetch=35)
        ids: list[str] = []
        while len(ids) < 35:
            frame = consumer.receive(timeout=ANSWER_S)
            assert frame is not None, f"only {len(ids)} of 35 messages came"
            ids.append(frame.headers["ack"])
        consumer.unsubscribe("early")
        for k, ack in enumerate(ids):
            consumer.ack(ack, receipt=f"a{k}")
        consumer.wait_receipt(f"a{len(ids) - 1}")
    store_all(broker, second)
    return first[35:] + second


@pytest.mark.parametrize("damage", ["length-digit", "truncated-in-wrapped-region"])
def test_e_start_up_on_a_damaged_file_never_prints_a_traceback(curb_broker, stomp_conn, start_on, damage):
    """A length that jumps far past the end of the file, or a file cut short inside the part
    of a wrapped live region that runs to the end of the ring."""
    broker = curb_broker(cap="64KiB")
    queued = wrap_the_live_region(broker)
    assert broker.stop() == 0
    data = bytearray(broker.file.read_bytes())
    if damage == "length-digit":
        flip(data, header_fields(data, body(36, 1000, b"a")[:9])[LENGTH][0])  # 0 -> 1: +256 MiB
    else:
        del data[data.find(body(37, 1000, b"a")[:9]) + 500 :]
    broker.file.write_bytes(data)
    run = start_on(broker, damage)
    if run.exited:
        lines = run.stderr().strip().splitlines()
        status = run.child.process.returncode
        assert "Traceback" not in run.stderr(), run.stderr()
        assert status != 0 and len(lines) == 1, f"exit {status}:\n{run.stderr()}"
        return
    assert SKIPPED.search(run.stderr()), f"started without saying what it skipped:\n{run.stderr()}"
    _, inbox = subscribe(stomp_conn, broker.port, prefetch=100, stderr=run.stderr)
    delivered = [m.body for m in inbox.quiet(1.0)]
    assert set(delivered) <= set(queued), "a message came back altered"
    assert not inbox.errors and not inbox.disconnected
    assert_no_crash(run.stderr())


# ---------------------------------------------------------------- f: a small file system

FS_SIZE = "2m"
FILLER = 512 * 1024
BIG = 8000


def unmount(where: Path) -> None:
    """Unmount, lazily if something (a broker being killed) still holds it."""
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs for this test, unmounted after it. Request it before curb_broker, so
    that the broker is killed before the unmount. Needs root; a root that cannot mount fails."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(
            f"cannot mount a {FS_SIZE} tmpfs at {where} as root ({done.stderr.strip() or done.returncode}): "
            f"this test needs a small file system; run it where root may mount (e.g. not in a "
            f"container without CAP_SYS_ADMIN)"
        )
    try:
        yield where
    finally:
        unmount(where)


def send_until_refused(broker, start: int, limit: int) -> tuple[list[bytes], StompError | None]:
    """SEND BIG-byte bodies with receipts until one is refused: (bodies stored, the refusal)."""
    stored: list[bytes] = []
    with Client("127.0.0.1", broker.port, timeout=ANSWER_S) as producer:
        for n in range(start, limit):
            payload = body(n, BIG)
            producer.send(payload, receipt=f"s{n}")
            try:
                producer.wait_receipt(f"s{n}")
            except StompError as err:
                return stored, err
            stored.append(payload)
    return stored, None


def store_one(port: int, payload: bytes) -> bool:
    try:
        with Client("127.0.0.1", port, timeout=ANSWER_S) as producer:
            producer.send(payload, receipt="again")
            producer.wait_receipt("again")
    except StompError:
        return False
    return True


def drain(port: int) -> list[bytes]:
    """Every queued message, ACKed, in delivery order."""
    got = []
    with Client("127.0.0.1", port, timeout=ANSWER_S) as consumer:
        consumer.subscribe("drain", ack="client-individual", prefetch=500)
        while (frame := consumer.receive(timeout=0.5)) is not None:
            got.append(frame.body)
            consumer.ack(frame.headers["ack"])
    return got


def test_f_a_full_disk_refuses_sends_clearly_and_room_lets_them_in_again(small_fs, curb_broker, wait_until):
    """A -cap above what the file system holds: the log grows as it needs, so SENDs are
    stored until the disk is full, then refused as "disk full", then stored again."""
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * FILLER)
    broker = curb_broker(cap="4MiB", file=small_fs / "curb.log")
    assert "WARNING: -cap is 4.0 MiB" in broker.stderr_text(), "start-up says the file system is too small"
    with Client("127.0.0.1", broker.port, timeout=ANSWER_S) as producer:
        for i in range(20):  # 160 KB, a tenth of the free space
            store(producer, body(i, BIG), f"s{i}", broker)
    stored, refusal = send_until_refused(broker, 20, 400)
    assert refusal is not None, f"{len(stored) + 20} SENDs of {BIG} bytes fit in a {FS_SIZE} file system"
    assert refusal.frame is not None and "disk full" in str(refusal).lower(), f"refused with {refusal}"
    assert wait_until(lambda: f"disk full: cannot grow {small_fs / 'curb.log'}" in broker.stderr_text())
    filler.unlink()
    again = body(999, BIG)
    assert wait_until(lambda: store_one(broker.port, again), timeout=5), (
        f"no SEND stored after freeing {FILLER} bytes\n{tail_of(broker.stderr_text())}"
    )
    assert broker.running()
    assert drain(broker.port) == [body(i, BIG) for i in range(20)] + stored + [again]
    assert_no_crash(broker.stderr_text())
