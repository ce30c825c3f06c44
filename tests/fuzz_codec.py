"""Fuzz the frame codec and the sans-I/O session with generated and mutated frames.

Each input is a few valid STOMP frames, mutated (bit flips, splices, duplications,
truncations, inserted delimiters, numbers made huge or zero-padded), then:
- fed to a FrameParser whole and at random split points: only ProtocolError may come
  out, and every split must give the same frames and the same error as the whole;
- fed, in the same pieces and mostly after a valid CONNECT, to a Session of one Broker
  over a LogCore on an in-memory disk, which a well-behaved consumer drains: nothing may
  raise, and everything the broker writes must parse as STOMP. Simulated time passes
  10 ms per step, and a slow consumer with a 15 ms ack deadline settles what it got one
  input later (touching some first), so deadlines pass, messages come back, and late
  ACKs and NACKs meet the fuzzed frames; a late one must never be an ERROR.
Input i is made from the seed and i alone, so `--seed S --only I` replays one finding.

    bin/fuzz codec --inputs 1000000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from simclock import SimClock
from simdisk import SimDisk
from test_frame_props import run as feed_all  # frames and error of one parser, its buffer bounded

from curb.broker import Broker, BrokerEvents
from curb.broker_config import BrokerConfig
from curb.frame import Frame, FrameParser, ProtocolError, encode
from curb.log import LogCore
from curb.session import Session

COMMANDS = ["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "DISCONNECT", "CONNECT", "STOMP"]
DELIMITERS = [b"\0", b"\n", b"\r", b"\r\n", b":", b"\\", b"\n\n", b"\n\r\n", b"\xff", b"\\c"]
NUMBERS = [b"0", b"5", b"000000000000000000005", b"9" * 25, b"-1", b"1," + b"9" * 400, b"18446744073709551616"]
CONNECT = encode("CONNECT", {"accept-version": "1.2", "host": "fuzz"})
SLOW_SUBSCRIBE = encode(
    "SUBSCRIBE",
    {"id": "slow", "destination": "/queue/curb", "ack": "client-individual", "prefetch-count": "2",
     "curb-ack-timeout": "15"},
)  # fmt: skip


def valid_frame(rng: random.Random) -> bytes:
    """One well-formed frame with plausible, sometimes awkward, headers and body."""
    command = rng.choice(COMMANDS)
    headers: dict[str, str] = {}
    if command == "SEND":
        headers["destination"] = "/queue/curb"
    if command in ("SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK"):
        headers["id"] = rng.choice(["0", "1", "count-1", str(rng.randrange(1, 50))])
    if command == "SUBSCRIBE":
        headers["destination"] = rng.choice(["/queue/curb", "./count"])
        headers["ack"] = rng.choice(["auto", "client", "client-individual"])
        if rng.random() < 0.3:
            headers["prefetch-count"] = str(rng.choice([1, 5, 1000001]))
        if rng.random() < 0.3:
            headers["curb-ack-timeout"] = rng.choice(["0", "5", "20", "86400001"])
    if command == "NACK" and rng.random() < 0.3:
        headers["curb-touch"] = rng.choice(["0", "1", "30", "86400000"])
    if command in ("CONNECT", "STOMP"):
        headers["accept-version"] = "1.2"
        headers["heart-beat"] = rng.choice(["0,0", "100,100", "0,86400000"])
    if rng.random() < 0.5:
        headers["receipt"] = f"r{rng.randrange(100)}"
    for _ in range(rng.choice([0, 0, 1, 3])):
        awkward = (
            ["v", "é" * 5] if command in ("CONNECT", "STOMP") else ["v", "a:b", "line\nbreak", "back\\slash", "é" * 5]
        )
        headers[f"x-{rng.randrange(1000)}"] = rng.choice(awkward)
    body = rng.randbytes(rng.choice([0, 0, 3, 40, 300])) if command in ("SEND", "ACK") else b""
    return encode(command, headers, body)


def mutate(data: bytearray, rng: random.Random, donor: bytes) -> None:
    """One random change, in place."""
    kind = rng.randrange(8)
    at = rng.randrange(len(data) + 1)
    if kind == 0 and data:  # bit flip
        i = min(at, len(data) - 1)
        data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # splice in part of another frame
        start = rng.randrange(len(donor) + 1)
        data[at:at] = donor[start : start + rng.randrange(1, 60)]
    elif kind == 2 and data:  # duplicate a slice
        start = rng.randrange(len(data))
        data[at:at] = data[start : start + rng.randrange(1, 80)] * rng.choice([1, 2, 50])
    elif kind == 3:  # truncate
        del data[at:]
    elif kind == 4:  # insert a delimiter
        data[at:at] = rng.choice(DELIMITERS)
    elif kind == 5 and data:  # delete a few bytes
        del data[at : at + rng.randrange(1, 8)]
    elif kind == 6:  # a number made huge, negative or zero-padded
        digits = [i for i, b in enumerate(data) if 48 <= b <= 57]
        if digits:
            i = rng.choice(digits)
            data[i : i + 1] = rng.choice(NUMBERS)
    else:  # many header lines
        data[at:at] = b"h:v\n" * rng.choice([10, 130, 200])


def make_input(seed: int, index: int) -> tuple[bytes, list[int], bool]:
    """Input `index` of the run with `seed`: its bytes, split points, and whether a valid
    CONNECT goes before it in the session."""
    rng = random.Random(seed * 1_000_003 + index)
    data = bytearray(b"".join(valid_frame(rng) for _ in range(rng.randint(1, 4))))
    donor = valid_frame(rng)
    for _ in range(rng.choice([0, 1, 1, 2, 3, 6])):
        mutate(data, rng, donor)
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.choice([0, 1, 2, 5, 20])))
    return bytes(data), cuts, rng.random() < 0.85


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


class Harness:
    """One broker over a LogCore on an in-memory disk, a consumer that drains it, and a
    fresh session per input; scheduled callbacks run after every input, and 10 ms of
    simulated time pass, so that ack deadlines of a few ms pass and fire."""

    def __init__(self, seed: int) -> None:
        self.later: list[Callable[[], None]] = []
        self.clock = SimClock()
        events = BrokerEvents()
        self.core = LogCore(
            SimDisk(random.Random(seed)), 1 << 20, events=events, clock=self.clock.time, wall_ms=self.clock.wall_ms
        )
        self.broker = Broker(
            self.core,
            BrokerConfig(heartbeat_ms=0, ack_timeout=0.015),
            schedule=lambda delay, callback: self.later.append(callback),
            clock=self.clock.time,
            loop=self.clock,
        )
        events.broker = self.broker
        self.consumer = Session(self.broker, 0.0, "consumer")
        self.check_output(self.consumer, CONNECT + encode("SUBSCRIBE", {"id": "0", "destination": "/queue/curb"}))
        self.slow = Session(self.broker, 0.0, "slow")
        self.check_output(self.slow, CONNECT + SLOW_SUBSCRIBE)
        self.held: list[str] = []  # ack ids the slow consumer got and has not settled
        self.late = 0  # RECEIPTs with curb-late:true the slow consumer got

    def check_output(self, session: Session, data: bytes = b"") -> list[Frame]:
        """Feed bytes (if any), run what is due, and parse what the session wrote."""
        if data:
            session.receive_data(data, self.now)
        self.settle()
        out = session.data_to_send(self.now)
        try:
            return FrameParser(max_frame_bytes=1 << 25).feed(out)
        except ProtocolError as err:
            raise AssertionError(f"the broker wrote bad STOMP ({err}): {out[:200]!r}") from None

    def step_slow(self, rng: random.Random) -> None:
        """The slow consumer ACKs or NACKs what it got an input ago (often past its
        deadline by now), and touches a third of what it gets now."""
        answers = [encode(rng.choice(["ACK", "NACK"]), {"id": ack, "receipt": f"s{ack}"}) for ack in self.held]
        self.held = []
        for frame in self.check_output(self.slow, b"".join(answers)):
            if frame.command == "ERROR":
                raise AssertionError(f"the slow consumer got an ERROR: {frame.headers}")
            if frame.command == "RECEIPT" and frame.headers.get("curb-late") == "true":
                self.late += 1
            if frame.command == "MESSAGE":
                self.held.append(frame.headers["ack"])
                if rng.random() < 0.33:
                    self.slow.receive_data(encode("NACK", {"id": frame.headers["ack"], "curb-touch": "25"}), self.now)

    @property
    def now(self) -> float:
        return self.clock.now

    def settle(self) -> None:
        while self.later or self.clock.fire_due():
            later, self.later = self.later, []
            for callback in later:
                callback()
        self.clock.now += 0.01
        self.core.flush()
        self.core.sync()

    def run(self, chunks: list[bytes], connect: bool, rng: random.Random) -> None:
        session = Session(self.broker, self.now, "fuzz")
        if connect:
            self.check_output(session, CONNECT)
        for chunk in chunks:
            self.check_output(session, chunk)
            if session.close_wanted:
                break
        session.connection_lost()
        self.check_output(self.consumer)
        self.step_slow(rng)


@dataclass
class Totals:
    inputs: int = 0
    bytes: int = 0
    frames: int = 0
    errors: int = 0
    crashes: list[str] = field(default_factory=list)


def run_one(harness: Harness, seed: int, index: int, totals: Totals) -> None:
    data, cuts, connect = make_input(seed, index)
    chunks = pieces(data, cuts)
    try:
        whole = feed_all([data])
        split = feed_all(chunks)
        if split != whole:
            raise AssertionError(f"split at {cuts} gave {split!r}, whole gave {whole!r}")
        harness.run(chunks, connect, random.Random(seed * 1_000_003 + index + 1))
    except Exception:
        totals.crashes.append(f"input {index}: {data[:300]!r}\n{traceback.format_exc()}")
    totals.inputs += 1
    totals.bytes += len(data)
    totals.frames += len(whole[0])
    totals.errors += whole[1] is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz curb's frame codec and sans-I/O session.")
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs to run (default 1000000)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    parser.add_argument("--only", type=int, default=None, help="replay input ONLY of the seed and stop")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    indices = [args.only] if args.only is not None else range(args.inputs)
    harness = Harness(seed)
    totals = Totals()
    started = time.monotonic()
    for index in indices:
        run_one(harness, seed, index, totals)
        if len(totals.crashes) >= 10:
            break
    seconds = time.monotonic() - started
    print(
        f"fuzz codec: seed {seed}: {totals.inputs} inputs ({totals.bytes} bytes, {totals.frames} frames parsed, "
        f"{totals.errors} inputs ending in ProtocolError) through the codec (whole and split) and the session "
        f"in {seconds:.1f} s; ack deadlines passed: {harness.broker.metrics.ack_timeouts}, late answers: "
        f"{harness.late}; crashes: {len(totals.crashes)}"
    )
    for crash in totals.crashes:
        index = crash.split(":", 1)[0].split()[1]
        print(f"\nCRASH (replay: bin/fuzz codec --seed {seed} --only {index})\n{crash}")
    return 1 if totals.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
