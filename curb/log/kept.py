"""The messages the log keeps apart from the queue's line: parked records, and the
delayed messages and dead letters given back to it.

The log keeps parked records in its index (curb.log.parked) as entries, not objects,
and reads one back only when it is handed out (due, a dead letter taken or redriven). A
held message that becomes parked (requeued with a delay, or a dead letter its holder
lets go of) stays a Record, kept here (`reparks`) until a flush copies it to the head as
an entry of the index (curb.log.placement). This unit is those reads and that keeping,
and the ready line they feed: the log (curb.log.core) calls it for the broker's
requeues, burials and dead-letter reads.

Delayed messages, dead letters and the delivery count (the design; curb.log.record has
the format, curb.log.parked the index):
- Where they are recorded: in the record itself. Its first 32 bytes, the *mutable block*,
  hold the state (`rdy`; `max` or `exp` for a dead letter of reason max-deliveries or
  expired; `ack`), the delivery count (8 hex digits: no user reaches its end) and the due
  time (wall ms; 0 or past: rdy now). The expiry time is fixed at SEND and covered by the
  CRC. A delayed SEND is written with its due time; a requeue (with or without a delay),
  a burial and a redrive rewrite the mutable block in place, like the ACK patch, and are
  durable like it (`on_durable` covers them). Records start at multiples of 32 bytes,
  so the block lies in one 512-byte sector and a patch is never torn: after a crash the
  record shows the block before the patch or after it, never a mix. So a due time or a
  dead mark that was synced is kept, and one that was not is as if never asked (the
  message is rdy as before it: delivered again, never lost). A read of a record back
  applies a rewrite still waiting for the next flush (`read_current`).
- The delivery count on disk is the count at the record's last patch: every way back
  (NACK, deadline, disconnect, shutdown) patches it, so a crash loses only deliveries
  since the message's last patch reached disk: the delivery of a message held at the
  crash, and those whose return was not yet synced. It never goes below a count a
  RECEIPT covered. A redrive resets it to 0, as the operator asked.
- The wall clock is injected (`wall_ms`), as `clock` is: the log has no clock of its own.
  A record whose due time is ahead is *parked*: the read cursor never hands it out, and
  dead letters never either. Parked records stay where they are in the ring; the log
  keeps them in `curb.log.parked`: in ring order (offset, size, id, a state byte: 17 bytes
  each in a ring up to 4 GiB) for compaction and the logical tail, and by due time in
  sorted runs of packed keys (8 bytes each) for `due(now_ms)`. So 1,000,000 delayed
  messages cost about 25 MB of index, not Python objects, and the queue sees a message only once it is due.
- Compaction copies parked records like held ones, so long-lived records never pin the
  tail (curb.log.placement).
- Start-up rebuilds the index from the record headers alone: recovery's walk reads the
  state and due field of each header it skims (never a body) and hands the parked ones
  to the index in batches; the cursor then steps over runs of them by their recorded
  sizes. The cost is the walk's (about a second per million records on a quiet machine)
  plus the index's appends and one sort per RUN keys: about twice the CPU of a walk over
  as many plain records (bin/bench-delayed measures both).
- A message parked while held is patched in place and stays a Record: requeued with a
  delay, the log keeps it (`reparks`) until `release` hands it back; buried, its holder
  keeps it (the broker's dead letters). Compaction copies such records as held ones.
  Delayed SENDs and every parked record found at start-up are never objects. A record is
  in `reparks` exactly while it is `parked`: kept by the log, held by no one.
- Every parked record is in the index from the moment it is placed: recovery indexes
  those it finds, and the pending line's writing (curb.log.appends) and compaction
  (curb.log.placement) index a delayed append and a copy of a parked record when they
  place it at the head, so the index keeps ring order and the cursor never has to park
  what it meets (curb.log.cursor). So every delayed message and dead letter the log
  counts is one `release`, `next_dead`, `dead_letters` and `redrive` reach: there is no
  state in between ("in transit") that a reader misses. Dead letters and delayed
  messages count in `live_bytes` against -cap like any message.
- A parked record that damage took is reported and forgotten (`lost`): it never pins
  the tail for good, and is never delivered.
- Reads back are paced like the cursor's walk: each charges the cursor's slice
  (`Cursor.spend`), so handing out a million due messages never holds the loop.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from curb.log import record as fmt
from curb.log.cursor import KEEP_PAYLOAD, Cursor, Record
from curb.log.disk import Disk
from curb.log.dying import Dying
from curb.log.events import LogEvents
from curb.log.pacing import Pacer
from curb.log.parked import DEAD_HELD, DELAYED, EXP, HELD, MAX, READY, Parked
from curb.log.record import DEAD_REASONS, DEAD_STATES, RECORD_HEADER, STATE_EXP, STATE_MAX, STATE_RDY, FormatError

# A dead letter's reason (Record.dead) as its state in the index.
DEAD_INDEX = {DEAD_REASONS[STATE_MAX]: MAX, DEAD_REASONS[STATE_EXP]: EXP}
# Due messages moved to the ready line per call of `release`: no read each, so a call is
# a few milliseconds at most.
RELEASE_SLICE = 4096
# Parked entries an ACK up to an id's walk looks at per slice (blocks of ids all above
# its watermark skipped unread): a few milliseconds of CPU.
UPTO_SLICE = 2048


class Kept:
    """The parked index's reads and the Records the log keeps, and the ready line."""

    def __init__(
        self,
        disk: Disk,
        parked: Parked,
        cursor: Cursor,
        dying: Dying,
        patches: dict[int, bytes],
        pacer: Pacer,
        events: LogEvents,
        wall_ms: Callable[[], int],
        patch: Callable[[Record, bytes], None],
        damaged: Callable[[str], None],
        ready_changed: Callable[[], None],
    ):
        self.disk = disk
        self.parked = parked
        self.cursor = cursor
        self.dying = dying  # the ACKs up to an id not yet durable: their sizes still count
        self.classes = dying.classes
        self.patches = patches  # the log's rewrites of mutable blocks, by offset, not yet written
        self.pacer = pacer
        self.events = events
        self.wall_ms = wall_ms
        self.patch = patch
        self.damaged = damaged
        self.ready_changed = ready_changed  # the ready line went empty or got messages
        # Held records the log keeps from now on (requeued with a delay, or dead letters
        # their holder let go of), until a flush copies each to the head as an entry of
        # the index. A record is here exactly while it is `parked`.
        self.reparks: collections.deque[Record] = collections.deque()
        # Kept records that came due or were redriven before a flush copied them: the
        # front of the ready line, ahead of the index's.
        self.ready_kept: collections.deque[Record] = collections.deque()

    # ---------------------------------------------------------------- keeping

    def keep(self, rec: Record) -> None:
        """A held record (not from the index) becomes the log's to keep: copied to the head
        at the next flush, as an entry of the index, and no object after that."""
        rec.parked = True
        self.reparks.append(rec)
        self.pacer.flush_wanted()

    def unkeep(self, rec: Record) -> None:
        """A record the log kept is handed out, or copied into the index."""
        rec.parked = False
        self.reparks.remove(rec)

    def requeue(self, rec: Record, due_ms: int = 0) -> None:
        """The message goes back: its delivery count and due time are written in place
        (durable like an ACK; `on_durable` covers it). With `due_ms` ahead of the wall
        clock it is parked: the caller lets go of it, and `release` hands it back once
        due. Otherwise the caller keeps it, rdy again (a dead letter stays dead: nothing
        is written)."""
        if rec.acked or rec.dead:
            return
        if due_ms > self.wall_ms():
            rec.due_ms = due_ms
            if rec.slot >= 0:
                self.parked.set(rec.slot, DELAYED, due_ms)
                rec.slot = -1
            else:
                self.keep(rec)
        else:
            rec.due_ms = 0
        self.patch(rec, STATE_RDY)

    def bury(self, rec: Record, reason: str) -> None:
        """The held message becomes a dead letter, for `reason` ("max-deliveries" or
        "expired"): written in place (durable like an ACK), never handed out by
        `next_ready` again, also after a restart. The caller keeps the record (its dead
        letters' queue); `ack` deletes it for good, `revive` makes it rdy again."""
        if rec.acked:
            return
        state = DEAD_STATES[reason]
        rec.dead = reason
        rec.due_ms = 0
        if rec.slot >= 0:
            self.parked.set(rec.slot, DEAD_HELD)
        self.patch(rec, state)

    def keep_dead(self, rec: Record) -> None:
        """The caller lets go of a dead letter it holds (one it buried): the log keeps it
        from now on, as it keeps those found at start-up, and `next_dead` hands it out."""
        if rec.acked or not rec.dead:
            return
        if rec.slot >= 0:
            self.parked.set(rec.slot, DEAD_INDEX[rec.dead])
            rec.slot = -1
        else:
            self.keep(rec)

    def revive(self, rec: Record) -> None:
        """A dead letter the caller holds is rdy again with its delivery count reset
        (a redrive), written in place; the caller puts it in the queue."""
        if rec.acked or not rec.dead:
            return
        rec.dead = ""
        rec.deliveries = 0
        if rec.slot >= 0:
            self.parked.set(rec.slot, HELD)
        self.patch(rec, STATE_RDY)

    # ---------------------------------------------------------------- counts

    @property
    def delayed(self) -> int:
        """Messages waiting for their due time, in the index or kept."""
        return self.parked.delayed + sum(1 for rec in self.reparks if not rec.dead)

    @property
    def dead(self) -> int:
        """Dead letters the log holds and has not handed out (those held by a reader of
        the dead letters are the reader's to count)."""
        parked = self.parked
        held = sum(1 for seq in parked.held if parked.state(seq) == DEAD_HELD)
        kept = sum(1 for rec in self.reparks if rec.dead)
        return parked.dead - held + kept

    @property
    def ready_waiting(self) -> int:
        """Messages in the ready line: `next_ready_line` hands these out before the cursor's."""
        return self.parked.ready + len(self.ready_kept)

    def next_due(self) -> int | None:
        """The earliest due time (wall ms) of a delayed message in the index or kept."""
        soonest = self.parked.next_due()
        later = min((rec.due_ms for rec in self.reparks if not rec.dead), default=None)
        if later is not None and (soonest is None or later < soonest):
            soonest = later
        return soonest

    # ---------------------------------------------------------------- the ready line

    def release(self, now_ms: int, limit: int = RELEASE_SLICE) -> bool:
        """Up to `limit` messages due by `now_ms` join the ready line, where `next_ready`
        hands them out first, reading each only then (a million due at once cost no
        object each, and no read, until consumers take them). Returns whether more are
        due by then: the caller goes on in its next loop pass."""
        for rec in [r for r in self.reparks if not r.dead and r.due_ms <= now_ms]:
            self.unkeep(rec)
            self.ready_kept.append(rec)
        moved = self.parked.release(now_ms, limit)
        self.ready_changed()
        return moved >= limit

    def next_ready_line(self) -> Record | None:
        """The ready line's oldest message (a kept record's, or the index's, read now),
        then the cursor's; each now in flight, as `next_ready` hands them out."""
        kept = self.ready_kept
        while kept:
            rec = kept.popleft()
            if not rec.acked:
                return rec
        parked = self.parked
        while self.cursor.spend() and (seq := parked.take_ready()) is not None:
            found = self.read_parked(seq)
            if found is None:
                continue
            found.slot = seq
            parked.held[seq] = found
            return found
        if self.cursor.stalled:
            return None  # this slice's reading is spent: the next flush grants another
        self.ready_changed()
        return self.cursor.next_ready()

    # ---------------------------------------------------------------- dead letters

    def next_dead(self) -> Record | None:
        """The next dead letter the log holds (found at start-up, or kept since), now
        held by the caller: `ack` deletes it for good; `requeue` keeps it dead in the
        caller's hands, `keep_dead` gives it back; `revive` makes it rdy."""
        parked = self.parked
        while (seq := parked.next_dead()) is not None and self.cursor.spend():
            rec = self.read_parked(seq)
            if rec is None:
                continue
            rec.slot = seq
            parked.set(seq, DEAD_HELD)
            parked.held[seq] = rec
            return rec
        if self.cursor.stalled:
            return None  # this slice's reading is spent: the next flush grants another
        for rec in self.reparks:
            if rec.dead:
                self.unkeep(rec)
                return rec
        return None

    def dead_letters(self) -> tuple[int, list[Record]]:
        """Where a browse of the dead letters the log holds stops, and what it holds apart:
        the highest id among its index's (`dead_after` lists them from there in slices,
        `read_dead` reads each) and the records it keeps until a flush copies them."""
        return self.parked.last_dead(), [rec for rec in self.reparks if rec.dead]

    def read_dead(self, mid: int) -> Record | None:
        """Dead letter `mid` of the index, read now, if it is one still (also one a
        reader of the dead letters holds: it is dead until acked or redriven)."""
        seq = self.parked.dead_entry(mid)
        return None if seq is None else self.read_parked(seq)

    def redrive(self, count: int) -> list[int]:
        """Up to `count` of the dead letters the log holds, oldest first, are rdy again
        with their delivery count reset, written in place, and join the ready line.
        Returns the ids of those that moved (fewer: none left); `on_durable` tells when
        that is on disk."""
        parked = self.parked
        moved: list[int] = []
        while len(moved) < count:
            seq = parked.next_dead()
            if seq is None:
                break
            rec = self.read_parked(seq)
            if rec is None:
                continue
            rec.deliveries = 0
            rec.due_ms = 0
            self.patch(rec, STATE_RDY)
            parked.set(seq, READY)
            moved.append(rec.id)
        for rec in [r for r in self.reparks if r.dead][: count - len(moved)]:
            self.revive(rec)
            self.unkeep(rec)
            self.ready_kept.append(rec)
            moved.append(rec.id)
        self.ready_changed()
        return moved

    # ---------------------------------------------------------------- ACKs up to an id

    def ack_upto(self, upto: int) -> None:
        """An ACK up to `upto` (LogCore.ack_upto): held messages up to it are acked, and
        so are parked ones, held ones at once, the others by the index's walk (`walk_upto`)."""
        cur = self.cursor
        for held in (cur.behind, cur.ahead):
            for rec in [r for r in held.values() if r.id <= upto and not r.acked]:
                rec.acked = True
                if rec.parked:
                    self.unkeep(rec)
                cur.settled(rec)
                self.dying.take_upto(rec.offset, rec.size)
        if self.ready_kept:
            self.ready_kept = collections.deque(rec for rec in self.ready_kept if not rec.acked)
        cur.ack_upto(upto)  # first: it tells parked records from unread ones by the index
        parked = self.parked
        for seq in [seq for seq, held_rec in parked.held.items() if held_rec.id <= upto]:
            self.drop_parked(seq)  # held ones at once: their records are acked now
        parked.ack_upto(upto)

    def walk_upto(self) -> bool:
        """One slice of an ACK up to an id's walk of the parked index, if one is under
        way (whether it was): it removes the entries the watermark acked, the next slice
        at the next flush; `events.walked` once the counts are exact again."""
        parked = self.parked
        if not parked.walking:
            return False
        for seq in parked.walk_upto(UPTO_SLICE):
            self.drop_parked(seq)
        if not parked.walking:
            self.events.walked()
        else:
            self.pacer.flush_wanted()
        return True

    # ---------------------------------------------------------------- reads of parked records

    def drop_parked(self, seq: int) -> None:
        """A parked entry is acked: removed, and its record, if one is held, acked."""
        parked = self.parked
        held_rec = parked.held.get(seq)
        if held_rec is not None:
            held_rec.acked = True
            held_rec.slot = -1
        self.dying.take_upto(parked.offset(seq), parked.size(seq))
        parked.remove(seq)

    def lost(self, seq: int) -> None:
        """A parked record that damage took (reported where it was found): forget it."""
        self.classes.remove(self.parked.size(seq))
        self.parked.remove(seq)

    def read_current(self, offset: int, size: int) -> bytearray:
        """The record at `offset` as it is now: read back, with the rewrites of its mutable
        block that wait for the next flush applied."""
        raw = bytearray(self.disk.pread(size, offset))
        patch = self.patches.get(offset)
        if patch is not None:
            raw[: len(patch)] = patch
        return raw

    def checked(self, offset: int, size: int, mid: int) -> tuple[fmt.RecordHeader, bytearray] | None:
        """The record of message `mid` at `offset` as it is now, read and checked; None
        if damage took it (reported)."""
        raw = self.read_current(offset, size)
        try:
            hdr = fmt.parse_header(raw, 0)
        except FormatError:
            hdr = None
        if hdr is None or hdr.id != mid or not fmt.check_payload(raw, 0, hdr):
            self.damaged(f"parked message {mid} at byte {offset} is damaged; never delivered")
            return None
        return hdr, raw

    def read_parked(self, seq: int) -> Record | None:
        """The Record of a parked entry; None if damage took it (reported, and the entry
        forgotten: it must not pin the tail for good)."""
        parked = self.parked
        offset, size = parked.offset(seq), parked.size(seq)
        checked = self.checked(offset, size, parked.id(seq))
        if checked is None:
            if seq not in parked.held:  # one in a reader's hands goes when the reader lets go
                self.lost(seq)
            return None
        hdr, raw = checked
        view = memoryview(raw)[RECORD_HEADER : RECORD_HEADER + hdr.length]
        rec = Record(
            hdr.id,
            offset,
            size,
            hdr.deliveries,
            hdr.timestamp_ms,
            bytes(view) if size <= KEEP_PAYLOAD else view,  # as the cursor keeps payloads
            hdr.wseq,
            hdr.due_ms,
            hdr.expires_ms,
        )
        rec.dead = DEAD_REASONS.get(hdr.state, "")
        return rec
