"""Logins under load: a reconnect storm of valid users, and a flood of bad logins.

    bin/bench-logins [--clients 2000] [--users 10] [--procs 4] [--flood-seconds 8] [--curb DIR]

Each case starts a broker with a users file (real scrypt hashes) in a temporary directory,
and a bystander client, connected before the case starts in its own process, that does a
round trip (SUBSCRIBE, then UNSUBSCRIBE with a receipt) every 10 ms; its worst round trip
is printed with each case.

- storm, plain and TLS: a fresh broker, so no login is cached; `--clients` clients of
  `--users` users, all with correct passcodes, connect at once from `--procs` processes.
  Prints the seconds until every one of them was CONNECTED, what the others got, the
  broker's RSS while they are all connected, and the bystander's round trips while they
  all close at once and a second after (the broker's teardown of them).
- flood: four clients from 127.0.0.2 send CONNECTs with wrong, ever-different passcodes
  (each costs an scrypt check), dropping each connection 10 ms later; meanwhile ten users
  from 127.0.0.1 log in for the first time, one after another. Prints the flood's rate and
  those logins' times, beside the same logins with no flood.

`--curb DIR` runs the brokers from another source tree (e.g. an older commit from `git
archive`), for before-and-after figures. Not part of the test run: it measures, it does
not judge.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import secrets
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path

import trustme

from benchmark.broker import rss_bytes
from curb import users
from curb.frame import FrameParser, encode
from curb.spawn import BrokerProcess

BYSTANDER = "bystander"
ROUND_TRIP_EVERY = 0.01
# A client's close is done before the broker has torn its connection down (a plain one
# does not wait for the broker at all): the bystander goes on this long after the last.
TEARDOWN_SECONDS = 1.0
FLOOD_THREADS = 4
FRESH_USERS = 10


class Endpoint:
    """Where the broker listens, and the TLS context to reach it with (None: plain)."""

    def __init__(self, port: int, ca_file: str | None):
        self.port = port
        self.ca_file = ca_file

    def context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    def open(self, source: str = "127.0.0.1", timeout: float = 30.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout, source_address=(source, 0))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = self.context()
        return context.wrap_socket(sock, server_hostname="127.0.0.1") if context else sock


def connect_frame(login: str, passcode: str) -> bytes:
    return encode("CONNECT", {"accept-version": "1.2", "login": login, "passcode": passcode})


def read_frame(sock: socket.socket, parser: FrameParser) -> str:
    """The next frame's command (and message header, for an ERROR); "closed" at EOF."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return "closed"
        frames = parser.feed(data)
        if frames:
            frame = frames[0]
            return frame.command + (f" {frame.headers.get('message')}" if frame.command == "ERROR" else "")


def passcode_of(name: str) -> str:
    return f"{name}-passcode"


# ---------------------------------------------------------------- the bystander


def bystander(endpoint: Endpoint, ready: Connection, orders: Connection) -> None:
    """Log in, say so, then do round trips; at each order send back the worst and the 99th
    percentile round trip since the last (in seconds) and how many were done, and stop at
    "stop"."""
    sock = endpoint.open()
    parser = FrameParser()
    sock.sendall(connect_frame(BYSTANDER, passcode_of(BYSTANDER)))
    answer = read_frame(sock, parser)
    ready.send(answer)
    trip = encode("SUBSCRIBE", {"id": "b", "destination": "/queue/curb"}) + encode(
        "UNSUBSCRIBE", {"id": "b", "receipt": "r"}
    )
    times: list[float] = []
    while True:
        if orders.poll(ROUND_TRIP_EVERY):
            order = orders.recv()
            times.sort()
            ready.send((times[-1], times[int(len(times) * 0.99)], len(times)) if times else (0.0, 0.0, 0))
            times = []
            if order == "stop":
                break
        started = time.monotonic()
        sock.sendall(trip)
        if read_frame(sock, parser) != "RECEIPT":
            raise SystemExit("the bystander lost its connection")
        times.append(time.monotonic() - started)
    sock.close()


class Bystander:
    """The bystander's process: `mark()` and `result()` each say how its round trips went
    since the last call (or since it logged in)."""

    def __init__(self, endpoint: Endpoint):
        context = multiprocessing.get_context("spawn")
        self._ready, child_ready = context.Pipe()
        self._orders, child_orders = context.Pipe()
        self._process = context.Process(target=bystander, args=(endpoint, child_ready, child_orders), daemon=True)

    def __enter__(self) -> Bystander:
        self._process.start()
        answer = self._ready.recv()
        if answer != "CONNECTED":
            raise SystemExit(f"the bystander's login got {answer}")
        return self

    def mark(self, order: str = "mark") -> str:
        self._orders.send(order)
        worst, p99, trips = self._ready.recv()
        return f"worst {worst * 1000:.1f} ms, 99th percentile {p99 * 1000:.1f} ms ({trips} round trips)"

    def __exit__(self, *exc: object) -> None:
        if self._process.is_alive():
            self.mark("stop")
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()


