"""Measurements of Curb against slow, greedy and hostile clients, each printing figures.

Run `bin/hostile` for every scenario, or `bin/hostile NAME ...` for some:

- fd-limit: a broker whose open-file limit is 1024 (soft and hard), flooded with connections
  for 10 s, with the default -max-connections and with the limit lifted past the fd limit
  (-max-connections 100000, as before Curb had one): stderr bytes, broker CPU seconds, and
  whether a good client is served once the flood's connections close.
- trickle: a 15 MiB SEND sent in tiny writes; the broker's peak RSS beside the frame size.
- count: produce throughput with 0 and with 1,000 connections subscribed to ./count.
- logins: produce throughput while 4 clients from 127.0.0.2 keep sending CONNECTs with
  wrong passwords (each costs the broker an scrypt check), beside the same without them,
  and what a good login from 127.0.0.1 gets meanwhile (`bin/bench-logins` measures more).
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
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from curb.frame import Frame, FrameParser, encode
from curb.spawn import BrokerProcess

FD_LIMIT = 1024  # the common default soft limit
BROKER_ENV: dict[str, str] | None = None  # set by --curb: the environment brokers run in
STARTED: list[BrokerProcess] = []  # killed when a scenario ends, however it ends


def start(workdir: Path, *flags: str, preexec_fn: Callable[[], None] | None = None) -> BrokerProcess:
    broker = BrokerProcess(cwd=workdir, env=BROKER_ENV, preexec_fn=preexec_fn)
    STARTED.append(broker)
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

    def __init__(self, port: int, timeout: float = 10.0, source: str = "127.0.0.1"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
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
    broker = start(workdir, "-cap", "128MiB", "-max-frame", "16MiB")  # a message may take a sixth of the cap
    client = Client(broker.port)
    client.connect()
    base = rss_bytes(broker.pid)
    head = encode("SEND", {"destination": "/queue/curb", "receipt": "r"}, b"")
    head = head[: head.index(b"content-length:")] + b"content-length:%d\n\n" % size
    client.sock.sendall(head)
    chunk = b"x" * 16
    sent, writes, started = 0, 0, time.monotonic()
    during = []
    while sent < size:
        n = min(len(chunk), size - sent)
        client.sock.sendall(chunk[:n])
        sent += n
        writes += 1
        if sent % (size // 4) == 0:
            during.append(rss_bytes(broker.pid) - base)
    client.sock.sendall(b"\0")
    frame = client.read()
    seconds = time.monotonic() - started
    peak = rss_bytes(broker.pid, "VmHWM")
    broker.stop()
    print(
        f"trickle: a {size >> 20} MiB SEND in {writes} writes of {len(chunk)} bytes took {seconds:.1f} s; "
        f"broker RSS {base / 2**20:.1f} MiB before, peak {peak / 2**20:.1f} MiB "
        f"(+{(peak - base) / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB frame); at each quarter sent: "
        f"+{', +'.join(f'{d / 2**20:.1f}' for d in during)} MiB; answer: "
        f"{frame.command + ' ' + frame.headers.get('message', '') if frame else 'none'}"
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


def count(workdir: Path, watchers: int = 1000, rounds: int = 2, seconds: float = 5.0) -> None:
    """Alternate runs without and with the watchers on one broker, so a busy machine
    skews both alike."""
    broker = start(workdir, "-cap", "1GiB")
    rates: dict[int, list[float]] = {0: [], watchers: []}
    for _ in range(rounds):
        rates[0].append(produce_rate(broker.port, seconds))
        idle = []
        for i in range(watchers):
            client = Client(broker.port)
            client.connect()
            client.send("SUBSCRIBE", {"id": f"c{i}", "destination": "./count"})
            idle.append(client)
        rates[watchers].append(produce_rate(broker.port, seconds))
        for client in idle:
            client.close()
    broker.stop()
    for n, runs in rates.items():
        print(f"count: {n} ./count subscribers: {', '.join(f'{r:.0f}' for r in runs)} msg/s produced")
    ratio = sum(rates[watchers]) / sum(rates[0])
    print(f"count: throughput with {watchers} subscribers is {ratio:.2f} of that with none")


# ---------------------------------------------------------------- flood


def flood(workdir: Path) -> None:
    broker = start(workdir, "-cap", "1MiB")
    greedy = Client(broker.port)
    greedy.connect()
    body = b"f" * 1000
    sent = 0
    answer: Frame | None = None
    send_frame = encode("SEND", {"destination": "/queue/curb"}, body)
    failed = ""
    while answer is None and sent < 100_000:
        try:
            greedy.sock.sendall(send_frame)
            sent += 1
            if not select.select([greedy.sock], [], [], 0)[0]:
                continue
            data = greedy.sock.recv(1 << 16)
        except OSError as err:
            failed = f" (then its socket failed: {err.strerror})"
            break
        if not data:
            break
        frames = greedy.parser.feed(data)
        answer = frames[0] if frames else None
    print(
        f"flood: after {sent} receipt-less SENDs of 1000 bytes into a 1 MiB log the producer got "
        f"{answer.command if answer else 'nothing'} {answer.headers.get('message') if answer else ''!r}{failed}"
    )
    consumer = Client(broker.port)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"id": "s", "destination": "/queue/curb", "ack": "client-individual"})
    for n in range(300):
        message = consumer.read()
        assert message is not None and message.command == "MESSAGE", message
        consumer.send("ACK", {"id": message.headers["ack"], **({"receipt": "a"} if n == 299 else {})})
    while (frame := consumer.read()) is not None and frame.command != "RECEIPT":
        pass
    producer = Client(broker.port)
    producer.connect()
    producer.send("SEND", {"destination": "/queue/curb", "receipt": "p"}, b"after")
    reply = producer.read()
    print(
        f"flood: a consumer then got and acked 300 messages (receipt: {frame is not None}); "
        f"another producer's SEND got {reply.command if reply else 'nothing'} "
        f"{reply.headers.get('message', '') if reply else ''}"
    )
    broker.stop()


def _bad_logins(port: int, stop: threading.Event, tried: list[int]) -> None:
    """CONNECTs from 127.0.0.2 with ever-different wrong passcodes: identical logins would
    share one check."""
    while not stop.is_set():
        try:
            client = Client(port, source="127.0.0.2")
            client.send("CONNECT", {"accept-version": "1.2", "login": "producer", "passcode": f"wrong {len(tried)}"})
            tried.append(1)
            time.sleep(0.01)  # the refusal comes a second later; no need to wait for it
            client.close()
        except OSError:
            pass


def logins(workdir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "curb", "passwd", "users", "producer", "--perm", "send"],
        input="pw\n",
        text=True,
        cwd=workdir,
        env=BROKER_ENV,
        check=True,
        capture_output=True,
    )
    broker = start(workdir, "-users", "users")

    client = Client(broker.port)
    client.send("CONNECT", {"accept-version": "1.2", "login": "producer", "passcode": "pw"})
    client.read()

    def rate() -> float:
        body, sent, n, end = b"m" * 100, 0, 0, time.monotonic() + 5.0
        while time.monotonic() < end:
            for _ in range(99):
                client.send("SEND", {"destination": "/queue/curb"}, body)
            n += 1
            client.send("SEND", {"destination": "/queue/curb", "receipt": str(n)}, body)
            client.read()
            sent += 100
        return sent / 5.0

    quiet = rate()
    stop, tried = threading.Event(), list[int]()
    threads = [threading.Thread(target=_bad_logins, args=(broker.port, stop, tried)) for _ in range(4)]
    for thread in threads:
        thread.start()
    busy = rate()
    fresh = Client(broker.port)
    fresh.send("CONNECT", {"accept-version": "1.2", "login": "producer", "passcode": "pw"})
    answer = fresh.read()
    stop.set()
    for thread in threads:
        thread.join()
    lines = broker.output().count("access refused to")
    broker.stop()
    print(
        f"logins: {quiet:.0f} msg/s produced alone, {busy:.0f} msg/s ({busy / quiet:.2f}) while 4 clients sent "
        f"{len(tried) / 5.0:.0f} bad logins a second from 127.0.0.2; a good login from 127.0.0.1 during the flood got "
        f"{answer.command + ' ' + answer.headers.get('message', '') if answer else 'nothing'}; "
        f"{lines} 'access refused' lines logged"
    )


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "fd-limit": fd_limit,
    "trickle": trickle,
    "count": count,
    "flood": flood,
    "logins": logins,
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
            try:
                SCENARIOS[name](Path(workdir))
            finally:
                for broker in STARTED:
                    broker.kill()
                STARTED.clear()
            sys.stdout.flush()


if __name__ == "__main__":
    main()
