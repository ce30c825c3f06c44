"""Start-up over damaged log files: recover what is intact, or refuse in one line.

A broker that finds its log damaged (bit rot, a zeroed sector, a file cut short or
grown, blocks in the wrong place) must do one of two things at start-up:

- recover: every message it then delivers (by draining `next_ready`) is byte for byte
  one that was sent, none is delivered twice, and delivery never raises; `LogReader`
  lists only messages that were sent, too;
- refuse: raise `LogError` with a one-line message an operator can act on.

Any other exception (IndexError, ValueError, MemoryError, FormatError, ...) is a bug:
the broker dies with a traceback, or dies later while delivering.

The base files are written by a real `Log` under a deterministic workload (so a seed
replays the same bytes): small caps so the ring has wrapped many times, messages acked
and in flight, one held forever so that it is copied forward lap after lap, and each
file either closed cleanly or copied mid-run as a crash would leave it. Each case
derives from one integer seed: a base, a cap, and one or more mutations, written as
short commands that replay exactly: "flip 4242.3" (bit 3 of byte 4242), "zero 4096 512",
"cut 60000", "grow random 512 7", "copy A B 512", "swap A B 512", "set 900 ffffffff".
An offset may also be given as `kind[k]+d` (see Layout), e.g. "flip length[9]+1.1".

After the fuzzing come the failure classes it found, each a fixed case spelled out
(they fail until the log handles that damage), and a start-up in a small address space.
`tests/startup_fuzz.py` runs the same cases by the hundred thousand.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import curb
from curb.log import Log, LogCore, LogError, LogReader, QueueFull, Record
from curb.log import record as fmt

KIB = 1024
SECTOR = 512
RING_START = 512
CASE_SECONDS = 5.0
MAX_HANGS = 3
DEFAULT_CASES = 2400
CURB_DIR = Path(curb.__file__).resolve().parent


# ---------------------------------------------------------------- known payloads


def message(n: int, longest: int) -> bytes:
    """Payload n: SEND headers and a body of n-dependent length and content. Some bodies
    are binary and some hold lines that look like record headers, so that a recovery
    hunting for the next record after damage meets decoys."""
    size = 16 + (n * 7919) % longest
    tag = b"body %07d|" % n
    kind = n % 3
    if kind == 0:
        filler = random.Random(n).randbytes(size)
    elif kind == 1:
        filler = b"\nrdy 0000 %012x 000000000001 000000000000 00000010 00000000\n" % n * (size // 60 + 1)
    else:
        filler = (b"%d " % n) * size
    return b"content-type:application/octet-stream\nx-seq:%d\n\n" % n + tag + filler[:size]


AFTER_RECOVERY = message(9_999_999, 100)


@dataclass(frozen=True)
class Known:
    """Every payload a base's workload sent, by body (bodies are unique by their tag)."""

    payloads: frozenset[bytes]
    headers_by_body: dict[bytes, dict[str, str]]

    @classmethod
    def of(cls, sent: Iterable[bytes]) -> Known:
        """The workload's payloads, and the one each start-up sends (AFTER_RECOVERY)."""
        payloads = [*sent, AFTER_RECOVERY]
        table: dict[bytes, dict[str, str]] = {}
        for p in payloads:
            head, _, body = p.partition(b"\n\n")
            table[body] = dict(line.split(":", 1) for line in head.decode().splitlines())
        return cls(frozenset(payloads), table)


# ---------------------------------------------------------------- writing the base files


@contextlib.contextmanager
def frozen_clock() -> Iterator[None]:
    """Make the base files identical from run to run, so that a seed replays the same
    bytes. Send times are stored in each record, so the wall clock ticks a fixed 1 ms a
    reading; and since the log writes a pending checkpoint only once enough monotonic
    time has passed, the monotonic clock leaps a second a reading, so that it always has
    (the event loop driving the log reads the same clock, and merely never waits)."""
    wall = iter(range(1_700_000_000_000_000_000, 1 << 62, 1_000_000))
    mono = iter(range(1_000_000, 1 << 62))
    real_ns, real_mono = time.time_ns, time.monotonic
    time.time_ns = lambda: next(wall)
    time.monotonic = lambda: float(next(mono))
    try:
        yield
    finally:
        time.time_ns, time.monotonic = real_ns, real_mono


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """These tests parse files, they never lose power: fdatasync, which on a busy disk
    is most of a case's time, may return at once."""
    real = os.fdatasync
    os.fdatasync = lambda fd: None
    try:
        yield
    finally:
        os.fdatasync = real


