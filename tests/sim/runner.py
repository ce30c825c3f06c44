"""The simulator's runner, one for every workload: seeds, processes, statistics, the
failure report and the command line of `bin/crashsim`.

A workload (the log's, `sim.log_driver`; the whole broker's, `sim.driver`; a router's in
front of several instances, `sim.router_driver`) is a
`Target`: a name, how to play one seed (`play`, returning an `Outcome`) and its options.
The runner plays ranges of seeds over processes, sums each seed's `Stats`, groups the
failed seeds by the kind of their findings with example seeds, and prints the totals
line; `--seed S -v` replays one seed with its trace. Every choice of a seed comes from
the seed, so a failure prints the command that replays it exactly.

    bin/crashsim --seeds 2000 --start 0 --jobs 2          # the log's workload
    bin/crashsim --broker --seeds 2000 --jobs 2           # the whole broker's
    bin/crashsim --router --seeds 2000 --jobs 2           # a router's, in front of instances
    bin/crashsim [--broker | --router] --seed S -v        # replay one seed
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Protocol, TypeVar

Options = tuple[tuple[str, Any], ...]  # a target's options, hashable and picklable
BLOCK = 100  # the most seeds one process plays before it reports
PROGRESS_S = 10.0


class SimFailure(Exception):
    """An invariant broke. `kind` groups failures of one sort across seeds."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(slots=True)
class Stats:
    """What a run of seeds did, summed over seeds and processes for the totals line.
    Each workload adds its own counters and says how its line reads."""

    seeds: int = 0
    failures: int = 0

    def add(self, other: Stats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def line(self) -> str:
        return f"seeds {self.seeds}, failures {self.failures}"


S = TypeVar("S", bound=Stats)
S_co = TypeVar("S_co", bound=Stats, covariant=True)


@dataclass(slots=True)
class Finding:
    """One broken invariant of one seed: where, what, and the trace leading to it."""

    kind: str
    step: int
    text: str
    trace: list[str]


@dataclass(slots=True)
class Outcome(Generic[S]):
    """What one seed did and what it found; `replay` is the command that plays it again
    (without --seed, --steps and -v)."""

    seed: int
    stats: S
    replay: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    @property
    def kind(self) -> str | None:
        """The first finding's kind (the one that stopped the seed), or None."""
        return self.findings[0].kind if self.findings else None

    def report(self, steps: int, trace: bool = True) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"seed {self.seed} step {f.step}: {f.text}")
            lines += f.trace if trace else []
        lines.append(f"  replay: {self.replay} --seed {self.seed} --steps {steps} -v")
        return "\n".join(lines)


class Playable(Protocol[S_co]):
    """One seed's simulation, as the runner sees it."""

    @property
    def stats(self) -> S_co: ...
    @property
    def step(self) -> int: ...

    def play(self) -> None: ...
    def traced(self) -> list[str]:
        """The last lines of the trace, for a failure's report."""

    def notes(self) -> list[Finding]:
        """Broken invariants noted on the way that did not stop the seed."""


def play(sim: Playable[S], seed: int, replay: str, ignore: frozenset[str] = frozenset()) -> Outcome[S]:
    """Play one seed: a broken invariant, or an exception from the code under test, is a
    finding; so is each note. Kinds in `ignore` are dropped (to hunt past a known one)."""
    outcome: Outcome[S] = Outcome(seed, sim.stats, replay)
    try:
        sim.play()
    except SimFailure as err:
        outcome.findings.append(Finding(err.kind, sim.step, str(err), sim.traced()))
    except Exception as err:  # the code under test raising is a finding, reported like the others
        text = f"exception: {err!r}\n" + traceback.format_exc(limit=-8)
        outcome.findings.append(Finding(f"exception {type(err).__name__}", sim.step, text, sim.traced()))
    outcome.findings += sim.notes()
    outcome.findings = [f for f in outcome.findings if f.kind not in ignore]
    outcome.stats.failures = int(outcome.failed)
    return outcome


@dataclass(frozen=True, slots=True)
class Target(Generic[S]):
    """A workload the runner plays: `name` prefixes its progress and totals lines,
    `run_seed(seed, steps, verbose, out, ignore, **options)` plays one seed,
    `add_options` adds its own flags and `options` reads them back."""

    name: str
    description: str
    steps: int
    run_seed: Callable[..., Outcome[S]]
    stats: Callable[[], S]
    show: int = 5
    add_options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    options: Callable[[argparse.Namespace], dict[str, Any]] = lambda args: {}


@dataclass(slots=True)
class Totals(Generic[S]):
    stats: S
    failed: list[Outcome[S]] = field(default_factory=list)

    def add(self, other: Totals[S]) -> None:
        self.stats.add(other.stats)
        self.failed += other.failed

    def kinds(self) -> dict[str, list[int]]:
        """The failed seeds by the kind of their findings, each list sorted."""
        kinds: dict[str, list[int]] = {}
        for outcome in self.failed:
            for kind in {f.kind for f in outcome.findings}:
                kinds.setdefault(kind, []).append(outcome.seed)
        return {kind: sorted(seeds) for kind, seeds in sorted(kinds.items())}


