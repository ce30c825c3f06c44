"""Delayed messages at rest: the broker's memory and restart time with a million of them.

    bin/bench-delayed [--messages 1000000] [--body 100] [--cap 512MiB]

It writes a log of N delayed messages (due from one to two hours ahead, spread, so that
none comes due while it runs) straight through the log core, as a broker that took N
delayed SENDs would have left it, and the same log with N messages not delayed. Then for
each it starts the broker on it and reports the seconds from launch to a CONNECTED
(start-up's recovery walk rebuilds the index of parked records from the record headers)
(and the log's own recovery time, from the broker's start-up line) and the broker's
resident memory then. An empty log gives the baseline. The targets the
README states: RSS at most 60 MiB and restart under 2 s for 1,000,000 delayed messages.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time

from benchmark.broker import CurbBroker, rss_bytes
from curb.log import LogCore, parse_size
from curb.log.disk import FileDisk

HOUR_MS = 3_600_000
BATCH = 20_000
TIMEOUT = 600.0


def write_log(path: str, cap: int, messages: int, body: bytes, delayed: bool) -> float:
    """A log holding `messages` SENDs of `body`, delayed or not; returns the seconds it took."""
    started = time.monotonic()
    disk = FileDisk(path)
    log = LogCore(disk, cap)
    now_ms = time.time_ns() // 1_000_000
    payload = b"destination:/queue/curb\n\n" + body
    for n in range(messages):
        due = now_ms + HOUR_MS + (n * 7919) % HOUR_MS if delayed else 0
        log.append(payload, urgent=False, due_ms=due)
        if n % BATCH == BATCH - 1:
            log.flush()
            log.sync()
    log.final_checkpoint()
    disk.close()
    return time.monotonic() - started


def measure(path: str, cap: str) -> tuple[float, float, int]:
    """(seconds from launch to CONNECTED, seconds of the log's recovery, RSS bytes then) of
    a broker started on `path`."""
    broker = CurbBroker(path, cap, TIMEOUT)
    try:
        seconds = broker.start()
        time.sleep(0.5)  # what start-up allocated settles
        rss = rss_bytes(broker.pid)
        broker.stop()
    except BaseException:
        broker.kill()
        raise
    found = re.search(r"recovered .* in ([0-9.]+)s", broker.log_tail())
    return seconds, float(found.group(1)) if found else float("nan"), rss


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-delayed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=100, help="body bytes of each message")
    parser.add_argument("--cap", default="512MiB")
    args = parser.parse_args()
    cap = parse_size(args.cap)
    body = b"b" * args.body
    with tempfile.TemporaryDirectory(prefix="curb-bench-delayed-") as workdir:
        rows: list[tuple[str, float, float, int, int, float]] = []
        for name, count, delayed in (
            ("empty log", 0, False),
            (f"{args.messages:,} delayed", args.messages, True),
            (f"{args.messages:,} not delayed", args.messages, False),
        ):
            path = os.path.join(workdir, f"curb-{len(rows)}.log")
            wrote = write_log(path, cap, count, body, delayed)
            seconds, recovery, rss = measure(path, args.cap)
            rows.append((name, seconds, recovery, rss, os.path.getsize(path), wrote))
            os.unlink(path)
        print(f"{'log':<26} {'restart s':>9} {'recovery s':>10} {'RSS MiB':>8} {'file MiB':>9} {'(written in s)':>15}")
        for name, seconds, recovery, rss, size, wrote in rows:
            print(f"{name:<26} {seconds:9.2f} {recovery:10.2f} {rss / 2**20:8.1f} {size / 2**20:9.1f} {wrote:15.1f}")


if __name__ == "__main__":
    main()
