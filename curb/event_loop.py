"""The event loop Curb serves on: asyncio's, on a selector that hands out the sockets
whose peer has closed last, at most CLOSING_PER_PASS a loop pass.

asyncio handles in one loop pass every socket the selector reports. When 2,000 clients
close at once, that is 2,000 ends of stream read, transports closed and sessions ended,
over 100 ms in a pass or two, and a client still connected waits behind all of them
for its answers. Nobody waits on a closed connection's teardown, so `ClosingLast` asks
epoll to flag the sockets whose peer closed (EPOLLRDHUP) and reports, in each call,
every other ready socket and at most CLOSING_PER_PASS of the flagged ones: the storm
is spread over the passes after, and live clients are read in each of them.

Invariant: no readiness is lost and none starves. epoll is level-triggered as asyncio
uses it: a flagged socket left out is still ready, and reported again by the next call;
and the window of flagged sockets reported moves on from call to call, so each gets its
turn. Where epoll (or EPOLLRDHUP) is missing, the platform's default selector is used.
"""

from __future__ import annotations

import asyncio
import math
import select
import selectors
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CLOSING_PER_PASS = 64

_RDHUP: int = getattr(select, "EPOLLRDHUP", 0)
_READABLE = getattr(select, "EPOLLIN", 0) | _RDHUP | getattr(select, "EPOLLHUP", 0) | getattr(select, "EPOLLERR", 0)
_WRITABLE = getattr(select, "EPOLLOUT", 0) | getattr(select, "EPOLLHUP", 0) | getattr(select, "EPOLLERR", 0)

Ready = list[tuple[selectors.SelectorKey, int]]


if sys.platform == "linux":  # epoll, and so EPOLLRDHUP

    class ClosingLast(selectors.EpollSelector):
        """epoll, with the sockets whose peer closed reported last and `most` at a time."""

        def __init__(self, most: int = CLOSING_PER_PASS):
            super().__init__()
            self._most = most
            self._turn = 0  # where the next window starts among more closing sockets than `most`
            # The base class's own table of keys by fd, as its select reads it: looked up for
            # every ready socket, so without the public mapping's layers.
            self._keys: dict[int, selectors.SelectorKey] = self._fd_to_key  # type: ignore[attr-defined]

        def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
            key = super().register(fileobj, events, data)
            self._flag(key)
            return key

        def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
            key = super().modify(fileobj, events, data)
            self._flag(key)
            return key

        def _flag(self, key: selectors.SelectorKey) -> None:
            """Ask epoll to flag a reader's socket once its peer has closed."""
            if key.events & selectors.EVENT_READ:
                mask = select.EPOLLIN | _RDHUP | (select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0)
                self._epoll.modify(key.fd, mask)

        @property
        def _epoll(self) -> select.epoll:
            return self._selector  # type: ignore[attr-defined,no-any-return]

        def select(self, timeout: float | None = None) -> Ready:
            if timeout is None:
                wait = -1.0
            elif timeout <= 0:
                wait = 0.0
            else:
                wait = math.ceil(timeout * 1e3) * 1e-3  # epoll counts whole milliseconds
            keys = self._keys
            try:
                events = self._epoll.poll(wait, max(len(keys), 1))
            except InterruptedError:
                return []
            ready: Ready = []
            closing: Ready = []
            for fd, event in events:
                key = keys.get(fd)
                if key is None:
                    continue
                mask = (selectors.EVENT_READ if event & _READABLE else 0) | (
                    selectors.EVENT_WRITE if event & _WRITABLE else 0
                )
                (closing if event & _RDHUP else ready).append((key, mask & key.events))
            if closing:
                ready += self._window(closing)
            return ready

        def _window(self, closing: Ready) -> Ready:
            count, most = len(closing), self._most
            if count <= most:
                return closing
            start = self._turn % count
            self._turn = start + most
            window = closing[start : start + most]
            return window + closing[: most - len(window)]


def new_loop() -> asyncio.AbstractEventLoop:
    if sys.platform == "linux":
        return asyncio.SelectorEventLoop(ClosingLast())
    return asyncio.SelectorEventLoop(selectors.DefaultSelector())


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on a loop with the selector above."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)
