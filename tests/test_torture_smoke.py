"""The kill -9 torture tool (tests/torture.py, bin/torture) keeps working: a short run of it
against the real broker must finish, do real work and find every promise kept. The long
runs are opt-in; this one only guards the tool itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from torture import disk_bytes

TORTURE = Path(__file__).with_name("torture.py")


@pytest.mark.slow
def test_three_kill_cycles_at_256kib_keep_every_promise(tmp_path: Path, free_port: Callable[[], int]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(TORTURE),
            "--cycles",
            "3",
            "--cap",
            "256KiB",
            "--seed",
            "7",
            "--port",
            str(free_port()),
            "--dir",
            str(tmp_path),
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.stdout.strip(), result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    shown = json.dumps(summary, indent=1)
    assert result.returncode == 0 and summary["ok"], shown
    assert summary["cycles_done"] == 3, shown
    assert summary["receipted"] > 0 and summary["ack_receipted"] > 0 and summary["nacked"] > 0, shown
    # The work queue's states under the kills: delayed and expiring SENDs, NACKs with a
    # delay, and poison that became dead letters, read back from ./dead.
    assert summary["delayed_sent"] > 0 and summary["expiring_sent"] > 0 and summary["nacked_delayed"] > 0, shown
    assert summary["poison_dead"] > 0 and summary["dead_by_reason"].get("max-deliveries", 0) > 0, shown
    assert summary["lost"] == summary["resurrections"] == summary["duplicates"] == 0, shown
    assert summary["early"] == summary["past_limit"] == 0, shown
    assert summary["corrupt"] == summary["unexpected_errors"] == 0, shown
    assert 512 <= summary["max_file_bytes"] <= summary["cap_bytes"] == 256 * 1024, shown
    assert summary["seconds"] < 40, shown


def test_data_bytes_leave_out_the_file_systems_own_blocks(tmp_path: Path) -> None:
    """A fallocated file written in scattered pieces has all of its bytes allocated to
    data, whatever blocks the file system adds to track the pieces."""
    path = tmp_path / "log"
    with path.open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, 1 << 20)
        for offset in range(0, 1 << 20, 100_000):
            os.pwrite(file.fileno(), b"w" * 4096, offset)
        os.fsync(file.fileno())
    size, data, blocks = disk_bytes(path)
    assert (size, data) == (1 << 20, 1 << 20)
    assert blocks >= data
    assert disk_bytes(tmp_path / "none") == (0, 0, 0)
