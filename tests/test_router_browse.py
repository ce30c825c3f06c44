"""Browses through `curb router`, for real: a browse reads the destination's instances and
changes nothing (a browse through the router once took the messages it read)."""

from __future__ import annotations

import time

import pytest

from curb.client import Client, StompError
from curb.frame import Frame
from curb.router.browses import HOLD_BYTES
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


def test_dead_letters_through_the_router_browse_and_redrive(curb_broker, curb_router):
    """./NAME/dead browses and consumes and ./NAME/redrive moves the instances' dead
    letters back, with the direct broker's answers (curb-moved); refused through the
    router before."""
    first = curb_broker(file="a.log", extra_args=["-max-deliveries", "1"])
    second = curb_broker(file="b.log", extra_args=["-max-deliveries", "1"])
    router = curb_router([f"p=127.0.0.1:{first.port},127.0.0.1:{second.port}"])
    with Client("127.0.0.1", router.port) as client:
        for n in range(4):
            client.send(b"d%d" % n, destination="/queue/p", receipt=f"r{n}")
        client.wait_receipt("r3")
        client.subscribe("s", destination="/queue/p", ack="client-individual", prefetch=4)
        for _ in range(4):
            frame = client.receive(10)
            assert frame is not None and frame.command == "MESSAGE"
            client.nack(frame.headers["ack"])
        client.unsubscribe("s")
        dead: list[Frame] = []
        for _ in range(50):  # the instances bury them as the NACKs come
            dead = list(client.browse(destination="./p/dead", sub_id=f"d{len(dead)}"))
            if len(dead) == 4:
                break
        assert sorted(frame.body for frame in dead) == [b"d0", b"d1", b"d2", b"d3"]
        assert {frame.headers["curb-dead-reason"] for frame in dead} == {"max-deliveries"}
        client.send(b"", destination="./p/redrive", receipt="moved", headers={"curb-count": "3"})
        receipt = client.receive(10)
        assert receipt is not None and receipt.command == "RECEIPT", receipt
        assert (receipt.headers["receipt-id"], receipt.headers["curb-moved"]) == ("moved", "3")
        assert len(list(client.browse(destination="./p/dead", sub_id="after"))) == 1
        assert len(list(client.browse(destination="/queue/p", sub_id="queued"))) == 3
        # The last one is read from ./p/dead as a dead letter, with its reason, and ACKed for good.
        client.subscribe("dead", destination="./p/dead", ack="client-individual")
        letter = client.receive(10)
        assert letter is not None and letter.headers["subscription"] == "dead"
        assert (letter.headers["curb-dead-reason"], letter.headers["curb-deliveries"]) == ("max-deliveries", "1")
        client.ack(letter.headers["ack"], receipt="gone")
        client.wait_receipt("gone")
        assert list(client.browse(destination="./p/dead", sub_id="none")) == []


def test_ack_upto_through_the_router_names_the_routers_ids(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as client:
        for n in range(5):
            client.send(b"u%d" % n, destination="/queue/q", receipt=f"r{n}")
        client.wait_receipt("r4")
        ids = sorted(int(frame.headers["message-id"]) for frame in client.browse(destination="/queue/q"))
        client.ack_upto(ids[2], receipt="upto", destination="/queue/q")
        client.wait_receipt("upto")
        assert [frame.body for frame in client.browse(destination="/queue/q", sub_id="left")] == [b"u3", b"u4"]
    assert counts(instance.port)["rdy"] == "2"
    with Client("127.0.0.1", router.port) as client:
        client.ack_upto(1, receipt="no-destination")
        with pytest.raises(StompError, match="needs a destination header"):
            client.wait_receipt("no-destination")


@pytest.mark.parametrize("receipt", ["upto", None])
def test_an_instances_refusal_of_ack_upto_is_the_clients_error_with_or_without_a_receipt(
    curb_broker, curb_router, receipt
):
    """An id above the instance's highest is the instance's own ERROR, passed on as the
    client's (a RECEIPT's place holds it; without a receipt it is sent all the same)."""
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as client:
        client.send(b"x", destination="/queue/q", receipt="r")
        client.wait_receipt("r")
        client.ack_upto(1 << 40, receipt=receipt, destination="/queue/q")
        with pytest.raises(StompError, match="above the highest message id"):
            client.wait_receipt("never")
    assert counts(instance.port)["rdy"] == "1"


def test_a_browse_larger_than_what_the_router_holds_comes_whole(curb_broker, curb_router):
    """A browse holds at most HOLD_BYTES not yet taken by its client; past that its link
    reads nothing until the client takes some: a larger browse, its client slow to
    read at first, still comes whole."""
    instance = curb_broker(cap="64MiB")
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    body = b"b" * (256 * 1024)
    count = HOLD_BYTES // len(body) * 4
    with Client("127.0.0.1", router.port, timeout=30) as client:
        for n in range(count):
            client.send(body, destination="/queue/q", receipt=f"r{n}")
        client.wait_receipt(f"r{count - 1}")
        client.subscribe("b", destination="/queue/q", headers={"browser": "true"})
        client.flush()
        time.sleep(1.0)  # the router reads the instance meanwhile, up to what it may hold
        got: list[bytes] = []
        while True:
            frame = client.receive(30)
            assert frame is not None, f"the browse stopped after {len(got)} of {count}"
            if frame.headers.get("browser") == "end":
                break
            got.append(frame.body)
    assert len(got) == count and all(each == body for each in got)
