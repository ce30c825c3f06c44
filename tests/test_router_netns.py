"""Many machines on one: instances in three network namespaces, each reached over a veth
pair from the namespace the router runs in, and one link cut and restored mid-stream.
No receipted SEND may be lost and no message whose ACK got a RECEIPT may come back.

The namespaces, links and addresses (10.231.N.0/24) are made by the test and removed
after it; nothing else is touched. Skipped, with the reason, where namespaces cannot be
made (not root, no `ip`, a container without CAP_SYS_ADMIN)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from curb.client import Client, StompError
from curb.spawn import BrokerProcess

CLONE_NEWNET = 0x40000000
PORT = 61613
SENDS = 600


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def _can_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"curbprobe{os.getpid()}"
    made = ip("netns", "add", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    ip("netns", "del", probe)
    return None


def enter(namespace: str) -> Callable[[], None]:
    """A preexec_fn that moves the child into a named network namespace (setns(2))."""
    path = f"/run/netns/{namespace}"

    def move() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            os._exit(99)
        os.close(fd)

    return move


class Hosts:
    """Three namespaces, `hostN` at 10.231.N.2, its veth peer at 10.231.N.1 here."""

    def __init__(self, tag: str):
        self.names = [f"curb{tag}h{n}" for n in range(1, 4)]
        self.made: list[str] = []

    def make(self) -> None:
        for n, name in enumerate(self.names, start=1):
            outside, inside = f"{name}o", f"{name}i"
            steps = [
                ("netns", "add", name),
                ("link", "add", outside, "type", "veth", "peer", "name", inside),
                ("link", "set", inside, "netns", name),
                ("addr", "add", f"10.231.{n}.1/24", "dev", outside),
                ("link", "set", outside, "up"),
                ("-n", name, "addr", "add", f"10.231.{n}.2/24", "dev", inside),
                ("-n", name, "link", "set", inside, "up"),
                ("-n", name, "link", "set", "lo", "up"),
            ]
            self.made.append(name)
            for step in steps:
                result = ip(*step)
                assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"

    def address(self, n: int) -> str:
        return f"10.231.{n}.2"

    def cut(self, n: int, up: bool) -> None:
        result = ip("link", "set", f"{self.names[n - 1]}o", "up" if up else "down")
        assert result.returncode == 0, result.stderr

    def remove(self) -> None:
        for name in self.made:
            ip("link", "del", f"{name}o")
            ip("netns", "del", name)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    why = _can_make_namespaces()
    if why is not None:
        pytest.skip(why)
    made = Hosts(str(os.getpid() % 100000))
    try:
        made.make()
        yield made
    finally:
        made.remove()


def test_a_link_cut_and_restored_mid_stream_loses_nothing_and_undoes_no_ack(hosts, curb_router, tmp_path: Path):
    instances = []
    for n in range(1, 4):
        child = BrokerProcess(cwd=tmp_path, output=tmp_path / f"h{n}.stderr", preexec_fn=enter(hosts.names[n - 1]))
        flags = ["-addr", f"{hosts.address(n)}:{PORT}", "-file", str(tmp_path / f"h{n}.log"), "-cap", "10MiB"]
        child.start([*flags, "-heartbeat", "300ms"])
        instances.append(child)
    try:
        route = "p=" + ",".join(f"{hosts.address(n)}:{PORT}" for n in range(1, 4))
        router = curb_router([route], ["-link-heartbeat", "300ms", "-link-wait", "30s"])
        receipted: set[bytes] = set()
        acked: set[bytes] = set()  # ACKs that got a plain RECEIPT: done for good
        # ACKs whose RECEIPT said curb-unconfirmed (their link was lost, so they may or
        # may not have taken effect: the message comes again if not) or curb-late (the
        # message's link was lost before the ACK: it changed nothing).
        maybe: set[bytes] = set()
        seen_after_ack: list[bytes] = []
        lock = threading.Lock()
        stop = threading.Event()

        def consume() -> None:
            with Client("127.0.0.1", router.port, timeout=30) as consumer:
                consumer.subscribe("s", destination="/queue/p", prefetch=12)
                pending: dict[str, bytes] = {}
                n = 0
                while not stop.is_set() or pending:
                    frame = consumer.receive(0.2)
                    if frame is None:
                        if stop.is_set() and not pending:
                            break
                        continue
                    if frame.command == "MESSAGE":
                        with lock:
                            if frame.body in acked:
                                seen_after_ack.append(frame.body)
                        n += 1
                        pending[f"a{n}"] = frame.body
                        consumer.ack(frame.headers["ack"], receipt=f"a{n}")
                    elif frame.command == "RECEIPT" and frame.headers["receipt-id"] in pending:
                        body = pending.pop(frame.headers["receipt-id"])
                        with lock:
                            plain = not {"curb-late", "curb-unconfirmed"} & frame.headers.keys()
                            (acked if plain else maybe).add(body)

        consumer_thread = threading.Thread(target=consume, daemon=True)
        consumer_thread.start()
        with Client("127.0.0.1", router.port, timeout=60) as producer:
            batch: list[bytes] = []
            for n in range(SENDS):
                body = b"m%d" % n
                producer.send(body, receipt=body.decode(), destination="/queue/p")
                batch.append(body)
                if len(batch) == 20:  # receipts come in order: the last one answers for the batch
                    producer.wait_receipt(body.decode())
                    receipted.update(batch)
                    batch = []
                if n == SENDS // 3:
                    hosts.cut(2, up=False)
                if n == 2 * SENDS // 3:
                    hosts.cut(2, up=True)
                time.sleep(0.002)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if receipted <= acked | maybe:
                    break
            time.sleep(0.1)
        stop.set()
        consumer_thread.join(30)
        assert "is down" in router.stderr_text(), "the cut was never noticed"
        with lock:
            assert sorted(receipted - acked - maybe) == []
            assert seen_after_ack == []
        # What is still queued on the instances may only be messages whose ACK's fate was
        # unknown (they come again); none whose ACK got a plain RECEIPT.
        for n in range(1, 4):
            with Client(hosts.address(n), PORT) as direct:
                live = {frame.body for frame in direct.browse()}
            assert sorted(live & acked) == []
    finally:
        for child in instances:
            child.kill()


def test_instances_in_namespaces_cannot_be_reached_without_their_link(hosts, tmp_path: Path):
    """The namespaces are real: an instance there is reachable over its veth pair only."""
    child = BrokerProcess(cwd=tmp_path, preexec_fn=enter(hosts.names[0]))
    child.start(["-addr", f"{hosts.address(1)}:{PORT}", "-file", str(tmp_path / "x.log"), "-cap", "1MiB"])
    try:
        with Client(hosts.address(1), PORT) as client:
            client.send(b"x", receipt="r")
            client.wait_receipt("r")
        hosts.cut(1, up=False)
        with pytest.raises((OSError, StompError)):
            Client(hosts.address(1), PORT, timeout=1).connect()
    finally:
        child.kill()
