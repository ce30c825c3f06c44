"""Flow control of a running broker: a client that does not read can neither grow the
broker's memory nor take messages it will never get."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from curb.client import Client
from curb.frame import encode

QUEUE = "/queue/curb"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def stalled_client(port: int) -> socket.socket:
    """A connected STOMP client with a small receive buffer that will never read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "localhost"}))
    return sock


def push(sock: socket.socket, data: bytes, limit: int, stall: float = 1.0) -> int:
    """Send `data` over and over until `limit` bytes went or the peer stopped taking them
    for `stall` seconds; the bytes sent."""
    sock.settimeout(stall)
    sent = 0
    try:
        while sent < limit:
            sent += sock.send(data)
    except TimeoutError:
        pass
    return sent


def test_a_client_that_never_reads_cannot_grow_the_broker(curb_broker):
    broker = curb_broker()
    pid = broker.proc.pid
    with Client("127.0.0.1", broker.port) as bystander:
        bystander.connect()
        before = rss_mib(pid)
        sock = stalled_client(broker.port)
        # Each frame costs 15 kB in and comes back as a 15 kB RECEIPT plus a ./count MESSAGE.
        frame = encode("SUBSCRIBE", {"id": "c", "destination": "./count", "receipt": "r" * 15000})
        limit = 64 << 20
        sent = push(sock, frame * 16, limit)
        # What the kernel's socket buffers hold (a few MiB), not all that was offered.
        assert sent < limit // 2, "the broker kept reading from a client it could not write to"
        grown = rss_mib(pid) - before
        assert grown < 16, f"the broker grew by {grown:.0f} MiB for a client that does not read"
        bystander.send(b"still served", receipt="r1")
        bystander.wait_receipt("r1", timeout=10)
        sock.close()


def test_an_auto_ack_consumer_that_never_reads_leaves_the_rest_in_the_log(curb_broker):
    broker = curb_broker(cap="64MiB")
    count, size = 3000, 10_000
    with Client("127.0.0.1", broker.port) as producer:
        producer.connect()
        for i in range(count):
            producer.send(b"%05d" % i + b"x" * size, receipt="last" if i == count - 1 else None)
        producer.wait_receipt("last", timeout=60)
    stalled = stalled_client(broker.port)
    stalled.sendall(encode("SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "auto", "prefetch-count": "1"}))
    time.sleep(1.5)
    with Client("127.0.0.1", broker.port) as consumer:
        consumer.connect()
        consumer.subscribe("r", ack="client-individual", prefetch=1000)
        got = []
        while (frame := consumer.receive(timeout=2.0)) is not None:
            if frame.command == "MESSAGE":
                got.append(frame.body[:5])
                consumer.ack(frame.headers["ack"])
    # Only what the stalled consumer's transport could hold was taken from the log: the
    # output bound (256 KiB) and the kernel's socket buffers, not the whole queue.
    taken = count - len(got)
    assert taken * size < 12 << 20, f"{taken} messages went to a consumer that never read"
    assert len(set(got)) == len(got)
    stalled.close()
