"""The one SEND rule, for every front (STOMP over TCP, TLS and WebSocket, HTTP), compiled
(mypyc) since it runs for every message; curb.broker hands its `accept` on as its own.

A message is taken with the headers it keeps for its MESSAGE (the one-hop ones,
curb.payload.NOT_STORED, dropped), its due and expiry times read from them
(curb.timing), within the limits a MESSAGE must meet (curb.message_limits); or Refused
(curb.refused) with nothing stored. Its `done(None)` runs once it is fsynced, which is
what a RECEIPT or an HTTP 201 waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from curb import message_limits, payload, send_rule
from curb.counts import CountWatch
from curb.log.admission import QueueFull, TooLarge
from curb.metrics import Metrics
from curb.peer import Peer
from curb.refused import BAD_HEADERS, FULL, RETRY_FULL_SECONDS, TOO_LARGE, Refused
from curb.returns import Returns

Done = Callable[[str | None], None]


class Appended(Protocol):
    """What taking a message needs of the log."""

    def append(
        self, payload: bytes, done: Done | None = None, urgent: bool = True, *, due_ms: int = 0, expires_ms: int = 0
    ) -> object: ...


class Intake:
    """`accept`, with what it checks against and tells."""

    def __init__(
        self,
        log: Appended,
        max_frame: int,
        wall_ms: Callable[[], int],
        metrics: Metrics,
        returns: Returns,
        count_watch: CountWatch,
    ):
        self.log = log
        self.max_frame = max_frame
        self.wall_ms = wall_ms
        self.metrics = metrics
        self.returns = returns
        self.count_watch = count_watch

    def accept(
        self,
        headers: Mapping[str, str],
        body: bytes,
        done: Done | None = None,
        urgent: bool = True,
        session: Peer | None = None,
    ) -> None:
        """Take a message of these headers and body, or raise Refused with nothing
        stored. `done(None)` once it is fsynced; `done(reason)` if it could not be stored
        after all. urgent=False: nobody waits for `done`, so the write may wait for
        company. (`session`, the connection that sent it, is the router's concern.)"""
        lines = payload.header_lines(headers)
        data = lines + b"\n" + body
        due_ms = expires_ms = 0
        max_frame = self.max_frame
        if lines or len(data) - 1 + message_limits.RESERVE > max_frame:  # else nothing to check
            try:
                due_ms, expires_ms = send_rule.check(headers, lines, len(data), max_frame, self.wall_ms)
            except send_rule.BadSend as err:
                raise Refused(str(err), err.advice, TOO_LARGE if err.too_large else BAD_HEADERS) from None
        try:
            self.log.append(data, done, urgent=urgent, due_ms=due_ms, expires_ms=expires_ms)
        except TooLarge as err:
            self.metrics.refused_too_large += 1
            raise Refused(
                "message too large",
                f"{err}: send a smaller message, or ask the operator for a larger -cap",
                TOO_LARGE,
            ) from None
        except QueueFull as err:
            self.metrics.refused_full += 1
            raise Refused("queue full", str(err), FULL, RETRY_FULL_SECONDS) from None
        self.metrics.sent += 1
        if due_ms:
            self.returns.arm_due()
        if self.count_watch.watchers:
            self.count_watch.changed()
