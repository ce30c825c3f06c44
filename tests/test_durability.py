"""What survives a crash, what the cap allows, and what a torn tail costs, proven
against the real broker process: SIGKILL, truncation and corruption of its file."""

import os
import threading
import time

import pytest

from curb.client import Client, StompError
from curb.log import LogReader, max_message_for

WINDOW = 32


class Producer(threading.Thread):
    """Pipelined SENDs with a receipt each until the connection dies; remembers which
    bodies were receipted."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.receipted: set[bytes] = set()
        self.sent = 0

    def run(self) -> None:
        try:
            with Client("127.0.0.1", self.port, timeout=10) as c:
                outstanding: dict[str, bytes] = {}
                while True:
                    while len(outstanding) < WINDOW:
                        body = b"msg-%07d" % self.sent
                        outstanding[f"s{self.sent}"] = body
                        c.send(body, receipt=f"s{self.sent}")
                        self.sent += 1
                    frame = c.receive(timeout=10)
                    if frame is not None and frame.command == "RECEIPT":
                        self.receipted.add(outstanding.pop(frame.headers["receipt-id"]))
        except (StompError, OSError):
            return


class Consumer(threading.Thread):
    """ACKs every message with a receipt until the connection dies; remembers which
    bodies it sent an ACK for, and which of those ACKs were receipted."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.ack_sent: set[bytes] = set()
        self.acked: set[bytes] = set()

    def run(self) -> None:
        pending = {}
        try:
            with Client("127.0.0.1", self.port, timeout=10) as c:
                c.subscribe("c", ack="client-individual", prefetch=64)
                while True:
                    frame = c.receive(timeout=10)
                    if frame is None:
                        continue
                    if frame.command == "MESSAGE":
                        mid = frame.headers["ack"]
                        pending[f"a{mid}"] = frame.body
                        self.ack_sent.add(frame.body)
                        c.ack(mid, receipt=f"a{mid}")
                    elif frame.command == "RECEIPT":
                        self.acked.add(pending.pop(frame.headers["receipt-id"]))
        except (StompError, OSError):
            return


def drain(port: int) -> list[bytes]:
    """Every message left in the queue, acked, in delivery order."""
    bodies = []
    with Client("127.0.0.1", port, timeout=10) as c:
        c.subscribe("d", ack="client-individual", prefetch=500)
        while (frame := c.receive(timeout=1.0)) is not None:
            if frame.command == "MESSAGE":
                bodies.append(frame.body)
                c.ack(frame.headers["ack"])
        c.disconnect()
    return bodies


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("kill_after", [50, 400, 1500, 4000])
def test_kill_9_loses_no_receipted_send_and_undoes_no_receipted_ack(curb_broker, kill_after):
    broker = curb_broker(cap="64MiB")
    producer, consumer = Producer(broker.port), Consumer(broker.port)
    producer.start()
    consumer.start()
    wait_for(lambda: len(producer.receipted) >= kill_after and len(consumer.acked) >= kill_after // 4)
    broker.kill()
    producer.join(15)
    consumer.join(15)
    receipted, acked = set(producer.receipted), set(consumer.acked)
    broker.start()
    left = drain(broker.port)
    assert len(left) == len(set(left)), "a message came back twice"
    assert not acked & set(left), "an ACK whose RECEIPT was sent was undone"
    missing = receipted - consumer.ack_sent - set(left)
    assert not missing, f"{len(missing)} receipted SENDs lost, e.g. {sorted(missing)[:3]}"
    assert "recovered" in broker.stderr_text()


def disk_bytes(path) -> int:
    st = os.stat(path)
    return max(st.st_size, st.st_blocks * 512)


def fill(port: int, start: int) -> int:
    """SEND with receipts until the broker refuses one as queue full; returns how many
    it took. The refused one must not be stored."""
    n = start
    with Client("127.0.0.1", port, timeout=10) as c:
        with pytest.raises(StompError, match="queue full"):
            while True:
                c.send(b"fill-%07d-" % n + b"x" * 200, receipt=f"f{n}")
                c.wait_receipt(f"f{n}")
                n += 1
    return n - start


def test_cap_fill_drain_refill_restart_stays_under_the_cap(curb_broker):
    cap = 64 * 1024
    broker = curb_broker(cap="64KiB")
    assert disk_bytes(broker.file) <= cap
    first = fill(broker.port, 0)
    assert first > 150
    assert disk_bytes(broker.file) <= cap
    bodies = drain(broker.port)
    assert [b[:12] for b in bodies] == [b"fill-%07d" % i for i in range(first)]
    assert disk_bytes(broker.file) <= cap
    for lap in range(1, 4):
        n = fill(broker.port, lap * 10000)
        assert n >= first * 0.9
        assert disk_bytes(broker.file) <= cap
        broker.restart()
        assert f"recovered {n} messages" in broker.stderr_text()
        assert disk_bytes(broker.file) <= cap
        bodies = drain(broker.port)
        assert [b[:12] for b in bodies] == [b"fill-%07d" % i for i in range(lap * 10000, lap * 10000 + n)]
        assert disk_bytes(broker.file) <= cap


def test_message_larger_than_the_cap_allows_is_refused_and_nothing_is_harmed(curb_broker):
    broker = curb_broker(cap="64KiB")
    with Client("127.0.0.1", broker.port) as c:
        c.send(b"keep me", receipt="k")
        c.wait_receipt("k")
    with Client("127.0.0.1", broker.port) as c:
        with pytest.raises(StompError, match="too large") as raised:
            c.send(b"x" * 12000, receipt="big")
            c.wait_receipt("big")
    frame = raised.value.frame
    assert frame is not None, "the refusal is an ERROR frame, not a lost connection"
    # Refused at the head, from its content-length, before the body is read.
    limit = max_message_for(64 * 1024)
    assert frame.headers["message"] == f"body too large: content-length 12000 exceeds the limit of {limit} bytes"
    assert frame.headers["receipt-id"] == "big"
    assert drain(broker.port) == [b"keep me"]


def test_a_message_of_an_eighth_of_the_cap_is_stored(curb_broker):
    """Under -cap 64KiB a message of 8 KiB (the cap's eighth) fits beside others."""
    broker = curb_broker(cap="64KiB")
    big = b"b" * (64 * 1024 // 8)
    with Client("127.0.0.1", broker.port) as c:
        c.send(b"small", receipt="s")
        c.send(big, receipt="big")
        c.wait_receipt("big")
    assert drain(broker.port) == [b"small", big]


def send_all(port: int, count: int) -> None:
    with Client("127.0.0.1", port) as c:
        for i in range(count):
            c.send(b"torn-%04d" % i, receipt=f"t{i}")
        c.wait_receipt(f"t{count - 1}")


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_torn_or_corrupt_tail_drops_only_the_broken_record(curb_broker, damage):
    broker = curb_broker()
    send_all(broker.port, 20)
    broker.kill()
    entries = list(LogReader(broker.file).entries())
    assert len(entries) == 20
    last = entries[-1]
    if damage == "truncate":
        os.truncate(broker.file, last.offset + last.size // 2)
    else:
        with open(broker.file, "r+b") as f:
            # A byte of the body, which the CRC covers (the padding after it is not).
            f.seek(f.read().index(b"torn-0019", last.offset))
            f.write(b"#")
    broker.start()
    expected = "torn tail" if damage == "truncate" else "damaged bytes"
    assert expected in broker.stderr_text()
    assert "bytes in all, never delivered)" in broker.stderr_text()
    assert drain(broker.port) == [b"torn-%04d" % i for i in range(19)]
