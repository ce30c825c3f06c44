"""curb.heap: the trim threshold raised while large messages move, and the pages given
back once they stop; and the server telling it of large reads and writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from curb import heap
from curb.client import Client
from curb.instance import Config, Instance

KEEP = (heap.M_TRIM_THRESHOLD, heap.KEEP_BYTES)
BACK = (heap.M_TRIM_THRESHOLD, heap.TRIM_BYTES)
TRIM = ("trim", 0)


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[object, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1


class FakeTimers:
    """A clock that moves only when told, and the one timer Keeper may arm."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: float | None = None
        self.callback: Callable[[], object] | None = None

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeTimers:
        assert self.due is None, "one timer at a time"
        self.due, self.callback = when, callback
        return self

    def cancel(self) -> None:
        self.due = self.callback = None

    def run_to(self, now: float) -> None:
        """Move the clock to `now`, firing the timer (and any it arms) on the way."""
        while self.due is not None and self.due <= now:
            self.now, callback = self.due, self.callback
            self.due = self.callback = None
            assert callback is not None
            callback()
        self.now = now


def keeper() -> tuple[heap.Keeper, FakeTimers, FakeLibc]:
    timers, libc = FakeTimers(), FakeLibc()
    return heap.Keeper(timers, libc, quiet=1.0), timers, libc


def test_a_large_move_keeps_the_top_once_and_the_quiet_gives_it_back():
    keep, timers, libc = keeper()
    keep.moved()
    keep.moved()
    assert libc.calls == [KEEP] and keep.keeping and timers.due == 101.0
    timers.run_to(101.5)
    assert libc.calls == [KEEP, BACK, TRIM] and not keep.keeping and timers.due is None


@pytest.mark.parametrize(
    ("moves", "released_at"),
    [
        ([], 101.0),  # the first move only: quiet one second after it
        ([100.5], 101.5),  # a later move pushes the release back: quiet after the last
        ([100.5, 101.2, 101.9], 102.9),
    ],
)
def test_the_release_comes_a_quiet_second_after_the_last_large_move(moves, released_at):
    keep, timers, libc = keeper()
    keep.moved()
    for at in moves:
        timers.run_to(at)
        keep.moved()
    timers.run_to(released_at - 0.01)
    assert keep.keeping and libc.calls == [KEEP]
    timers.run_to(released_at)
    assert not keep.keeping and libc.calls == [KEEP, BACK, TRIM]


def test_keeping_starts_again_after_a_release_and_release_twice_is_once():
    keep, timers, libc = keeper()
    keep.moved()
    keep.release()
    keep.release()
    assert libc.calls == [KEEP, BACK, TRIM] and timers.due is None
    keep.moved()
    assert keep.keeping and libc.calls == [KEEP, BACK, TRIM, KEEP]


def test_trim_gives_the_free_pages_back_and_keeps_nothing():
    keep, timers, libc = keeper()
    keep.trim()
    assert libc.calls == [TRIM] and not keep.keeping and timers.due is None


def test_install_makes_the_process_keeper_on_glibc_for_its_loop_only(monkeypatch):
    monkeypatch.setattr(heap, "_keeper", None)

    async def run() -> tuple[heap.Keeper | None, heap.Keeper | None]:
        loop = asyncio.get_running_loop()
        return heap.install(loop), heap.keeper(loop)

    made, found = asyncio.run(run())
    assert made is not None and found is made and not made.keeping
    # Its loop closed, another loop's connections never get it (its timers would fail there).
    other = asyncio.new_event_loop()
    try:
        assert heap.keeper(other) is None
    finally:
        other.close()


def test_the_server_tells_the_keeper_of_large_reads_and_writes_only(tmp_path, monkeypatch):
    """A SEND of 100 bytes moves nothing large; one of 100 KiB is a large read, and its
    MESSAGE later a large write; after each, once quiet, the pages go back."""
    libc = FakeLibc()
    config = Config(path=str(tmp_path / "q.log"), cap=8 << 20, addr=("127.0.0.1", 0), heartbeat_ms=0)

    def send(port: int, body: bytes) -> None:
        with Client("127.0.0.1", port) as client:
            client.send(body, receipt="r")
            client.wait_receipt("r", timeout=10)

    def consume(port: int) -> list[bytes]:
        with Client("127.0.0.1", port) as client:
            client.subscribe(ack="client-individual", prefetch=2)
            frames = [client.receive(timeout=10), client.receive(timeout=10)]
            return [frame.body for frame in frames if frame is not None]

    async def run() -> tuple[list[list[tuple[object, int]]], list[bytes]]:
        monkeypatch.setattr(heap, "_keeper", heap.Keeper(asyncio.get_running_loop(), libc, quiet=0.05))
        seen = []
        async with Instance(config) as curb:
            port = curb.addresses[0][1]
            await asyncio.to_thread(send, port, b"x" * 100)
            seen.append(list(libc.calls))
            await asyncio.to_thread(send, port, b"y" * (100 << 10))
            await asyncio.sleep(0.3)
            seen.append(list(libc.calls))
            bodies = await asyncio.to_thread(consume, port)
            await asyncio.sleep(0.3)
            seen.append(list(libc.calls))
        return seen, bodies

    seen, bodies = asyncio.run(run())
    assert bodies == [b"x" * 100, b"y" * (100 << 10)]
    assert seen == [[], [KEEP, BACK, TRIM], [KEEP, BACK, TRIM, KEEP, BACK, TRIM]]


def test_a_broker_run_as_the_process_trims_after_recovery_and_releases_at_stop(tmp_path, monkeypatch):
    """Start-up gives back what recovery freed (one malloc_trim before serving); a stop
    while keeping gives the kept pages back."""
    from curb import instance

    libc = FakeLibc()
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    monkeypatch.setattr(instance, "_settle_memory", lambda: None)  # gc.freeze would hold the test's objects
    monkeypatch.setattr(heap, "install", lambda loop: heap.Keeper(loop, libc))
    config = Config(path=str(tmp_path / "q.log"), cap=8 << 20, addr=("127.0.0.1", 0), heartbeat_ms=0)

    async def run() -> tuple[list[tuple[object, int]], list[tuple[object, int]]]:
        curb = Instance(config, process=True)
        await curb.start()
        started = list(libc.calls)
        kept = curb._heap
        assert kept is not None
        kept.moved()
        await curb.stop()
        return started, list(libc.calls)

    started, stopped = asyncio.run(run())
    assert started == [TRIM]
    assert stopped == [TRIM, KEEP, BACK, TRIM]
