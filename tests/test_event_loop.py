"""curb.event_loop's selector on real sockets: every live ready socket is reported each
call, those whose peer closed at most `most` a call and each in its turn, nothing is lost
(level-triggered), and a loop on it serves as asyncio's does."""

from __future__ import annotations

import asyncio
import selectors
import socket
import sys

import pytest

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
