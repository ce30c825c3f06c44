"""The benchmark's output: one aligned table (median and min-max over the runs, and the
ratio to the reference broker measured in the same runs), or the same figures as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from statistics import median
from typing import Any

from benchmark.workloads import MACHINE_ROWS, Settings, all_rows

FORMATS = {
    "MB/s": "{:,.0f}",
    "msg/s": "{:,.0f}",
    "rec/s": "{:,.0f}",
    "us": "{:,.0f}",
    "MiB": "{:,.1f}",
    "s": "{:.2f}",
    "ratio": "{:.2f}",
}
LARGE_BODY = 64 * 1024  # bodies from this size on are set against the loopback ceiling
# Rows whose rate is set against what the disk allows: (row, disk row, how the disk is used).
DISK_SHARES = (
    ("produce-w1", "disk-1", "one fdatasync per record"),
    ("produce-4x256", "disk-64", "64 records per fdatasync"),
)


def spread(values: list[float]) -> dict:
    return {"median": median(values), "min": min(values), "max": max(values), "runs": values}


def tabulate(samples: dict[str, dict[str, list[float]]], side_names: list[str], settings: Settings) -> list[dict]:
    """One dict per measured row, in table order: workload, unit, a spread per side (None
    when not measurable there), and the spread of the per-run ratio first side / second
    side. Rows about the machine rather than a broker carry the first side only."""
    rows = []
    for key, (label, unit) in all_rows(settings).items():
        by_side = samples.get(key)
        if not by_side:
            continue
        row: dict[str, Any] = {"key": key, "workload": label.format(queued=settings.queued), "unit": unit}
        for name in side_names[:1] if key in MACHINE_ROWS else side_names:
            row[name] = spread(by_side[name]) if by_side.get(name) else None
        if len(side_names) == 2 and row[side_names[0]] and row.get(side_names[1]):
            # pairs the runs both sides measured
            pairs = zip(by_side[side_names[0]], by_side[side_names[1]], strict=False)
            ratios = [mine / theirs for mine, theirs in pairs if theirs]
            row["ratio"] = spread(ratios) if ratios else None
        rows.append(row)
    return rows


def disk_shares(samples: dict[str, dict[str, list[float]]], side_names: list[str]) -> list[str]:
    disk_side = side_names[0]
    lines = []
    for row, disk_row, how in DISK_SHARES:
        disk = samples.get(disk_row, {}).get(disk_side)
        for name in side_names:
            rates = samples.get(row, {}).get(name)
            if disk and rates:
                lines.append(f"{name} {row}: {median(rates) / median(disk):.0%} of the disk's rate with {how}")
    return lines


def loopback_shares(samples: dict[str, dict[str, list[float]]], side_names: list[str], settings: Settings) -> list[str]:
    """Each side's consume rate of bodies of 64 KiB and more, in body bytes, against what
    one loopback connection moves on this machine (its ceiling)."""
    ceiling = samples.get("loopback", {}).get(side_names[0])
    lines = []
    for size in settings.body_sizes:
        for name in side_names:
            rates = samples.get(f"consume-b{size}", {}).get(name)
            if ceiling and rates and size >= LARGE_BODY:
                share = median(rates) * size / (median(ceiling) * 1e6)
                lines.append(
                    f"{name} consume-b{size}: {median(rates) * size / 1e6:,.0f} MB/s of bodies, {share:.0%} of loopback"
                )
    return lines


def cell(row: dict, column: str, unit: str) -> str:
    """A spread as `median (min-max)`; `n/a` if it could not be measured, blank if it does not apply."""
    if column not in row:
        return ""
    stats = row[column]
    if stats is None:
        return "n/a"
    shown = FORMATS[unit].format
    if len(stats["runs"]) == 1:
        return shown(stats["median"])
    return f"{shown(stats['median'])} ({shown(stats['min'])}-{shown(stats['max'])})"


def table(rows: list[dict], side_names: list[str], settings: Settings, notes: list[str]) -> str:
    headers = ["workload", "unit", *side_names] + (["ratio"] if len(side_names) == 2 else [])
    if len(side_names) == 2:
        headers[-1] = f"{side_names[0]}/{side_names[1]}"
    lines = [
        [row["workload"], row["unit"], *(cell(row, name, row["unit"]) for name in side_names)]
        + ([cell(row, "ratio", "ratio")] if len(side_names) == 2 else [])
        for row in rows
    ]
    widths = [max(len(line[column]) for line in [headers, *lines]) for column in range(len(headers))]

    def aligned(line: list[str]) -> str:
        return "  ".join(
            text.ljust(width) if column < 2 else text.rjust(width)
            for column, (text, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()

    runs = f"{settings.runs} runs, median (min-max)" if settings.runs > 1 else "1 run"
    out = [
        f"Curb benchmark: {settings.size}-byte bodies, {runs}",
        "",
        aligned(headers),
        aligned(["-" * width for width in widths]),
        *map(aligned, lines),
    ]
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def as_json(rows: list[dict], settings: Settings, notes: list[str], duplicates: dict[str, int]) -> str:
    return json.dumps({"settings": asdict(settings), "rows": rows, "notes": notes, "duplicates": duplicates}, indent=2)
