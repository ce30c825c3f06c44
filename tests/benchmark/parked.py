"""Parked messages through the real broker: its memory with a million delayed messages or
dead letters, live and after a restart, and the restart's time.

    bin/bench-parked [--messages 1000000] [--body 100] [--cap 512MiB] [--case delayed,dead]

Each case starts a broker on a new log and makes N parked messages the way clients do:

- delayed: N SENDs with `curb-delay` of an hour, each with a receipt, pipelined with at
  most WINDOW receipts outstanding on one connection;
- dead: N such SENDs with `curb-ttl:1` instead, then one consumer subscribes, so that the
  queue finds them all expired on the way to a delivery and makes them dead letters.

Once `./count` says N delayed (or dead) it reads the broker's RSS (live), stops it with
SIGTERM, starts it again on the same log and reports the seconds from launch to a
CONNECTED and the RSS then, checking `./count` once more. The targets the README
states: RSS at most 60 MiB, live and after the restart, and a restart under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

from benchmark.broker import CurbBroker, rss_bytes
from curb.client import Client
from curb.frame import encode

HOUR_MS = 3_600_000
WINDOW = 1000  # receipts outstanding at most while storing
WAIT_EVERY = 100  # SENDs written between waits for the receipt WINDOW behind
SETTLE = 0.5  # seconds for what an operation allocated to settle before RSS is read
TIMEOUT = 600.0
TARGET_RSS_MIB = 60
TARGET_RESTART_S = 2.0


def store(port: int, messages: int, headers: dict[str, str], body: bytes) -> float:
    """SEND `messages` copies of `body` with `headers`, each with a receipt, at most WINDOW
    unanswered; returns the seconds until the last receipt."""
    started = time.monotonic()
    with Client("127.0.0.1", port, timeout=TIMEOUT) as c:
        for n in range(messages):
            c.write(encode("SEND", {"destination": "/queue/curb", **headers, "receipt": f"r{n}"}, body))
            if n >= WINDOW and n % WAIT_EVERY == 0:
                c.wait_receipt(f"r{n - WINDOW}")
        if messages:
            c.wait_receipt(f"r{messages - 1}")
    return time.monotonic() - started


def counts(port: int) -> dict[str, int]:
    """The queue's counts now, from `./count`."""
    with Client("127.0.0.1", port, timeout=TIMEOUT) as c:
        c.subscribe("count", "./count")
        return json.loads(c.receive().body)


def dead_letter_all(port: int, messages: int) -> float:
    """Subscribe a consumer and wait until `./count` says `messages` dead: the queue met
    them all expired. Returns the seconds it took."""
    started = time.monotonic()
    with Client("127.0.0.1", port, timeout=TIMEOUT) as c:
        c.subscribe("count", "./count")
        c.subscribe("take", prefetch=1000)
        while True:
            frame = c.receive()
            if frame.headers.get("subscription") == "take":
                raise SystemExit(f"a consumer got message {frame.headers.get('message-id')}: none should be live")
            if json.loads(frame.body)["dead"] >= messages:
                return time.monotonic() - started


def expect(port: int, state: str, messages: int, when: str) -> None:
    found = counts(port)
    if found[state] != messages:
        raise SystemExit(f"./count {when} says {found}, expected {state}: {messages}")


def run_case(
    workdir: str, cap: str, messages: int, state: str, make: Callable[[int], float]
) -> tuple[float, int, float, int]:
    """(seconds to make the messages, live RSS, seconds from launch to CONNECTED at the
    restart, RSS after it) of a broker on a new log in which `make(port)` parks `messages`
    in `state`."""
    path = os.path.join(workdir, f"curb-{state}.log")
    broker = CurbBroker(path, cap, TIMEOUT)
    try:
        broker.start()
        port = broker.target.port
        made = make(port)
        expect(port, state, messages, "live")
        time.sleep(SETTLE)
        live = rss_bytes(broker.pid)
        broker.stop()
        restart = broker.start()
        time.sleep(SETTLE)
        after = rss_bytes(broker.pid)
        expect(port, state, messages, "after the restart")
        broker.stop()
    except BaseException:
        broker.kill()
        raise
    os.unlink(path)
    return made, live, restart, after


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-parked", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100, help="body bytes of each message")
    parser.add_argument("--cap", default="512MiB")
    parser.add_argument("--case", default="delayed,dead", help="the cases to run, comma-separated")
    args = parser.parse_args()
    n, body = args.messages, b"b" * args.body

    def delayed(port: int) -> float:
        return store(port, n, {"curb-delay": str(HOUR_MS)}, body)

    def dead(port: int) -> float:
        return store(port, n, {"curb-ttl": "1"}, body) + dead_letter_all(port, n)

    cases = {"delayed": delayed, "dead": dead}
    chosen = args.case.split(",")
    if unknown := set(chosen) - set(cases):
        parser.error(f"unknown --case {', '.join(sorted(unknown))}: choose from {', '.join(cases)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="curb-bench-parked-") as workdir:
        for state in chosen:
            made, live, restart, after = run_case(workdir, args.cap, n, state, cases[state])
            rows.append((f"{n:,} {state}", made, live, restart, after))
            print(f"{rows[-1][0]}: made in {made:.1f} s", flush=True)
    print(f"{'case':<20} {'live RSS MiB':>12} {'restart s':>9} {'RSS after MiB':>13} {'(made in s)':>12}")
    for name, made, live, restart, after in rows:
        print(f"{name:<20} {live / 2**20:12.1f} {restart:9.2f} {after / 2**20:13.1f} {made:12.1f}")
    print(f"{'target':<20} {TARGET_RSS_MIB:>12} {'< ' + str(TARGET_RESTART_S):>9} {TARGET_RSS_MIB:>13}")


if __name__ == "__main__":
    main()
