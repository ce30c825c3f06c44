"""The parked index's slices, in memory: an ACK up to an id walks only the blocks that
hold an id up to it, a slice at a time, and no reader sees what it acked meanwhile; the
dead letters come in slices by id, and a browse of them (`DeadBrowse`) resumes by id
whatever changed between its steps."""

from __future__ import annotations

import pytest

from curb.dead import SLICE_IDS, STEP_ENTRIES, DeadBrowse
from curb.log.cursor import Record
from curb.log.parked import DEAD_HELD, DELAYED, EXP, GONE, ID_BLOCK, MAX, READY, Parked

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
        assert parked.dead_after(0, 100, 100) == ([50, 51], None)


def test_the_counts_are_exact_once_the_walk_is_done():
    parked = index(list(range(1, 3 * ID_BLOCK)), MAX)
    parked.ack_upto(ID_BLOCK)
    assert parked.dead == 3 * ID_BLOCK - 1  # not walked yet
    walk(parked, ID_BLOCK, 100)
    assert parked.dead == 2 * ID_BLOCK - 1


def dead_seq(parked: Parked, mid: int) -> int:
    """The seq of dead letter `mid`, which must be one."""
    seq = parked.dead_entry(mid)
    assert seq is not None
    return seq


def dead_index(ids: list[int], states: dict[int, int] | None = None) -> Parked:
    parked = index(ids, MAX)
    for mid, state in (states or {}).items():
        seq = next(s for s in range(parked.base, parked.end) if parked.id(s) == mid)
        if state == GONE:
            parked.remove(seq)
        else:
            parked.set(seq, state)
    return parked


@pytest.mark.parametrize(
    ("ids", "states", "after", "last", "limit", "out"),
    [
        ([1, 2, 3, 4], {}, 0, 10, 10, ([1, 2, 3, 4], None)),
        ([1, 2, 3, 4], {}, 0, 10, 2, ([1, 2], 2)),
        ([1, 2, 3, 4], {}, 2, 10, 2, ([3, 4], None)),
        ([1, 2, 3, 4], {}, 0, 3, 10, ([1, 2, 3], None)),  # none above `last`
        ([1, 2, 3, 4], {2: READY, 3: GONE}, 0, 10, 3, ([1], 3)),  # looked at 3, found 1
        ([1, 2, 3, 4], {1: DEAD_HELD}, 0, 10, 10, ([1, 2, 3, 4], None)),  # handed out: still dead, shown
        ([3, 1, 2], {}, 0, 10, 10, ([1, 2, 3], None)),  # recovery's order, sorted by id
    ],
)
def test_dead_letters_come_in_slices_by_id(ids, states, after, last, limit, out):
    parked = dead_index(ids, states)
    parked.sort_dead()
    assert parked.dead_after(after, last, limit) == out


def test_a_slice_never_ends_between_two_entries_of_one_id():
    parked = dead_index([1, 2, 3])
    original = dead_seq(parked, 2)
    parked.add(3 * SIZE, SIZE, 2, MAX, replaces=original)  # compaction's copy of 2
    parked.remove(original)
    assert parked.dead_after(0, 10, 2) == ([1, 2], 2)
    assert parked.dead_after(2, 10, 2) == ([3], None)


class FakeDead:
    """The log's side of a dead browse over a Parked index: its records read by id."""

    def __init__(self, parked: Parked):
        self.parked = parked
        self.calls = 0

    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]:
        self.calls += 1
        return self.parked.dead_after(after, last, limit)

    def read_dead(self, mid: int) -> Record | None:
        seq = self.parked.dead_entry(mid)
        return None if seq is None else dead_record(mid)


def dead_record(mid: int) -> Record:
    rec = Record(mid, 0, SIZE, 5, 0, b"", 0)
    rec.dead = "max-deliveries"
    return rec


def browse_all(browse: DeadBrowse, between=lambda: None) -> list[int]:
    """The ids a browse sends, a small step at a time, calling `between` between steps."""
    got = []
    while True:
        step = browse.step(1)
        got += [mid for mid, _ in step.messages]
        if step.done:
            return got
        between()


def test_a_dead_browse_merges_the_index_and_the_held_records_by_id_each_once():
    parked = dead_index([1, 3, 5, 7])
    log = FakeDead(parked)
    held = [dead_record(4), dead_record(5), dead_record(9)]  # 5 in both: the index's and held
    browse = DeadBrowse(log, parked.last_dead(), held, lambda rec: b"")
    assert browse.to_id == 9
    assert browse_all(browse) == [1, 3, 4, 5, 7, 9]


