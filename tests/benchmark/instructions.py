"""`bin/bench --instructions`: the broker's CPU per message, counted in instructions.

Time on a shared machine swings by half between runs; the instructions a broker retires
for a workload do not. Each workload runs twice, against a fresh broker under callgrind
each time, with a small and a large load (LOADS); the difference of the two counts over
the difference of the loads is what one more message costs, so start-up, connecting,
subscribing and shutdown cancel out. Counting is switched on (`callgrind_control -i on`)
only once the broker is up and, for the consume workload, the queue prefilled, and off
again before the final drain that checks every message: the counts hold the measured
load and nothing else, in every thread of the broker.

CPython 3.11 shows callgrind only its C functions (the evaluation loop, dict and bytes
operations, the allocator), which says where the interpreter spends but not which Python
function made it. So each workload also runs twice under cProfile (no callgrind), switched
on and off around the load as callgrind is and timed by the main thread's CPU clock (so
that waiting for sockets or fdatasync does not count), and Curb's Python functions are
ranked by the difference of their cumulative time between the two loads, as a share of
the difference of the main thread's CPU time. cProfile's own cost per call inflates
functions called often; read the shares as a map, and the instruction counts as the
measure.
"""

from __future__ import annotations

import json
import os
import platform
import pstats
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import curb
from benchmark import load
from benchmark.broker import CurbBroker, RoutedCurb
from benchmark.target import BrokerError, Target
from benchmark.workloads import PIPELINE_WINDOW, Bench, Side
from curb.compiled import build, compiled_modules

LOADS = (2_000, 12_000)
QUICK_LOADS = (100, 600)
# --check: every workload against the committed baseline, at loads a few minutes measure,
# failing when one costs more than CHECK_MARGIN over its baseline.
CHECK_LOADS = (1_000, 6_000)
CHECK_MARGIN = 0.03
# One baseline a build: the compiled modules (setup.py, mypyc) retire far fewer
# instructions than the pure-Python ones, so each is guarded against its own figures.
BASELINES = {
    "pure": Path(__file__).with_name("instructions_baseline.json"),
    "compiled": Path(__file__).with_name("instructions_baseline_compiled.json"),
}
TOP = 20
START_SECONDS = 300.0  # a broker under callgrind starts 20 to 50 times slower
CALLGRIND = ("valgrind", "--tool=callgrind", "--dump-instr=no", "--instr-atstart=no")
# callgrind_annotate's lines: `1,234 (12.34%)  file:function [object]`.
_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)\s*$")
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)
CURB_DIR = os.path.dirname(curb.__file__)
CURB_MODULE = "curb/"
# `python -c PROFILED OUT -m curb FLAGS`: the broker under cProfile timed by the main
# thread's CPU clock, so that waiting (for sockets, for fdatasync) does not count;
# SIGUSR1 starts the profile, SIGUSR2 stops it (the broker does not use either).
PROFILED = """
import cProfile, runpy, signal, sys, time
out, sys.argv = sys.argv[1], ["curb", *sys.argv[4:]]
profile = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: profile.disable())
try:
    runpy.run_module("curb", run_name="__main__", alter_sys=True)
finally:
    profile.dump_stats(out)
"""
SIGNAL_SECONDS = 0.2
# The interpreter's own dispatch (calls, frames, the evaluation loop) is in every Python
# call's inclusive cost; the C-level list names the functions that do work instead:
# builtins and the allocator (the kernel is not counted). Recursion levels (`name'2`) are left out too.
_DISPATCH = re.compile(
    r"'\d+$|^0x|^_?Py(Eval|Function|Object_(Vectorcall|Call|MakeTpCall|FastCall)|_RunMain|_BytesMain)|^_PyEval"
    r"|^_PyFrame_|vectorcall|^context_run$|^slot_tp_call$|^cfunction_call|^run_|^pymain_|^main$"
    r"|^__libc_start|^_start$|^\(below main\)$|^thread_run$|^start_thread$|^clone"
)


Counting = Callable[[bool], None]  # counting(True) just before the measured load, (False) just after


@dataclass(frozen=True)
class Workload:
    label: str
    # Runs `count` messages through the broker at `target`, counting only the load (not a
    # prefill); returns what was sent per producer and what the consumers received, for
    # the check.
    run: Callable[[Bench, Target, str, int, Counting], tuple[dict[int, int], list[dict]]]


