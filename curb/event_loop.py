"""The event loop Curb serves on: asyncio's, on a selector that hands out the sockets
that look like they are closing last, at most CLOSING_PER_PASS a loop pass.

asyncio handles in one loop pass every socket the selector reports. When 2,000 clients
close at once, that is 2,000 ends of stream read, transports closed and sessions ended,
over 100 ms in a pass or two, and a client still connected waits behind all of them
for its answers. Nobody waits on a closed connection's teardown, so `ClosingLast`
reports, in each call, every socket in conversation and at most CLOSING_PER_PASS of
those that look like they are closing: the storm is spread over the passes after, and
live clients are read in each of them. Each teardown step asyncio runs after the read
(the transport's close, its connection_lost, the session's end) is one call a pass
later, so the bound holds for every pass of the teardown, not only the first.

A socket looks like it is closing when epoll flags its peer's close (EPOLLRDHUP), or
when it becomes readable after a silence of QUIET_SECONDS and of two calls that found
sockets ready. The second is for TLS: its clients send close_notify before their TCP
end, and until the broker has read and decrypted it (and then sent its own, closed and
torn down) it cannot be told from data. A client in conversation spoke within
QUIET_SECONDS, or in one of the last two such calls (when passes are slow, its next
request waits on the loop, and that is no silence of its own), and is never held behind
the crowd; a quiet one that wakes waits at most a few passes for its turn. A call that
finds nothing ready costs nothing more than epoll's.

Invariant: no readiness is lost and none starves. epoll is level-triggered as asyncio
uses it: a socket left out is still ready, and reported again by the next call; and
the window of closing sockets reported moves on from call to call, so each gets its
turn. Where epoll (or EPOLLRDHUP) is missing, the platform's default selector is used.
"""

from __future__ import annotations

import asyncio
import math
import select
import selectors
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CLOSING_PER_PASS = 32
# Silence after which a socket's next readiness counts with the closing ones. A client in
# conversation (round trips, a busy consumer's ACKs) speaks more often; the clients of a
# storm have been quiet since their login; one that speaks less often (a heart-beat)
# only waits its turn when a crowd wakes with it.
QUIET_SECONDS = 0.1

_RDHUP: int = getattr(select, "EPOLLRDHUP", 0)
_READABLE = getattr(select, "EPOLLIN", 0) | _RDHUP | getattr(select, "EPOLLHUP", 0) | getattr(select, "EPOLLERR", 0)
_WRITABLE = getattr(select, "EPOLLOUT", 0) | getattr(select, "EPOLLHUP", 0) | getattr(select, "EPOLLERR", 0)

Ready = list[tuple[selectors.SelectorKey, int]]


if sys.platform == "linux":  # epoll, and so EPOLLRDHUP

    class ClosingLast(selectors.EpollSelector):
        """epoll, with the sockets that look like they are closing reported last and `most`
        at a time; `clock` tells the seconds that `quiet` is counted in."""

        def __init__(
            self,
            most: int = CLOSING_PER_PASS,
            quiet: float = QUIET_SECONDS,
            clock: Callable[[], float] = time.monotonic,
        ):
            super().__init__()
            self._most = most
            self._quiet = quiet
            self._clock = clock
            self._turn = 0  # where the next window starts among more closing sockets than `most`
            self._heard: dict[int, float] = {}  # fd -> the call that last reported it readable
            self._earlier = self._last = -math.inf  # when the last two calls that found any were
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

        def unregister(self, fileobj: Any) -> selectors.SelectorKey:
            key = super().unregister(fileobj)
            self._heard.pop(key.fd, None)  # its number may come back as another socket's
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
            if not events:
                return []
            now = self._clock()
            # Readable and last heard before `woken`: silent for QUIET_SECONDS and through
            # the last two calls that found any, so it looks like it is closing.
            woken = now - self._quiet
            if self._earlier < woken:
                woken = self._earlier
            self._earlier = self._last
            self._last = now
            heard = self._heard
            ready: Ready = []
            closing: Ready = []
            for fd, event in events:
                key = keys.get(fd)
                if key is None:
                    continue
                mask = (selectors.EVENT_READ if event & _READABLE else 0) | (
                    selectors.EVENT_WRITE if event & _WRITABLE else 0
                )
                if event & _READABLE:
                    if event & _RDHUP or heard.get(fd, now) < woken:
                        closing.append((key, mask & key.events))
                        continue
                    heard[fd] = now
                ready.append((key, mask & key.events))
            if closing:
                window = self._window(closing)
                for key, _ in window:
                    heard[key.fd] = now
                ready += window
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