def test_a_dead_browse_resumes_by_id_whatever_changed_between_its_steps():
    ids = list(range(1, 2001))
    parked = dead_index(ids)
    log = FakeDead(parked)
    browse = DeadBrowse(log, parked.last_dead(), [], lambda rec: b"")
    moves = iter(range(10**6))

    def between() -> None:
        n = next(moves)
        if n == 3:  # a redrive of 100..199
            for mid in range(100, 200):
                parked.set(dead_seq(parked, mid), READY)
        if n == 5:  # a ./dead reader takes the oldest left and deletes it
            oldest = parked.next_dead()
            assert oldest is not None
            parked.remove(oldest)
        if n == 7:  # compaction copies every dead letter forward (ids kept)
            for mid in ids:
                seq = parked.dead_entry(mid)
                if seq is not None:
                    parked.add(parked.end * SIZE, SIZE, mid, MAX, replaces=seq)
                    parked.remove(seq)
        if n == 9:  # a new dead letter, above the browse's end, and one below it
            parked.add(parked.end * SIZE, SIZE, 5000, MAX)

    got = browse_all(browse, between)
    assert got == sorted(set(got))  # oldest first, each once
    assert set(range(200, 2001)) <= set(got)  # dead all along: all there
    assert not set(range(100, 200)) & set(got) and 5000 not in got


def test_a_dead_browse_step_looks_at_a_bounded_number_of_entries():
    parked = dead_index(list(range(1, 100_001)))
    for mid in range(1, 99_001):
        parked.set(dead_seq(parked, mid), READY)  # redriven since: not shown, but looked at
    log = FakeDead(parked)
    browse = DeadBrowse(log, parked.last_dead(), [], lambda rec: b"")
    steps = 0
    got: list[int] = []
    while not (step := browse.step(1 << 30)).done:
        steps += 1
        got += [mid for mid, _ in step.messages]
        assert log.calls <= steps * (STEP_ENTRIES // SLICE_IDS + 1)
    got += [mid for mid, _ in step.messages]
    assert got == list(range(99_001, 100_001))


@pytest.mark.parametrize(
    ("limit", "stepped", "passed"),
    [(0, (SIZE, 1), 1), (1, (SIZE, 1), 1), (3, (3 * SIZE, 3), 3), (10, (5 * SIZE, 5), 5)],
)
def test_the_cursor_steps_over_at_most_limit_parked_records_at_a_time(limit, stepped, passed):
    parked = Parked()
    for mid in range(1, 6):
        parked.add((mid - 1) * SIZE, SIZE, mid, DELAYED, due_ms=10**9, passed=False)
    assert parked.step_over(0, 1 << 40, limit) == stepped
    assert parked.passed == passed
    assert parked.unpassed_bytes == (5 - passed) * SIZE


def test_the_first_live_entry_is_found_past_a_million_gone_ones():
    parked = index(list(range(1, 1_000_002)))
    parked.ack_upto(1_000_000)
    while parked.upto_at is not None:
        for seq in parked.walk_upto(1 << 20):
            parked.remove(seq)
    assert [parked.id(seq) for seq in parked.passed_live()] == [1_000_001]
    assert parked.first == parked.end - 1


def test_dead_letters_in_readers_hands_at_the_front_make_no_cut_over_and_over(monkeypatch):
    """A ./dead reader holds 10,000 dead letters and a redrive takes the other 10,000 one
    by one: each cut of dead_order's front keeps the held ones, and must not come again
    at once for want of room it cannot make (a redrive of 300,000 stalled 0.7 s a slice)."""
    parked = index(list(range(1, 20_001)), MAX)
    for _ in range(10_000):  # handed out, as LogCore.next_dead does
        seq = parked.next_dead()
        assert seq is not None
        parked.set(seq, DEAD_HELD)
        parked.held[seq] = object()
    cuts: list[tuple[int, ...]] = []
    kept = Parked._dead_kept

    def counted(self: Parked, *args: int):
        cuts.append(args)
        return kept(self, *args)

    monkeypatch.setattr(Parked, "_dead_kept", counted)
    moved = 0
    while (seq := parked.next_dead()) is not None:  # a redrive: READY one by one
        parked.set(seq, READY)
        moved += 1
    assert moved == 10_000 and len(cuts) <= 2, len(cuts)
    held = [s for s in parked.dead_order if parked.state(s) == DEAD_HELD]
    assert len(held) == 10_000  # still findable, by dead_entry and a browse
    assert parked.dead_entry(parked.id(held[0])) == held[0]
