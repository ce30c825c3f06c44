"""Ring arithmetic as tables: where records go, and whether copies can free room."""

import pytest

from curb.log.record import PAD_SIZE, RING_START
from curb.log.ring import Ring

R = RING_START
END = R + 1000


@pytest.mark.parametrize(
    "head,tail,size,spot",
    [
        (R, R, 100, (R, False)),  # empty ring
        (R + 900, R + 50, 100, None),  # neither the end of the lap nor the start has room
        (R + 900, R + 600, 100, (R, True)),  # wraps: pad at the head, record at the start
        (R + 10, R + 900, 100, (R + 10, False)),  # second lap, before the tail
        (R + 800, R + 900, 100, None),  # would meet the tail
    ],
)
def test_place(head: int, tail: int, size: int, spot: tuple[int, bool] | None):
    assert Ring(END, head, tail).place(size) == spot


# A ring after a crash amid compaction: its free bytes in two pieces, 100 before the pad
# that ends the lap and 100 at the start of the next.
SPLIT = Ring(END, END - PAD_SIZE - 100, R + 100)
GAP = Ring(R + 8000, R + 1000, R + 1498)  # wrapped: the head is a lap ahead, 498 bytes short of the tail
FITS = 498 - PAD_SIZE - 31  # a copy that fits in GAP leaving a pad's worth and 31 bytes
D = PAD_SIZE - 67  # the tables below were drawn for a 67-byte pad: SPLIT's free bytes grow by this


@pytest.mark.parametrize(
    "size,keep,spot",
    [
        (FITS, 0, (R + 1000, False)),
        (454, 0, None),  # fits before the tail, but not with a pad's worth besides
        (FITS, 31, (R + 1000, False)),
        (FITS, 32, None),
        (500, 0, None),
    ],
)
def test_copy_spot(size: int, keep: int, spot: tuple[int, bool] | None):
    assert GAP.free() == 498
    assert GAP.copy_spot(size, keep) == spot


@pytest.mark.parametrize(
    "ring,held,rest,want,clears",
    [
        # Nothing held: a checkpoint alone frees everything up to the read position.
        (SPLIT, [], R + 500, 400 + D, True),
        # The first held record is too big for either piece: nothing can be copied.
        (SPLIT, [(R + 100, 150), (R + 250, 40)], R + 500, 300 + D, False),
        # A small first record is copied to the end of the lap; the bytes before the
        # second are freed, so the second (150) fits at the start of the next lap.
        (SPLIT, [(R + 100, 40), (R + 250, 150)], R + 500, 300 + D, True),
        # The same, but the lap's unusable end (after the pad) leaves 50 bytes short.
        (SPLIT, [(R + 100, 40), (R + 250, 150)], R + 500, 400 + D, False),
        # Enough is free before the first copy is needed.
        (SPLIT, [(R + 100, 150)], R + 500, 150 + D, True),
        # Wrapped, 498 bytes free before the tail: a 454-byte copy would fit, but would
        # leave less than a pad's worth, and compaction does not make such a copy
        # (crash simulator seed 1028490).
        (GAP, [(R + 1498, 454), (R + 5000, 100)], R + 6000, 1000, False),
        (GAP, [(R + 1498, FITS), (R + 5000, 100)], R + 6000, 1000, True),
    ],
)
def test_clears(ring: Ring, held: list[tuple[int, int]], rest: int, want: int, clears: bool):
    assert ring.clears(held, rest, want) is clears
