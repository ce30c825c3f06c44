"""Rate-limited lines and the connection limit, in memory: curb.ratelimit, Broker.admit and
the loop's handler for accept() failing at the fd limit."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from typing import cast

import pytest
from test_session_rules import World

from curb import instance
from curb.ratelimit import LineLimit


@pytest.mark.parametrize(
    "times, lines",
    [
        ([0.0], [1]),
        ([0.0, 1.0, 2.0], [1, 0, 0]),
        ([0.0, 1.0, 9.9, 10.0], [1, 0, 0, 3]),
        ([5.0, 20.0, 21.0, 31.0], [1, 1, 0, 2]),
    ],
)
def test_a_line_is_due_at_once_then_once_per_interval_with_the_count(times, lines):
    limit = LineLimit(10.0)
    assert [limit.hit(t) for t in times] == lines


def test_connections_past_the_limit_are_refused_counted_and_logged_once_per_interval():
    world = World()
    said: list[dict] = []
    world.broker.refusals.events = lambda event, text, **fields: said.append({"event": event, **fields})
    world.broker.config = dataclasses.replace(world.broker.config, max_connections=2)
    assert world.broker.admit(0.0, "10.0.0.1:1")
    world.session(), world.session()
    peers = [f"10.0.0.2:{port}" for port in range(4)]
    assert [world.broker.admit(t, peer) for t, peer in zip((1.0, 2.0, 3.0, 11.5), peers, strict=True)] == [False] * 4
    assert world.broker.metrics.connections_refused == 4
    assert said == [
        {"event": "connection_limit", "peer": peers[0], "limit": 2, "count": 1},
        {"event": "connection_limit", "peer": peers[3], "limit": 2, "count": 3},
    ]


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.passed_on: list[dict] = []

    def time(self) -> float:
        return self.now

    def default_exception_handler(self, context: dict) -> None:
        self.passed_on.append(context)


def test_accept_failures_are_one_line_per_interval_and_other_errors_pass_on():
    said: list[dict] = []
    handle = instance._accept_failures_as_lines(lambda event, text, **fields: said.append({"event": event, **fields}))
    fake = FakeLoop()
    loop = cast(asyncio.AbstractEventLoop, fake)  # the handler calls only time() and default_exception_handler()
    emfile = {"message": "socket.accept() out of system resource", "exception": OSError(errno.EMFILE, "Too many")}
    for now in (0.0, 0.5, 1.0, 10.0):
        fake.now = now
        handle(loop, emfile)
    other = {"message": "something else", "exception": RuntimeError("boom")}
    handle(loop, other)
    assert [(s["event"], s["failures"]) for s in said] == [("accept_failed", 1), ("accept_failed", 3)]
    assert fake.passed_on == [other]


def test_connect_timeouts_are_logged_once_per_interval():
    world = World()
    said: list[dict] = []
    world.broker.refusals.events = lambda event, text, **fields: said.append({"event": event, **fields})
    world.broker.config = dataclasses.replace(world.broker.config, connect_timeout=1.0)
    peers = [world.session(now=0.0) for _ in range(3)]
    for peer in peers:
        peer.session.tick(1.0)
        [error] = peer.frames(1.0)
        assert error.headers["message"] == "CONNECT timeout"
    late = world.session(now=10.0)
    late.session.tick(11.0)
    assert [(s["event"], s["count"]) for s in said] == [("connect_timeout", 1), ("connect_timeout", 3)]
    assert world.broker.metrics.connect_timeouts == 4
    assert world.broker.metrics.protocol_errors == 0, "no frame broke the protocol"
