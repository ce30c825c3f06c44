"""The parked index's slices, in memory: an ACK up to an id walks only the blocks that
hold an id up to it, a slice at a time, and no reader sees what it acked meanwhile."""

from __future__ import annotations

import pytest

from curb.log.parked import DELAYED, EXP, GONE, ID_BLOCK, MAX, READY, Parked

SIZE = 64


def index(ids: list[int], state: int = DELAYED) -> Parked:
    """An index of one entry per id, in this ring order, each SIZE bytes."""
    parked = Parked()
    for at, mid in enumerate(ids):
        parked.add(at * SIZE, SIZE, mid, state, due_ms=10**9)
    return parked


def walk(parked: Parked, upto: int, limit: int) -> tuple[list[int], int]:
    """The ids an ACK up to `upto` removes, walked `limit` entries a slice; and the slices."""
    parked.ack_upto(upto)
    removed, slices = [], 0
    while parked.upto_at is not None:
        slices += 1
        for seq in parked.walk_upto(limit):
            removed.append(parked.id(seq))
            parked.remove(seq)
    return removed, slices


ASCENDING = list(range(1, 5 * ID_BLOCK + 1))
# Compaction's copies: old ids among new ones, as a copy of a parked record is placed.
COPIES = [*range(1, 2 * ID_BLOCK + 1), 7, 9, *range(2 * ID_BLOCK + 1, 4 * ID_BLOCK + 1)]


@pytest.mark.parametrize(
    ("ids", "upto", "limit", "removed", "slices"),
    [
        (ASCENDING, 0, 10**9, [], 0),  # no walk
        (ASCENDING, 10, 10**9, list(range(1, 11)), 1),
        # Three blocks read, one a slice; then the last two skipped unread, in one.
        (ASCENDING, ID_BLOCK * 3, ID_BLOCK, list(range(1, ID_BLOCK * 3 + 1)), 4),
        (ASCENDING, ID_BLOCK * 5, ID_BLOCK, ASCENDING, 5),
        (COPIES, 8, 10**9, [*range(1, 9), 7], 1),
        # The first block; the second skipped and the third (the copies) read; the rest skipped.
        (COPIES, 8, ID_BLOCK, [*range(1, 9), 7], 3),
    ],
)
def test_an_ack_up_to_an_id_walks_only_the_blocks_that_hold_one(ids, upto, limit, removed, slices):
    parked = index(ids)
    got, walked = walk(parked, upto, limit)
    assert sorted(got) == sorted(removed)
    assert walked == slices
    assert parked.delayed == len(ids) - len(removed)
    assert all(parked.id(s) > upto for s in range(parked.base, parked.end) if parked.state(s) != GONE)


def test_a_block_walked_whole_remembers_its_lowest_id_left_so_the_next_walk_skips_it():
    parked = index(ASCENDING)
    walk(parked, ID_BLOCK // 2, 10**9)
    parked.ack_upto(ID_BLOCK + 1)
    first = parked.walk_upto(1)  # the first block: only the second half left, all in range
    assert [parked.id(s) for s in first] == list(range(ID_BLOCK // 2 + 1, ID_BLOCK + 1))
    walk(parked, 4 * ID_BLOCK, 10**9)
    assert parked.id_lo[parked.end // ID_BLOCK - 1 - parked.block0] == 4 * ID_BLOCK + 1


def test_a_copy_placed_while_the_walk_goes_on_is_walked_too():
    parked = index(ASCENDING[: 2 * ID_BLOCK])
    parked.ack_upto(5)
    parked.walk_upto(ID_BLOCK)  # the walk is past the first block...
    copy = parked.add(2 * ID_BLOCK * SIZE, SIZE, 3, DELAYED, due_ms=10**9)  # ...when a copy of id 3 is placed
    seen = []
    while parked.upto_at is not None:
        seen += parked.walk_upto(ID_BLOCK)
    assert copy in seen


@pytest.mark.parametrize("state", [READY, MAX, EXP])
def test_while_the_walk_goes_on_no_reader_hands_out_or_shows_an_entry_it_acked(state):
    parked = index([1, 2, 3, 50, 51], state)
    parked.ack_upto(3)  # not walked yet
    taken = parked.take_ready() if state == READY else parked.next_dead()
    assert taken is not None and parked.id(taken) == 50
    if state != READY:
        assert parked.dead_entry(2) is None
        assert list(parked.dead_letters()) == [50, 51]


def test_the_counts_are_exact_once_the_walk_is_done():
    parked = index(list(range(1, 3 * ID_BLOCK)), MAX)
    parked.ack_upto(ID_BLOCK)
    assert parked.dead == 3 * ID_BLOCK - 1  # not walked yet
    walk(parked, ID_BLOCK, 100)
    assert parked.dead == 2 * ID_BLOCK - 1