# ---------------------------------------------------------------- the storm


async def storm_share(endpoint: Endpoint, names: list[str], start_at: float, out: Connection) -> None:
    """Log in as each of `names` at once (from start_at); send back what each got and when
    the last CONNECTED came (seconds after start_at), then close them all when told."""
    context = endpoint.context()
    writers: list[asyncio.StreamWriter] = []

    async def one(name: str) -> tuple[str, float]:
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", endpoint.port, ssl=context, server_hostname="127.0.0.1" if context else None
            )
        except OSError as err:
            return f"connect failed ({err.strerror or err})", 0.0
        writers.append(writer)
        writer.write(connect_frame(name, passcode_of(name)))
        try:
            data = await reader.readuntil(b"\0")
        except (asyncio.IncompleteReadError, OSError):
            return "closed", 0.0
        command = data.split(b"\n", 1)[0].decode()
        if command == "ERROR":
            message = [line for line in data.split(b"\n") if line.startswith(b"message:")]
            command += " " + (message[0][8:].decode() if message else "")
        return command, time.monotonic() - start_at

    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    results = await asyncio.gather(*(one(name) for name in names))
    got = Counter(answer for answer, _ in results)
    out.send((got, max((t for answer, t in results if answer == "CONNECTED"), default=0.0)))
    out.recv()
    for writer in writers:
        writer.close()
    await asyncio.gather(*(writer.wait_closed() for writer in writers), return_exceptions=True)
    out.send("closed")


def storm_process(endpoint: Endpoint, names: list[str], out: Connection) -> None:
    _raise_fd_limit()
    out.send("ready")
    start_at = out.recv()
    asyncio.run(storm_share(endpoint, names, start_at, out))


def storm(
    endpoint: Endpoint, clients: int, user_count: int, procs: int, watcher: Bystander, broker_pid: int
) -> list[str]:
    context = multiprocessing.get_context("spawn")
    names = [f"user{n % user_count}" for n in range(clients)]
    pipes, processes = [], []
    for share in range(procs):
        mine, theirs = context.Pipe()
        process = context.Process(target=storm_process, args=(endpoint, names[share::procs], theirs))
        process.start()
        pipes.append(mine)
        processes.append(process)
    for pipe in pipes:
        pipe.recv()  # started and waiting
    lines = [f"bystander's round trips while the clients' processes started: {watcher.mark()}"]
    start_at = time.monotonic() + 0.1
    for pipe in pipes:
        pipe.send(start_at)
    got: Counter[str] = Counter()
    last = 0.0
    for pipe in pipes:
        share_got, share_last = pipe.recv()
        got.update(share_got)
        last = max(last, share_last)
    answers = ", ".join(f"{n} {answer}" for answer, n in got.most_common())
    every = "all" if got["CONNECTED"] == clients else "NOT all"
    lines.append(f"{clients} clients of {user_count} users at once: {answers}; {every} CONNECTED within {last:.2f} s")
    lines.append(f"broker's RSS with them connected: {rss_bytes(broker_pid) / (1 << 20):.0f} MiB")
    lines.append(f"bystander's round trips during the storm: {watcher.mark()}")
    closing = time.monotonic()
    for pipe in pipes:
        pipe.send("close")
    for pipe, process in zip(pipes, processes, strict=True):
        pipe.recv()
        process.join()
    closed = time.monotonic() - closing
    time.sleep(TEARDOWN_SECONDS)
    lines.append(
        f"bystander's round trips while the {clients} clients closed ({closed:.2f} s) and "
        f"{TEARDOWN_SECONDS:.0f} s after: {watcher.mark()}"
    )
    return lines


# ---------------------------------------------------------------- the flood


def flood_thread(endpoint: Endpoint, stop: threading.Event, tried: list[int]) -> None:
    while not stop.is_set():
        try:
            sock = endpoint.open(source="127.0.0.2", timeout=5)
            sock.sendall(connect_frame("user0", secrets.token_hex(8)))
            tried.append(1)
            time.sleep(0.01)  # the refusal comes a second later; no need to wait for it
            sock.close()
        except OSError:
            time.sleep(0.01)


