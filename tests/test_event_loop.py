"""curb.event_loop's selector on real sockets: every live ready socket is reported each
call, those whose peer closed or that wake from silence at most `most` a call and each in
its turn, nothing is lost (level-triggered), and a loop on it serves as asyncio's does,
tearing down TLS clients that close at once a few a pass."""

from __future__ import annotations

import asyncio
import collections
import selectors
import socket
import ssl
import sys
from typing import cast

import pytest
import trustme

from curb import event_loop

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ClosingLast is epoll's (Linux)")


@pytest.fixture
def pairs():
    made: list[tuple[socket.socket, socket.socket]] = []

    def make(count: int) -> list[tuple[socket.socket, socket.socket]]:
        new = [socket.socketpair() for _ in range(count)]
        made.extend(new)
        return new

    yield make
    for ours, theirs in made:
        ours.close()
        theirs.close()


def reported(selector, timeout: float = 0.0) -> list[str]:
    return sorted(key.data for key, _ in selector.select(timeout))


def test_live_sockets_come_every_call_and_closed_ones_two_at_a_time_each_in_turn(pairs):
    selector = event_loop.ClosingLast(most=2)
    live, closing = pairs(2), pairs(5)
    for n, (ours, _) in enumerate(live):
        selector.register(ours, selectors.EVENT_READ, f"live{n}")
    for n, (ours, _) in enumerate(closing):
        selector.register(ours, selectors.EVENT_READ, f"closed{n}")
    for _, theirs in live:
        theirs.sendall(b"frame")
    for _, theirs in closing:
        theirs.close()
    seen: list[str] = []
    for _ in range(3):
        got = reported(selector)
        assert [name for name in got if name.startswith("live")] == ["live0", "live1"]
        closed = [name for name in got if name.startswith("closed")]
        assert len(closed) == 2
        seen += closed
    assert set(seen) == {f"closed{n}" for n in range(5)}  # each had its turn within three calls
    # Handled (read to its end and unregistered, as asyncio does), a socket leaves for good.
    for ours, _ in closing:
        assert ours.recv(10) == b""
        selector.unregister(ours)
    assert reported(selector) == ["live0", "live1"]
    selector.close()


class Clock:
    """The selector's clock: moved by hand, and a microsecond by each reading, so no two
    calls of the selector are at the same time (as none are on a real clock)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now


def speak(pairs: list[tuple[socket.socket, socket.socket]], data: bytes = b"frame") -> None:
    for _, theirs in pairs:
        theirs.sendall(data)


def hear(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    """Read what came, as asyncio does with a socket it was handed."""
    for ours, _ in pairs:
        ours.recv(100)


def test_quiet_sockets_that_wake_at_once_come_two_a_call_and_a_talking_one_every_call(pairs):
    clock = Clock()
    selector = event_loop.ClosingLast(most=2, quiet=1.0, clock=clock)
    talking, quiet = pairs(1), pairs(5)
    for n, (ours, _) in enumerate(talking + quiet):
        selector.register(ours, selectors.EVENT_READ, f"talking{n}" if n < len(talking) else f"quiet{n - 1}")
    speak(talking + quiet)  # the logins: none was heard before, so all are in conversation
    assert len(reported(selector)) == 6
    hear(talking + quiet)
    for clock.now in (4.5, 4.8):
        speak(talking)
        assert reported(selector) == ["talking0"]
        hear(talking)
    clock.now = 5.0
    assert reported(selector) == []
    speak(talking + quiet)  # the quiet ones close their TLS sessions: data, to epoll
    seen: list[str] = []
    for _ in range(3):
        got = reported(selector)
        assert "talking0" in got  # heard half a second ago: never held behind the crowd
        woken = [name for name in got if name.startswith("quiet")]
        assert len(woken) <= 2
        seen += woken
        hear([quiet[int(name[5:])] for name in woken])
    assert sorted(seen) == [f"quiet{n}" for n in range(5)]  # each had its turn, once
    selector.close()


def test_a_socket_heard_in_one_of_the_last_two_busy_calls_is_in_conversation_after_a_long_pass(pairs):
    clock = Clock()
    selector = event_loop.ClosingLast(most=1, quiet=1.0, clock=clock)
    talking, quiet = pairs(1), pairs(2)
    for n, (ours, _) in enumerate(talking + quiet):
        selector.register(ours, selectors.EVENT_READ, f"talking{n}" if n < len(talking) else f"quiet{n - 1}")
    speak(talking + quiet)
    reported(selector)
    hear(talking + quiet)
    for _ in range(2):
        speak(talking)
        assert reported(selector) == ["talking0"]
        hear(talking)
    clock.now = 10.0  # the loop's pass took ten seconds: the talking one waited on it
    speak(talking + quiet)
    got = reported(selector)
    assert "talking0" in got and len(got) == 2  # and one of the quiet ones
    selector.close()


class Counted(asyncio.Protocol):
    """A server's connection that notes in which loop pass it was torn down, and echoes."""

    def __init__(self, passes: list[int], ends: collections.Counter[int]):
        self.passes = passes
        self.ends = ends

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ends[self.passes[0]] += 1


