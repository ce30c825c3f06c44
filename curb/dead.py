"""The dead letters as a queue of their own: `./dead` reads them, `./redrive` sends them back.

A dead letter is a message past the delivery limit or expired (curb.redelivery's
reasons). It stays in the log with its body, headers, delivery count and reason (the log
marks it, `bury`, and keeps it from then on, `keep_dead`: an entry of its index, no
object, as the dead letters found at start-up are), and the broker serves the dead
letters with a second `curb.queue.Queue`, untimed (no expiry, no delivery limit), whose
source (`DeadSource`) is the log's dead letters. A `./dead` subscriber's ACK deletes one
for good; its NACK, disconnect or close, or its ack deadline passing (as a queue
subscriber's, `curb-ack-timeout` or -ack-timeout), puts it back among the dead (never in
the ordinary queue). A
redrive makes the dead letters ordinary messages again, count reset: the log's
(`redrive`), then those back from `./dead` subscribers (`revive`).

A browse of `./dead` (`DeadBrowse`) shows each dead letter that was dead when it began
and still is when its turn comes, once, oldest first, then an end marker; a bounded
number of bytes and of index entries per step, like a browse of the queue. It snapshots
nothing of the log's index: it takes the log's dead letters in id order, a slice at a
time, from the id where the last slice stopped (`dead_after`), up to the highest id of
a dead letter when it began; so each step costs its slice, whatever the number of dead
letters. Invariants:
- Each id is shown at most once: the browse only moves up in id (`_after`), and the
  records held apart (in the dead letters' queue, or kept until a flush) are merged in
  by id, an id met both there and in the index taken once.
- A dead letter dead all along is shown: it is in the index, or held apart (the
  snapshot of those records is taken when the browse begins), and compaction's copy of
  it keeps its id, so the walk by id still meets it.
- One redriven, acked or handed out to a `./dead` reader when its turn comes is not
  shown; one buried since the browse began may be (it was not dead when it began).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from curb.log.browse import Step
from curb.log.cursor import Record

DEAD_DESTINATION = "./dead"
REDRIVE_DESTINATION = "./redrive"
# Entries a browse step looks at, at most, sent or not: each one the log's is read then
# (about 10 us), so that a step holds the loop a few milliseconds.
STEP_ENTRIES = 512
SLICE_IDS = 256  # dead letters' ids taken from the log at a time


class DeadIndex(Protocol):
    """The log's dead letters by id, as a browse reads them."""

    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]: ...
    def read_dead(self, mid: int) -> Record | None: ...


class DeadLog(Protocol):
    def next_dead(self) -> Record | None: ...


class DeadSource:
    """The dead letters the log found at start-up, as the dead letters' queue's source."""

    def __init__(self, log: DeadLog):
        self._log = log

    def next_ready(self) -> Record | None:
        return self._log.next_dead()


def dead_headers(rec: Record) -> bytes:
    """The header lines a dead letter's MESSAGE carries ahead of its own."""
    return b"curb-dead-reason:%s\ncurb-deliveries:%d\n" % (rec.dead.encode(), rec.deliveries)


class DeadBrowse:
    """A browse of the dead letters that were dead when it began, oldest first: the
    log's, their ids taken a slice at a time (each read only when the browse gets to
    it, found by id wherever compaction has copied it since), merged with the dead
    letters held as records. Each is sent only if still dead when its turn comes;
    `step` as curb.log.browse.Browse's."""

    def __init__(
        self,
        log: DeadIndex,
        last: int,
        records: list[Record],
        payload: Callable[[Record], bytes | memoryview],
    ):
        self._log, self._last = log, last
        self._ids: list[int] = []  # the slice taken, not yet looked at
        self._next_after: int | None = 0  # where the next slice starts (None: no more)
        self._after = 0  # every id up to this is done with
        self._records, self._next = sorted(records, key=lambda rec: rec.id), 0
        self._payload = payload
        self.to_id = max(last, self._records[-1].id if self._records else 0)

    def step(self, budget: int) -> Step:
        messages: list[tuple[int, bytes]] = []
        ids, records = self._ids, self._records
        looked = 0
        while budget > 0 and looked < STEP_ENTRIES:
            after = self._after
            while ids and ids[-1] <= after:
                ids.pop()
            if not ids and self._next_after is not None:  # the log's next slice, by id
                got, self._next_after = self._log.dead_after(max(after, self._next_after), self._last, SLICE_IDS)
                ids.extend(reversed(got))
                looked += SLICE_IDS
                continue
            while self._next < len(records) and records[self._next].id <= after:
                self._next += 1
            held = records[self._next] if self._next < len(records) else None
            looked += 1
            rec: Record | None
            if ids and (held is None or ids[-1] < held.id):
                self._after = mid = ids.pop()
                rec = self._log.read_dead(mid)
            elif held is not None:
                self._after = held.id
                self._next += 1
                rec = held
            else:
                break
            if rec is None or rec.acked or not rec.dead:
                continue  # taken, deleted or redriven since the browse began
            data = dead_headers(rec) + bytes(self._payload(rec))
            messages.append((rec.id, data))
            budget -= len(data)
        done = self._next >= len(records) and not ids and self._next_after is None
        return Step(messages, done=done)
