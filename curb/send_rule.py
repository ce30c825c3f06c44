"""The one SEND rule's checks, for every place a SEND is taken: the broker's
(`Broker.accept`, every front) and the router's, which checks a SEND before it forwards
it or holds it in a transaction, so that a SEND an instance would refuse is refused at
once, and a COMMIT never forwards part of a transaction an instance then refuses part of.

A SEND must leave a MESSAGE that fits every reader's frame limits (curb.message_limits)
and give due and expiry times Curb can keep (curb.timing). Only a SEND with kept header
lines, or one whose stored payload comes within `message_limits.RESERVE` of the frame
limit, has anything to check: callers test that inline, so the common SEND costs a
comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from curb import message_limits
from curb.queue_errors import QueueError
from curb.timing import TIME_HEADERS, send_times


class BadSend(QueueError):
    """A SEND refused with nothing stored: str() for the ERROR's message header, `advice`
    its body; `too_large` tells a front's "too large" (HTTP 413) from bad headers (400)."""

    def __init__(self, message: str, advice: str, too_large: bool):
        super().__init__(message, advice)
        self.too_large = too_large


def check(
    headers: Mapping[str, str], lines: bytes, size: int, max_frame: int, wall_ms: Callable[[], int]
) -> tuple[int, int]:
    """(due_ms, expires_ms) of a SEND whose kept header lines are `lines` and whose stored
    payload is `size` bytes, 0 for none; BadSend if an instance would refuse it."""
    problem = message_limits.send_problem(lines, size, max_frame)
    if problem is not None:
        message, detail = problem
        raise BadSend(message, detail, message == "message too large")
    if headers.keys().isdisjoint(TIME_HEADERS):
        return 0, 0
    try:
        return send_times(headers, wall_ms())
    except QueueError as err:
        raise BadSend(str(err), err.advice, False) from None
