"""Who waits for the log to make something durable, and when each is answered.

Every answer the log gives a caller that waits (a SEND's RECEIPT, an ACK's, NACK's or
DISCONNECT's through `on_durable`, an ACK up to an id) is a callback in one of these
queues, each in the order its answers go. Invariants, each kept here:
- A RECEIPT (a `done(None)`) is answered only after a sync that began after the write it
  covers: `synced` holds (flush, done), answered by a sync covering that flush
  (`synced_upto`), and a callback waiting for no write yet (`untagged`) is tagged with
  the flush after it (`tag`).
- `on_durable` covers every append accepted before it, written or still pending: while
  appends wait for room, its callback waits (`after_appends`, by the id of the last one
  accepted) until none of them is pending (`appends_written`; those an ACK up to an id
  took unwritten wait for the watermark instead, `taken_upto`), and fails with the
  reason if they are refused, after their own callbacks ran (`refuse_after_appends`).
  So a RECEIPT for a NACK, ACK or DISCONNECT never leaves before a receipt-less SEND
  that came before it is stored.
- An ACK retired by the checkpoint's tail (curb.log.checkpoints, rule 6) is durable only
  once a synced checkpoint counts it: `on_durable` made while some are not covered waits,
  after its sync, for the first durable checkpoint that counts them all (`retired`).
- An ACK up to an id is answered by the first durable checkpoint whose watermark reaches
  it (`watermark`, in watermark order); so is, after its sync, an `on_durable` made while
  the watermark is above the durable one (an ACK up to an id without a receipt of its
  own is covered by the next RECEIPT its connection gets, as any frame is).
- A failure of the log answers every waiter with its reason (`fail`), none with None.
  Its writes were issued, so what they covered may be on disk after all: the reason is a
  `MaybeStored`, and a SEND refused so may yet be delivered (its producer is told so).
  An append refused before it was written (`LogCore.cancel_pending`) gets a plain reason:
  it is never stored.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from curb.log.checkpoints import Checkpoints, Snapshot
from curb.log.reasons import MaybeStored

Done = Callable[[str | None], None]


class Waiters:
    """The callbacks waiting for durability, by what answers them."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        self.checkpoints = checkpoints
        self.synced: collections.deque[tuple[int, Done]] = collections.deque()  # (flush, done)
        self.untagged: list[Done] = []  # answered by the sync of the next flush
        self.after_appends: collections.deque[tuple[int, Done]] = collections.deque()  # (last id accepted, done)
        self.watermark: collections.deque[tuple[int, Done]] = collections.deque()  # (watermark, done)
        self.retired: collections.deque[tuple[int, Done]] = collections.deque()  # (retired ACKs, done)

    def on_durable(self, done: Done, last_pending: int | None, retired: int, acked_upto: int) -> None:
        """A caller waits for everything asked so far: appends up to `last_pending` (the
        last one still waiting to be written, if any), `retired` retired ACKs and the
        ack-up-to watermark `acked_upto`."""
        if retired > self.checkpoints.durable.retired:
            done = self._then_checkpoint("retired", retired, self.retired, done)
        if acked_upto > self.checkpoints.durable.acked_upto:
            done = self._then_checkpoint("acked_upto", acked_upto, self.watermark, done)
        if last_pending is not None:
            self.after_appends.append((last_pending, done))
        else:
            self.untagged.append(done)

    def _then_checkpoint(self, field: str, value: int, line: collections.deque[tuple[int, Done]], done: Done) -> Done:
        """`done` for on_durable while the durable checkpoint's `field` (the retired ACKs
        it counts, or its watermark) is below `value`: after its sync, it waits in `line`
        for the first durable checkpoint that reaches `value`."""

        def synced(err: str | None) -> None:
            if err is None and getattr(self.checkpoints.durable, field) < value:
                line.append((value, done))
            else:
                done(err)

        return synced

    def taken_upto(self, upto: int) -> None:
        """An ACK up to `upto` took the appends up to it unwritten: callers waiting for
        them wait for the watermark instead."""
        after = self.after_appends
        while after and after[0][0] <= upto:
            self.watermark.append((upto, after.popleft()[1]))

    def appends_written(self, waits_for: Callable[[int], bool]) -> None:
        """A flush wrote appends: callers whose appends are all written now wait for the
        flush (`waits_for(id)`: whether an append up to that id is still pending)."""
        after = self.after_appends
        while after and not waits_for(after[0][0]):
            self.untagged.append(after.popleft()[1])

    def tag(self, flush_no: int) -> bool:
        """Callers waiting for no write wait for the sync of flush `flush_no`. Returns
        whether there were any."""
        if not self.untagged:
            return False
        self.synced.extend((flush_no, done) for done in self.untagged)
        self.untagged.clear()
        return True

    def synced_upto(self, target: int) -> bool:
        """A sync covered every flush up to `target`: answer their callers. Returns
        whether any was answered."""
        synced = self.synced
        answered = False
        while synced and synced[0][0] <= target:
            synced.popleft()[1](None)
            answered = True
        return answered

    def checkpoint_synced(self, durable: Snapshot) -> bool:
        """A checkpoint is durable: answer the ACKs up to its watermark and the callers
        waiting for the ACKs its tail retired. Returns whether any was answered."""
        answered = False
        while self.watermark and self.watermark[0][0] <= durable.acked_upto:
            self.watermark.popleft()[1](None)
            answered = True
        while self.retired and self.retired[0][0] <= durable.retired:
            self.retired.popleft()[1](None)
            answered = True
        return answered

    def refuse_after_appends(self, reason: str) -> None:
        """The appends still pending were refused: so are the callers waiting for them."""
        while self.after_appends:
            self.after_appends.popleft()[1](reason)

    def fail(self, reason: str) -> None:
        """The log failed for good: every caller still waiting hears why (`MaybeStored`)."""
        reason = MaybeStored(reason)
        while self.synced:
            self.synced.popleft()[1](reason)
        for done in self.untagged:
            done(reason)
        self.untagged.clear()
        for waiters in (self.watermark, self.retired):
            while waiters:
                waiters.popleft()[1](reason)