def _produce(window: int, producers: int):
    def run(bench: Bench, target: Target, run_id: str, count: int, counting: Counting):
        share = max(1, count // producers)
        counting(True)
        results = bench.crew.run(
            [bench.produce_task(target, run_id, producer, window, count=share) for producer in range(producers)]
        )
        counting(False)
        return {r["producer"]: r["sent"] for r in results}, []

    return run


def _consume(bench: Bench, target: Target, run_id: str, count: int, counting: Counting):
    sent = bench.prefill(target, run_id, count)
    counting(True)
    [result] = bench.crew.run([bench.consume_task(target, run_id, 256, count=count, subscribe_at_start=True)])
    counting(False)
    return sent, [result]


def _pingpong(bench: Bench, target: Target, run_id: str, count: int, counting: Counting):
    counting(True)
    task = dict(target=target, run_id=run_id, size=bench.settings.size, rounds=count, warmup=0)
    [result] = bench.crew.run([(load.pingpong, dict(task, timeout=bench.settings.timeout))])
    counting(False)
    return {0: count}, [result]


WORKLOADS = {
    "produce-4x256": Workload(
        f"SEND, receipt each, 4 producers x {PIPELINE_WINDOW} in flight", _produce(PIPELINE_WINDOW, 4)
    ),
    "produce-w1": Workload("SEND, receipt each, 1 producer, window 1", _produce(1, 1)),
    "consume-p256": Workload("consume + ACK, prefetch 256 (MESSAGE and its ACK)", _consume),
    "pingpong": Workload("ping-pong: SEND, its MESSAGE, its ACK", _pingpong),
    # Through `curb router`: the router's own instructions, and the instance's behind it.
    "router-produce-4x256": Workload("curb router: SEND forwarded, as produce-4x256", _produce(PIPELINE_WINDOW, 4)),
    "router-consume-p256": Workload("curb router: MESSAGE and ACK forwarded, as consume-p256", _consume),
    "behind-router-produce-4x256": Workload(
        "the instance behind curb router, produce-4x256", _produce(PIPELINE_WINDOW, 4)
    ),
    "behind-router-consume-p256": Workload("the instance behind curb router, consume-p256", _consume),
}
# Which process of a routed workload is measured (the others measure the broker alone).
MEASURED = {"router-": "router", "behind-router-": "instance"}


@dataclass
class Measured:
    """One workload's figures: instructions per message, and the top functions (name,
    instructions per message) of callgrind and (name, share) of cProfile."""

    key: str
    label: str
    per_message: float
    native: list[tuple[str, float]]
    python: list[tuple[str, float]]


def missing_tools() -> list[str]:
    return [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate") if shutil.which(tool) is None]


def measure(bench: Bench, keys: list[str], loads: tuple[int, int], profile: bool = True) -> list[Measured]:
    results = []
    for key in keys:
        counted = [_callgrind_run(bench, key, count) for count in loads]
        extra = loads[1] - loads[0]
        per_message = (counted[1][0] - counted[0][0]) / extra
        native = _top(_diff(counted[0][1], counted[1][1]), extra)
        python: list[tuple[str, float]] = []
        if profile:
            python = python_shares(*(_profile_run(bench, key, count) for count in loads))
        bench.say(f"{key}: {per_message:,.0f} instructions per message")
        results.append(Measured(key, WORKLOADS[key].label, per_message, native, python))
    return results


def _drive(
    bench: Bench, key: str, count: int, interpreter: tuple[str, ...], switch: Callable[[int, bool], None]
) -> None:
    """Run one load against a fresh broker started with `interpreter`, with `switch(pid,
    on)` turning its counting on just before the load and off just after; then check
    every message (not counted) and stop the broker cleanly."""
    path = os.path.join(bench.workdir, f"{key}-{bench.new_run_id()}.log")
    timeout = max(bench.settings.timeout, START_SECONDS)
    measured = next((who for prefix, who in MEASURED.items() if key.startswith(prefix)), None)
    broker: CurbBroker | RoutedCurb = (
        CurbBroker(path, bench.settings.cap, timeout, bench.settings.broker_args, interpreter)
        if measured is None
        else RoutedCurb(path, bench.settings.cap, timeout, bench.settings.broker_args, interpreter, measured)
    )
    broker.start()
    try:
        run_id = bench.new_run_id()
        sent, received = WORKLOADS[key].run(bench, broker.target, run_id, count, lambda on: switch(broker.pid, on))
        bench.check(f"{key} ({count:,} messages)", Side("curb"), broker.target, run_id, sent, received)
    except BaseException:
        broker.kill()
        raise
    broker.stop()


def _callgrind_run(bench: Bench, key: str, count: int) -> tuple[int, dict[str, int]]:
    """The broker's instructions while the load ran, in all and by function (inclusive)."""
    out = f"{bench.workdir}/{key}-{count}.callgrind"

    def switch(pid: int, on: bool) -> None:
        command = ["callgrind_control", "-i", "on" if on else "off", str(pid)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=bench.settings.timeout)
        if done.returncode != 0 or "OK" not in done.stdout:
            raise BrokerError(f"{' '.join(command)} failed: {(done.stdout + done.stderr).strip()}")

    bench.say(f"{key}: {count:,} messages under callgrind ...")
    _drive(bench, key, count, (*CALLGRIND, f"--callgrind-out-file={out}", sys.executable), switch)
    with open(out) as counts:
        totals = _TOTALS.search(counts.read())
    if totals is None:
        raise BrokerError(f"callgrind wrote no totals line to {out}")
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
        capture_output=True,
        text=True,
        timeout=bench.settings.timeout,
        check=True,
    ).stdout
    return int(totals.group(1)), parse_annotated(annotated)


def parse_annotated(text: str) -> dict[str, int]:
    """callgrind_annotate's per-function lines as {function: instructions}, the file and
    object names dropped (a function inlined from a header is listed once per file, with
    the same calls: the largest is kept)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = _ANNOTATED.match(line)
        if match and ":" in match.group(2) and "PROGRAM TOTALS" not in line:
            name = match.group(2).split(":", 1)[1].split(" [", 1)[0]
            found[name] = max(found.get(name, 0), int(match.group(1).replace(",", "")))
    return found


def _diff(small: dict[str, int], large: dict[str, int]) -> dict[str, float]:
    return {name: large[name] - small.get(name, 0) for name in large}


def _top(costs: dict[str, float], per: int) -> list[tuple[str, float]]:
    ranked = sorted(((n, c) for n, c in costs.items() if not _DISPATCH.search(n)), key=lambda item: -item[1])[:TOP]
    return [(name, cost / per) for name, cost in ranked]


def _profile_run(bench: Bench, key: str, count: int) -> pstats.Stats:
    """The broker's Python profile in CPU time while the load ran (cProfile, switched on
    and off by signals, written when the broker exits)."""
    out = f"{bench.workdir}/{key}-{count}.pstats"

    def switch(pid: int, on: bool) -> None:
        os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)
        time.sleep(SIGNAL_SECONDS)  # the broker's main thread takes the signal between two bytecodes

    bench.say(f"{key}: {count:,} messages under cProfile ...")
    _drive(bench, key, count, (sys.executable, "-c", PROFILED, out), switch)
    return pstats.Stats(out)


def python_shares(small: pstats.Stats, large: pstats.Stats) -> list[tuple[str, float]]:
    """Curb's own Python functions by the growth of their cumulative CPU time from the
    small load to the large, as a share of the growth of the main thread's CPU time
    (functions called once, which hold the whole run, such as main, left out)."""
    before, after = _by_function(small), _by_function(large)
    busy = sum(own for own, _, _ in after.values()) - sum(own for own, _, _ in before.values())
    if busy <= 0:
        return []
    growth = {
        name: cumulative - before.get(name, (0.0, 0.0, 0))[1]
        for name, (_, cumulative, calls) in after.items()
        if name.startswith(CURB_MODULE) and calls > 1
    }
    ranked = sorted(growth.items(), key=lambda item: -item[1])
    return [(name.removeprefix(CURB_MODULE), share / busy) for name, share in ranked][:TOP]


def _by_function(stats: pstats.Stats) -> dict[str, tuple[float, float, int]]:
    """{function: (own time, cumulative time, calls)}, named `module.py:line(function)`,
    with CURB_MODULE in front for Curb's own, whose subpackages' keep their folder
    (`router/links.py:...`)."""
    table: dict[str, tuple[float, float, int]] = {}
    for (path, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = function if path == "~" else f"{os.path.basename(path)}:{line}({function})"
        if path.startswith(CURB_DIR + os.sep):
            name = CURB_MODULE + f"{os.path.relpath(path, CURB_DIR)}:{line}({function})"
        table[name] = (own, cumulative, calls)
    return table


def report(results: list[Measured], loads: tuple[int, int]) -> str:
    lines = [
        f"Curb broker instructions per message (callgrind; loads {loads[0]:,} and {loads[1]:,}, "
        f"the difference over {loads[1] - loads[0]:,})",
        "",
    ]
    width = max(len(m.label) for m in results)
    lines += [f"{m.label.ljust(width)}  {m.per_message:>10,.0f}" for m in results]
    for m in results:
        lines += ["", f"{m.key}: top functions by inclusive instructions per message (callgrind, C level)"]
        lines += [f"  {cost:>10,.0f}  {name}" for name, cost in m.native]
        if m.python:
            lines += [f"{m.key}: top Python functions by inclusive share of CPU time per message (cProfile)"]
            lines += [f"  {share:>9.1%}  {name}" for name, share in m.python]
    return "\n".join(lines)


def build_kind() -> str:
    """The build the benchmark's brokers run, which picks the baseline: they are started
    from this environment, so they load the modules this process loads."""
    return "compiled" if compiled_modules() else "pure"


def fell_back_to_pure(environ: Mapping[str, str] = os.environ, compiler: str | None = None) -> str:
    """Why this pure-Python build is not the one asked for, or "" when it is (or runs
    compiled). setup.py falls back to pure Python when compiling fails, and the install
    goes on; so where a C compiler is and CURB_PURE_PYTHON is not 1, a pure build means
    the compile failed, and the guard would compare the wrong build with its baseline."""
    if build_kind() == "compiled" or environ.get("CURB_PURE_PYTHON") == "1":
        return ""
    cc = compiler if compiler is not None else (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return ""
    return (
        f"the pure-Python build runs, but a C compiler ({cc}) is here and CURB_PURE_PYTHON is not 1: "
        "compiling the hot modules failed (`.venv/bin/pip install -v -e .` shows mypyc's error)"
    )


def baseline_path() -> Path:
    return BASELINES[build_kind()]


def baseline_record(results: list[Measured]) -> dict[str, object]:
    """What --write-baseline commits: the figures, and what they were counted with."""
    return {
        "loads": list(CHECK_LOADS),
        "python": platform.python_version(),
        "build": build(),
        "instructions_per_message": {m.key: round(m.per_message) for m in results},
    }


def check(results: list[Measured], baseline: Mapping[str, object]) -> tuple[str, bool]:
    """Each workload against its baseline: the table, and whether none costs more than
    CHECK_MARGIN over it. A workload the baseline lacks fails: a new one joins the
    baseline in the commit that adds it."""
    figures = baseline.get("instructions_per_message")
    if not isinstance(figures, dict):
        raise ValueError("the baseline has no instructions_per_message")
    lines = [f"{'workload':<28} {'baseline':>10} {'now':>10} {'change':>8}"]
    ok = True
    for m in results:
        base = figures.get(m.key)
        if not isinstance(base, int | float) or base <= 0:
            lines.append(f"{m.key:<28} {'-':>10} {m.per_message:>10,.0f}  not in the baseline: FAIL")
            ok = False
            continue
        change = m.per_message / base - 1
        over = change > CHECK_MARGIN
        ok = ok and not over
        verdict = f"  more than {CHECK_MARGIN:.0%} over: FAIL" if over else ""
        lines.append(f"{m.key:<28} {base:>10,.0f} {m.per_message:>10,.0f} {change:>+8.1%}{verdict}")
    if baseline.get("python") != platform.python_version():
        lines.append(
            f"note: the baseline was counted with Python {baseline.get('python')}, this is "
            f"{platform.python_version()}: the interpreter's own counts differ"
        )
    if "build" in baseline and baseline["build"] != build():
        lines.append(f"note: the baseline was counted with {baseline['build']}, this is {build()}")
    return "\n".join(lines), ok


def read_baseline(path: Path | None = None) -> dict[str, object]:
    """The baseline at `path`, by default the one of the build in use."""
    path = path or baseline_path()
    with path.open() as f:
        loaded = json.load(f)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return loaded


def write_baseline(results: list[Measured]) -> Path:
    """Writes the baseline of the build in use, and says which file that is."""
    path = baseline_path()
    path.write_text(json.dumps(baseline_record(results), indent=2) + "\n")
    return path
