"""The `./count` MESSAGE, encoded once per change of the counts and shared by every subscriber.

With a thousand dashboards subscribed, encoding the JSON and the frame per subscriber cost
more than the queue's own work. Only the first line and the `subscription` header differ
between subscribers, so `CountMessages.tail` encodes the rest once per change of the
counts and each session puts its own two lines in front.

Invariant: a message-id `count-N` names one version of the counts broker-wide, N rising.
"""

from __future__ import annotations

import json

from curb.frame import encode

COUNT_DESTINATION = "./count"
_FIRST_LINE = b"MESSAGE\n"


class CountMessages:
    """The latest counts' MESSAGE minus its first line, cached until the counts change."""

    def __init__(self) -> None:
        self._counts: dict[str, int] | None = None
        self._tail = b""
        self._version = 0

    def tail(self, counts: dict[str, int]) -> bytes:
        if counts != self._counts:
            self._version += 1
            frame = encode(
                "MESSAGE",
                {
                    "message-id": f"count-{self._version}",
                    "destination": COUNT_DESTINATION,
                    "content-type": "application/json",
                    "rdy": str(counts["rdy"]),
                    "wip": str(counts["wip"]),
                },
                json.dumps(counts).encode(),
            )
            self._counts, self._tail = dict(counts), frame[len(_FIRST_LINE) :]
        return self._tail


def count_prefix(subscription: bytes) -> bytes:
    """The part of a ./count MESSAGE that is one subscriber's own, `subscription` escaped."""
    return _FIRST_LINE + b"subscription:" + subscription + b"\n"
