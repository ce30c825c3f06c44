"""The fast stage of the suite (`bin/test --fast`): the tests that start no process, in
well under 30 s, for everyday work; the full suite still runs everything.

Loaded as a pytest plugin (`-p fast_stage`). Tests that ask for a broker process by
fixture are deselected before they run, and so are the few long in-process runs named in
FULL_ONLY; any other test that tries to start a process (subprocess.Popen) is skipped at
that point. So a new unit test joins the stage by itself.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

PROCESS_FIXTURES = frozenset({"curb_broker", "broker", "run_curb"})
# Node id prefixes that take too long for the stage (seed sweeps, fuzzing, a JVM, a wheel).
FULL_ONLY = (
    "tests/spark/",
    "tests/test_packaging.py",
    "tests/test_crash_sim.py::test_seeds_in_the_default_range",
    "tests/test_broker_sim.py::test_seeds_in_the_default_range",
    "tests/test_startup_fuzz.py::test_fuzzed_startup",
    "tests/test_fuzz_smoke.py::test_a_short_codec_fuzz",
    "tests/test_queue.py::test_the_largest_prefetch_a_subscribe_may_ask_for",
    "tests/test_slices.py::test_an_ack_upto_a_crash_interrupts_between_slices",
    "tests/test_parked_slices.py::test_the_first_live_entry_is_found_past_a_million",
    "tests/test_session_limits.py::test_the_largest_deliverable_send",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        slow = item.nodeid.startswith(FULL_ONLY)
        uses = PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        (drop if slow or uses else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class _NoProcess(subprocess.Popen):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pytest.skip("starts a process: runs in the full suite (bin/test), not the fast stage")


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "Popen", _NoProcess)
