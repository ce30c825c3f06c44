"""Runs of records of one shape, read with one pattern: how recovery's skim (curb.log.scan)
reads a million parked records found at start-up in well under a second.

A *shape* is a state, whether the record is a copy, and a payload length (so a size):
what a flood of delayed SENDs of one kind, or of dead letters buried in turn, leaves.
`run_rows` matches records of one shape laid end to end with a compiled pattern over the
whole run, in C, and hands back the fields the skim needs of each; the skim then counts
the run at once, where its loop of one record at a time costs a microsecond or two each.

Invariants:
- The pattern is fixed-width (the header's 103 bytes, then `size - 103` of anything), so
  its matches over `k * size` bytes are `k` exactly when every one of the `k` records
  there has the shape: `k` non-overlapping matches of `size` bytes tile the span, so each
  starts where a record does. Fewer matches, and the run is cut at the first span that
  missed (the skim reads on one record at a time there).
- A record that matches is one the skim's own checks accept: the header's newline, the
  state, the tag equal to the write sequence's low digits, hex where a field is parsed,
  and the length (the same bytes as the run's first record's). The pattern checks more
  than the skim does, never less.
- Work is bounded: runs are read in spans that double from FIRST records, so a run that
  ends early costs at most about twice the records it had.
"""

from __future__ import annotations

import re
from operator import itemgetter

from curb.log.record import ALIGN, RECORD_HEADER

FIRST = 16  # records of the first span; the least run worth a pattern
SHAPES = 64  # patterns kept (a log has few shapes at a time; the cache is cleared past it)
DUE, TAG, ID, WSEQ_HIGH = 0, 1, 2, 3  # fields of a row: due time, tag, id, write sequence's high digits
IDS = itemgetter(ID)
DUES = itemgetter(DUE)

_patterns: dict[tuple[bytes, bool, bytes, int], re.Pattern[bytes]] = {}


def pattern(state: bytes, copy: bool, length: bytes, size: int) -> re.Pattern[bytes]:
    """The pattern of one record of a shape (`length`: the header's 8 hex digits)."""
    key = (state, copy, length, size)
    found = _patterns.get(key)
    if found is None:
        if len(_patterns) >= SHAPES:
            _patterns.clear()
        stamp = b"[89a-f]" if copy else b"[0-7]"  # the send time's top digit: COPY_FLAG
        found = _patterns[key] = re.compile(
            re.escape(state)
            + rb" [0-9a-f]{8} ([0-9a-f]{12}) ([0-9a-f]{6}) ([0-9a-f]{12}) ([0-9a-f]{6})\2 "
            + stamp
            + rb".{11} .{12} "
            + re.escape(length)
            + rb" .{8}\n.{%d}" % (size - RECORD_HEADER),
            re.DOTALL,
        )
    return found


def size_of(length: bytes) -> int:
    """The record size of a header's length field, as the skim reads it; 0 if none."""
    try:
        return (RECORD_HEADER + ALIGN + int(length, 16)) & -ALIGN
    except ValueError:
        return 0


def run_rows(buf: bytes, off: int, shape: re.Pattern[bytes], size: int, most: int) -> list[tuple[bytes, ...]]:
    """The rows (due, tag, id, write sequence's high digits) of the records of `shape` laid
    end to end from buf[off], at most `most` of them: fewer than FIRST when fewer lie
    there (not worth a run)."""
    rows: list[tuple[bytes, ...]] = []
    span = FIRST
    while len(rows) < most:
        span = min(span, most - len(rows))
        start = off + len(rows) * size
        got = shape.findall(buf, start, start + span * size)
        if len(got) != span:
            break
        rows += got
        span *= 2
    return rows
