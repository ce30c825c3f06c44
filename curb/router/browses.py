"""Browses through the router, sans I/O: a browse of a routed destination (SUBSCRIBE with
browser:true, of the queue or of `./NAME/dead`) read from its instances.

Rules:
- A browse reads each instance of its destination in route order, over a connection of
  its own (a BROWSES link), opened for it and closed at its end: so a slow browser holds
  up no SEND and no consumer. It holds at most HOLD_BYTES the session has not taken; past
  that its link reads nothing (`Link.hold`) until the session took them.
- A browse changes nothing: an instance's browse only reads.
- Ids are the router's (curb.router.deliveries: the instance's id << INDEX_BITS | its
  index). A range [F, T] asks instance k for its ids i with F <= i << INDEX_BITS | k <= T,
  and its messages come back with the router's ids.
- The end marker's `curb-last-id` is T when the SUBSCRIBE gave one, else the highest id,
  in the router's ids, that an instance's end marker named.
- A browse link lost before its instance's end marker asks that instance again, from the
  id after the last one it sent.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from curb.frame import Frame, decimal
from curb.log.browse import Step
from curb.payload import encode
from curb.peer import Peer
from curb.router.links import BROWSES, Link, Links
from curb.router.placement import INDEX_BITS
from curb.router.routes import Address

HOLD_BYTES = 4 * 1024 * 1024  # what one browse holds, read and not yet taken, at most
BROWSE_END = "browse-end"
_OWN = frozenset(("subscription", "destination", "message-id", "content-length", "curb-due"))


class RoutedBrowse:
    """One session's browse of a routed destination, instance by instance."""

    def __init__(
        self,
        session: Peer,
        dest: str,
        source: str,
        first: int,
        last: int | None,
        instances: list[tuple[Address, int]],
    ):
        self.session, self.dest, self.source = session, dest, source
        self.first, self.last = first, last
        self.instances = instances  # (address, index), in route order
        self.to_id = last if last is not None else 0
        self.link: Link | None = None
        self.next_id = 0  # the id, the instance's own, the current instance is read from
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()
        self.pending_bytes = 0
        self.due: dict[int, int] = {}
        self.finished = False

    def range_of(self, index: int) -> tuple[int, int | None] | None:
        """Instance `index`'s own ids of this browse: (from, to or None), or None if none."""
        first = max(0, (self.first - index + (1 << INDEX_BITS) - 1) >> INDEX_BITS)
        if self.last is None:
            return first, None
        if self.last < index:
            return None
        last = (self.last - index) >> INDEX_BITS
        return (first, last) if first <= last else None

    def step(self, budget: int) -> Step:
        messages: list[tuple[int, bytes]] = []
        size = 0
        while self.pending and size < budget:
            msg_id, data = self.pending.popleft()
            messages.append((msg_id, data))
            size += len(data)
        self.pending_bytes -= size
        due = {msg_id: self.due.pop(msg_id) for msg_id, _ in messages if msg_id in self.due}
        link = self.link
        if link is not None and link.hold and self.pending_bytes < HOLD_BYTES // 2:
            link.hold = False  # the glue reads it again at its next flush
        done = self.finished and not self.pending
        return Step(messages, done, not done and not self.pending, due)


class Browses:
    """The browses running through the router, by their links."""

    def __init__(self, links: Links, opened: Callable[[Link], None], changed: Callable[[], None]):
        self.links = links
        self.opened = opened  # a new BROWSES link, for the glue to connect
        self.changed = changed  # a browse has more for its session
        self.by_link: dict[Link, RoutedBrowse] = {}

    def start(self, browse: RoutedBrowse) -> RoutedBrowse:
        self._next_instance(browse, 0)
        return browse

    def _next_instance(self, browse: RoutedBrowse, position: int) -> None:
        """Read the first instance from `position` on that holds ids of the range."""
        for at in range(position, len(browse.instances)):
            address, index = browse.instances[at]
            span = browse.range_of(index)
            if span is not None:
                browse.next_id = span[0]
                link = Link(self.links.new_number(), browse.dest, address, BROWSES)
                link.position = at
                self.links.by_number[link.number] = link
                browse.link = link
                self.by_link[link] = browse
                self.opened(link)
                return
        browse.link, browse.finished = None, True
        self.changed()

    def link_up(self, link: Link) -> None:
        browse = self.by_link.get(link)
        if browse is None:
            return
        span = browse.range_of(browse.instances[link.position][1])
        assert span is not None  # the link was opened for an instance with ids in range
        headers = {"id": "b", "destination": browse.source, "browser": "true", "curb-from-id": str(browse.next_id)}
        if span[1] is not None:
            headers["curb-to-id"] = str(span[1])
        self.links.send(link, "SUBSCRIBE", headers)

    def message(self, link: Link, frame: Frame) -> None:
        browse = self.by_link.get(link)
        if browse is None:
            return
        try:
            self._take(browse, link, frame)
        except ValueError as err:
            self.links.drop(link, f"bad browse MESSAGE from the instance: {err}")

    def _take(self, browse: RoutedBrowse, link: Link, frame: Frame) -> None:
        headers = frame.headers
        index = browse.instances[link.position][1]
        if headers.get("message-id") == BROWSE_END:
            last = decimal(headers.get("curb-last-id", "0"), "curb-last-id", 1 << 62)
            if browse.last is None:
                browse.to_id = max(browse.to_id, last << INDEX_BITS | index)
            self._close(link)
            self._next_instance(browse, link.position + 1)
            return
        own = decimal(headers.get("message-id", "0"), "message-id", 1 << 62)
        browse.next_id = own + 1
        msg_id = own << INDEX_BITS | index
        if "curb-due" in headers:
            browse.due[msg_id] = decimal(headers["curb-due"], "curb-due", 1 << 62)
        data = encode({name: value for name, value in headers.items() if name not in _OWN}, frame.body)
        browse.pending.append((msg_id, data))
        browse.pending_bytes += len(data)
        if browse.pending_bytes >= HOLD_BYTES and not link.hold:
            link.hold = True
            self.links.dirty[link] = None
        self.changed()

    def end(self, browse: RoutedBrowse) -> None:
        """The session ended the browse (its end marker, an UNSUBSCRIBE, or it went)."""
        if browse.link is not None:
            self._close(browse.link)
            browse.link = None

    def _close(self, link: Link) -> None:
        self.by_link.pop(link, None)
        self.links.by_number.pop(link.number, None)
        self.links.drop(link, "its browse ended")
