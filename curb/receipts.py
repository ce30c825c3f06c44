"""The line of answers a connection owes, in frame order: the receipt line.

Each frame that asked for a RECEIPT takes a place in the line when it is handled; its
place is filled once its effect is durable (SEND, ACK, NACK, DISCONNECT) or at once
(the rest), and whatever is at the front of the line and filled is written. So RECEIPTs
leave in frame order, whenever the log answers.

What ends a connection (an ERROR, a DISCONNECT's RECEIPT, a shutdown's close) takes the
line's last place (`end`), or, when a frame's effect failed to become durable, that
frame's place; it is written only after every earlier place, and nothing is written
after it. So an ERROR never overtakes the RECEIPTs owed for the frames before it. Every
place is filled, with a RECEIPT or with an ERROR when the log reports a failure, so the
line never blocks for good; only a lost peer or a heart-beat timeout (an abort) drops it
(`clear`).

Pure: the line writes through the function it is given, asks the broker's `when_durable`
when a RECEIPT waits for the log, and puts the session's `error` in the place of a frame
the log lost.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from curb.frame import FRAME_END, escape
from curb.outcomes import Refusal, Unconfirmed

Done = Callable[[str | None], None]


@dataclass(slots=True, eq=False)
class Owed:
    """A place in the line: its bytes once known (a RECEIPT, an ERROR, or b"" for a plain
    close), and what to do once they are sent. Places compare by identity, so that a
    refused frame takes its own place out of the line (`remove`), not an equal one."""

    data: bytes | None = None
    then: Callable[[], None] | None = None


class ReceiptLine:
    """One connection's owed places, written in order through `write`."""

    __slots__ = ("_error", "_owed", "_when_durable", "_write", "last")

    def __init__(
        self,
        write: Callable[[bytes], None],
        when_durable: Callable[[Done], None],
        error: Callable[..., None],
    ):
        self._owed: collections.deque[Owed] = collections.deque()
        self._write = write
        self._when_durable = when_durable  # done(None) once what was asked of the log is on disk
        self._error = error  # the session's ERROR, for a place whose frame the log lost
        self.last: Owed | None = None  # the place that ends the line, once there is one

    def at_once(self, receipt_id: str | None) -> None:
        """A RECEIPT, if one was asked for, as soon as the places before it are written."""
        if receipt_id is not None:
            self.settle(self.owe(), receipt(receipt_id))

    def after_sync(self, receipt_id: str | None, command: str, late: bool = False, extra: bytes = b"") -> None:
        """A RECEIPT, if one was asked for, once everything the connection sent before is
        durable (`curb-late:true` for a `late` one; `extra`, header lines of its own)."""
        if receipt_id is not None:
            self._when_durable(self.answer(self.owe(), receipt_id, command, late=late, extra=extra))

    def after_sync_at(self, entry: Owed, receipt_id: str, command: str, extra: bytes = b"") -> None:
        """A RECEIPT in a place taken earlier (`owe`), once everything asked of the log
        by now is durable: for a frame whose work ran over several loop passes."""
        self._when_durable(self.answer(entry, receipt_id, command, extra=extra))

    def answer(
        self,
        entry: Owed,
        receipt_id: str,
        command: str,
        then: Callable[[], None] | None = None,
        late: bool = False,
        extra: bytes = b"",
    ) -> Done:
        """The log's answer for a place whose RECEIPT waits for durability: the RECEIPT, or
        an ERROR in its place when the log could not make the frames before durable."""

        def done(err: str | None) -> None:
            if err is None and not late:
                self.settle(entry, receipt(receipt_id, extra), then)
            elif err is None or isinstance(err, Unconfirmed):
                self.settle(
                    entry, late_receipt(receipt_id) if err is None else unconfirmed_receipt(receipt_id, late), then
                )
            elif isinstance(err, Refusal):
                self._error(err.message, str(err), receipt=receipt_id, entry=entry)
            else:
                self._error(
                    f"{command} not stored",
                    f"{err}. The broker could not make this {command} durable and stops serving: "
                    "reconnect once it is back (its log says why), and expect messages this connection "
                    "had acknowledged to come again.",
                    receipt=receipt_id,
                    entry=entry,
                )

        return done

    def when_durable(self, done: Done) -> None:
        """done(None) once everything the connection sent so far is durable."""
        self._when_durable(done)

    def owe(self) -> Owed:
        """A new place at the end of the line, filled in later by `settle`."""
        entry = Owed()
        self._owed.append(entry)
        return entry

    def end(self) -> Owed:
        """The line's last place, for what ends the connection."""
        entry = self.last = self.owe()
        return entry

    def remove(self, entry: Owed) -> None:
        """A refused frame's place: it owes nothing after all."""
        self._owed.remove(entry)

    def settle(self, entry: Owed, data: bytes, then: Callable[[], None] | None = None) -> None:
        """Fill in a place and write everything now at the front of the line."""
        entry.data, entry.then = data, then
        owed = self._owed
        while owed and (ready := owed[0].data) is not None:
            after = owed.popleft().then
            if ready:
                self._write(ready)
            if after is not None:
                after()

    def clear(self) -> None:
        """The connection is closing or gone: nothing more is written."""
        self._owed.clear()


def receipt(receipt_id: str, extra: bytes = b"") -> bytes:
    """A RECEIPT; `extra`: header lines of its own, each ending in a newline."""
    if extra:
        return b"RECEIPT\nreceipt-id:%s\n%s\n%s" % (escape(receipt_id).encode(), extra, FRAME_END)
    return b"RECEIPT\nreceipt-id:%s\n\n%s" % (escape(receipt_id).encode(), FRAME_END)


def late_receipt(receipt_id: str) -> bytes:
    """The RECEIPT of an ACK, NACK or touch that came after its message's ack deadline."""
    return receipt(receipt_id, b"curb-late:true\n")


def unconfirmed_receipt(receipt_id: str, late: bool) -> bytes:
    """The RECEIPT of a frame after which what the connection sent cannot be confirmed
    (`Unconfirmed`); `late` as well when the frame itself was late, and changed nothing."""
    return receipt(receipt_id, (b"curb-late:true\n" if late else b"") + b"curb-unconfirmed:true\n")
