"""Ack deadlines on a real broker with a short -ack-timeout, seen from stomp.py: a hung
consumer's message goes to a consumer with credit, and nothing else of the hung one
changes; its late ACK is answered with a RECEIPT that says so; a touch (NACK with
curb-touch) keeps a message past its original deadline; /stats counts both."""

from __future__ import annotations

import http.client
import json
import threading

import stomp
from conftest import free_port, wait_until

QUEUE = "/queue/curb"


class Receipts(stomp.ConnectionListener):
    """The headers of every RECEIPT, by receipt-id."""

    def __init__(self) -> None:
        self.headers: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def on_receipt(self, frame) -> None:
        with self._lock:
            self.headers[frame.headers["receipt-id"]] = dict(frame.headers)

    def wait(self, receipt_id: str) -> dict[str, str]:
        assert wait_until(lambda: receipt_id in self.headers), f"no RECEIPT {receipt_id!r}"
        return self.headers[receipt_id]


def connect(stomp_conn, port: int):
    conn, inbox = stomp_conn(port)
    receipts = Receipts()
    conn.set_listener("receipts", receipts)
    return conn, inbox, receipts


def stats(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/stats")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_a_hung_consumer_loses_only_the_message_past_its_deadline_and_its_late_ack_is_answered(curb_broker, stomp_conn):
    http_port = free_port()
    broker = curb_broker(extra_args=["-ack-timeout", "300ms", "-http", f"127.0.0.1:{http_port}"])
    producer, _, sent = connect(stomp_conn, broker.port)
    producer.send(QUEUE, "kept", receipt="kept")
    sent.wait("kept")

    hung, hung_inbox, hung_receipts = connect(stomp_conn, broker.port)
    # One subscription with a long deadline takes "kept"; after UNSUBSCRIBE (its wip stays)
    # one with the broker's 300 ms, first in line, takes "hung". Then the consumer does nothing.
    long = {"prefetch-count": "1", "curb-ack-timeout": "60000"}
    hung.subscribe(QUEUE, id="long", ack="client-individual", headers=long)
    [kept] = hung_inbox.wait_messages(1)
    hung.unsubscribe(id="long")
    hung.subscribe(QUEUE, id="short", ack="client-individual", headers={"prefetch-count": "1"}, receipt="short")
    hung_receipts.wait("short")
    worker, worker_inbox, worker_receipts = connect(stomp_conn, broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual", headers={"curb-ack-timeout": "60000"}, receipt="w")
    worker_receipts.wait("w")
    producer.send(QUEUE, "hung", receipt="hung")
    stuck = hung_inbox.wait_messages(2)[1]
    assert (kept.body, stuck.body) == ("kept", "hung")

    [again] = worker_inbox.wait_messages(1)
    assert again.body == "hung"
    assert (again.headers["redelivered"], again.headers["curb-deliveries"]) == ("true", "2")
    assert again.headers["message-id"] == stuck.headers["message-id"]

    # The hung consumer wakes up: its late ACK changes nothing and is answered, not an ERROR.
    hung.ack(stuck.headers["ack"], receipt="late")
    assert hung_receipts.wait("late").get("curb-late") == "true"
    hung.ack(kept.headers["ack"], receipt="kept-done")  # its other message was never touched
    assert "curb-late" not in hung_receipts.wait("kept-done")
    worker.ack(again.headers["ack"], receipt="done")
    assert "curb-late" not in worker_receipts.wait("done")
    assert hung.is_connected() and not hung_inbox.errors and not worker_inbox.errors
    assert hung_inbox.quiet() == [kept, stuck] and worker_inbox.quiet() == [again]

    counters = stats(http_port)
    assert (counters["ack_timeouts"], counters["late_acks"], counters["acked"], counters["rdy"]) == (1, 1, 2, 0)
    assert "ack deadline passed: 1 delivered messages" in broker.stderr_text()


def test_a_touch_keeps_a_message_past_its_original_deadline(curb_broker, stomp_conn):
    broker = curb_broker(extra_args=["-ack-timeout", "300ms"])
    producer, _, sent = connect(stomp_conn, broker.port)
    producer.send(QUEUE, "slow job", receipt="sent")
    sent.wait("sent")
    holder, holder_inbox, holder_receipts = connect(stomp_conn, broker.port)
    holder.subscribe(QUEUE, id="h", ack="client-individual", headers={"curb-ack-timeout": "1000"})
    [job] = holder_inbox.wait_messages(1)
    # stomp.py passes extra keyword headers on NACK (its ack() takes none)
    holder.nack(job.headers["ack"], receipt="touched", **{"curb-touch": "6000"})
    assert "curb-late" not in holder_receipts.wait("touched")
    worker, worker_inbox, _ = connect(stomp_conn, broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    assert worker_inbox.quiet(1.5) == [], "past the 1 s deadline, the touched message stays with its holder"
    holder.ack(job.headers["ack"], receipt="done")
    assert "curb-late" not in holder_receipts.wait("done")
    assert worker_inbox.quiet() == [] and holder_inbox.messages == [job]
