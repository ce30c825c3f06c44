"""The `./count` MESSAGE, encoded once per change of the counts and shared by every subscriber.

With a thousand dashboards subscribed, encoding the JSON and the frame per subscriber cost
more than the queue's own work. Only the first line and the `subscription` header differ
between subscribers, so `CountMessages.tail` encodes the rest once per change of the
counts and each session lays it out behind its own prefix (curb.render).

Invariant: a message-id `count-N` names one version of the counts broker-wide, N rising.
"""

from __future__ import annotations

import json

from curb import payload

COUNT_DESTINATION = "./count"


class CountMessages:
    """The latest counts' message-id line and payload, cached until the counts change."""

    def __init__(self) -> None:
        self._counts: dict[str, int] | None = None
        self._tail = (b"", b"")
        self._version = 0

    def tail(self, counts: dict[str, int]) -> tuple[bytes, bytes]:
        """(message-id line, payload): the MESSAGE after its subscription's prefix, as
        curb.render.write_message takes it."""
        if counts != self._counts:
            self._version += 1
            stored = payload.encode(
                {
                    "content-type": "application/json",
                    "rdy": str(counts["rdy"]),
                    "wip": str(counts["wip"]),
                    "delayed": str(counts["delayed"]),
                    "dead": str(counts["dead"]),
                },
                json.dumps(counts).encode(),
            )
            self._counts, self._tail = dict(counts), (b"message-id:count-%d\n" % self._version, stored)
        return self._tail