class Writer:
    """Drives a Log as a broker would, one step at a time, each step waiting until what
    it wrote is synced: the file's bytes then depend on the steps alone, not on timing.
    `log` is its core."""

    def __init__(self, path: str, cap: int):
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.driver = Log(path, cap)
        self.log = self.driver.core
        self.log.clock = time.monotonic  # the frozen clock (its default was bound at import)
        self.driver.start(self.loop)
        self.closed = False

    def send(self, payloads: list[bytes]) -> list:
        """Append (until the queue is full) and wait for every append to be synced."""
        recs, waits = [], []
        for p in payloads:
            fut = self.loop.create_future()
            try:
                recs.append(self.log.append(p, fut.set_result))
            except QueueFull:
                break
            waits.append(fut)
        if waits:
            reasons = self.loop.run_until_complete(asyncio.gather(*waits))
            assert reasons == [None] * len(waits), reasons
        return recs

    def send_unsynced(self, payloads: list[bytes]) -> None:
        """Append and let the log write them, but stop before they are synced."""
        for p in payloads:
            self.log.append(p)
        self.loop.run_until_complete(asyncio.sleep(0))

    def deliver(self) -> list:
        out = []
        while (rec := self.log.next_ready()) is not None:
            out.append(rec)
        return out

    def snapshot(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.run_until_complete(self.driver.close())
            self.loop.close()


@dataclass(frozen=True)
class Scenario:
    """How a base file is made: ring size, largest body, and how the run ends:
    'closed' (clean close), 'moved' (a crash right after a held message was copied
    forward, so the file holds it twice), 'unsynced' (a crash after a batch was
    written and before it was synced)."""

    name: str
    cap: int
    longest: int
    ending: str


SCENARIOS = (
    Scenario("ring64-closed", 64 * KIB, 600, "closed"),
    Scenario("ring64-moved", 64 * KIB, 600, "moved"),
    Scenario("ring256-closed", 256 * KIB, 5000, "closed"),
    Scenario("ring256-unsynced", 256 * KIB, 5000, "unsynced"),
)
BASE_NAMES = tuple(s.name for s in SCENARIOS)


@dataclass
class Workload:
    """What has been sent and acked so far, to know which payloads the file holds."""

    scenario: Scenario
    writer: Writer
    sent: list[bytes] = field(default_factory=list)
    acked: set[bytes] = field(default_factory=set)
    last_offset: int = 0

    def send(self, count: int) -> list:
        batch = [message(len(self.sent) + i, self.scenario.longest) for i in range(count)]
        recs = self.writer.send(batch)
        self.sent += batch[: len(recs)]
        if recs:
            self.last_offset = recs[-1].offset
        return recs

    def ack(self, recs: list) -> None:
        for rec in recs:
            self.writer.log.ack(rec)
            self.acked.add(bytes(self.writer.log.payload(rec)))

    def live(self) -> frozenset[bytes]:
        return frozenset(set(self.sent) - self.acked)


@dataclass(frozen=True)
class Base:
    """An undamaged file, what it holds, and where its parts are (for aiming mutations)."""

    name: str
    cap: int
    data: bytes
    known: Known
    live: frozenset[bytes]
    layout: Layout


def build_base(scenario: Scenario, workdir: str) -> Base:
    path = os.path.join(workdir, scenario.name + ".log")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with frozen_clock(), no_fsync():
        w = Workload(scenario, Writer(path, scenario.cap))
        data, live = run_workload(w)
        w.writer.close()
    with open(path, "wb") as f:
        f.write(data)
    return Base(scenario.name, scenario.cap, data, Known.of(w.sent), live, Layout.of(data, path))


def run_workload(w: Workload) -> tuple[bytes, frozenset[bytes]]:
    """Laps of send-and-consume with one message held forever and a few held for a while
    (so in-flight records pin the tail and get copied forward), then, unless the run
    ends at a copy, a backlog that wraps around the end of the ring."""
    w.send(1)
    held_forever = w.writer.deliver()[0]
    snap = churn(w, held_forever)
    if snap is not None:
        return snap
    first = w.last_offset
    while w.last_offset >= first:
        assert w.send(4), "the backlog filled the ring before it wrapped"
    w.send(8)
    if w.scenario.ending == "unsynced":
        batch = [message(len(w.sent) + i, w.scenario.longest) for i in range(3)]
        w.writer.send_unsynced(batch)
        w.sent += batch
        return w.writer.snapshot(), w.live()
    w.writer.close()
    return w.writer.snapshot(), w.live()


def churn(w: Workload, stuck) -> tuple[bytes, frozenset[bytes]] | None:
    """Send and consume for at least four laps; the 'moved' ending returns the file as it
    is right after the held message was copied forward again, at a copy that leaves the
    original in the file and the live region wrapping around the end of the ring (so
    damage can land in both of its parts): each lap's copy lands a little further back,
    so some lap's copy does."""
    ring = w.scenario.cap - RING_START
    moved = w.scenario.ending == "moved"
    held: collections.deque = collections.deque()
    sent_bytes = 0
    while sent_bytes < 4 * ring or w.last_offset < RING_START + ring // 2 or moved:
        assert sent_bytes < 64 * ring, "no copy of the held message left a wrapped region"
        where = stuck.offset
        # One message a step on a 'moved' run: the copy then has the fewest appends after
        # it in its step, which could take the original's room at once.
        recs = w.send(1 if moved else 5)
        sent_bytes += sum(r.size for r in recs)
        if moved and stuck.offset != where:
            data = w.writer.snapshot()
            ckpt = fmt.latest_checkpoint(data[:RING_START])
            if ckpt.tail > ckpt.head and data.count(w.sent[0]) == 2:
                return data, w.live()
        got = w.writer.deliver()
        w.ack([r for r in got if r.id % 7 != 0] + list(held)[:-4])
        held = collections.deque(list(held)[-4:] + [r for r in got if r.id % 7 == 0])
    return None


# ---------------------------------------------------------------- layout: aiming mutations


@dataclass(frozen=True)
class Span:
    """Bytes [start, end) of a base file."""

    start: int
    end: int


@dataclass(frozen=True)
class Layout:
    """Where a base file's parts are, by kind: `slot` (the checkpoint lines, newest
    first), and `header`, `length` (its length field) and `payload` of each record that
    LogReader lists (queue order from the checkpoint's tail, acked ones included).
    A mutation may name a byte as `kind[k]+d` instead of by its offset."""

    size: int
    spans: dict[str, tuple[Span, ...]]
    ids: tuple[int, ...]
    states: tuple[str, ...]
    wrapped: int  # the first record past the end of the ring (0: the region does not wrap)

    @classmethod
    def of(cls, data: bytes, path: str) -> Layout:
        with LogReader(path) as reader:
            entries = list(reader.entries())
        slots = sorted(
            (i for i in range(RING_START) if data.startswith(b"ckpt ", i)),
            key=lambda i: -int(data[i : i + 22].split()[1], 16),
        )
        spans: dict[str, list[Span]] = {
            "slot": [Span(i, data.index(b"\n", i)) for i in slots],
            "header": [],
            "length": [],
            "payload": [],
        }
        for e in entries:
            end = data.index(b"\n", e.offset) + 1
            spans["header"].append(Span(e.offset, end))
            spans["payload"].append(Span(end, e.offset + e.size))
            fields = data[e.offset : end].split(b" ")
            if len(fields) == 10:
                at = e.offset + sum(len(f) + 1 for f in fields[:8])
                spans["length"].append(Span(at, at + len(fields[8])))
            else:
                spans["length"].append(Span(end, end))
        drops = [k for k in range(1, len(entries)) if entries[k].offset < entries[k - 1].offset]
        return cls(
            len(data),
            {k: tuple(v) for k, v in spans.items()},
            tuple(e.id for e in entries),
            tuple(e.state for e in entries),
            drops[0] if drops else 0,
        )

    def describe(self, offset: int) -> str:
        """What the byte at `offset` of the undamaged file is, as `kind[k]+d`."""
        for kind in ("length", "header", "payload", "slot"):
            for k, span in enumerate(self.spans[kind]):
                if span.start <= offset < span.end:
                    return f"{kind}[{k}]+{offset - span.start}"
        if offset < RING_START:
            return "file header"
        return "past the end" if offset >= self.size else "outside the live region"

    def resolve(self, word: str) -> int:
        """An offset, written as a number or as `kind[k]+d`."""
        if "[" not in word:
            return int(word)
        kind, _, rest = word.partition("[")
        index, _, delta = rest.partition("]")
        return self.spans[kind][int(index)].start + int(delta or 0)


# ---------------------------------------------------------------- mutations


def apply(buf: bytearray, command: str, layout: Layout) -> None:
    """Apply one mutation command (the words before any ' (' comment)."""
    words = command.split(" (")[0].split()
    op, args = words[0], words[1:]
    if op == "flip":
        where_, _, bit = args[0].rpartition(".")
        at = layout.resolve(where_)
        if at < len(buf):
            buf[at] ^= 1 << int(bit)
    elif op == "zero":
        at, n = layout.resolve(args[0]), int(args[1])
        buf[at : at + n] = bytes(len(buf[at : at + n]))
    elif op == "cut":
        del buf[layout.resolve(args[0]) :]
    elif op == "grow":
        buf += garbage(buf, args[0], int(args[1]), int(args[2]))
    elif op == "copy":
        src, dst, n = layout.resolve(args[0]), layout.resolve(args[1]), int(args[2])
        chunk = bytes(buf[src : src + n])
        buf[dst : dst + len(chunk)] = chunk[: max(0, len(buf) - dst)]
    elif op == "swap":
        a, b, n = layout.resolve(args[0]), layout.resolve(args[1]), int(args[2])
        first, second = bytes(buf[a : a + n]), bytes(buf[b : b + n])
        if len(first) == len(second) == n:
            buf[a : a + n], buf[b : b + n] = second, first
    elif op == "set":
        at, text = layout.resolve(args[0]), args[1].encode()
        buf[at : at + len(text)] = text[: max(0, len(buf) - at)]
    else:
        raise ValueError(f"unknown mutation {command!r}")


def garbage(buf: bytearray, kind: str, n: int, seed: int) -> bytes:
    """Bytes to grow a file with: random, zeros, or a stale copy of its own records."""
    if kind == "random":
        return random.Random(seed).randbytes(n)
    if kind == "zeros":
        return bytes(n)
    start = seed % max(1, len(buf) - RING_START) + RING_START
    return bytes(buf[start : start + n])


def pick_offset(rng: random.Random, layout: Layout, size: int) -> int:
    """A byte to damage: anywhere, or aimed at a part that recovery must parse."""
    pool = layout.spans[rng.choice(["slot", "header", "length", "payload"])]
    if not pool or rng.random() < 0.25:
        return rng.randrange(max(1, size))
    span = rng.choice(pool)
    return rng.randrange(span.start, max(span.start + 1, span.end))


def note(layout: Layout, offset: int) -> str:
    return f" ({layout.describe(offset)})"


def mutate_flip(rng: random.Random, layout: Layout, size: int) -> list[str]:
    bits = rng.choice([1, 1, 1, 2, 3, 8])
    spots = [pick_offset(rng, layout, size) for _ in range(bits)]
    return [f"flip {at}.{rng.randrange(8)}{note(layout, at)}" for at in spots]


def mutate_zero(rng: random.Random, layout: Layout, size: int) -> list[str]:
    at = pick_offset(rng, layout, size) // SECTOR * SECTOR
    return [f"zero {at} {SECTOR}{note(layout, at)}"]


def mutate_cut(rng: random.Random, layout: Layout, size: int) -> list[str]:
    at = pick_offset(rng, layout, size) if rng.random() < 0.7 else rng.randrange(size + 1)
    return [f"cut {at}{note(layout, at)}"]


def mutate_grow(rng: random.Random, layout: Layout, size: int) -> list[str]:
    kind = rng.choice(["random", "zeros", "stale"])
    return [f"grow {kind} {rng.choice([1, 67, SECTOR, 4096, 20000])} {rng.randrange(1 << 30)}"]


def mutate_sectors(rng: random.Random, layout: Layout, size: int) -> list[str]:
    """A block written twice or to the wrong place: sectors copied or swapped."""
    sectors = max(1, size // SECTOR)
    a, b = rng.randrange(sectors) * SECTOR, rng.randrange(sectors) * SECTOR
    n = SECTOR * rng.choice([1, 1, 2, 8])
    op = rng.choice(["copy", "swap"])
    return [f"{op} {a} {b} {n} ({layout.describe(a)} / {layout.describe(b)})"]


def mutate_shuffle(rng: random.Random, layout: Layout, size: int) -> list[str]:
    """A run of sectors written back in a random order (as swaps, to replay exactly)."""
    count = rng.choice([2, 4, 8])
    first = rng.randrange(max(1, size // SECTOR - count + 1))
    order = list(range(count))
    rng.shuffle(order)
    swaps = []
    for i in range(count):
        j = order.index(i, i)
        if j != i:
            order[i], order[j] = order[j], order[i]
            a, b = (first + i) * SECTOR, (first + j) * SECTOR
            swaps.append(f"swap {a} {b} {SECTOR} ({layout.describe(a)} / {layout.describe(b)})")
    return swaps or mutate_sectors(rng, layout, size)


def mutate_length(rng: random.Random, layout: Layout, size: int) -> list[str]:
    if not layout.spans["length"]:
        return mutate_flip(rng, layout, size)
    k = rng.randrange(len(layout.spans["length"]))
    value = rng.choice(["ffffffff", "7fffffff", f"{rng.randrange(0x10000, 1 << 32):08x}"])
    return [f"set {layout.spans['length'][k].start} {value} (length[{k}])"]


MUTATORS: tuple[tuple[Callable[[random.Random, Layout, int], list[str]], int], ...] = (
    (mutate_flip, 6),
    (mutate_zero, 2),
    (mutate_cut, 2),
    (mutate_grow, 1),
    (mutate_sectors, 2),
    (mutate_shuffle, 1),
    (mutate_length, 1),
)


@dataclass(frozen=True)
class Case:
    """One start-up to try: a base file, the cap to open it with, and its mutations."""

    seed: int
    base: str
    cap: int
    commands: tuple[str, ...]

    def __str__(self) -> str:
        return f"seed {self.seed}: {self.base}, cap {self.cap // KIB}KiB, " + "; ".join(self.commands)


def make_case(seed: int, bases: dict[str, Base]) -> Case:
    """The case a seed stands for: its base is BASE_NAMES[seed % 4]; the rest is random."""
    rng = random.Random(seed)
    base = bases[BASE_NAMES[seed % len(BASE_NAMES)]]
    cap = base.cap * 2 if rng.random() < 0.15 else base.cap
    count = rng.choice([1, 1, 1, 1, 2, 2, 3, 4])
    funcs, weights = zip(*MUTATORS, strict=True)
    commands: list[str] = []
    size = len(base.data)
    for func in rng.choices(funcs, weights, k=count):
        commands += func(rng, base.layout, size)
        size = len(mutated(base, commands))
    return Case(seed, base.name, cap, tuple(commands))


def mutated(base: Base, commands: Iterable[str]) -> bytearray:
    buf = bytearray(base.data)
    for command in commands:
        apply(buf, command, base.layout)
    return buf


# ---------------------------------------------------------------- one start-up, judged


class Hung(BaseException):
    """A case ran past CASE_SECONDS: start-up, delivery or the reader does not end.
    (Not an Exception, so that no `except Exception` on the way swallows it.)"""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise Hung in the main thread if the body runs too long (a loop that never ends
    is a failure too, and must not stall the suite)."""

    def alarm(signum, frame):
        raise Hung(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass(frozen=True)
class Outcome:
    """How start-up went ('recovered', with how many it delivered, or 'refused', with
    its message), and the failure classes met on the way: phase, exception and the
    innermost curb function, or the property that did not hold."""

    kind: str
    detail: str
    failures: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()


class Broken(Exception):
    """A property of recovery does not hold (the detail names it)."""


def where(exc: BaseException) -> str:
    """The two innermost curb functions on the exception's traceback ('caller > callee'):
    with the exception's type, the failure's class, stable across line-number changes."""
    inside = [
        f"{Path(f.filename).stem}.{f.name}"
        for f in traceback.extract_tb(exc.__traceback__)
        if Path(f.filename).resolve().parent == CURB_DIR
    ]
    return " > ".join(inside[-2:]) or "the test"


def classify(phase: str, exc: BaseException) -> str:
    if isinstance(exc, Broken):
        return f"{phase}: {exc}"
    return f"{phase}: {type(exc).__name__} in {where(exc)}"


def failure(phase: str, exc: BaseException, detail: str = "") -> Outcome:
    trace = "".join(traceback.format_exception(exc))
    return Outcome("failed", detail or repr(exc), (classify(phase, exc),), (trace,))


def one_line(err: LogError) -> str:
    text = str(err)
    if not text or "\n" in text:
        raise Broken(f"LogError message is not one line: {text!r}")
    return text


def check_reader(path: str, known: Known) -> None:
    """What an operator's `curb inspect` sees: only sent messages, or a one-line
    refusal, never a traceback."""
    try:
        with LogReader(path) as reader:
            for entry in reader.entries():
                headers = known.headers_by_body.get(entry.body)
                if headers is None or headers != entry.headers:
                    raise Broken("LogReader lists a message that was never sent")
            reader.summary()
    except LogError as err:
        one_line(err)


def drain(log: LogCore, known: Known, acks: int) -> int:
    """Deliver everything: each payload must be a sent one, and none may come twice.
    Then ack the first `acks` (after the drain, so that a failed one leaves no writes
    pending and closes at once)."""
    seen: set[bytes] = set()
    first: list[Record] = []
    while (rec := log.next_ready()) is not None:
        body = bytes(log.payload(rec))
        if body not in known.payloads:
            raise Broken("delivered a payload that was never sent")
        if body in seen:
            raise Broken("delivered the same payload twice")
        seen.add(body)
        if len(first) < acks:
            first.append(rec)
    for rec in first:
        log.ack(rec)
    return len(seen)


def send_one_more(log: LogCore, loop: asyncio.AbstractEventLoop) -> None:
    """A broker that recovered goes on taking messages (this one is known, so a restart
    may deliver it). Waiting for its answer, rather than letting close() poll, keeps a
    case short; if none comes within a second, close() deals with it."""
    answer: asyncio.Future[str | None] = loop.create_future()

    def done(reason: str | None) -> None:
        if not answer.done():
            answer.set_result(reason)

    try:
        log.append(AFTER_RECOVERY, done)
    except QueueFull:
        return
    with contextlib.suppress(asyncio.TimeoutError):
        loop.run_until_complete(asyncio.wait_for(answer, 1.0))


def start_up(path: str, cap: int, known: Known, loop: asyncio.AbstractEventLoop, acks: int, phase: str) -> Outcome:
    """Open the log, drain it, ack the first `acks` (a few: close() waits for their
    sync) and send one more message, and close it."""
    try:
        log = Log(path, cap)
    except LogError as err:
        try:
            return Outcome("refused", one_line(err))
        except Broken as exc:
            return failure(phase, exc, str(err))
    except Exception as exc:
        return failure(phase, exc)
    try:
        log.start(loop)
        delivered = drain(log.core, known, acks)
        if acks:
            send_one_more(log.core, loop)
    except Exception as exc:
        with contextlib.suppress(Exception):
            loop.run_until_complete(log.close())
        return failure(f"{phase} delivery", exc)
    try:
        loop.run_until_complete(log.close())
    except Exception as exc:
        return failure(f"{phase} close", exc)
    return Outcome("recovered", f"{delivered} delivered")


def judge(path: str, cap: int, known: Known, loop: asyncio.AbstractEventLoop) -> Outcome:
    """The offline reader on the damaged file, a start-up that acks some of what it
    delivers, and a second start-up of the file as the first one left it."""
    found: list[Outcome] = []
    try:
        check_reader(path, known)
    except Exception as exc:
        found.append(failure("reader", exc))
    first = start_up(path, cap, known, loop, 3, "start-up")
    found.append(first)
    if first.kind == "recovered":
        second = start_up(path, cap, known, loop, 0, "restart")
        if second.kind == "refused":
            second = failure("restart", Broken("refused a file that start-up recovered and closed"))
        found.append(second)
    failures = tuple(f for o in found for f in o.failures)
    traces = tuple(t for o in found for t in o.traces)
    return Outcome("failed" if failures else first.kind, first.detail, failures, traces)


class Runner:
    """Runs cases in one scratch directory on one event loop."""

    def __init__(self, bases: dict[str, Base], workdir: str):
        self.bases = bases
        self.workdir = workdir
        self.loop = asyncio.new_event_loop()

    def run(self, case: Case) -> Outcome:
        """Write the case's file, then judge it, within CASE_SECONDS."""
        path = os.path.join(self.workdir, "case.log")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with open(path, "wb") as f:
            f.write(mutated(self.bases[case.base], case.commands))
        try:
            with deadline(CASE_SECONDS), no_fsync():
                return judge(path, case.cap, self.bases[case.base].known, self.loop)
        except Hung as exc:
            with contextlib.suppress(Exception):
                self.loop.close()
            self.loop = asyncio.new_event_loop()
            return failure("hang", exc)

    def close(self) -> None:
        self.loop.close()


@dataclass
class Tally:
    """Counts of outcomes, and the cases of each failure class."""

    cases: int = 0
    recovered: int = 0
    refused: int = 0
    failed: int = 0
    failures: dict[str, list[Case]] = field(default_factory=dict)

    def add(self, case: Case, outcome: Outcome) -> None:
        self.cases += 1
        if outcome.kind == "recovered":
            self.recovered += 1
        elif outcome.kind == "refused":
            self.refused += 1
        else:
            self.failed += 1
        for cls in outcome.failures:
            self.failures.setdefault(cls, []).append(case)

    def merge(self, other: Tally) -> None:
        self.cases += other.cases
        self.recovered += other.recovered
        self.refused += other.refused
        self.failed += other.failed
        for cls, cases in other.failures.items():
            self.failures.setdefault(cls, []).extend(cases)

    def report(self, shown: int = 3) -> str:
        """Counts, then each failure class with its simplest cases, one per kind of damage."""
        lines = [
            f"{self.cases} cases: {self.recovered} recovered, {self.refused} refused cleanly, {self.failed} failed"
        ]
        for cls, cases in sorted(self.failures.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  {len(cases)} x {cls}")
            lines += [f"      {case}" for case in examples(cases, shown)]
        if self.failures:
            lines.append("  replay one: python tests/startup_fuzz.py --replay SEED")
        return "\n".join(lines)


def kind_of(command: str) -> str:
    """A mutation without its numbers, e.g. 'flip length': to tell kinds of damage apart."""
    op, _, rest = command.partition(" (")
    target = rest.split("[")[0].split(" /")[0].split("+")[0].rstrip(")")
    return f"{op.split()[0]} {target}".strip()


def examples(cases: list[Case], count: int) -> list[Case]:
    """The simplest cases, preferring ones whose damage is of a kind not shown yet."""
    ordered = sorted(cases, key=lambda c: (len(c.commands), len(str(c))))
    picked: list[Case] = []
    kinds: set[tuple[str, ...]] = set()
    for case in ordered:
        kind = tuple(sorted({kind_of(c) for c in case.commands}))
        if kind not in kinds and len(picked) < count:
            picked.append(case)
            kinds.add(kind)
    return picked


def build_bases(workdir: str) -> dict[str, Base]:
    return {s.name: build_base(s, workdir) for s in SCENARIOS}


def run_seeds(seeds: Iterable[int], bases: dict[str, Base], workdir: str) -> Tally:
    tally = Tally()
    runner = Runner(bases, workdir)
    try:
        for seed in seeds:
            case = make_case(seed, bases)
            tally.add(case, runner.run(case))
    finally:
        runner.close()
    return tally


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Base]:
    return build_bases(str(tmp_path_factory.mktemp("bases")))


@pytest.fixture
def runner(bases: dict[str, Base], tmp_path: Path) -> Iterator[Runner]:
    r = Runner(bases, str(tmp_path))
    yield r
    r.close()


@pytest.mark.parametrize("name", BASE_NAMES)
def test_the_undamaged_base_delivers_exactly_what_is_live(bases: dict[str, Base], runner: Runner, name: str):
    """The oracle's own check: before any damage, every live message comes back once."""
    base = bases[name]
    path = os.path.join(runner.workdir, "plain.log")
    with open(path, "wb") as f:
        f.write(base.data)
    log = Log(path, base.cap)
    log.start(runner.loop)
    got = []
    while (rec := log.core.next_ready()) is not None:
        got.append(log.core.payload(rec))
    runner.loop.run_until_complete(log.close())
    assert len(got) == len(set(got)) and set(got) == base.live
    with LogReader(path) as reader:
        waiting = {e.body for e in reader.entries() if e.state == "rdy"}
    assert waiting == {p.partition(b"\n\n")[2] for p in base.live}
    assert base.layout.wrapped, "the live region of the base should wrap around the ring"


@pytest.mark.parametrize("name", ["ring64-moved", "ring256-unsynced"])
def test_the_bases_are_the_same_bytes_every_run(bases: dict[str, Base], tmp_path: Path, name: str):
    """Seeds replay only if the workload writes identical files each time (the crash
    copies are the ones most exposed to timing)."""
    scenario = SCENARIOS[BASE_NAMES.index(name)]
    assert build_base(scenario, str(tmp_path)).data == bases[name].data


def test_the_moved_base_holds_a_message_twice(bases: dict[str, Base]):
    """It is the file a crash leaves right after the held message was copied forward: the
    copy is written and the original not yet overwritten. (Whether both are in the live
    region depends on when the log retires the original, so this looks at the bytes.)"""
    base = bases["ring64-moved"]
    assert base.data.count(message(0, SCENARIOS[1].longest)) == 2


@pytest.mark.parametrize("name", BASE_NAMES)
def test_fuzzed_startup_recovers_or_refuses(bases: dict[str, Base], runner: Runner, name: str):
    """Seeds 0 .. DEFAULT_CASES-1, those of this base (seed % 4): on failure, the classes
    found and the simplest seeds of each, which tests/startup_fuzz.py --replay shows.
    It stops at MAX_HANGS cases that hang, each of which costs CASE_SECONDS."""
    index = BASE_NAMES.index(name)
    seeds = range(index, DEFAULT_CASES, len(BASE_NAMES))
    tally = Tally()
    for seed in seeds:
        case = make_case(seed, bases)
        tally.add(case, runner.run(case))
        if sum(len(v) for k, v in tally.failures.items() if k.startswith("hang")) >= MAX_HANGS:
            break
    if tally.failures:
        pytest.fail(tally.report(), pytrace=False)


# ---------------------------------------------------------------- fixed failure classes


@dataclass(frozen=True)
class Fixed:
    """A failure class the fuzzing found, spelled out: the damage (aimed by `kind[k]+d`,
    so that it lands on the same part of the file if the layout shifts, and aimed anew
    when a base changes shape), and the seed that found it, with the command it made
    then (on the base of that time)."""

    name: str
    seed: int
    found: str
    base: str
    commands: tuple[str, ...]


FIXED = (
    # The wrapped part of the region, [tail, end of ring), is skimmed by record headers
    # alone; a length one flipped bit makes 32 MiB longer sends the skim past the end of
    # the file, where it indexes an empty read: IndexError in Scan._skim.
    Fixed(
        "flipped-length-digit-sends-the-skim-past-the-end",
        1433,
        "flip 55750.1 (length[9]+1)",
        "ring64-moved",
        ("flip length[3]+1.1",),
    ),
    # A file cut short inside the wrapped part of the region: the same skim reads past
    # the new end of the file.
    Fixed(
        "truncation-inside-the-wrapped-region",
        68,
        "cut 59854 (payload[86]+168)",
        "ring64-closed",
        ("cut payload[86]+168",),
    ),
    # Start-up skips a zeroed sector (it finds the next intact record), but the read
    # cursor parses the same bytes again with no damage handling: FormatError from
    # next_ready, on the first delivery that reaches it.
    Fixed(
        "zeroed-sector-skipped-at-start-up-kills-delivery",
        665,
        "zero 33280 512 (payload[105]+2)",
        "ring64-moved",
        ("zero payload[15]+2 512",),
    ),
    # The same with a flipped length digit where start-up checks every CRC: start-up
    # skips the record, the cursor follows the length (2 MiB too long) off the file.
    Fixed(
        "flipped-length-digit-skipped-at-start-up-kills-delivery",
        157,
        "flip 21490.1 (length[81]+2)",
        "ring64-moved",
        ("flip length[10]+2.1",),
    ),
    # A flipped timestamp digit in the oldest waiting record, in the skimmed part: the
    # skim never parses the timestamp, then LogReader.summary() does (for the oldest
    # message's age) and raises FormatError; delivery fails on it too.
    Fixed(
        "flipped-time-digit-of-the-oldest-message",
        15872,
        "flip 22633.5 (header[0]+46)",
        "ring64-closed",
        ("flip header[0]+46.5",),
    ),
)


@pytest.mark.parametrize("fixed", FIXED, ids=[f.name for f in FIXED])
def test_fixed_damage(bases: dict[str, Base], runner: Runner, fixed: Fixed):
    """Each must recover or refuse; they fail until the log handles that damage."""
    base = bases[fixed.base]
    case = Case(fixed.seed, fixed.base, base.cap, fixed.commands)
    outcome = runner.run(case)
    if outcome.failures:
        pytest.fail(
            "\n".join([f"{case}  (found as {fixed.found})", *outcome.failures, outcome.traces[-1]]), pytrace=False
        )


# ---------------------------------------------------------------- memory

MEMORY_LIMIT = 384 << 20
MEMORY_CHILD = """
import asyncio, resource, sys
from curb.log import Log, LogError, LogReader
path, cap, limit, what = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
if what == "reader":
    try:
        with LogReader(path) as reader:
            listed = sum(1 for _ in reader.entries())
            reader.summary()
        print("listed", listed)
    except LogError as err:
        print("refused:", err)
    sys.exit(0)
try:
    log = Log(path, cap)
except LogError as err:
    print("refused:", err)
    sys.exit(0)
loop = asyncio.new_event_loop()
log.start(loop)
n = 0
while (rec := log.core.next_ready()) is not None:
    log.core.payload(rec)
    n += 1
loop.run_until_complete(log.close())
print("delivered", n)
"""


def in_a_small_address_space(what: str, data: bytes, cap: int, workdir: Path) -> subprocess.CompletedProcess:
    """The reader or a start-up (`what`) of `data` in a child whose address space is
    MEMORY_LIMIT: a
    length field is trusted with a read of that many bytes, and Linux overcommit hides
    the allocation here; under a limit, as in a container, it is a MemoryError."""
    path = workdir / "huge.log"
    path.write_bytes(data)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(CURB_DIR.parent), os.environ.get("PYTHONPATH")]))
    )
    return subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(path), str(cap), str(MEMORY_LIMIT), what],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("what", ["reader", "start-up"])
def test_the_memory_limit_leaves_room_for_an_undamaged_file(bases: dict[str, Base], tmp_path: Path, what: str):
    """The control for the next test: the limit is not too small for a normal start-up."""
    base = bases["ring64-closed"]
    child = in_a_small_address_space(what, base.data, base.cap, tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("listed" if what == "reader" else f"delivered {len(base.live)}")


@pytest.mark.parametrize("what", ["reader", "start-up"])
def test_a_huge_length_field_does_not_exhaust_memory(bases: dict[str, Base], tmp_path: Path, what: str):
    """The length field is 8 hex digits, so ffffffff (4 GiB) is the most it can claim:
    as fatal as 1 TB under a limit of a few hundred MiB. The record is past the end of
    the ring, where start-up reads whole records to check their CRC. The damage is the
    huge length of seed 36 ('set 1934 ffffffff (length[101])'), which in-process, with
    memory overcommitted, fails only on delivery."""
    base = bases["ring64-closed"]
    data = mutated(base, ["set length[-1] ffffffff"])  # the newest record, whose CRC start-up checks
    child = in_a_small_address_space(what, bytes(data), base.cap, tmp_path)
    assert "MemoryError" not in child.stderr, child.stderr
    assert child.returncode == 0, child.stderr
