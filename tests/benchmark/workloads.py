"""The workloads. Each measures one broker (a Side) and returns its figures by row key;
each ends by draining the queue and checking everything that came back against what
was sent, so a figure is only ever reported for a broker that lost nothing."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from benchmark import load, loopback
from benchmark.bodies import Tally, VerificationError
from benchmark.broker import CurbBroker, rss_bytes
from benchmark.crew import Crew
from benchmark.disk import synced_appends_per_second
from benchmark.target import Target, close
from curb.log import LogReader, parse_size

MIB = 1024 * 1024
PIPELINE_WINDOW = 256
MIXED_WINDOW = 64
MIXED_PREFETCH = 256
DRAIN_PREFETCH = 256
PREFILL_PRODUCER = 100  # prefills number their messages apart from the timed producers
AFTER_DEADLINE_QUIET = 0.3  # a timed consumer stops once the queue was silent this long
LEFTOVER_QUIET = 1.0  # and so does the drain of an external broker's leftovers
FILL_FRACTION = 0.9
CALIBRATION_MESSAGES = 1000  # sent first to learn how many bytes a message takes in the log
DISK_RECORD_OVERHEAD = 64  # bytes a log record adds to a body, roughly, for the disk probe
RSS_SAMPLE_SECONDS = 0.01
BODY_SIZES = (100, 4096, 65536, 1 << 20)  # --body-sizes: the body-size workloads' bodies
BODY_PRODUCERS = 2
BODY_PREFETCH = 64
BODY_WINDOW_BYTES = 16 * MIB  # a body-size producer has at most this many bytes unreceipted

ROWS: dict[str, tuple[str, str]] = {
    "produce-w1": ("produce, receipt each, 1 producer, window 1", "msg/s"),
    "produce-4x256": ("produce, receipt each, 4 producers x 256 in flight", "msg/s"),
    "consume-p1": ("consume + ACK, prefetch 1", "msg/s"),
    "consume-p256": ("consume + ACK, prefetch 256", "msg/s"),
    "mixed": ("mixed 2 producers (w64) + 2 consumers (p256), consumed", "msg/s"),
    "pingpong-p50": ("ping-pong SEND -> MESSAGE, p50", "us"),
    "pingpong-p99": ("ping-pong SEND -> MESSAGE, p99", "us"),
    "rss-idle": ("broker RSS, idle", "MiB"),
    "rss-queued": ("broker RSS, {queued:,} queued", "MiB"),
    "rss-peak": ("broker RSS, peak with 4 producers + 4 consumers", "MiB"),
    "startup": ("restart with {queued:,} queued, until CONNECTED", "s"),
    "fill-empty": ("balanced 2+2, log empty", "msg/s"),
    "fill-full": ("balanced 2+2, log 90% full", "msg/s"),
    "fill-ratio": ("balanced 2+2, 90% full / empty", "ratio"),
    "disk-1": ("disk: append + fdatasync, 1 record per sync", "rec/s"),
    "disk-64": ("disk: append + fdatasync, 64 records per sync", "rec/s"),
}


def all_rows(settings: Settings) -> dict[str, tuple[str, str]]:
    """Every row in table order: the fixed ones, then the body-size workloads' rows for
    the sizes chosen and the loopback ceiling they are set against."""
    return {
        **ROWS,
        **body_rows(settings.body_sizes),
        "loopback": ("loopback: one connection, trivial sender and reader", "MB/s"),
    }


def body_rows(sizes: tuple[int, ...]) -> dict[str, tuple[str, str]]:
    """The rows of the body-size workloads, for these body sizes."""
    rows = {}
    for size in sizes:
        rows[f"produce-b{size}"] = (
            f"produce {size:,} B bodies, {BODY_PRODUCERS} producers, receipt each, window {body_window(size)}",
            "msg/s",
        )
        rows[f"consume-b{size}"] = (f"consume + ACK {size:,} B bodies, prefetch {BODY_PREFETCH}, prefilled", "msg/s")
    return rows


def body_window(size: int) -> int:
    return max(1, min(PIPELINE_WINDOW, BODY_WINDOW_BYTES // size))


MACHINE_ROWS = frozenset({"disk-1", "disk-64", "loopback"})  # figures of the machine, not of a broker


@dataclass(frozen=True)
class Settings:
    runs: int = 3
    size: int = 100  # body bytes
    seconds: float = 10.0  # length of the timed mixed and balanced workloads
    messages: int = 20_000  # per produce/consume measurement (a tenth for window 1)
    pings: int = 5_000
    warmup: int = 200
    queued: int = 100_000  # for the RSS and restart rows
    cap: str = "1GiB"
    fill_cap: str = "16MiB"  # the log that the 90%-full workload fills
    timeout: float = 60.0  # longest wait for any one frame
    quiet: float = 5.0  # how long a final drain waits for messages still missing
    disk_seconds: float = 2.0
    broker_args: tuple[str, ...] = ()
    body_sizes: tuple[int, ...] = BODY_SIZES
    body_bytes: int = 256 * MIB  # at most this many body bytes per body-size measurement
    loopback_seconds: float = 2.0


@dataclass
class Side:
    """One broker under test: a Curb the benchmark starts itself (no target), or a broker
    already running at an address (`pid` for its memory, `fill_count` for how many
    messages stand for a 90% full store)."""

    name: str
    target: Target | None = None
    pid: int | None = None
    fill_count: int | None = None

    @property
    def managed(self) -> bool:
        return self.target is None


@dataclass(frozen=True)
class Group:
    """Workloads measured together (`names` are what --only selects); `per_side` False for
    figures that belong to the machine, not to a broker."""

    names: frozenset[str]
    measure: Callable[[Bench, Side, set[str]], dict[str, float]]
    per_side: bool = True


class PeakRss:
    """Samples a process's resident memory in a thread while in the `with` block."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            self.peak = max(self.peak, rss_bytes(self.pid))