def test_tls_clients_closing_at_once_are_torn_down_three_a_pass_while_another_talks():
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    clock = Clock()
    loop = asyncio.SelectorEventLoop(event_loop.ClosingLast(most=3, quiet=1.0, clock=clock))
    passes, ends = [0], collections.Counter[int]()

    def count() -> None:
        passes[0] += 1
        loop.call_soon(count)

    async def main() -> list[int]:
        server = await loop.create_server(lambda: Counted(passes, ends), "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]

        async def client() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_tls, server_hostname="127.0.0.1"
            )
            writer.write(b"login")
            assert await reader.readexactly(5) == b"login"
            return reader, writer

        crowd = [await client() for _ in range(12)]
        talker_in, talker_out = await client()
        count()
        clock.now = 10.0  # the crowd has been quiet for ten seconds
        talker_out.write(b"ping")  # the talker has not
        assert await talker_in.readexactly(4) == b"ping"
        trips: list[int] = []  # the passes the talker's round trips ended in
        for _, writer in crowd:
            writer.close()  # close_notify, which the server must read to know
        while sum(ends.values()) < len(crowd):
            talker_out.write(b"ping")
            assert await talker_in.readexactly(4) == b"ping"
            trips.append(passes[0])
        talker_out.close()
        server.close()
        return trips

    try:
        trips = loop.run_until_complete(main())
    finally:
        loop.close()
    assert max(ends.values()) <= 3  # never more than `most` torn down in one pass
    assert len(ends) >= 4  # 12 connections, 3 a pass
    first, last = min(ends), max(ends)
    assert any(first <= trip <= last for trip in trips)  # served while the crowd was torn down


def test_a_writer_beside_a_reader_keeps_both_and_the_closed_flag(pairs):
    selector = event_loop.ClosingLast(most=1)
    [(ours, theirs)] = pairs(1)
    selector.register(ours, selectors.EVENT_READ, "r")
    selector.modify(ours, selectors.EVENT_READ | selectors.EVENT_WRITE, "rw")
    [(key, mask)] = selector.select(0)
    assert key.data == "rw" and mask == selectors.EVENT_WRITE  # writable, nothing to read yet
    theirs.close()
    [(key, mask)] = selector.select(0)
    assert mask == selectors.EVENT_READ | selectors.EVENT_WRITE
    selector.modify(ours, selectors.EVENT_WRITE, "w")  # reading paused: no flag asked
    [(key, mask)] = selector.select(0)
    assert mask == selectors.EVENT_WRITE
    selector.close()


def test_a_loop_on_it_serves_a_connection_and_sees_its_end():
    async def main() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(100):
                got.append(data)
                writer.write(data.upper())
                await writer.drain()
            writer.close()
            done.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await reader.read(100) == b"PING"
        writer.close()
        await asyncio.wait_for(done.wait(), 5)
        server.close()
        return got

    assert event_loop.run(main()) == [b"ping"]
