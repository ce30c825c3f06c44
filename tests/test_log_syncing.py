"""Which syncs the log asks to run inline: few writes of few bytes (curb.log.syncing)."""

from __future__ import annotations

import random

import pytest
from simdisk import SimDisk

from curb.log import LogCore
from curb.log.pacing import ByHand
from curb.log.record import record_size
from curb.log.syncing import INLINE_SYNC_BYTES, INLINE_SYNC_OPS


class Recorder(ByHand):
    """Flushes and syncs by hand, and keeps what each wish for a soon sync said."""

    def __init__(self) -> None:
        self.small: list[bool] = []

    def sync_soon(self, small: bool) -> None:
        self.small.append(small)


# The largest payload whose record still fits the inline byte bound.
FITS = max(n for n in range(INLINE_SYNC_BYTES) if record_size(n) <= INLINE_SYNC_BYTES)


@pytest.mark.parametrize(
    "payloads, small",
    [
        ([100], True),
        ([100] * INLINE_SYNC_OPS, True),
        ([100] * (INLINE_SYNC_OPS + 1), False),  # many writes: the thread syncs them
        ([FITS], True),
        ([FITS + 1], False),  # one large record: the loop goes on reading meanwhile
        ([FITS // 2, FITS // 2 + 64], False),
        ([1 << 20], False),
    ],
)
def test_a_sync_is_inline_only_for_few_writes_of_few_bytes(payloads, small):
    pacer = Recorder()
    log = LogCore(SimDisk(random.Random(1)), 16 << 20, clock=lambda: 0.0, pacer=pacer)
    for size in payloads:
        log.append(b"\n" + b"x" * (size - 1), lambda reason: None)
    log.flush()
    assert pacer.small[-1] is small
    log.sync()
    log.append(b"\nnext", lambda reason: None)
    log.flush()
    assert pacer.small[-1] is True  # the count starts again at each sync
