"""The pending line: messages accepted by the log and not yet written, and their writing.

`LogCore.append` puts a message at the end of the line (its id is assigned then, so the
line is in id order); a flush writes the line's front in order (`write`), as far as the
ring has room (curb.log.placement), and the message's `done` then waits for the sync of
that flush (curb.log.waiters). The line is a unit of its own because it is the one place
messages wait with no record on disk: an ACK up to an id takes them from it unwritten,
and a refusal (no room, a full disk, a failed write) answers them all.

Invariants kept here:
- Appends are written in id order, each exactly once, and a message is counted (by the
  cursor, or by the parked index when it is delayed) only once it is written.
- A delayed append is an entry of the index from the moment it is placed, at the head,
  in ring order (curb.log.parked); one due by then is the cursor's to hand out.
- `delayed` and `due` count the delayed messages still in the line and their earliest
  due time, so the log's counts and timers know them before they are written.
- A message refused (`cancel`) is answered with the reason, and so is every caller
  waiting for durability after it (curb.log.waiters): nothing waits for an append
  that will never be written.
"""

from __future__ import annotations

import collections
import errno
from collections.abc import Callable
from typing import Any

from curb.log import record as fmt
from curb.log.admission import Admission
from curb.log.checkpoints import Checkpoints
from curb.log.cursor import Cursor, Record
from curb.log.dying import Dying
from curb.log.events import LogEvents
from curb.log.marks import Marks
from curb.log.parked import DELAYED, Parked
from curb.log.placement import Placement, WriteRuns
from curb.log.record import PAD_SIZE, STATE_RDY, record_bytes
from curb.log.syncing import Syncs
from curb.log.waiters import Done, Waiters

Pending = tuple[Record, bytes, "Done | None", bool]  # the record, its payload, its `done`, urgent


