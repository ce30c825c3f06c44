"""The index's bulk paths (curb.log.parked) answer as their one-at-a-time forms do:
`extend` (recovery's batches, all delayed, all dead or mixed) as `add` for each entry,
`step_over` (STEP entries at a time while they lie end to end) as a walk of one entry at
a time, and the cheap packing of due keys as the general one."""

from __future__ import annotations

import random

import pytest

from curb.log.parked import DELAYED, EXP, GONE, MAX, SEQ_BITS, STEP, Parked, packed_runs

WALL = 1_700_000_000_000


def entries(rng: random.Random, n: int, kinds: str) -> list[tuple[int, int, int, int, int]]:
    """(offset, size, id, state, due) of n records laid end to end, ids mostly rising."""
    out, at = [], 512
    for i in range(n):
        size = rng.choice((160, 192, 224))
        state = {"delayed": DELAYED, "dead": rng.choice((MAX, EXP))}.get(kinds) or rng.choice((DELAYED, MAX, EXP))
        mid = i + 1 if rng.random() < 0.9 else rng.randrange(1, n + 1)
        out.append((at, size, mid, state, WALL + rng.randrange(0, 10**7) if state == DELAYED else 0))
        at += size
    return out


def released(parked: Parked) -> list[int]:
    parked.release(1 << 60, 1 << 62)
    return list(iter(parked.take_ready, None))


@pytest.mark.parametrize("kinds", ["delayed", "dead", "mixed"])
def test_extend_indexes_a_batch_as_add_does_one_by_one(kinds: str):
    rng = random.Random(kinds)
    batch = entries(rng, 3 * STEP + 17, kinds)
    one, bulk = Parked(), Parked()
    for offset, size, mid, state, due in batch:
        one.add(offset, size, mid, state, due, passed=False)
    for at in range(0, len(batch), 1000):
        part = batch[at : at + 1000]
        offsets, sizes, ids, states, dues = (list(col) for col in zip(*part, strict=True))
        bulk.extend(offsets, sizes, ids, bytearray(states), dues)
    for name in ("delayed", "dead", "bytes", "unpassed_bytes"):
        assert getattr(bulk, name) == getattr(one, name), name
    assert list(bulk.ids) == list(one.ids) and bytes(bulk.states) == bytes(one.states)
    bulk.sort_dead()
    one.sort_dead()
    assert [one.id(s) for s in one.dead_order] == [bulk.id(s) for s in bulk.dead_order]
    assert released(bulk) == released(one)


def step_over_one_by_one(parked: Parked, pos: int, stop: int) -> tuple[tuple[int, int] | None, int, int]:
    """The walk `step_over` does, an entry at a time: (its answer, passed, unpassed_bytes)."""
    seq, base = parked.passed, parked.base
    if seq >= parked.end or parked.offset(seq) != pos:
        return None, parked.passed, parked.unpassed_bytes
    at, first, unpassed = pos, seq, parked.unpassed_bytes
    while seq < parked.end and parked.offset(seq) == at and at != stop:
        if parked.state(seq) != GONE:
            unpassed -= parked.size(seq)
        at += parked.size(seq)
        seq += 1
    return (at - pos, max(parked.ids[first - base : seq - base])), seq, unpassed


@pytest.mark.parametrize("seed", range(12))
def test_step_over_steps_over_what_a_walk_of_one_entry_at_a_time_does(seed: int):
    rng = random.Random(seed)
    parked = Parked()
    at, starts = 512, []
    for i in range(rng.choice((10, STEP - 1, STEP, 2 * STEP + 3))):
        if rng.random() < 0.0005:
            at += 32  # a record no entry names: the run of entries ends there
        size = rng.choice((160, 192))
        starts.append(at)
        seq = parked.add(at, size, i + 1, DELAYED, WALL + i, passed=False)
        if rng.random() < 0.2:
            parked.remove(seq)  # GONE entries are stepped over too, their bytes not counted again
        at += size
    stop = rng.choice([at, rng.choice(starts), at + 32])
    want = step_over_one_by_one(parked, starts[0], stop)
    got = parked.step_over(starts[0], stop, 1 << 30)
    assert (got, parked.passed, parked.unpassed_bytes) == want


def test_keys_close_in_due_time_take_the_cheap_packing_and_give_back_what_they_hold():
    pairs = sorted((WALL + (i * 7919) % 3_600_000, i * 3) for i in range(4096))
    runs = packed_runs([due << SEQ_BITS | seq for due, seq in pairs])
    assert len(runs) == 1 and runs[0].shift == SEQ_BITS
    assert [runs[0].at(i) for i in range(len(runs[0]))] == pairs


def test_offsets_take_four_bytes_in_a_ring_up_to_4_gib_and_eight_past_it():
    small, large = Parked(1 << 32), Parked((1 << 32) + 4096)
    assert small.offsets.itemsize == 4 and large.offsets.itemsize == 8
    small.add((1 << 32) - 4096, 160, 1, MAX)
    large.add((1 << 32) + 512, 160, 2, MAX)
    assert small.offset(small.base) == (1 << 32) - 4096 and large.offset(large.base) == (1 << 32) + 512
