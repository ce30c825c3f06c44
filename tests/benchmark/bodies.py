"""Message bodies that identify themselves, and the tally that checks what came back.

A body is `<run id>:<seq>:` padded with dots to the requested size, so whoever receives
it can tell a good message from a lost, duplicated, altered or foreign one. A seq is
`producer * SEQ_STRIDE + index`: every producer numbers its own messages from 0.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

SEQ_STRIDE = 10**9


class VerificationError(Exception):
    """The broker lost, altered or invented messages: the benchmark's figures are void."""


def make_body(run_id: str, seq: int, size: int) -> bytes:
    tag = f"{run_id}:{seq}:".encode()
    return tag + b"." * (size - len(tag))


class BodyReader:
    """Classifies received bodies of one run: good ones yield their seq, the rest are counted."""

    def __init__(self, run_id: str, size: int):
        self.run_id = run_id
        self.size = size
        self._prefix = f"{run_id}:".encode()
        self.foreign = 0  # bodies of another run (or not from this benchmark at all)
        self.altered = 0  # bodies of this run whose content is not what was sent

    def seq(self, body: bytes) -> int | None:
        """The seq of a good body of this run, else None (and the body is counted). Checked in
        place, not against a rebuilt body: a consumer checks every message it receives."""
        if not body.startswith(self._prefix):
            self.foreign += 1
            return None
        start = len(self._prefix)
        colon = body.find(b":", start)
        digits = body[start:colon]
        if (
            colon < 0
            or not digits.isdigit()
            or (digits[0] == 48 and len(digits) > 1)  # no leading zero: one spelling per seq
            or len(body) != max(self.size, colon + 1)
            or body.count(b".", colon + 1) != len(body) - colon - 1
        ):
            self.altered += 1
            return None
        return int(digits)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one workload got back, against what its producers had sent."""

    expected: int
    unique: int
    duplicates: int
    missing: int
    unexpected: int  # seqs of this run that no producer reported sending
    foreign: int
    altered: int

    def problems(self) -> list[str]:
        return [
            f"{count:,} {what}"
            for count, what in (
                (self.missing, f"of {self.expected:,} messages lost"),
                (self.unexpected, "messages of this run that were never sent"),
                (self.altered, "messages with altered bodies"),
                (self.foreign, "foreign messages (not sent by this run)"),
            )
            if count
        ]


class Tally:
    """Counts deliveries per sent message; duplicates are allowed (at least once), loss is not."""

    def __init__(self, sent: dict[int, int]):
        self._seen = {producer: bytearray(count) for producer, count in sent.items()}
        self.expected = sum(sent.values())
        self.unique = self.duplicates = self.unexpected = self.foreign = self.altered = 0

    def add(self, seqs: Iterable[int]) -> None:
        seen = self._seen
        for seq in seqs:
            producer, index = divmod(seq, SEQ_STRIDE)
            marks = seen.get(producer)
            if marks is None or index >= len(marks):
                self.unexpected += 1
            elif marks[index]:
                self.duplicates += 1
                marks[index] = min(marks[index] + 1, 255)
            else:
                self.unique += 1
                marks[index] = 1

    def add_rejects(self, foreign: int, altered: int) -> None:
        self.foreign += foreign
        self.altered += altered

    def missing(self) -> array:
        """Seqs not delivered yet, as an array('q') cheap to hand to another process."""
        out = array("q")
        for producer, marks in self._seen.items():
            base = producer * SEQ_STRIDE
            start = marks.find(0)
            while start >= 0:
                out.append(base + start)
                start = marks.find(0, start + 1)
        return out

    def verdict(self) -> Verdict:
        return Verdict(
            self.expected,
            self.unique,
            self.duplicates,
            self.expected - self.unique,
            self.unexpected,
            self.foreign,
            self.altered,
        )