class Appends:
    """The messages waiting to be written, and the flush's writing of them."""

    def __init__(
        self,
        name: str,
        placement: Placement,
        admission: Admission,
        cursor: Cursor,
        parked: Parked,
        marks: Marks,
        checkpoints: Checkpoints,
        waiters: Waiters,
        syncs: Syncs,
        dying: Dying,
        events: LogEvents,
        metrics: Any,
        wall_ms: Callable[[], int],
    ):
        self.name = name
        self.placement = placement
        self.admission = admission
        self.cursor = cursor
        self.parked = parked
        self.marks = marks
        self.checkpoints = checkpoints
        self.waiters = waiters
        self.syncs = syncs
        self.dying = dying
        self.events = events
        self.metrics = metrics
        self.wall_ms = wall_ms
        self.line: collections.deque[Pending] = collections.deque()
        # Delayed appends in the line (indexed once written): how many, and the earliest
        # due time among them, so that the log's `delayed` and `next_due` know them.
        self.delayed = 0
        self.due: int | None = None
        self.room_wanted = False  # the last flush stopped at an append with no room yet

    def write(self, fno: int) -> tuple[int, bool]:
        """Place and write the line's appends in order as flush `fno`, stopping at the
        first that has no room yet; then refuse them all if room cannot come. Returns how
        many were placed, and whether anything was written (the copies and pads
        compaction made count: a checkpoint must wait for their sync). A flush that
        placed an urgent one (someone waits for its sync) is urgent."""
        runs = WriteRuns([], [])
        wall = self.wall_ms()
        written, urgent = self._place(fno, runs, wall)
        if not self.line:
            self.admission.pending_largest = 0
        if written and (self.delayed or self.due is not None):
            self.left()
        runs.write(self.placement.disk)
        cursor, placement = self.cursor, self.placement
        cursor.whead, cursor.next_wseq = placement.ring.head, placement.next_wseq
        if urgent:
            self.syncs.urgent_upto = fno
        if written:
            self._written(written, wall)
            self.syncs.written_ids.append((fno, written[-1][0].id))
        if self.line and self.room_wanted and not self._can_progress():
            if self.metrics is not None:
                self.metrics.refused_full += len(self.line)
            self.cancel("queue full: the log has no room for this message; it was not stored")
        return len(written), bool(runs.runs)

    def _place(self, fno: int, runs: WriteRuns, wall: int) -> tuple[list[tuple[Record, bytes]], bool]:
        """Place the line's appends into `runs` while they have room: the placed ones with
        their payloads, and whether one of them was urgent. Those due after `wall` are
        parked."""
        self.room_wanted = False
        written: list[tuple[Record, bytes]] = []
        urgent_any = False
        line, placement, parked = self.line, self.placement, self.parked
        ring, end, capacity = placement.ring, placement.end, placement.capacity
        admission, synced, syncs = self.admission, self.waiters.synced, self.syncs
        reserve = early = -1  # computed when first needed, and again once a record outgrows it
        while line:
            rec, payload, done, urgent = line[0]
            size = rec.size
            head, tail = ring.head, ring.tail
            if reserve < 0:
                reserve = admission.reserve()
                early = admission.early(reserve)
            if head >= tail and head + size + PAD_SIZE <= end and capacity - (head - tail) - size >= early:
                # The common case: room at the head, far from the tail.
                if head + size + PAD_SIZE > placement.allocated:
                    off: int | None = self._room(size, runs, reserve, head)
                else:
                    off = head
            else:
                off = self._room(size, runs, reserve, None)
            if off is None:
                break
            rec.wseq = wseq = placement.next_wseq
            placement.next_wseq = wseq + 1
            header = fmt.encode_record(
                STATE_RDY, 0, rec.id, wseq, rec.timestamp_ms, payload, due_ms=rec.due_ms, expires_ms=rec.expires_ms
            )
            runs.add(off, size, record_bytes(header, payload))
            rec.offset = off
            ring.head = off + size
            if rec.due_ms > wall:  # parked from its write on, at the head: in ring order
                parked.add(off, size, rec.id, DELAYED, rec.due_ms, passed=False)
            line.popleft()
            admission.pending_bytes -= size
            syncs.unsynced_bytes += size
            admission.classes.add(size)
            if 2 * (size + PAD_SIZE) > reserve:
                reserve = -1
            written.append((rec, payload))
            if done is not None:
                synced.append((fno, done))
            urgent_any = urgent_any or urgent
        return written, urgent_any

    def _room(self, size: int, runs: WriteRuns, reserve: int, head: int | None) -> int | None:
        """Where the append at the front goes when it is not the common case: at `head`
        once the file grows to cover it, else where placement finds room (None: no room
        yet, or the file system is full, and then every pending append is refused)."""
        placement = self.placement
        try:
            if head is not None:
                placement.allocate(head + size + PAD_SIZE)
                return head
            off = placement.room_for_append(size, runs, reserve)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            refused = len(self.line)
            self.cancel(f"disk full ({err.strerror}): message not stored")
            self.events.disk_full(refused, f"cannot grow {self.name}: {err.strerror}")
            return None
        if off is None:
            self.room_wanted = True
        return off

    def _written(self, written: list[tuple[Record, bytes]], wall: int) -> None:
        """The appends just written are the cursor's to hand out (but for those parked,
        due after `wall`: now in the index), and may be marks (curb.log.marks)."""
        cursor, marks = self.cursor, self.marks
        for rec, payload in written:
            if rec.due_ms <= wall:
                cursor.written(rec, payload)
            if marks.due(rec.offset):
                marks.add(rec.id, rec.offset, rec.wseq)

    def _can_progress(self) -> bool:
        """Whether room will come without new ACKs: a checkpoint yet to be written or
        synced will release space behind the tail, or ACKs already made will become
        durable (curb.log.dying: until then their room is not spent)."""
        syncs = self.syncs
        return (
            self.cursor.tail() != self.placement.ring.tail
            or self.checkpoints.writing is not None
            or syncs.written_no > syncs.synced_no
            or self.dying.pending()
        )

    def cancel(self, reason: str) -> None:
        """Refuse every append still waiting for room, and the on_durable calls after them."""
        admission, line = self.admission, self.line
        while line:
            rec, _, done, _ = line.popleft()
            admission.pending_bytes -= rec.size
            if done is not None:
                done(reason)
        self.left()
        admission.pending_largest = 0
        self.waiters.refuse_after_appends(reason)

    def left(self) -> None:
        """Appends left the line (written, refused, or taken by an ACK up to an id): count
        the delayed ones still in it, and their earliest due time, anew."""
        dues = [rec.due_ms for rec, _, _, _ in self.line if rec.due_ms]
        self.delayed = len(dues)
        self.due = min(dues, default=None)

    def drop_upto(self, upto: int) -> None:
        """An ACK up to `upto`: the appends up to it are never written, and their `done`
        waits for the watermark instead (LogCore.ack_upto)."""
        pending, admission, waiters = self.line, self.admission, self.waiters
        while pending and pending[0][0].id <= upto:
            rec, _, sent, _ = pending.popleft()
            admission.pending_bytes -= rec.size
            if sent is not None:
                waiters.watermark.append((upto, sent))
        waiters.taken_upto(upto)
        self.left()
        if not pending:
            admission.pending_largest = 0

    def waits_for(self, msg_id: int) -> bool:
        """Whether a message with an id up to `msg_id` is accepted but not yet written."""
        line = self.line
        return bool(line) and line[0][0].id <= msg_id

    def next_due(self, now: int) -> int | None:
        """The earliest due time after `now` among the appends not yet written (indexed once
        written, if not due by then; those due by then the cursor hands out, once written)."""
        due = self.due
        if due is not None and due <= now:
            due = self.due = min((r.due_ms for r, _, _, _ in self.line if r.due_ms > now), default=None)
        return due
