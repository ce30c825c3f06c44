"""Broker.accept, the one SEND rule every front calls (STOMP's SEND, and HTTP publish):
what it keeps, when its `done` runs, and how it refuses, in memory."""

from __future__ import annotations

import asyncio
import errno

import pytest
from memworld import MemWorld

from curb.broker import publish
from curb.frame import MAX_HEADERS
from curb.refused import BAD_HEADERS, FULL, RETRY_FULL_SECONDS, TOO_LARGE, NotStored, Refused


def test_done_runs_only_once_the_message_is_synced_and_its_kept_headers_reach_a_stomp_consumer():
    world = MemWorld()
    answers: list[str | None] = []
    headers = {"destination": "/x", "receipt": "r", "content-type": "application/json", "x-msg-x-id": "a:b"}
    world.broker.accept(headers, b'{"n": 1}', answers.append)
    world.log.flush()
    world.run_scheduled()
    assert answers == [], "done ran before the fsync"
    world.log.sync()
    world.run_scheduled()
    assert answers == [None]
    peer = world.peer()
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")
    [message] = [f for f in peer.frames() if f.command == "MESSAGE"]
    assert message.body == b'{"n": 1}'
    assert message.headers["content-type"] == "application/json" and message.headers["x-msg-x-id"] == "a:b"
    assert "receipt" not in message.headers and message.headers["destination"] == "/queue/curb"


@pytest.mark.parametrize(
    "headers, body, reason",
    [
        ({f"h{i}": "v" for i in range(MAX_HEADERS)}, b"", BAD_HEADERS),
        ({"h": "v" * 70_000}, b"", BAD_HEADERS),
        ({}, b"x" * 200_000, TOO_LARGE),
    ],
    ids=["too many headers", "header too long", "too large for the log"],
)
def test_a_message_that_cannot_go_out_is_refused_with_its_reason_and_nothing_stored(headers, body, reason):
    world = MemWorld()
    with pytest.raises(Refused) as refused:
        world.broker.accept(headers, body)
    assert refused.value.reason == reason and refused.value.retry_after is None
    assert str(refused.value).strip() and refused.value.message
    assert world.broker.metrics.sent == 0 and world.log.last_id == 0


def test_a_full_queue_is_refused_with_a_retry_hint():
    world = MemWorld()
    with pytest.raises(Refused) as refused:
        for _ in range(1000):
            world.broker.accept({}, b"x" * 10_000, urgent=False)
    assert refused.value.reason == FULL and refused.value.retry_after == RETRY_FULL_SECONDS
    assert refused.value.message == "queue full" and world.broker.metrics.refused_full == 1


def test_publish_is_a_future_done_after_the_fsync_and_failing_when_the_log_cannot_store(monkeypatch):
    async def run() -> tuple[bool, bool, str]:
        world = MemWorld()
        stored = publish(world.broker, {"content-type": "text/plain"}, b"hi")
        world.log.flush()
        world.run_scheduled()
        await asyncio.sleep(0)
        early = stored.done()
        world.settle()
        await stored

        def failing_sync() -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(world.disk, "sync", failing_sync)
        lost = publish(world.broker, {}, b"lost")
        world.settle()
        with pytest.raises(NotStored) as failed:
            await lost
        return early, stored.result() is None, str(failed.value)

    early, ok, why = asyncio.run(run())
    assert not early and ok and "Input/output error" in why
