"""Admission: whether the log takes a message now, and the room compaction keeps.

The log may refuse a SEND (QueueFull, TooLarge) but must never take one it cannot then
place without new ACKs. Invariants, each kept here:
- A message is accepted only if the live bytes leave room for it and the headroom
  compaction needs (`headroom`), bytes ahead of the read position that hold no live
  message counting as used (`ahead_dead_bytes`); then it is placed after at most a few
  sync and checkpoint cycles, with no new ACKs: compaction copies held messages that
  pin the tail, in batches, into space the headroom keeps free (`reserve`), so it keeps
  pace with producers. Whether copies can free the room at all is planned over every
  record that pins the tail, held and parked alike, in the order compaction copies them
  (curb.log.cursor's `pinning`): a plan over only some of them counted on room that the
  first uncopyable record would keep, and accepted SENDs compaction could not place.
- The headroom is counted from an upper bound of the largest live or waiting record
  (size classes, curb.log.sizes), never from an exact index of the records; a record
  acked counts until its ACK is durable (curb.log.dying: a crash may bring it back).
  When nothing is live and no ACK can be undone the bound is exact again, whatever
  damage made it err.
- Compaction starts before it must (`early`) only once a held message has pinned the
  tail for PINNED_FOR seconds of the log's clock (`pinned`): messages held briefly are
  acked before they would be copied.
"""

from __future__ import annotations

from collections.abc import Callable

from curb.log.cursor import Cursor
from curb.log.dying import Dying
from curb.log.record import PAD_SIZE, record_size
from curb.log.ring import Ring
from curb.log.sizes import SizeClasses, class_bound, size_class

PINNED_FOR = 0.1


class QueueFull(Exception):
    """No room now: the message was not stored."""


class TooLarge(Exception):
    """The message can never fit under the cap: it was not stored."""


class Admission:
    """The byte counts admission decides by: messages accepted and not yet placed
    (`pending_bytes`, `pending_largest`) and the size classes of the records placed."""

    def __init__(
        self,
        capacity: int,
        max_message: int,
        ring: Ring,
        cursor: Cursor,
        classes: SizeClasses,
        dying: Dying,
        clock: Callable[[], float],
    ):
        self.capacity = capacity
        self.max_message = max_message
        self.max_record = record_size(max_message)
        self.ring = ring
        self.cursor = cursor
        self.classes = classes
        self.dying = dying
        self.clock = clock
        self.pending_bytes = 0
        self.pending_largest = 0
        self._pin = (-1, 0.0)
        self._roomy = 3 * (self.max_record + PAD_SIZE) + 64

    @property
    def live_bytes(self) -> int:
        """Bytes of every message not yet acked, as records: delayed messages and dead
        letters too (curb.log.parked)."""
        cur = self.cursor
        return cur.unread_bytes + self.pending_bytes + cur.outstanding_bytes + cur.parked.bytes

    @property
    def ahead_dead_bytes(self) -> int:
        """Bytes ahead of the read position that hold no live message (acked records,
        dead copies, the end of a lap): not reclaimable until consumers move the cursor
        past them, so admission counts them as used."""
        cur = self.cursor
        ahead_live = cur.outstanding_bytes - cur.behind_bytes + cur.parked.unpassed_bytes
        return max(0, self.ring.distance(cur.rpos, cur.whead) - cur.unread_bytes - ahead_live)

    def admit(self, payload_size: int) -> int:
        """The record size of a payload the log may take now; raises TooLarge or
        QueueFull when it may not."""
        size = record_size(payload_size)
        if payload_size > self.max_message:
            raise TooLarge(
                f"message of {payload_size} bytes is larger than this broker can ever store "
                f"(the limit is {self.max_message} bytes with this -cap and -max-frame)"
            )
        cur, ring = self.cursor, self.ring
        live = self.live_bytes
        if live <= 0 and self.classes.top and not self.dying.pending():
            # Nothing is live (and nothing is being placed: appends come between flushes),
            # nor can a crash bring an acked record back (curb.log.dying), so the size
            # classes are exact again, whatever damage made them err.
            self.classes.clear()
        roomy = self._roomy + cur.behind_bytes // 4
        if live + size + roomy + ring.distance(cur.rpos, cur.whead) > self.capacity or ring.free() < roomy:
            # Not plainly roomy (the common case, which needs no exact headroom): decide
            # by the exact rule.
            room = self.capacity - self.headroom(size) - self.ahead_dead_bytes
            if live + size > room:
                raise QueueFull(
                    f"queue full now: {live} bytes are queued and a message of "
                    f"{payload_size} bytes needs {max(0, live + size - room)} more "
                    f"free; retry once consumers have caught up"
                )
        return size

    def accepted(self, size: int) -> None:
        """A record of `size` waits to be placed."""
        self.pending_bytes += size
        if size > self.pending_largest:
            self.pending_largest = size

    def headroom(self, size: int) -> int:
        """Free bytes a record of `size` needs beside the live bytes, with L the largest
        live or waiting record: 2(L + pad) kept free for compaction's copies (one copy
        ending a lap may waste up to a record), and L + pad for the unusable end of the
        lap the region spans or the new record may leave; and a quarter of the held
        messages compaction must copy to pass them, so that it gets there in a few
        batches, not one record's worth of room at a time. All of the ring while free
        bytes are short of the reserve and copying the held messages could not free
        enough (a crash left the free bytes in pieces too small for their copies)."""
        reserve = self.reserve()
        ring = self.ring
        free = ring.free()
        if free < reserve:
            cur = self.cursor
            reachable = free + ring.distance(ring.tail, cur.tail())
            want = self.pending_bytes + size + reserve
            pinning = ((offset, size) for offset, size, _, _ in cur.pinning())
            if reachable < want and not ring.clears(pinning, cur.rpos, want):
                # Too fragmented for compaction to copy the held and parked messages
                # that pin the tail (a crash interrupted it): nothing that needs copies,
                # until ACKs free the tail.
                return self.capacity
        # Sizes as the reserve will count them once placed: by their class's bound.
        waiting = class_bound(size_class(max(size, self.pending_largest)))
        largest = max(min(self.max_record, waiting), reserve // 2 - PAD_SIZE)
        return 3 * (largest + PAD_SIZE) + 64 + self.cursor.behind_bytes // 4

    def reserve(self) -> int:
        """Free bytes placements of new messages leave for compaction's copies of the
        records in the ring (messages still waiting to be placed are not in it yet): room
        for two of the largest, bounded within a quarter by their size classes."""
        return 2 * (min(self.max_record, self.classes.largest) + PAD_SIZE)

    def early(self, reserve: int) -> int:
        """Free bytes below which compaction may start before it must."""
        return max(2 * reserve, self.capacity // 4)

    def pinned(self) -> bool:
        """Whether the logical tail has stayed where it is for PINNED_FOR seconds."""
        tail, now = self.cursor.tail(), self.clock()
        if tail != self._pin[0]:
            self._pin = (tail, now)
            return False
        return now - self._pin[1] >= PINNED_FOR
