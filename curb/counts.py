"""The `./count` MESSAGE, encoded once per change of the counts and shared by every subscriber.

With a thousand dashboards subscribed, encoding the JSON and the frame per subscriber cost
more than the queue's own work. Only the first line and the `subscription` header differ
between subscribers, so `CountMessages.tail` encodes the rest once per change of the
counts and each session lays it out behind its own prefix (curb.render).

Invariant: a message-id `count-N` names one version of the counts broker-wide, N rising.

`CountWatch` coalesces the updates: one MESSAGE per change, at most every
COUNT_COALESCE_SECONDS, and less often the more watchers there are
(COUNT_FRAMES_PER_SECOND in all).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from typing import Protocol

from curb import payload

COUNT_DESTINATION = "./count"
COUNT_COALESCE_SECONDS = 0.05
# ./count MESSAGEs a second, all subscribers together, at most: each costs a send() call,
# and with a thousand subscribers at every 50 ms those calls took half the loop's time.
COUNT_FRAMES_PER_SECOND = 1000
Schedule = Callable[[float, Callable[[], None]], object]


class Watcher(Hashable, Protocol):
    def send_counts(self, counts: dict[str, int]) -> None: ...


class CountMessages:
    """The latest counts' message-id line and payload, cached until the counts change."""

    def __init__(self) -> None:
        self._counts: dict[str, int] | None = None
        self._tail = (b"", b"")
        self._version = 0

    def tail(self, counts: dict[str, int], extra: Mapping[str, object] | None = None) -> tuple[bytes, bytes]:
        """(message-id line, payload): the MESSAGE after its subscription's prefix, as
        curb.render.write_message takes it; `extra`: more for its JSON body only (a
        router's endpoints), fixed while `counts` are."""
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
                json.dumps({**counts, **(extra or {})}).encode(),
            )
            self._counts, self._tail = dict(counts), (b"message-id:count-%d\n" % self._version, stored)
        return self._tail


class CountWatch:
    """The watchers of `./count` in the order they came, and the coalesced updates they
    get of `counts()`."""

    def __init__(self, counts: Callable[[], dict[str, int]], schedule: Schedule):
        self.counts = counts
        self.schedule = schedule
        self.watchers: dict[Watcher, None] = {}
        self.messages = CountMessages()
        self._scheduled = False

    def watch(self, watcher: Watcher, watching: bool) -> None:
        if watching:
            self.watchers[watcher] = None
        else:
            self.watchers.pop(watcher, None)

    def changed(self) -> None:
        """The counts may have changed: an update is due, if anyone watches."""
        if self.watchers and not self._scheduled:
            self._scheduled = True
            delay = max(COUNT_COALESCE_SECONDS, len(self.watchers) / COUNT_FRAMES_PER_SECOND)
            self.schedule(delay, self._send)

    def _send(self) -> None:
        self._scheduled = False
        counts = self.counts()
        for watcher in list(self.watchers):
            watcher.send_counts(counts)
