"""What the session's rule units see of a connection: its states, its login, its
heart-beats, and the calls they make on it.

The session (curb.session) ties its units together (curb.commands, curb.access,
curb.deadlines, curb.render): it imports them, and they know it only through `Conn`, so
no unit imports the session and the session package has no import circle. Each unit's
state is an object of its own: the login's `Login` (written by curb.access, read by
curb.deadlines), the heart-beats' `Beats` (set by curb.access at CONNECT, moved by the
session's reads and writes, read by curb.deadlines).

The states: NEW until a CONNECT logged in, OPEN after it, CLOSING once what ends the
connection took the receipt line's last place (the session handles no frame from then on).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

from curb.frame import Frame
from curb.output import Piece
from curb.peer import Peer
from curb.receipts import Owed, ReceiptLine

if TYPE_CHECKING:
    from curb.backend import Backend, Browsing
    from curb.log.cursor import Record
    from curb.queue import Subscription
    from curb.transactions import Transactions

NEW, OPEN, CLOSING = "before CONNECT", "after CONNECT", "closing"  # a session's states


class Login:
    """A connection's login as curb.access keeps it."""

    __slots__ = ("held", "permissions", "refusing_at")

    def __init__(self) -> None:
        self.permissions: frozenset[str] | None = None  # None: everything is allowed
        self.refusing_at: float | None = None  # a failed login's "access refused" is due
        self.held: list[Frame] | None = None  # frames after a CONNECT whose check is under way


class Beats:
    """A connection's heart-beats: when bytes last came and went, and the agreed periods
    in seconds (0: none)."""

    __slots__ = ("expect_every", "last_recv", "last_send", "send_every")

    def __init__(self, now: float) -> None:
        self.last_recv = self.last_send = now
        self.send_every = self.expect_every = 0.0


class Subscriptions(Protocol):
    """A connection's subscriptions as the MESSAGEs they make (curb.render.Messages)."""

    prefixes: dict[Subscription[Peer, Record], bytes]
    browses: dict[str, tuple[Browsing, bytes]]
    ended: collections.deque[str]
    count_sub: str | None
    dead_sub: str | None

    def watch_counts(self, sub_id: str | None, prefix: bytes = b"", name: str = "") -> None: ...


class Conn(Peer, Protocol):
    """A connection as its rule units use it (curb.session.Session)."""

    broker: Backend
    state: str
    opened_at: float
    login: Login
    beats: Beats
    reading: bool
    stopped: bool
    gone: bool
    line: ReceiptLine
    transactions: Transactions | None  # the open ones, where the backend takes transactions
    deadlines: int  # changes whenever next_deadline may have come sooner

    @property
    def messages(self) -> Subscriptions: ...

    def handle(self, frame: Frame) -> None: ...
    def write(self, data: Piece, end: bool = True) -> None: ...
    def wake(self) -> None: ...
    def error(
        self,
        message: str,
        detail: str,
        frame: Frame | None = None,
        receipt: str | None = None,
        entry: Owed | None = None,
        version: str | None = None,
    ) -> None: ...
    def say_and_close(self, data: bytes) -> None: ...
    def end_with(self, data: bytes) -> None: ...
    def abort(self) -> None: ...
    def finish(self) -> Owed: ...
    def hang_up(self) -> None: ...
