"""The bounded queue served in turn across sources (curb.fairqueue), as tables."""

from __future__ import annotations

import pytest

from curb.fairqueue import FairQueue


def run(per_source: int, total: int, puts: str) -> tuple[list[str], list[str]]:
    """Put each `source+item` of `puts` (e.g. "a1 a2 b1"); returns (shed items, then every
    item in the order `take` gives them)."""
    queue: FairQueue[str] = FairQueue(per_source, total)
    shed = []
    for word in puts.split():
        dropped = queue.put(word[0], word)
        if dropped is not None:
            shed.append(dropped)
    taken = []
    while (item := queue.take()) is not None:
        taken.append(item)
    assert len(queue) == 0
    return shed, taken


@pytest.mark.parametrize(
    "per_source, total, puts, shed, taken",
    [
        # One source: first in, first out.
        (9, 9, "a1 a2 a3", "", "a1 a2 a3"),
        # Sources take turns, in the order they first came.
        (9, 9, "a1 a2 a3 b1 b2 c1", "", "a1 b1 c1 a2 b2 a3"),
        (9, 9, "b1 a1 a2 a3 a4 c1", "", "b1 a1 c1 a2 a3 a4"),
        # A source at its bound sheds its new items; the others are not touched.
        (2, 9, "a1 a2 a3 a4 b1", "a3 a4", "a1 b1 a2"),
        # A full queue sheds the newest item of the source holding the most...
        (9, 4, "a1 a2 a3 a4 b1", "a4", "a1 b1 a2 a3"),
        (9, 4, "a1 a2 a3 a4 b1 c1", "a4 a3", "a1 b1 c1 a2"),
        (9, 4, "a1 a2 b1 b2 c1", "a2", "a1 b1 c1 b2"),
        (9, 4, "a1 a2 a3 b1 b2", "a3", "a1 b1 a2 b2"),
        # ...but not to make room for a source that would then hold as many.
        (9, 4, "a1 a2 b1 c1 c2", "c2", "a1 b1 c1 a2"),
        (9, 4, "a1 b1 c1 d1 e1", "e1", "a1 b1 c1 d1"),
    ],
)
def test_put_and_take(per_source, total, puts, shed, taken):
    assert run(per_source, total, puts) == (shed.split(), taken.split())


def test_a_source_served_goes_to_the_back_of_the_line():
    queue: FairQueue[str] = FairQueue(9, 9)
    for item in ("a1", "a2", "b1"):
        queue.put(item[0], item)
    assert queue.take() == "a1"
    queue.put("c", "c1")  # comes after a, whose next turn was already in line
    assert [queue.take() for _ in range(3)] == ["b1", "a2", "c1"]


@pytest.mark.parametrize(
    "remove, removed, left",
    [
        ("a2", True, "a1 b1 a3"),
        ("b1", True, "a1 a2 a3"),  # b's only item: b leaves the line
        ("b2", False, "a1 b1 a2 a3"),
    ],
)
def test_remove(remove, removed, left):
    queue: FairQueue[str] = FairQueue(9, 9)
    for item in ("a1", "a2", "a3", "b1"):
        queue.put(item[0], item)
    assert queue.remove(remove[0], remove) is removed
    assert queue.held("a") + queue.held("b") == len(queue) == len(left.split())
    assert [queue.take() for _ in range(len(queue))] == left.split()
