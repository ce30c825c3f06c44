"""Fuzz a real broker over sockets while a well-behaved producer and consumer keep working.

Hostile threads open connection after connection and send mutated frames (made as in
tests/fuzz_codec.py, split at random points, mostly after a valid CONNECT); inputs that
parse to a SUBSCRIBE are skipped, since a hostile subscriber may legitimately take the
good pair's messages. Meanwhile the good producer sends numbered messages, each with a
receipt, and the good consumer (client-individual acks) checks every receipted one
arrives exactly once with its body; messages the hostile SENDs stored are acked and
counted. The report: mutated inputs and frames sent, connections, broker crashes, the
good pair's losses and duplicates, and the longest stall (the longest wait for a receipt
or, while messages were owed, for the next message). Exit status 1 unless all is well.

    bin/fuzz broker --seconds 300 --seed 1
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from fuzz_codec import CONNECT, make_input, pieces
from test_frame_props import run as feed_all

from curb.client import Client, StompError
from curb.spawn import BrokerProcess

GOOD = "x-good"
DRAIN_S = 30.0


def good_body(seq: int) -> bytes:
    return b"good message %d " % seq + bytes(range(seq % 256)) + b"\0end"


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    inputs: int = 0
    frames: int = 0
    connections: int = 0
    skipped: int = 0
    receipted: set[int] = field(default_factory=set)
    received: Counter[int] = field(default_factory=Counter)
    bad_bodies: list[int] = field(default_factory=list)
    foreign: int = 0
    stall: float = 0.0
    failures: list[str] = field(default_factory=list)

    def stalled(self, seconds: float) -> None:
        with self.lock:
            self.stall = max(self.stall, seconds)


def hostile(port: int, seed: int, worker: int, stop: threading.Event, stats: Stats) -> None:
    """Connection after connection of mutated frames, until told to stop."""
    index = worker
    while not stop.is_set():
        data, cuts, connect = make_input(seed, index)
        index += 1_000_000  # each worker its own inputs of the seed
        frames, _ = feed_all([data])
        if any(frame.command == "SUBSCRIBE" for frame in frames):
            with stats.lock:
                stats.skipped += 1
            continue
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
                if connect:
                    sock.sendall(CONNECT)
                for chunk in pieces(data, cuts):
                    sock.sendall(chunk)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(0.2)
                try:
                    while sock.recv(65536):
                        pass
                except (TimeoutError, OSError):
                    pass
        except OSError:
            pass  # the broker closed on us mid-send: an ERROR for bad input, as it should
        with stats.lock:
            stats.inputs += 1
            stats.frames += len(frames)
            stats.connections += 1


def producer(port: int, stop: threading.Event, stats: Stats) -> None:
    seq = 0
    try:
        with Client("127.0.0.1", port, timeout=60.0) as client:
            while not stop.is_set():
                seq += 1
                started = time.monotonic()
                client.send(good_body(seq), {GOOD: str(seq)}, receipt=f"g{seq}")
                client.wait_receipt(f"g{seq}")
                stats.stalled(time.monotonic() - started)
                with stats.lock:
                    stats.receipted.add(seq)
    except (StompError, OSError) as err:
        with stats.lock:
            stats.failures.append(f"good producer failed at message {seq}: {err}")


def consumer(port: int, done: threading.Event, stats: Stats) -> None:
    """Take messages until `done` is set and every receipted message came."""
    try:
        with Client("127.0.0.1", port, timeout=60.0) as client:
            client.subscribe("good", ack="client-individual", prefetch=50)
            last = time.monotonic()
            while True:
                with stats.lock:
                    owed = stats.receipted - set(stats.received)
                if done.is_set() and not owed:
                    return
                frame = client.receive(0.5)
                now = time.monotonic()
                if frame is None:
                    if owed:
                        stats.stalled(now - last)
                        if done.is_set() and now - last > DRAIN_S:
                            return
                    else:
                        last = now
                    continue
                if owed:
                    stats.stalled(now - last)
                last = now
                if frame.command != "MESSAGE":
                    continue
                client.ack(frame.headers["ack"])
                raw = frame.headers.get(GOOD)
                with stats.lock:
                    if raw is None:
                        stats.foreign += 1
                        continue
                    seq = int(raw)
                    stats.received[seq] += 1
                    if frame.body != good_body(seq):
                        stats.bad_bodies.append(seq)
    except (StompError, OSError) as err:
        with stats.lock:
            stats.failures.append(f"good consumer failed: {err}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz a real curb broker over sockets.")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    parser.add_argument("--workers", type=int, default=4, help="hostile connection threads (default 4)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    stats = Stats()
    with tempfile.TemporaryDirectory(prefix="curb-fuzz-") as tmp:
        broker = BrokerProcess(cwd=tmp)
        port = broker.start(["-cap", "64MiB", "-addr", "127.0.0.1:0", "-file", "fuzz.log"])
        stop, done = threading.Event(), threading.Event()
        good = [
            threading.Thread(target=producer, args=(port, stop, stats)),
            threading.Thread(target=consumer, args=(port, done, stats)),
        ]
        workers = [threading.Thread(target=hostile, args=(port, seed, n, stop, stats)) for n in range(args.workers)]
        for thread in good + workers:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in [*workers, good[0]]:
            thread.join()
        done.set()
        good[1].join()
        crashed = not broker.running()
        status = broker.stop(timeout=60)
        output = broker.output()
    crashes = int(crashed or status != 0 or "Traceback" in output)
    losses = sorted(stats.receipted - set(stats.received))
    duplicates = sorted(seq for seq, n in stats.received.items() if n > 1)
    print(
        f"fuzz broker: seed {seed}: {args.seconds:g} s, {stats.inputs} mutated inputs ({stats.frames} frames "
        f"parsed from them) over {stats.connections} connections, {stats.skipped} inputs skipped (SUBSCRIBE); "
        f"broker crashes: {crashes} (exit status {status}); good pair: {len(stats.receipted)} receipted, "
        f"{sum(stats.received.values())} received, losses: {len(losses)}, duplicates: {len(duplicates)}, "
        f"bad bodies: {len(stats.bad_bodies)}, longest stall: {stats.stall:.2f} s; "
        f"{stats.foreign} hostile messages drained"
    )
    for failure in stats.failures:
        print(failure)
    if crashes:
        print(f"broker output:\n{output[-4000:]}")
    if losses or duplicates or stats.bad_bodies:
        print(f"lost {losses[:20]}, duplicated {duplicates[:20]}, bad bodies {stats.bad_bodies[:20]}")
    failed = crashes or losses or duplicates or stats.bad_bodies or stats.failures
    if failed:
        print(f"replay: bin/fuzz broker --seconds {args.seconds:g} --seed {seed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