def flood_process(endpoint: Endpoint, seconds: float, out: Connection) -> None:
    stop, tried = threading.Event(), list[int]()
    threads = [threading.Thread(target=flood_thread, args=(endpoint, stop, tried)) for _ in range(FLOOD_THREADS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    out.send(len(tried) / seconds)


def first_logins(endpoint: Endpoint, names: list[str]) -> tuple[float, float, Counter[str]]:
    """Log in as each name in turn (first logins: each costs a check); the worst and the
    median seconds to an answer, and the answers."""
    times, got = [], Counter[str]()
    for name in names:
        started = time.monotonic()
        sock = endpoint.open()
        sock.sendall(connect_frame(name, passcode_of(name)))
        got[read_frame(sock, FrameParser())] += 1
        times.append(time.monotonic() - started)
        sock.close()
    times.sort()
    return times[-1], times[len(times) // 2], got


def flood(endpoint: Endpoint, seconds: float) -> list[str]:
    worst, median, got = first_logins(endpoint, [f"quiet{n}" for n in range(FRESH_USERS)])
    lines = [
        f"no flood: {FRESH_USERS} first logins from 127.0.0.1 one after another: worst {worst * 1000:.0f} ms, "
        f"median {median * 1000:.0f} ms ({_answers(got)})"
    ]
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=flood_process, args=(endpoint, seconds, theirs))
    process.start()
    time.sleep(seconds / 4)  # let the flood fill the queue
    worst, median, got = first_logins(endpoint, [f"fresh{n}" for n in range(FRESH_USERS)])
    rate = mine.recv()
    process.join()
    lines.append(
        f"flood of {rate:.0f} bad logins a second from 127.0.0.2: {FRESH_USERS} first logins from "
        f"127.0.0.1 meanwhile: worst {worst * 1000:.0f} ms, median {median * 1000:.0f} ms ({_answers(got)})"
    )
    return lines


def _answers(got: Counter[str]) -> str:
    return ", ".join(f"{n} {answer}" for answer, n in got.most_common())


# ---------------------------------------------------------------- set-up


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def write_users(path: Path, user_count: int) -> None:
    names = [BYSTANDER, *(f"user{n}" for n in range(user_count))]
    names += [f"{kind}{n}" for kind in ("quiet", "fresh") for n in range(FRESH_USERS)]
    table = [users.User(name, users.hash_password(passcode_of(name)), frozenset(users.PERMISSIONS)) for name in names]
    path.write_text(users.format_users(table))


def start(workdir: Path, env: dict[str, str] | None, tls: bool) -> tuple[BrokerProcess, Endpoint]:
    broker = BrokerProcess(cwd=workdir, env=env)
    flags = ["-file", "curb.log", "-users", "users"]
    if tls:
        flags += ["-addr", "off", "-tls-addr", "127.0.0.1:0", "-tls-cert", "server.pem", "-tls-key", "server.key"]
    else:
        flags += ["-addr", "127.0.0.1:0"]
    port = broker.start(flags)
    return broker, Endpoint(port, str(workdir / "ca.pem") if tls else None)


def write_certs(workdir: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_pem.write_to_path(str(workdir / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(workdir / "server.pem"))
    ca.cert_pem.write_to_path(str(workdir / "ca.pem"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-logins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000, help="clients in the storm (default 2000)")
    parser.add_argument("--users", type=int, default=10, help="users they log in as (default 10)")
    parser.add_argument("--procs", type=int, default=4, help="processes the storm's clients run in (default 4)")
    parser.add_argument("--flood-seconds", type=float, default=8.0, help="how long the flood lasts (default 8)")
    parser.add_argument("--curb", metavar="DIR", help="run the brokers from this source tree")
    parser.add_argument("cases", nargs="*", choices=["plain", "tls", "flood", []], help="default: all")
    args = parser.parse_args()
    _raise_fd_limit()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.curb)} if args.curb else None
    with tempfile.TemporaryDirectory(prefix="curb-bench-logins-") as name:
        workdir = Path(name)
        write_users(workdir / "users", args.users)
        write_certs(workdir)
        for case in args.cases or ["plain", "tls", "flood"]:
            broker, endpoint = start(workdir, env, tls=case == "tls")
            try:
                with Bystander(endpoint) as watcher:
                    time.sleep(1.0)
                    lines = [f"bystander's round trips for a second before: {watcher.mark()}"]
                    if case == "flood":
                        lines += flood(endpoint, args.flood_seconds)
                    else:
                        lines += storm(endpoint, args.clients, args.users, args.procs, watcher, broker.pid)
                    if case == "flood":
                        lines.append(f"bystander's round trips meanwhile: {watcher.mark()}")
                for line in lines:
                    print(f"{case}: {line}", flush=True)
            finally:
                broker.stop()
                (workdir / "curb.log").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