def _targets() -> dict[str, Target[Any]]:
    from sim import driver, log_driver, router_driver

    return {"log": log_driver.TARGET, "broker": driver.TARGET, "router": router_driver.TARGET}


def run_range(
    target: Target[S], start: int, count: int, steps: int, ignore: frozenset[str] = frozenset(), options: Options = ()
) -> Totals[S]:
    """Play seeds start .. start+count-1 in this process."""
    totals = Totals(target.stats())
    for seed in range(start, start + count):
        outcome = target.run_seed(seed, steps, ignore=ignore, **dict(options))
        totals.stats.add(outcome.stats)
        if outcome.failed:
            totals.failed.append(outcome)
    return totals


Block = tuple[str, int, int, int, frozenset[str], Options]


def _run_block(block: Block) -> Totals[Any]:
    name, start, count, steps, ignore, options = block
    return run_range(_targets()[name], start, count, steps, ignore, options)


def run_many(
    target: Target[S],
    start: int,
    count: int,
    steps: int,
    jobs: int,
    ignore: frozenset[str] = frozenset(),
    options: Options = (),
    progress: Callable[[Totals[S], float], None] | None = None,
) -> Totals[S]:
    """Play `count` seeds over `jobs` processes, calling `progress` now and then."""
    name = next(key for key, known in _targets().items() if known is target)
    block = max(1, min(BLOCK, count // (jobs * 4) or 1))
    blocks = [
        (name, s, min(block, start + count - s), steps, ignore, options) for s in range(start, start + count, block)
    ]
    totals = Totals(target.stats())
    began = last = time.monotonic()
    for part in _map(blocks, jobs):
        totals.add(part)
        now = time.monotonic()
        if progress is not None and now - last >= PROGRESS_S:
            progress(totals, now - began)
            last = now
    return totals


def _map(blocks: Sequence[Block], jobs: int) -> Iterator[Totals[Any]]:
    if jobs <= 1:
        yield from map(_run_block, blocks)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap_unordered(_run_block, blocks)


# ---------------------------------------------------------------- command line


def main(argv: Iterable[str] | None = None) -> int:
    """`bin/crashsim [--broker | --router] ...`: the log's workload, with --broker the whole
    broker's, with --router a router's in front of several instances."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    name = "router" if "--router" in args_in else "broker" if "--broker" in args_in else "log"
    target = _targets()[name]
    prog = "bin/crashsim" + ("" if name == "log" else f" --{name}")
    parser = argparse.ArgumentParser(prog=prog, description=target.description)
    parser.add_argument("--broker", action="store_true", help="the whole broker's workload (else the log's)")
    parser.add_argument("--router", action="store_true", help="a router's workload, in front of several instances")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to play (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, help="play just this seed (replay a failure)")
    parser.add_argument("--steps", type=int, default=target.steps, help=f"steps per seed (default {target.steps})")
    parser.add_argument("--jobs", type=int, default=1, help="processes to fan out over (default 1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the trace of every step")
    parser.add_argument(
        "--show", type=int, default=target.show, help=f"failures to print in full (default {target.show})"
    )
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="KIND",
        help="drop findings of this kind (as printed after FAILED); repeatable",
    )
    target.add_options(parser)
    args = parser.parse_args(args_in)
    ignore = frozenset(args.ignore)
    options = target.options(args)
    if args.seed is not None:
        began = time.monotonic()
        outcome = target.run_seed(args.seed, args.steps, args.verbose, ignore=ignore, **options)
        print(f"seed {args.seed}: {outcome.stats.line()}, {time.monotonic() - began:.2f} s")
        if not outcome.failed:
            print("ok")
            return 0
        print(outcome.report(args.steps, trace=not args.verbose))
        return 1
    began = time.monotonic()
    jobs = max(1, args.jobs)

    def progress(totals: Totals[Any], seconds: float) -> None:
        done = totals.stats.seeds
        print(
            f"{target.name}: {done}/{args.seeds} seeds, {len(totals.failed)} failed, {done / seconds:.1f} seeds/s",
            file=sys.stderr,
            flush=True,
        )

    totals = run_many(target, args.start, args.seeds, args.steps, jobs, ignore, tuple(options.items()), progress)
    for outcome in sorted(totals.failed, key=lambda o: o.seed)[: args.show]:
        print(outcome.report(args.steps), end="\n\n")
    for kind, seeds in totals.kinds().items():
        print(f"FAILED {kind}: {len(seeds)} seeds, e.g. {seeds[:8]}")
    print(
        f"{target.name}: seeds {args.start}..{args.start + args.seeds - 1}: {totals.stats.line()}, "
        f"{time.monotonic() - began:.1f} s with {jobs} jobs"
    )
    return 1 if totals.failed else 0
