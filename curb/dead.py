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

A browse of `./dead` (`DeadBrowse`) is a snapshot of the dead letters when it starts,
in id order, each sent only if it is still dead when its turn comes, a bounded number
of bytes per step, like a browse of the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from curb.log.browse import Step
from curb.log.cursor import Record

DEAD_DESTINATION = "./dead"
REDRIVE_DESTINATION = "./redrive"
STEP_ENTRIES = 4096  # entries a browse step looks at, at most, sent or not


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
    """A browse of the dead letters that were dead when it began, oldest first: the ids
    of the log's (each read only when the browse gets to it, found by id wherever
    compaction has copied it since, so a million cost 8 bytes each until then) merged
    with the dead letters held as records. Each is sent only if still dead when its turn
    comes, a bounded number of bytes per step, like a browse of the queue; `step` as
    curb.browse.Browse's."""

    def __init__(
        self,
        ids: Sequence[int],
        records: list[Record],
        read: Callable[[int], Record | None],
        payload: Callable[[Record], bytes | memoryview],
    ):
        self._ids, self._at = ids, 0
        self._records, self._next = sorted(records, key=lambda rec: rec.id), 0
        self._read, self._payload = read, payload
        self.to_id = max(ids[-1] if ids else 0, self._records[-1].id if self._records else 0)

    def step(self, budget: int) -> Step:
        messages: list[tuple[int, bytes]] = []
        ids, records = self._ids, self._records
        looked = 0
        while budget > 0 and looked < STEP_ENTRIES and (self._at < len(ids) or self._next < len(records)):
            looked += 1
            rec: Record | None
            if self._next >= len(records) or (self._at < len(ids) and ids[self._at] < records[self._next].id):
                rec = self._read(ids[self._at])
                self._at += 1
            else:
                rec = records[self._next]
                self._next += 1
            if rec is None or rec.acked or not rec.dead:
                continue  # taken, deleted or redriven since the browse began
            data = dead_headers(rec) + bytes(self._payload(rec))
            messages.append((rec.id, data))
            budget -= len(data)
        return Step(messages, done=self._at >= len(ids) and self._next >= len(records))
