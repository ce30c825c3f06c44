"""Browse and ACK up to an id against the real broker process, with stomp.py and
curb.client: browse while producing, browse while compaction moves a held message,
ACK up to an id then restart or kill -9."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from conftest import free_port, wait_until

from curb.client import BROWSE_END, Client, StompError


class Producer(threading.Thread):
    """Receipted SENDs of numbered bodies, `count` of them; `receipted` is how many
    have their RECEIPT (all bodies below it are stored)."""

    def __init__(self, port: int, count: int, size: int = 100):
        super().__init__(daemon=True)
        self.port, self.count, self.size = port, count, size
        self.receipted = 0
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with Client("127.0.0.1", self.port, timeout=20) as c:
                for n in range(self.count):
                    c.send(body(n, self.size), receipt=f"r{n}")
                    if n % 16 == 15 or n == self.count - 1:
                        c.wait_receipt(f"r{n}")
                        self.receipted = n + 1
        except (StompError, OSError) as err:
            self.error = err


def body(n: int, size: int = 100) -> bytes:
    return (b"p-%07d-" % n).ljust(size, b"x")


def number(data: bytes) -> int:
    return int(data[2:9])


def browse_ids(port: int, from_id: int | None = None) -> tuple[list[int], list[bytes], int]:
    with Client("127.0.0.1", port, timeout=20) as c:
        frames = list(c.browse(from_id))
        return [int(f.headers["message-id"]) for f in frames], [f.body for f in frames], c.last_browsed


def test_stomp_py_browses_while_a_producer_sends(curb_broker, stomp_conn):
    broker = curb_broker()
    producer = Producer(broker.port, 3000)
    producer.start()
    conn, inbox = stomp_conn(broker.port, auto_decode=False)
    for round_ in range(4):
        enough = 500 * (round_ + 1)
        wait_until(lambda: producer.receipted >= enough)  # noqa: B023 (called before the loop moves on)
        stored_before = producer.receipted
        seen = len(inbox.messages)
        conn.subscribe("/queue/curb", id=f"b{round_}", ack="client", headers={"browser": "true"}, receipt=f"s{round_}")
        inbox.wait_for(
            lambda i, n=seen: any(f.headers.get("browser") == "end" for f in i.messages[n:]), "the end marker"
        )
        frames = inbox.messages[seen:]
        end = frames[-1]
        assert end.headers["message-id"] == BROWSE_END and end.headers["subscription"] == f"b{round_}"
        messages = frames[:-1]
        ids = [int(f.headers["message-id"]) for f in messages]
        assert ids == sorted(set(ids)), "each message once, in id order (no compaction under a 10MiB cap)"
        assert all("ack" not in f.headers for f in messages)
        numbers = {number(f.body) for f in messages}
        assert set(range(stored_before)) <= numbers  # everything stored before the SUBSCRIBE
        assert int(end.headers["curb-last-id"]) >= max(ids)
    producer.join(30)
    assert producer.error is None
    ids, bodies, last = browse_ids(broker.port)
    assert ids == list(range(1, 3001)) and last == 3000
    assert [number(b) for b in bodies] == list(range(3000))


def stats(http_port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats", timeout=10) as response:
        return json.load(response)


def test_browse_returns_a_held_message_exactly_once_while_compaction_moves_it(curb_broker):
    http_port = free_port()
    broker = curb_broker(cap="64KiB", extra_args=("-http", f"127.0.0.1:{http_port}"))
    with Client("127.0.0.1", broker.port, timeout=20) as holder, Client("127.0.0.1", broker.port) as worker:
        holder.send(body(0), receipt="first")
        holder.wait_receipt("first")
        holder.subscribe("h", ack="client-individual", prefetch=1)
        held = holder.receive(timeout=10)
        assert held is not None and held.headers["message-id"] == "1"  # held, never ACKed
        worker.subscribe("w", ack="auto")
        producer = Producer(broker.port, 1500, size=600)
        producer.start()
        browses = 0
        while producer.is_alive() or browses < 3:
            ids, bodies, _ = browse_ids(broker.port)
            assert len(ids) == len(set(ids)), f"a message browsed twice: {ids}"
            assert ids.count(1) == 1 and bodies[ids.index(1)] == body(0)
            browses += 1
            while worker.receive(timeout=0) is not None:
                pass
        producer.join(30)
        assert producer.error is None
        assert stats(http_port)["compactions"] > 0, "the held message was never copied forward"
        holder.ack("1", receipt="done")
        holder.wait_receipt("done")
    assert browses >= 3


@pytest.mark.parametrize("stop", ["restart", "kill -9"])
def test_ack_upto_is_durable_across_restart_and_kill(curb_broker, stop):
    broker = curb_broker()
    with Client("127.0.0.1", broker.port) as c:
        for n in range(100):
            c.send(body(n), receipt=f"r{n}")
        c.wait_receipt("r99")
    holder, committer = Client("127.0.0.1", broker.port), Client("127.0.0.1", broker.port)
    holder.connect()
    committer.connect()
    holder.subscribe("h", ack="client", prefetch=5)
    held = [holder.receive(timeout=10) for _ in range(5)]
    assert [f.headers["message-id"] for f in held if f] == ["1", "2", "3", "4", "5"]
    committer.ack_upto(60, receipt="upto")
    committer.wait_receipt("upto")
    assert browse_ids(broker.port)[0] == list(range(61, 101))
    if stop == "kill -9":
        broker.kill()  # right after the receipt
        broker.start()
    else:
        broker.restart()
    holder.close()
    committer.close()
    ids, bodies, _ = browse_ids(broker.port)
    assert ids == list(range(61, 101)) and number(bodies[0]) == 60
    with Client("127.0.0.1", broker.port) as consumer:
        consumer.subscribe("c", ack="client-individual")
        first = consumer.receive(timeout=10)
        assert first is not None and first.headers["message-id"] == "61"
        # a clean stop goes on from 100; after kill -9 the ids the last checkpoint
        # reserved are skipped, so that none a crash lost is ever given again
        assert consumer.last_id() == 100 if stop == "restart" else consumer.last_id() > 100
        consumer.send(b"after", receipt="after")
        consumer.wait_receipt("after")
    assert browse_ids(broker.port, from_id=101)[0][0] > 100


def test_ack_upto_errors_and_the_holders_ack_through_stomp_py(curb_broker, stomp_conn):
    broker = curb_broker()
    with Client("127.0.0.1", broker.port) as c:
        for n in range(3):
            c.send(body(n), receipt=f"r{n}")
        c.wait_receipt("r2")
    holder, holder_inbox = stomp_conn(broker.port)
    holder.subscribe("/queue/curb", id="h", ack="client-individual", headers={"prefetch-count": "1"})
    [message] = holder_inbox.wait_messages(1)
    committer, inbox = stomp_conn(broker.port)
    committer.send_frame("ACK", {"curb-upto": "2", "receipt": "u"})
    inbox.wait_receipt("u")
    holder.ack(message.headers["message-id"])
    assert "not awaiting ACK" in holder_inbox.wait_error().headers["message"]
    committer.send_frame("ACK", {"curb-upto": "4", "receipt": "too far"})
    error = inbox.wait_error()
    assert "above the highest message id so far (3)" in error.headers["message"]
    assert error.headers["receipt-id"] == "too far"


def test_an_empty_broker_and_a_killed_one_report_their_last_id(curb_broker):
    broker = curb_broker()
    with Client("127.0.0.1", broker.port) as c:
        assert c.last_id() == 0
        for n in range(5):
            c.send(body(n))
        c.send(b"last", receipt="last")
        c.wait_receipt("last")
        assert c.last_id() == 6
        c.ack_upto(6, receipt="all")
        c.wait_receipt("all")
    broker.kill()
    broker.start()
    with Client("127.0.0.1", broker.port) as c:
        assert c.last_id() >= 6
        assert list(c.browse()) == []
        c.send(b"new", receipt="new")
        c.wait_receipt("new")
        [new] = list(c.browse())
        assert int(new.headers["message-id"]) > 6 and new.body == b"new"
