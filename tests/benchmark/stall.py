"""Stalls: how long one client's frame keeps every other client waiting.

    bin/bench-stall [--messages 1000000,5000000] [--body 100] [--cap 1GiB]

For each queue depth N it starts a broker on a new log in a temporary directory, fills
it with N pipelined SENDs, restarts it (so that nothing is in memory but what start-up
rebuilds), and then, while a second client sends a frame every 5 ms and times each
round trip, runs two operations one after the other:

- a browse of 11 messages near the end, `curb-from-id:N-10000 curb-to-id:N-9990`;
- `ACK curb-upto:<90% of N>` with a receipt.

It prints each operation's own time (to its end marker or RECEIPT) and the other
client's worst round trip while it ran, next to that client's median round trip, and
at the end the worst round trip of all. The bound docs/guide.md states is 50 ms. The
second client's frame is a receipted SUBSCRIBE to `./count`, answered at once: its round
trip is the event loop's delay, with no fsync in it (`--ping send`: a receipted SEND,
which adds the disk's fsync time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial

from benchmark.browse import fill
from curb.client import Client
from curb.spawn import BrokerProcess

PING_EVERY = 0.005
WARM_UP = 0.5
BOUND_SECONDS = 0.05
TIMEOUT = 600.0


class Pinger:
    """A second client: a frame every PING_EVERY seconds, each round trip timed as
    (sent at, seconds)."""

    def __init__(self, port: int, kind: str):
        self.port = port
        self.kind = kind
        self.trips: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pinger:
        self._thread.start()
        time.sleep(WARM_UP)  # a baseline of round trips before the operation
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with Client("127.0.0.1", self.port, timeout=TIMEOUT) as c:
            n = 0
            while not self._stop.is_set():
                n += 1
                sent = time.monotonic()
                if self.kind == "send":
                    c.send(b"ping", receipt=f"p{n}")
                else:
                    c.subscribe("count", "./count", headers={"receipt": f"p{n}"})
                c.wait_receipt(f"p{n}")
                self.trips.append((sent, time.monotonic() - sent))
                time.sleep(PING_EVERY)

    def worst_during(self, start: float, end: float) -> float:
        """The slowest round trip that was under way at some time in [start, end]."""
        return max((rtt for sent, rtt in self.trips if sent <= end and sent + rtt >= start), default=0.0)

    def median(self) -> float:
        return statistics.median(rtt for _, rtt in self.trips)

    def worst_before(self, start: float) -> float:
        """The slowest round trip over before `start`: the noise of the machine."""
        return max((rtt for sent, rtt in self.trips if sent + rtt < start), default=0.0)


def browse_near_end(port: int, messages: int) -> float:
    """Seconds to the end marker of a browse of the 11 messages from id N-10000."""
    first = max(1, messages - 10_000)
    with Client("127.0.0.1", port, timeout=TIMEOUT) as c:
        started = time.monotonic()
        got = sum(1 for _ in c.browse(first, first + 10))
        seconds = time.monotonic() - started
    if got != 11:
        raise SystemExit(f"the browse of {first}..{first + 10} returned {got} messages, expected 11")
    return seconds


def ack_upto(port: int, messages: int) -> float:
    """Seconds to the RECEIPT of an ACK up to 90% of the queue."""
    with Client("127.0.0.1", port, timeout=TIMEOUT) as c:
        started = time.monotonic()
        c.ack_upto(messages * 9 // 10, receipt="upto")
        c.wait_receipt("upto")
        return time.monotonic() - started


def measure(port: int, ping: str, name: str, operation: Callable[[], float]) -> float:
    """Run the operation beside a pinger; print and return the pinger's worst round trip."""
    with Pinger(port, ping) as pinger:
        started = time.monotonic()
        seconds = operation()
        worst = pinger.worst_during(started, started + seconds)
    print(
        f"  {name}: {seconds * 1000:,.1f} ms; the other client's worst round trip "
        f"{worst * 1000:,.1f} ms (its median {pinger.median() * 1000:.2f} ms, "
        f"its worst in the {WARM_UP:g} s before {pinger.worst_before(started) * 1000:,.1f} ms)",
        flush=True,
    )
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-stall", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", default="1000000,5000000", help="queue depths, comma-separated (default 1000000,5000000)"
    )
    parser.add_argument("--body", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--cap", default="1GiB", help="the broker's -cap (default 1GiB)")
    parser.add_argument(
        "--ping",
        choices=("count", "send"),
        default="count",
        help="the second client's frame: SUBSCRIBE ./count (default) or SEND, each with a receipt",
    )
    args = parser.parse_args()
    worst = 0.0
    for messages in (int(n) for n in args.messages.split(",")):
        with tempfile.TemporaryDirectory(prefix="curb-bench-stall-") as workdir:
            broker = BrokerProcess(cwd=workdir, timeout=TIMEOUT)
            flags = ["-cap", args.cap, "-addr", "127.0.0.1:0", "-file", "curb.log"]
            try:
                port = broker.start(flags)
                fill_seconds = fill(port, messages, b"x" * args.body)
                broker.stop()
                started = time.monotonic()
                port = broker.start(flags)
                print(
                    f"{messages:,} messages of {args.body} B queued (filled in {fill_seconds:.0f} s, "
                    f"restarted in {time.monotonic() - started:.1f} s):",
                    flush=True,
                )
                browse = partial(browse_near_end, port, messages)
                worst = max(worst, measure(port, args.ping, "browse of 11 near the end", browse))
                upto = partial(ack_upto, port, messages)
                worst = max(worst, measure(port, args.ping, f"ACK curb-upto:{messages * 9 // 10}", upto))
            finally:
                broker.stop()
    verdict = "within" if worst <= BOUND_SECONDS else "OVER"
    bound = f"{verdict} the {BOUND_SECONDS * 1000:.0f} ms bound"
    print(f"worst round trip of the other client: {worst * 1000:,.1f} ms ({bound})")


if __name__ == "__main__":
    main()
