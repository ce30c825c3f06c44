"""The start-up fuzz of tests/test_startup_fuzz.py, by the hundred thousand (opt-in).

The test suite runs a few thousand cases; this runs as many as you like, in parallel:

    python tests/startup_fuzz.py --cases 200000 --seed 0 --jobs 4
    python tests/startup_fuzz.py --replay 1234

Case seeds are SEED .. SEED+CASES-1; each one alone names a base file, the cap to open
it with and its mutations, so a failing case replays from its seed (on the same base
bytes: the digests printed first must match). At the end it prints the cases run, how
many recovered, how many were refused cleanly, and each failure class with the seeds
that replay it. Exit status: 0 if nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator

import test_startup_fuzz as fuzz

CHUNK = 250
_bases: dict[str, fuzz.Base] = {}


def chunks(first: int, count: int) -> Iterator[range]:
    for start in range(first, first + count, CHUNK):
        yield range(start, min(start + CHUNK, first + count))


def run_chunk(seeds: range) -> fuzz.Tally:
    """One worker's share, in a scratch directory of its own."""
    with tempfile.TemporaryDirectory(prefix="startup-fuzz-") as workdir:
        return fuzz.run_seeds(seeds, _bases, workdir)


def run(first: int, count: int, jobs: int) -> fuzz.Tally:
    total = fuzz.Tally()
    started = last = time.monotonic()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for part in pool.imap_unordered(run_chunk, chunks(first, count)):
            total.merge(part)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                print(
                    f"  {total.cases} cases, {total.failed} failed, {total.cases / (last - started):.0f}/s",
                    file=sys.stderr,
                )
    return total


def replay(seed: int) -> int:
    """Run one case and show what happened, tracebacks included."""
    with tempfile.TemporaryDirectory(prefix="startup-fuzz-") as workdir:
        runner = fuzz.Runner(_bases, workdir)
        case = fuzz.make_case(seed, _bases)
        outcome = runner.run(case)
        runner.close()
    print(case)
    print(f"{outcome.kind}: {outcome.detail}")
    for cls, trace in zip(outcome.failures, outcome.traces, strict=True):
        print(f"\n{cls}\n{trace}")
    return 1 if outcome.failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10000, help="how many cases (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="the first case seed (default 0)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run the one case SEED, verbosely")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-fuzz-bases-") as basedir:
        _bases.update(fuzz.build_bases(basedir))
    for name, base in _bases.items():
        print(f"base {name}: {len(base.data)} bytes, sha256 {hashlib.sha256(base.data).hexdigest()[:16]}")
    if args.replay is not None:
        return replay(args.replay)
    started = time.monotonic()
    tally = run(args.seed, args.cases, args.jobs)
    print(f"seeds {args.seed}..{args.seed + args.cases - 1}, {time.monotonic() - started:.0f}s")
    print(tally.report(shown=5))
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
