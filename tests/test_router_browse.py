"""Browses through `curb router`, for real: a browse reads the destination's instances and
changes nothing (a browse through the router once took the messages it read)."""

from __future__ import annotations

from curb.client import Client
from curb.router.placement import INDEX_BITS


def counts(port: int) -> dict[str, str]:
    """An instance's ./count headers, read directly."""
    with Client("127.0.0.1", port) as direct:
        direct.subscribe("n", destination="./count")
        frame = direct.receive(10)
        assert frame is not None
        return frame.headers


def test_a_browse_through_the_router_reads_every_instance_and_changes_nothing(curb_broker, curb_router):
    first, second = curb_broker(file="a.log"), curb_broker(file="b.log")
    router = curb_router([f"p=127.0.0.1:{first.port},127.0.0.1:{second.port}"])
    with Client("127.0.0.1", router.port) as client:
        for n in range(6):
            client.send(b"m%d" % n, destination="/queue/p", receipt=f"r{n}")
        client.wait_receipt("r5")
        browsed = list(client.browse(destination="/queue/p"))
        assert sorted(frame.body for frame in browsed) == [b"m%d" % n for n in range(6)]
        ids = [int(frame.headers["message-id"]) for frame in browsed]
        assert len(set(ids)) == 6 and {msg_id & ((1 << INDEX_BITS) - 1) for msg_id in ids} == {0, 1}
        assert client.last_browsed >= max(ids)
        again = list(client.browse(destination="/queue/p"))
        assert [frame.headers["message-id"] for frame in again] == [frame.headers["message-id"] for frame in browsed]
        # An id range names the router's ids: the browse keeps to it.
        lowest = sorted(ids)[:3]
        ranged = list(client.browse(from_id=lowest[0], to_id=lowest[-1], destination="/queue/p", sub_id="r"))
        assert sorted(int(frame.headers["message-id"]) for frame in ranged) == lowest
        assert client.last_browsed == lowest[-1]
    assert int(counts(first.port)["rdy"]) + int(counts(second.port)["rdy"]) == 6
    with Client("127.0.0.1", router.port) as consumer:
        consumer.subscribe("s", destination="/queue/p", ack="client-individual")
        got = []
        for _ in range(6):
            frame = consumer.receive(10)
            assert frame is not None
            got.append(frame.body)
            consumer.ack(frame.headers["ack"])
        assert sorted(got) == [b"m%d" % n for n in range(6)]


def test_last_id_through_the_router_is_a_browse_that_takes_nothing(curb_broker, curb_router):
    """Spark's `Client.last_id()` through the router once emptied a queue of 5 and timed out."""
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as client:
        for n in range(5):
            client.send(b"x", destination="/queue/q", receipt=f"r{n}")
        client.wait_receipt("r4")
        assert client.last_id(destination="/queue/q") >= 5 << INDEX_BITS
    assert counts(instance.port)["rdy"] == "5"
