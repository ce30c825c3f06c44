"""Measurements of Curb against slow, greedy and hostile clients, each printing figures.

Run `bin/hostile` for every scenario, or `bin/hostile NAME ...` for some:

- fd-limit: a broker whose open-file limit is 1024 (soft and hard), flooded with connections
  for 10 s, with the default -max-connections and with the limit lifted past the fd limit
  (-max-connections 100000, as before Curb had one): stderr bytes, broker CPU seconds, and
  whether a good client is served once the flood's connections close.
- trickle: a 15 MiB SEND sent in tiny writes; the broker's peak RSS beside the frame size.
- count: produce throughput with 0 and with 1,000 connections subscribed to ./count.
- flood: a producer sends receipt-less SENDs into a small log until the queue is full; what
  it gets, and whether another producer and a consumer are still served.

`--curb DIR` runs the brokers from another checkout's source (e.g. an older commit, from
`git archive`), for before-and-after figures. Not part of the default test run: these take
minutes and measure, they do not judge.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from curb.frame import Frame, FrameParser, encode
from curb.spawn import BrokerProcess

FD_LIMIT = 1024  # the common default soft limit
BROKER_ENV: dict[str, str] | None = None  # set by --curb: the environment brokers run in


def start(workdir: Path, *flags: str, preexec_fn: Callable[[], None] | None = None) -> BrokerProcess:
    broker = BrokerProcess(cwd=workdir, env=BROKER_ENV, preexec_fn=preexec_fn)
    broker.start(["-addr", "127.0.0.1:0", "-file", "curb.log", *flags])
    return broker


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


class Client:
    """A blocking STOMP connection, enough for measurements."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser(max_frame_bytes=64 << 20)
        self.frames: list[Frame] = []

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.sock.sendall(encode(command, headers or {}, body))

    def read(self) -> Frame | None:
        while not self.frames:
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def connect(self) -> Frame | None:
        self.send("CONNECT", {"accept-version": "1.2"})
        return self.read()

    def close(self) -> None:
        self.sock.close()


def served(port: int) -> bool:
    try:
        client = Client(port, timeout=5)
        frame = client.connect()
        client.close()
        return frame is not None and frame.command == "CONNECTED"
    except OSError:
        return False


# ---------------------------------------------------------------- fd-limit


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def fd_limit(workdir: Path) -> None:
    configs: list[tuple[str, list[str]]] = [("default flags", [])]
    if BROKER_ENV is None:  # another checkout may not know the flag
        configs.append(("-max-connections 100000", ["-max-connections", "100000"]))
    for label, flags in configs:
        broker = start(workdir, *flags, preexec_fn=_low_fd_limit)
        before_err, before_cpu = len(broker.output()), cpu_seconds(broker.pid)
        held: list[socket.socket] = []
        refused = 0
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            try:
                sock = socket.create_connection(("127.0.0.1", broker.port), timeout=1)
            except OSError:
                refused += 1
                time.sleep(0.01)
                continue
            if len(held) < 4 * FD_LIMIT:
                held.append(sock)
            else:
                sock.close()
                time.sleep(0.001)
        err_bytes = len(broker.output()) - before_err
        cpu = cpu_seconds(broker.pid) - before_cpu
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 10
        ok = False
        while not ok and time.monotonic() < deadline:
            ok = served(broker.port)
        lines = broker.output()[before_err:].splitlines()
        broker.stop()
        print(
            f"fd-limit ({label}, fd limit {FD_LIMIT}): 10 s of connection flood: {err_bytes} stderr bytes "
            f"({len(lines)} lines), broker CPU {cpu:.2f} s, client connects failed {refused}, "
            f"good client served afterwards: {ok}"
        )
        kinds = collections.Counter(" ".join(line.split()[:3]) for line in lines)
        for kind, n in kinds.most_common(4):
            print(f"    {n} lines starting {kind!r}")


# ---------------------------------------------------------------- trickle


