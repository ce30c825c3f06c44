"""A SEND the broker would not take, or took but could not make durable: the exceptions
every front maps to its own words (an ERROR frame, an HTTP status), and the reasons they
carry.

A module of its own, pure Python: the compiled intake (curb.intake) raises them, and the
fronts and the router catch them.
"""

from __future__ import annotations

from curb.log.reasons import MaybeStored


class Refused(Exception):
    """A message the broker would not take (`accept`); nothing was stored. `message` is
    for an ERROR frame's header, str() the detail (what happened and what to do), `reason`
    one of TOO_LARGE, BAD_HEADERS, FULL (an HTTP front's 413, 400, 503), and
    `retry_after` the seconds after which trying again may work (FULL only)."""

    def __init__(self, message: str, detail: str, reason: str = "", retry_after: float | None = None):
        super().__init__(detail)
        self.message = message
        self.reason = reason
        self.retry_after = retry_after


class NotStored(Exception):
    """A message `accept` took could not be made durable after all: it will not be
    delivered, or (`maybe`: the log failed after writing it) it may be on disk and then
    delivered. str() says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.maybe = isinstance(reason, MaybeStored)


TOO_LARGE, BAD_HEADERS, FULL = "too_large", "bad_headers", "full"
# When a front may suggest trying a SEND the full queue refused again (HTTP's Retry-After).
RETRY_FULL_SECONDS = 1.0
