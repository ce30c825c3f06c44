"""./count fan-out: one encoded MESSAGE per change shared by every subscriber, and fewer
updates a second the more subscribers there are (curb.counts.CountWatch)."""

from __future__ import annotations

import json

import pytest
from test_session_rules import World

from curb import render
from curb.counts import COUNT_COALESCE_SECONDS, COUNT_FRAMES_PER_SECOND, CountMessages
from curb.frame import FrameParser


def test_every_subscriber_gets_the_same_message_under_its_own_subscription():
    world = World()
    peers = [world.session() for _ in range(3)]
    for n, peer in enumerate(peers):
        peer.connect()
        peer.send("SUBSCRIBE", id=f"watch:{n}", destination="./count")
        peer.frames()  # the counts at once
    producer = world.session()
    producer.connect()
    producer.send("SEND", destination="/queue/curb", body=b"x")
    world.run_scheduled()
    frames = [peer.frames() for peer in peers]
    assert [[f.headers["subscription"] for f in got] for got in frames] == [["watch:0"], ["watch:1"], ["watch:2"]]
    ids = {got[0].headers["message-id"] for got in frames}
    assert len(ids) == 1, "one version of the counts, one message-id"
    assert all(json.loads(got[0].body)["rdy"] == 1 for got in frames)


def test_the_shared_part_is_encoded_once_per_change():
    messages = CountMessages()
    first = messages.tail({"rdy": 1, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0})
    assert messages.tail({"rdy": 1, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0}) is first
    second = messages.tail({"rdy": 2, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0})
    assert first[0] == b"message-id:count-1\n" and second[0] == b"message-id:count-2\n"
    out: list[bytes] = []
    render.write_message(lambda data, end: out.append(bytes(data)), b"MESSAGE\nsubscription:s\n" + second[0], second[1])
    [frame] = FrameParser().feed(b"".join(out))
    assert frame.headers["rdy"] == "2" and json.loads(frame.body)["rdy"] == 2


@pytest.mark.parametrize("watchers, delay", [(1, 0.05), (50, 0.05), (100, 0.1), (1000, 1.0)])
def test_more_subscribers_mean_fewer_updates_a_second(watchers, delay):
    world = World()
    delays: list[float] = []
    world.broker.count_watch.schedule = lambda seconds, callback: delays.append(seconds)
    for _ in range(watchers):
        world.broker.count_watch.watch(world.session().session, True)
    world.broker.count_watch.changed()
    world.broker.count_watch.changed()
    assert delays == [pytest.approx(delay)]
    assert watchers / delay <= max(COUNT_FRAMES_PER_SECOND, 1 / COUNT_COALESCE_SECONDS)