def trickle(workdir: Path) -> None:
    size = 15 << 20
    broker = start(workdir, "-cap", "64MiB", "-max-frame", "16MiB")
    client = Client(broker.port)
    client.connect()
    base = rss_bytes(broker.pid)
    head = encode("SEND", {"destination": "/queue/curb", "receipt": "r"}, b"")
    head = head[: head.index(b"content-length:")] + b"content-length:%d\n\n" % size
    client.sock.sendall(head)
    chunk = b"x" * 16
    sent, writes, started = 0, 0, time.monotonic()
    while sent < size:
        n = min(len(chunk), size - sent)
        client.sock.send(chunk[:n])
        sent += n
        writes += 1
    client.sock.sendall(b"\0")
    frame = client.read()
    seconds = time.monotonic() - started
    peak = rss_bytes(broker.pid, "VmHWM")
    broker.stop()
    print(
        f"trickle: a {size >> 20} MiB SEND in {writes} writes of {len(chunk)} bytes took {seconds:.1f} s; "
        f"broker RSS {base / 2**20:.1f} MiB before, peak {peak / 2**20:.1f} MiB "
        f"(+{(peak - base) / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB frame); answer: "
        f"{frame.command if frame else 'none'}"
    )


# ---------------------------------------------------------------- count


def produce_rate(port: int, seconds: float, batch: int = 100) -> float:
    """Messages per second one producer gets stored, with a receipt every `batch` SENDs."""
    client = Client(port)
    client.connect()
    body = b"m" * 100
    sent, n, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(batch - 1):
            client.send("SEND", {"destination": "/queue/curb"}, body)
        n += 1
        client.send("SEND", {"destination": "/queue/curb", "receipt": str(n)}, body)
        frame = client.read()
        assert frame is not None and frame.command == "RECEIPT", frame
        sent += batch
    rate = sent / seconds
    client.close()
    return rate


def count(workdir: Path, watchers: int = 1000) -> None:
    rates = {}
    for n in (0, watchers):
        broker = start(workdir, "-cap", "1GiB")
        idle = []
        for i in range(n):
            client = Client(broker.port)
            client.connect()
            client.send("SUBSCRIBE", {"id": f"c{i}", "destination": "./count"})
            idle.append(client)
        # The watchers read nothing: their kernel buffers fill, which is the worst case for the broker.
        rates[n] = produce_rate(broker.port, 10.0)
        cpu = cpu_seconds(broker.pid)
        for client in idle:
            client.close()
        broker.stop()
        (workdir / "curb.log").unlink()
        print(f"count: {n} ./count subscribers: {rates[n]:.0f} msg/s produced (broker CPU {cpu:.1f} s in all)")
    print(f"count: throughput with {watchers} subscribers is {rates[watchers] / rates[0]:.2f} of that with none")


# ---------------------------------------------------------------- flood


def flood(workdir: Path) -> None:
    broker = start(workdir, "-cap", "1MiB")
    greedy = Client(broker.port)
    greedy.connect()
    body = b"f" * 1000
    sent = 0
    greedy.sock.settimeout(0)
    answer: Frame | None = None
    while answer is None and sent < 100_000:
        greedy.send("SEND", {"destination": "/queue/curb"}, body)
        sent += 1
        try:
            data = greedy.sock.recv(1 << 16)
        except BlockingIOError:
            continue
        frames = greedy.parser.feed(data)
        answer = frames[0] if frames else None
    print(
        f"flood: after {sent} receipt-less SENDs of 1000 bytes into a 1 MiB log the producer got "
        f"{answer.command if answer else 'nothing'} {answer.headers.get('message') if answer else ''!r}"
    )
    other = Client(broker.port)
    other.connect()
    other.send("SUBSCRIBE", {"id": "s", "destination": "/queue/curb", "ack": "client-individual"})
    message = other.read()
    assert message is not None
    other.send("ACK", {"id": message.headers["ack"], "receipt": "a"})
    while (frame := other.read()) is not None and frame.command != "RECEIPT":
        pass
    producer = Client(broker.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/curb", "receipt": "p"}, b"after")
    reply = producer.read()
    print(
        f"flood: another consumer got a message and its ACK receipt ({frame is not None}); another producer's SEND got "
        f"{reply.command if reply else 'nothing'} {reply.headers.get('message', '') if reply else ''}"
    )
    broker.stop()


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "fd-limit": fd_limit,
    "trickle": trickle,
    "count": count,
    "flood": flood,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--curb", metavar="DIR", help="run the brokers from this source tree")
    parser.add_argument("names", nargs="*", choices=[*SCENARIOS, []], help="scenarios to run (default: all)")
    args = parser.parse_args()
    names = args.names or list(SCENARIOS)
    if args.curb:
        global BROKER_ENV
        BROKER_ENV = {**os.environ, "PYTHONPATH": os.path.abspath(args.curb)}
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the clients need more than the broker
    for name in names:
        with tempfile.TemporaryDirectory(prefix="curb-hostile-") as workdir:
            SCENARIOS[name](Path(workdir))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
