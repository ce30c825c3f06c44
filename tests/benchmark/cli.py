"""`bin/bench`: the command line. Measures Curb brokers it starts itself (or a broker at
--addr), optionally side by side with a reference broker (--ref-addr), and prints one table."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, replace
from typing import TypedDict

import click

from benchmark import instructions, report
from benchmark.bodies import VerificationError
from benchmark.crew import Crew, LoadError
from benchmark.target import BrokerError, Target
from benchmark.workloads import WORKLOAD_NAMES, Bench, Settings, Side
from curb.addr import parse_addr
from curb.client import StompError
from curb.frame import ProtocolError
from curb.log import LogError, parse_size

CREW_SIZE = 8  # the most load processes one workload uses (4 producers + 4 consumers)


class Preset(TypedDict, total=False):
    """Settings that --quick and --full change."""

    runs: int
    seconds: float
    messages: int
    pings: int
    warmup: int
    queued: int
    fill_cap: str
    disk_seconds: float
    body_bytes: int
    loopback_seconds: float


QUICK: Preset = dict(
    runs=1,
    seconds=0.5,
    messages=400,
    pings=200,
    warmup=20,
    queued=2_000,
    fill_cap="2MiB",
    disk_seconds=0.2,
    body_bytes=8 << 20,
    loopback_seconds=0.2,
)
FULL: Preset = dict(queued=1_000_000)


def parse_target_addr(text: str) -> tuple[str, int]:
    """HOST:PORT as the broker's -addr takes it; an empty host means this machine."""
    try:
        host, port = parse_addr(text)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return host or "127.0.0.1", port


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated sizes with B, KiB, MiB suffixes (as -cap takes them)."""
    try:
        sizes = tuple(parse_size(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{text!r}: give sizes of at least 1 byte, e.g. 100,4KiB,64KiB,1MiB")
    return sizes


def parse_headers(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    headers = []
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME:VALUE (e.g. persistent:true)")
        headers.append((name, value))
    return tuple(headers)


def broker_options(prefix: str, whose: str):
    """The options that describe one broker, under --PREFIXname."""
    options = [
        click.option(
            f"--{prefix}addr",
            help=f"HOST:PORT of {whose} that is already running"
            + (" (default: start Curb brokers in a temporary directory)" if not prefix else ""),
        ),
        click.option(f"--{prefix}dest", default="/queue/bench", show_default=True, help="destination to use"),
        click.option(
            f"--{prefix}send-header", multiple=True, metavar="K:V", help="extra header on every SEND (repeatable)"
        ),
        click.option(
            f"--{prefix}sub-header", multiple=True, metavar="K:V", help="extra header on every SUBSCRIBE (repeatable)"
        ),
        click.option(
            f"--{prefix}prefetch-header",
            default="prefetch-count",
            show_default=True,
            help="SUBSCRIBE header that bounds unacknowledged messages",
        ),
        click.option(f"--{prefix}login", help="CONNECT login"),
        click.option(f"--{prefix}passcode", help="CONNECT passcode"),
        click.option(f"--{prefix}pid", type=int, help=f"process id of {whose}, for the RSS rows"),
        click.option(
            f"--{prefix}fill-count",
            type=click.IntRange(1),
            help="messages that stand for a 90%-full store (default: as many as filled Curb's log)",
        ),
    ]

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def make_side(name: str, options: dict, prefix: str) -> Side | None:
    def get(option: str):
        return options[f"{prefix}{option}".replace("-", "_")]

    if get("addr") is None:
        return Side(name) if not prefix else None
    host, port = parse_target_addr(get("addr"))
    target = Target(
        host,
        port,
        get("dest"),
        parse_headers(get("send-header")),
        parse_headers(get("sub-header")),
        get("prefetch-header"),
        get("login"),
        get("passcode"),
    )
    return Side(name, target, get("pid"), get("fill-count"))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--runs", type=click.IntRange(1), help="runs of every workload  [default: 3; --quick: 1]")
@click.option("--bytes", "size", type=click.IntRange(1), default=100, show_default=True, help="message body size")
@click.option(
    "--body-sizes",
    default="100,4KiB,64KiB,1MiB",
    show_default=True,
    help="body sizes of the `bodies` workloads (produce and consume at each, beside the loopback ceiling)",
)
@click.option("--seconds", type=click.FloatRange(0.1), help="length of the timed workloads  [default: 10]")
@click.option(
    "--messages",
    type=click.IntRange(4),
    help="messages per produce and consume measurement (a tenth for the window-1 produce)  [default: 20000]",
)
@click.option("--pings", type=click.IntRange(1), help="timed ping-pong round trips  [default: 5000]")
@click.option(
    "--queued",
    type=click.IntRange(1),
    help="messages queued for the RSS and restart rows  [default: 100000; --full: 1000000]",
)
@click.option("--cap", default="1GiB", show_default=True, help="-cap of the Curb brokers started")
@click.option("--fill-cap", help="-cap of the log that the 90%-full workload fills  [default: 16MiB]")
@click.option(
    "--broker-arg", multiple=True, metavar="ARG", help="extra argument for the Curb brokers started (repeatable)"
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1),
    default=60.0,
    show_default=True,
    help="seconds to wait for any one frame before failing",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, exists=True),
    help="where the temporary directory for logs and the disk probe goes  [default: system temp]",
)
@click.option("--only", help=f"comma-separated workloads, of: {', '.join(WORKLOAD_NAMES)}")
@click.option("--quick", is_flag=True, help="small counts and one run: a smoke test in seconds")
@click.option("--full", is_flag=True, help="1,000,000 queued messages for the RSS and restart rows")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of the table")
@click.option(
    "--instructions",
    "count_instructions",
    is_flag=True,
    help="count the broker's instructions per message under callgrind instead of timing "
    f"(workloads: {', '.join(instructions.WORKLOADS)}; loads "
    f"{instructions.LOADS[0]:,} and {instructions.LOADS[1]:,}, --quick: "
    f"{instructions.QUICK_LOADS[0]:,} and {instructions.QUICK_LOADS[1]:,})",
)
@click.option(
    "--no-profile", is_flag=True, help="with --instructions: skip the cProfile runs that name the Python functions"
)
@click.option(
    "--check",
    is_flag=True,
    help="with --instructions: count every workload at "
    f"{instructions.CHECK_LOADS[0]:,} and {instructions.CHECK_LOADS[1]:,} messages and fail (exit 1) when one costs "
    f"more than {instructions.CHECK_MARGIN:.0%} over the baseline of the build in use (tests/benchmark/"
    f"{instructions.BASELINES['pure'].name} or {instructions.BASELINES['compiled'].name})",
)
@click.option(
    "--write-baseline",
    is_flag=True,
    help="with --instructions: count as --check does and write the baseline of the build in use",
)
@broker_options("", "the broker to measure")
@broker_options("ref-", "a reference broker to compare with")
def main(
    runs,
    size,
    body_sizes,
    seconds,
    messages,
    pings,
    queued,
    cap,
    fill_cap,
    broker_arg,
    timeout,
    directory,
    only,
    quick,
    full,
    as_json,
    count_instructions,
    no_profile,
    check,
    write_baseline,
    **brokers,
):
    """Measure Curb: throughput, latency, memory, restart time and the disk's own limits,
    checking every message. Starts its own brokers on 127.0.0.1 unless given --addr."""
    choices = tuple(instructions.WORKLOADS) if count_instructions else WORKLOAD_NAMES
    selected = set(choices)
    if only:
        selected = {name.strip() for name in only.split(",") if name.strip()}
        unknown = selected - set(choices)
        if unknown:
            raise click.BadParameter(
                f"unknown workload(s) {', '.join(sorted(unknown))}; choose from {', '.join(choices)}",
                param_hint="--only",
            )
    if (check or write_baseline) and not count_instructions:
        raise click.UsageError("--check and --write-baseline go with --instructions")
    if (check or write_baseline) and only:
        raise click.UsageError("--check and --write-baseline count every workload: leave out --only")
    if count_instructions:
        if brokers["addr"] or brokers["ref_addr"]:
            raise click.BadParameter("--instructions counts a Curb it starts itself: leave out --addr and --ref-addr")
        if missing := instructions.missing_tools():
            raise click.UsageError(
                f"--instructions needs valgrind's {', '.join(missing)}: install valgrind "
                "(e.g. apt-get install valgrind)"
            )
    settings = Settings(
        size=size,
        cap=cap,
        timeout=timeout,
        quiet=min(Settings.quiet, timeout),
        broker_args=broker_arg,
        body_sizes=parse_sizes(body_sizes),
    )
    for preset, chosen in ((QUICK, quick), (FULL, full)):  # --full's queued wins over --quick's
        if chosen:
            settings = replace(settings, **preset)
    given = dict(runs=runs, seconds=seconds, messages=messages, pings=pings, queued=queued, fill_cap=fill_cap)
    settings = replace(settings, **{name: value for name, value in given.items() if value is not None})
    sides = [side for side in (make_side("curb", brokers, ""), make_side("reference", brokers, "ref-")) if side]

    def say(line: str) -> None:
        click.echo(line, err=True)

    crew = Crew(CREW_SIZE)
    try:
        with tempfile.TemporaryDirectory(prefix="curb-bench-", dir=directory) as workdir:
            bench = Bench(settings, sides, crew, workdir, say)
            if count_instructions:
                loads = instructions.QUICK_LOADS if quick else instructions.LOADS
                keys = [key for key in instructions.WORKLOADS if key in selected]
                if check or write_baseline:
                    fallen = instructions.fell_back_to_pure()
                    if fallen:
                        click.echo(f"curb bench: FAILED: {fallen}", err=True)
                        sys.exit(1)
                    measured = instructions.measure(bench, keys, instructions.CHECK_LOADS, profile=False)
                    if write_baseline:
                        click.echo(f"wrote {instructions.write_baseline(measured)}")
                        return
                    table, ok = instructions.check(measured, instructions.read_baseline())
                    click.echo(table)
                    if not ok:
                        click.echo(
                            "curb bench: FAILED: instructions per message rose; make it cheaper, or raise "
                            "the baseline (--write-baseline) in a commit of its own that says why",
                            err=True,
                        )
                        sys.exit(1)
                    return
                measured = instructions.measure(bench, keys, loads, profile=not no_profile)
                click.echo(
                    json.dumps([asdict(m) for m in measured], indent=2)
                    if as_json
                    else instructions.report(measured, loads)
                )
                return
            samples = bench.run(selected)
    except (VerificationError, LoadError, BrokerError, StompError, ProtocolError, LogError, OSError) as err:
        click.echo(f"curb bench: FAILED: {err}", err=True)
        sys.exit(1)
    finally:
        crew.close()
    names = [side.name for side in sides]
    rows = report.tabulate(samples, names, settings)
    notes = [
        *bench.notes.values(),
        *report.disk_shares(samples, names),
        *report.loopback_shares(samples, names, settings),
        *(f"duplicates (allowed: at least once): {count:,} in {what}" for what, count in bench.duplicates.items()),
    ]
    click.echo(
        report.as_json(rows, settings, notes, dict(bench.duplicates))
        if as_json
        else report.table(rows, names, settings, notes)
    )