def percentile(ordered: list[int], fraction: float) -> int:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Bench:
    """Runs the selected workloads on every side, `runs` times, and keeps every sample."""

    def __init__(self, settings: Settings, sides: list[Side], crew: Crew, workdir: str, say: Callable[[str], None]):
        self.settings = settings
        self.sides = sides
        self.crew = crew
        self.workdir = workdir
        self.say = say
        self.notes: dict[str, str] = {}  # by topic; a later run's note replaces an earlier one
        self.duplicates: dict[str, int] = defaultdict(int)
        self.curb_fill_count: int | None = None  # messages that filled Curb's log to 90% this run
        self._token = secrets.token_hex(3)
        self._serial = itertools.count()

    def run(self, selected: set[str]) -> dict[str, dict[str, list[float]]]:
        samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for side in self.sides:
            if side.target is not None:  # not managed
                self.clear(side.name, side.target)
        for run in range(1, self.settings.runs + 1):
            self.curb_fill_count = None
            for group in GROUPS:
                wanted = selected & group.names
                if not wanted:
                    continue
                for side in self.sides if group.per_side else self.sides[:1]:
                    figures = group.measure(self, side, wanted)
                    for key, value in figures.items():
                        samples[key][side.name].append(value)
                    shown = ", ".join(f"{key} {value:,.2f}" for key, value in figures.items()) or "nothing measurable"
                    self.say(f"run {run}/{self.settings.runs} {side.name}: {shown}")
        return samples

    def new_run_id(self) -> str:
        return f"{self._token}-{next(self._serial)}"

    def clear(self, name: str, target: Target) -> None:
        """Empty an external broker's queue of leftovers before measuring it."""
        conn, connected = target.connect(self.settings.timeout)
        close(conn)
        server = connected.headers.get("server")
        [result] = self.crew.run([self.consume_task(target, "", DRAIN_PREFETCH, quiet=LEFTOVER_QUIET)])
        self.notes[name] = f"{name}: {server or 'server unnamed'}" + (
            f"; {result['received']:,} leftover messages drained first" if result["received"] else ""
        )

    @contextmanager
    def broker(self, side: Side, label: str, cap: str | None = None) -> Iterator[tuple[Target, CurbBroker | None]]:
        """A fresh Curb on a file of its own (stopped cleanly after), or the side's own broker."""
        if side.target is not None:  # not managed
            yield side.target, None
            return
        path = os.path.join(self.workdir, f"{label}-{next(self._serial)}.log")
        broker = CurbBroker(path, cap or self.settings.cap, self.settings.timeout, self.settings.broker_args)
        broker.start()
        try:
            yield broker.target, broker
        except BaseException:
            broker.kill()
            raise
        broker.stop()

    def produce_task(self, target: Target, run_id: str, producer: int, window: int, size: int | None = None, **kwargs):
        return load.produce, dict(
            target=target,
            run_id=run_id,
            producer=producer,
            size=size or self.settings.size,
            window=window,
            timeout=self.settings.timeout,
            **kwargs,
        )

    def consume_task(self, target: Target, run_id: str, prefetch: int, size: int | None = None, **kwargs):
        return load.consume, dict(
            target=target,
            run_id=run_id,
            size=size or self.settings.size,
            prefetch=prefetch,
            timeout=self.settings.timeout,
            **kwargs,
        )

    def prefill(
        self,
        target: Target,
        run_id: str,
        count: int,
        first_producer: int = PREFILL_PRODUCER,
        size: int | None = None,
    ) -> dict[int, int]:
        """Queue `count` messages (untimed, two pipelined producers); returns what each sent."""
        shares = [share for share in (count - count // 2, count // 2) if share]
        window = body_window(size) if size else PIPELINE_WINDOW
        results = self.crew.run(
            [
                self.produce_task(target, run_id, first_producer + index, window, size, count=share)
                for index, share in enumerate(shares)
            ]
        )
        return {result["producer"]: result["sent"] for result in results}

    def mixed(
        self, target: Target, run_id: str, producers: int, consumers: int, balanced: bool = False
    ) -> tuple[float, dict[int, int], list[dict]]:
        """Producers (window 64) and consumers (prefetch 256) for `seconds`, then the consumers
        empty the queue. Returns messages consumed per second before the deadline, what each
        producer sent and what the consumers received. `balanced` keeps the queue's depth."""
        seconds = self.settings.seconds
        gate = (
            load.Gate(tuple(range(producers)), tuple(range(producers, producers + consumers)), producers * MIXED_WINDOW)
            if balanced
            else None
        )
        results = self.crew.run(
            [
                self.produce_task(target, run_id, index, MIXED_WINDOW, seconds=seconds, gate=gate)
                for index in range(producers)
            ]
            + [
                self.consume_task(
                    target, run_id, MIXED_PREFETCH, seconds=seconds, quiet=AFTER_DEADLINE_QUIET, gate=gate
                )
                for _ in range(consumers)
            ]
        )
        consumed = results[producers:]
        rate = sum(result["before_deadline"] for result in consumed) / seconds
        return rate, {result["producer"]: result["sent"] for result in results[:producers]}, consumed

    def check(
        self,
        what: str,
        side: Side,
        target: Target,
        run_id: str,
        sent: dict[int, int],
        received: list[dict],
        size: int | None = None,
    ) -> None:
        """Drain the queue and verify: every sent message came back intact, nothing else came."""
        tally = Tally(sent)
        for result in received:
            tally.add(array("q", result["seqs"]))
            tally.add_rejects(result["foreign"], result["altered"])
        [drained] = self.crew.run(
            [
                self.consume_task(
                    target,
                    run_id,
                    DRAIN_PREFETCH,
                    size,
                    wanted=tally.missing().tobytes(),
                    quiet=self.settings.quiet,
                )
            ]
        )
        tally.add(array("q", drained["seqs"]))
        tally.add_rejects(drained["foreign"], drained["altered"])
        verdict = tally.verdict()
        if verdict.problems():
            raise VerificationError(f"{what} on {side.name}: " + "; ".join(verdict.problems()))
        if verdict.duplicates:
            self.duplicates[f"{what} on {side.name}"] += verdict.duplicates

    def fill_log(self, target: Target, broker: CurbBroker, run_id: str) -> dict[int, int]:
        """Queue messages until their records take FILL_FRACTION of the broker's -cap."""
        sent = self.prefill(target, run_id, CALIBRATION_MESSAGES)
        with LogReader(broker.path) as reader:
            summary = reader.summary()
        cap = parse_size(broker.cap)
        total = int(FILL_FRACTION * cap * summary.messages / summary.live_bytes)
        sent |= self.prefill(target, run_id, total - summary.messages, PREFILL_PRODUCER + 2)
        with LogReader(broker.path) as reader:
            summary = reader.summary()
        self.notes["fill90"] = (
            f"90% full: {summary.messages:,} messages in {summary.live_bytes:,} live bytes "
            f"of a {cap:,}-byte cap ({summary.live_bytes / cap:.0%})"
        )
        self.curb_fill_count = total
        return sent


def produce_one_at_a_time(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    count = max(100, bench.settings.messages // 10)
    with bench.broker(side, "produce-w1") as (target, _):
        run_id = bench.new_run_id()
        [result] = bench.crew.run([bench.produce_task(target, run_id, 0, 1, count=count)])
        bench.check("produce-w1", side, target, run_id, {0: result["sent"]}, [])
    return {"produce-w1": count / (result["end"] - result["start"])}


def produce_pipelined(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    share = max(1, bench.settings.messages // 4)
    with bench.broker(side, "produce-4x256") as (target, _):
        run_id = bench.new_run_id()
        results = bench.crew.run(
            [bench.produce_task(target, run_id, producer, PIPELINE_WINDOW, count=share) for producer in range(4)]
        )
        bench.check("produce-4x256", side, target, run_id, {r["producer"]: r["sent"] for r in results}, [])
    return {"produce-4x256": 4 * share / (max(r["end"] for r in results) - results[0]["start"])}


def consume_prefilled(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    count = bench.settings.messages
    figures = {}
    for prefetch in (1, 256):
        key = f"consume-p{prefetch}"
        if key not in wanted:
            continue
        with bench.broker(side, key) as (target, _):
            run_id = bench.new_run_id()
            sent = bench.prefill(target, run_id, count)
            [result] = bench.crew.run(
                [bench.consume_task(target, run_id, prefetch, count=count, subscribe_at_start=True)]
            )
            bench.check(key, side, target, run_id, sent, [result])
        figures[key] = count / (result["end"] - result["start"])
    return figures


def mixed(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    with bench.broker(side, "mixed") as (target, _):
        run_id = bench.new_run_id()
        rate, sent, received = bench.mixed(target, run_id, 2, 2)
        bench.check("mixed", side, target, run_id, sent, received)
    return {"mixed": rate}


def pingpong(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    settings = bench.settings
    with bench.broker(side, "pingpong") as (target, _):
        run_id = bench.new_run_id()
        [result] = bench.crew.run(
            [
                (
                    load.pingpong,
                    dict(
                        target=target,
                        run_id=run_id,
                        size=settings.size,
                        rounds=settings.pings,
                        warmup=settings.warmup,
                        timeout=settings.timeout,
                    ),
                )
            ]
        )
        bench.check("pingpong", side, target, run_id, {0: settings.warmup + settings.pings}, [result])
    latencies = sorted(array("q", result["latency_ns"]))
    return {"pingpong-p50": percentile(latencies, 0.50) / 1000, "pingpong-p99": percentile(latencies, 0.99) / 1000}


def queued(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    """Memory idle, under 4+4 load and with many messages queued; then the restart time
    with them queued (Curb only), which the final drain proves lost nothing."""
    figures: dict[str, float] = {}
    with bench.broker(side, "queued") as (target, broker):
        pid = broker.pid if broker is not None else side.pid
        rss_pid = pid if "rss" in wanted else None
        restarted = broker if "startup" in wanted else None
        if rss_pid is None and restarted is None:
            return figures
        if rss_pid is not None:
            figures["rss-idle"] = rss_bytes(rss_pid) / MIB
            run_id = bench.new_run_id()
            with PeakRss(rss_pid) as peak:
                _, sent, received = bench.mixed(target, run_id, 4, 4)
            figures["rss-peak"] = peak.peak / MIB
            bench.check("rss-peak", side, target, run_id, sent, received)
        run_id = bench.new_run_id()
        sent = bench.prefill(target, run_id, bench.settings.queued)
        if rss_pid is not None:
            figures["rss-queued"] = rss_bytes(rss_pid) / MIB
        if restarted is not None:
            restarted.stop()
            figures["startup"] = restarted.start()
        bench.check("queued", side, target, run_id, sent, [])
    return figures


def fill90(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    """Balanced producers and consumers with the log empty, then with it 90% full."""
    count = side.fill_count or bench.curb_fill_count
    if not side.managed and count is None:
        bench.notes[f"fill90 {side.name}"] = (
            f"fill90 skipped on {side.name}: no fill count given and no Curb log filled in the same run"
        )
        return {}
    with bench.broker(side, "fill90", bench.settings.fill_cap) as (target, broker):
        run_id = bench.new_run_id()
        empty, sent, received = bench.mixed(target, run_id, 2, 2, balanced=True)
        bench.check("fill90 empty", side, target, run_id, sent, received)
        run_id = bench.new_run_id()
        if broker is not None:
            prefilled = bench.fill_log(target, broker, run_id)
        else:
            assert count is not None  # an external broker without a fill count returned above
            prefilled = bench.prefill(target, run_id, count)
        full, sent, received = bench.mixed(target, run_id, 2, 2, balanced=True)
        bench.check("fill90 full", side, target, run_id, prefilled | sent, received)
    return {"fill-empty": empty, "fill-full": full, "fill-ratio": full / empty}


def disk_limits(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    record = bench.settings.size + DISK_RECORD_OVERHEAD
    seconds = bench.settings.disk_seconds
    return {f"disk-{batch}": synced_appends_per_second(bench.workdir, record, batch, seconds) for batch in (1, 64)}


def body_sizes(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    """Produce and consume at each body size: a fresh broker per measurement, at most
    `body_bytes` of bodies each; the consumer takes a prefilled queue with prefetch 64."""
    settings = bench.settings
    figures = {}
    for size in settings.body_sizes:
        count = max(4, min(settings.messages, settings.body_bytes // size))
        share = max(1, count // BODY_PRODUCERS)
        key = f"produce-b{size}"
        with bench.broker(side, key) as (target, _):
            run_id = bench.new_run_id()
            results = bench.crew.run(
                [
                    bench.produce_task(target, run_id, producer, body_window(size), size, count=share)
                    for producer in range(BODY_PRODUCERS)
                ]
            )
            bench.check(key, side, target, run_id, {r["producer"]: r["sent"] for r in results}, [], size)
        figures[key] = BODY_PRODUCERS * share / (max(r["end"] for r in results) - results[0]["start"])
        key = f"consume-b{size}"
        with bench.broker(side, key) as (target, _):
            run_id = bench.new_run_id()
            sent = bench.prefill(target, run_id, count, size=size)
            [result] = bench.crew.run(
                [bench.consume_task(target, run_id, BODY_PREFETCH, size, count=count, subscribe_at_start=True)]
            )
            bench.check(key, side, target, run_id, sent, [result], size)
        figures[key] = count / (result["end"] - result["start"])
    return figures


def loopback_limit(bench: Bench, side: Side, wanted: set[str]) -> dict[str, float]:
    return {"loopback": loopback.bytes_per_second(bench.crew, bench.settings.loopback_seconds) / 1e6}


GROUPS = (
    Group(frozenset({"produce-w1"}), produce_one_at_a_time),
    Group(frozenset({"produce-4x256"}), produce_pipelined),
    Group(frozenset({"consume-p1", "consume-p256"}), consume_prefilled),
    Group(frozenset({"mixed"}), mixed),
    Group(frozenset({"pingpong"}), pingpong),
    Group(frozenset({"rss", "startup"}), queued),
    Group(frozenset({"fill90"}), fill90),
    Group(frozenset({"disk"}), disk_limits, per_side=False),
    Group(frozenset({"bodies"}), body_sizes),
    Group(frozenset({"bodies"}), loopback_limit, per_side=False),
)
WORKLOAD_NAMES = tuple(name for group in GROUPS for name in sorted(group.names))
