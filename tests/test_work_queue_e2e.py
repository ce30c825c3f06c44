"""Delays, retries, the delivery limit, dead letters, redrive and expiry on a real broker,
seen from stomp.py: a poison message stops blocking the queue and lands in ./dead with
its reason and count; a consumer that crashes on a message counts; a redrive brings it
back with its count reset; delayed SENDs (curb-delay, AMQ_SCHEDULED_DELAY,
AMQ_SCHEDULED_TIME) come when due and not before, also after kill -9; expired messages
are never delivered; a NACK with curb-delay and the -redelivery-delay policy wait; the
operator sees it all in ./count and /stats. The rules as tables in memory:
tests/test_broker_policy.py."""

from __future__ import annotations

import json
import time

import stomp
from conftest import free_port, wait_until
from test_ack_deadline_e2e import connect, stats

QUEUE = "/queue/curb"


def send(stomp_conn, port: int, body: str, **headers: str) -> None:
    producer, inbox = stomp_conn(port)
    producer.send(QUEUE, body, headers={**headers, "receipt": "sent"})
    inbox.wait_receipt("sent")
    producer.disconnect()


def test_a_poison_message_becomes_a_dead_letter_and_the_queue_moves_on(curb_broker, stomp_conn):
    http_port = free_port()
    broker = curb_broker(
        extra_args=["-max-deliveries", "3", "-redelivery-delay", "0", "-http", f"127.0.0.1:{http_port}"]
    )
    for body in ["poison", "a", "b", "c"]:
        send(stomp_conn, broker.port, body)
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual", headers={"prefetch-count": "1"})
    for n in range(1, 4):
        poison = inbox.wait_messages(n)[-1]
        assert (poison.body, poison.headers["curb-deliveries"]) == ("poison", str(n))
        worker.nack(poison.headers["ack"])
    for n, body in enumerate(["a", "b", "c"], start=4):
        frame = inbox.wait_messages(n)[-1]
        assert (frame.body, frame.headers["curb-deliveries"]) == (body, "1")
        worker.ack(frame.headers["ack"])
    assert [f.body for f in inbox.quiet()] == ["poison"] * 3 + ["a", "b", "c"]

    reader, dead_inbox = stomp_conn(broker.port)
    reader.subscribe("./dead", id="d", ack="client-individual")
    [dead] = dead_inbox.wait_messages(1)
    assert (dead.body, dead.headers["curb-dead-reason"], dead.headers["curb-deliveries"]) == (
        "poison",
        "max-deliveries",
        "3",
    )
    counters = stats(http_port)
    assert (counters["dead"], counters["dead_lettered_max_deliveries"], counters["rdy"]) == (1, 1, 0)
    reader.ack(dead.headers["ack"], receipt="deleted")
    dead_inbox.wait_receipt("deleted")
    assert stats(http_port)["dead"] == 0


def test_a_consumer_that_crashes_on_a_message_counts_and_a_redrive_brings_it_back(curb_broker, stomp_conn):
    broker = curb_broker(extra_args=["-max-deliveries", "2"])
    send(stomp_conn, broker.port, "crashes its consumer")
    for n in (1, 2):
        crasher, inbox = stomp_conn(broker.port)
        crasher.subscribe(QUEUE, id="c", ack="client-individual")
        assert inbox.wait_messages(1)[0].headers["curb-deliveries"] == str(n)
        crasher.transport.disconnect_socket()  # no DISCONNECT: the process died
    admin, admin_inbox = stomp_conn(broker.port)
    admin.subscribe("./count", id="count")
    admin_inbox.wait_for(
        lambda inbox: any(json.loads(f.body)["dead"] == 1 for f in inbox.messages), "dead:1 in ./count"
    )
    moved = Receipts()
    admin.set_listener("moved", moved)
    admin.send("./redrive", "", headers={"receipt": "redriven"})
    admin_inbox.wait_receipt("redriven")
    assert wait_until(lambda: "redriven" in moved.headers)
    assert moved.headers["redriven"]["curb-moved"] == "1", "the RECEIPT says how many dead letters moved"
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    [back] = inbox.wait_messages(1)
    assert (back.body, back.headers["curb-deliveries"]) == ("crashes its consumer", "1"), "its count was reset"


def test_a_dead_letter_held_past_its_deadline_is_dead_again_and_a_late_ack_deletes_nothing(curb_broker, stomp_conn):
    http_port = free_port()
    broker = curb_broker(extra_args=["-max-deliveries", "1", "-http", f"127.0.0.1:{http_port}"])
    send(stomp_conn, broker.port, "poison")
    worker, worker_inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    [poison] = worker_inbox.wait_messages(1)
    worker.nack(poison.headers["ack"])  # past -max-deliveries 1: a dead letter

    hung, hung_inbox, hung_receipts = connect(stomp_conn, broker.port)
    hung.subscribe(
        "./dead", id="d", ack="client-individual", headers={"curb-ack-timeout": "300", "prefetch-count": "1"}
    )
    [stuck] = hung_inbox.wait_messages(1)
    reader, reader_inbox, reader_receipts = connect(stomp_conn, broker.port)
    reader.subscribe("./dead", id="d", ack="client-individual")
    [again] = reader_inbox.wait_messages(1)  # once the hung reader's 300 ms passed
    assert again.headers["message-id"] == stuck.headers["message-id"] == poison.headers["message-id"]
    assert (again.headers["curb-dead-reason"], again.headers["curb-deliveries"]) == ("max-deliveries", "1")
    assert worker_inbox.quiet() == [poison], "a dead letter never goes back to the queue"

    hung.ack(stuck.headers["ack"], receipt="late")
    assert hung_receipts.wait("late").get("curb-late") == "true"
    assert hung.is_connected() and not hung_inbox.errors
    counters = stats(http_port)
    assert (counters["dead"], counters["ack_timeouts"], counters["late_acks"]) == (1, 1, 1)
    reader.ack(again.headers["ack"], receipt="deleted")
    assert "curb-late" not in reader_receipts.wait("deleted")
    assert stats(http_port)["dead"] == 0


class Receipts(stomp.ConnectionListener):
    """The headers of each RECEIPT, by receipt-id."""

    def __init__(self) -> None:
        self.headers: dict[str, dict[str, str]] = {}

    def on_receipt(self, frame) -> None:
        self.headers[frame.headers["receipt-id"]] = frame.headers


class Arrivals(stomp.ConnectionListener):
    """The wall-clock ms each MESSAGE arrived at, by body."""

    def __init__(self) -> None:
        self.at: dict[str, int] = {}

    def on_message(self, frame) -> None:
        self.at[frame.body] = int(time.time() * 1000)


def test_delayed_sends_come_when_due_and_not_before_even_after_kill_9(curb_broker, stomp_conn):
    broker = curb_broker()
    now_ms = int(time.time() * 1000)
    send(stomp_conn, broker.port, "curb-delay", **{"curb-delay": "6000"})
    send(stomp_conn, broker.port, "AMQ_SCHEDULED_DELAY", AMQ_SCHEDULED_DELAY="6000")
    send(stomp_conn, broker.port, "AMQ_SCHEDULED_TIME", AMQ_SCHEDULED_TIME=str(now_ms + 6000))
    send(stomp_conn, broker.port, "at once")
    broker.kill()
    broker.start()
    worker, inbox = stomp_conn(broker.port)
    arrivals = Arrivals()
    worker.set_listener("arrivals", arrivals)
    worker.subscribe(QUEUE, id="w")
    delivered = inbox.wait_messages(4, timeout=30)
    assert delivered[0].body == "at once"
    assert sorted(f.body for f in delivered[1:]) == ["AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME", "curb-delay"]
    for body in ("curb-delay", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME"):
        assert arrivals.at[body] >= now_ms + 6000, f"{body} was delivered before its due time"


def test_an_expired_message_is_never_delivered_and_waits_in_dead(curb_broker, stomp_conn):
    broker = curb_broker()
    now_ms = int(time.time() * 1000)
    send(stomp_conn, broker.port, "expired", expires=str(now_ms - 1000))
    send(stomp_conn, broker.port, "short ttl", **{"curb-ttl": "200"})
    send(stomp_conn, broker.port, "fresh", **{"curb-ttl": "600000"})
    time.sleep(0.3)
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w")
    assert [f.body for f in inbox.wait_messages(1)] == ["fresh"]
    reader, dead_inbox = stomp_conn(broker.port)
    reader.subscribe("./dead", id="d", headers={"browser": "true"})
    browsed = dead_inbox.wait_messages(3)
    assert [(f.body, f.headers.get("curb-dead-reason")) for f in browsed] == [
        ("expired", "expired"),
        ("short ttl", "expired"),
        ("", None),  # the end marker
    ]
    assert [f.body for f in inbox.quiet()] == ["fresh"]


def test_a_nack_with_a_delay_and_the_default_backoff_wait(curb_broker, stomp_conn):
    broker = curb_broker(extra_args=["-redelivery-delay", "400ms", "-redelivery-multiplier", "2"])
    send(stomp_conn, broker.port, "job")
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    [job] = inbox.wait_messages(1)
    nacked = time.monotonic()
    worker.nack(job.headers["ack"], **{"curb-delay": "1200"})
    again = inbox.wait_messages(2, timeout=10)[-1]
    assert time.monotonic() - nacked >= 1.2
    worker.nack(again.headers["ack"])  # the policy: 400 ms times 2 for the two deliveries before
    nacked = time.monotonic()
    third = inbox.wait_messages(3, timeout=10)[-1]
    assert time.monotonic() - nacked >= 0.8
    assert third.headers["curb-deliveries"] == "3"


def test_a_bad_delay_is_an_error_that_says_what_the_header_takes(curb_broker, stomp_conn):
    broker = curb_broker()
    producer, inbox = stomp_conn(broker.port)
    producer.send(QUEUE, "x", headers={"curb-delay": "-1"})
    error = inbox.wait_error()
    assert error.headers["message"].startswith("bad curb-delay header")
    assert "0 to 2592000000" in error.body
    assert wait_until(lambda: not producer.is_connected())


def count_of(stomp_conn, port: int) -> dict[str, int]:
    """The queue's counts as ./count answers them now."""
    admin, inbox = stomp_conn(port)
    admin.subscribe("./count", id="count")
    [frame] = inbox.wait_messages(1)
    admin.disconnect()
    return json.loads(frame.body)


def test_a_redrive_after_a_restart_moves_the_dead_letters_compaction_copied(curb_broker, stomp_conn):
    """Dead letters found at start-up, copied forward by compaction past messages no one
    has read yet: the redrive moves every one of them, as ./count counts them. Every frame
    waits for its receipt, so that the broker sees them in one order."""
    broker = curb_broker(cap="64KiB", extra_args=["-max-deliveries", "1"])
    for n in range(5):
        send(stomp_conn, broker.port, f"dead-{n}")
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    for frame in inbox.wait_messages(5):
        worker.nack(frame.headers["ack"], receipt=f"nack-{frame.body}")
        inbox.wait_receipt(f"nack-{frame.body}")
    worker.disconnect()
    broker.restart()
    assert count_of(stomp_conn, broker.port)["dead"] == 5
    producer, sent = stomp_conn(broker.port)
    reader, lap = stomp_conn(broker.port)
    reader.subscribe(QUEUE, id="lap", ack="client-individual")
    for n in range(60):  # most of a lap of the ring, read and ACKed
        producer.send(QUEUE, "x" * 900, headers={"receipt": f"lap-{n}"})
        sent.wait_receipt(f"lap-{n}")
        frame = lap.wait_messages(n + 1)[-1]
        reader.ack(frame.headers["ack"], receipt=f"ack-{n}")
        lap.wait_receipt(f"ack-{n}")
    reader.disconnect()
    for n in range(8):  # unread: compaction copies the dead letters on, past these
        producer.send(QUEUE, "y" * 900, headers={"receipt": f"unread-{n}"})
        sent.wait_receipt(f"unread-{n}")
    moved = Receipts()
    producer.set_listener("moved", moved)
    producer.send("./redrive", "", headers={"receipt": "redriven"})
    sent.wait_receipt("redriven")
    assert wait_until(lambda: "redriven" in moved.headers)
    assert moved.headers["redriven"]["curb-moved"] == "5", "the RECEIPT says all five moved"
    assert count_of(stomp_conn, broker.port)["dead"] == 0, "the redrive left dead letters behind"
    consumer, got = stomp_conn(broker.port)
    consumer.subscribe(QUEUE, id="c", ack="client-individual")
    got.wait_for(lambda inbox: sum(f.body.startswith("dead-") for f in inbox.messages) == 5, "5 redriven messages")
    redriven = [f for f in got.messages if f.body.startswith("dead-")]
    assert sorted(f.body for f in redriven) == [f"dead-{n}" for n in range(5)]
    assert {f.headers["curb-deliveries"] for f in redriven} == {"1"}, "their counts were reset"


def test_a_send_curb_cannot_honour_is_an_error_and_nothing_is_stored(curb_broker, stomp_conn):
    http_port = free_port()
    broker = curb_broker(extra_args=["-http", f"127.0.0.1:{http_port}"])
    refused = {
        ("./Redrive", ()): "did you mean ./redrive?",
        ("/queue/redrive", ()): "did you mean ./redrive?",
        ("./dead", ()): "SEND to ./dead refused",
        ("./redrive", (("curb-delay", "60000"),)): "./redrive takes no curb-delay header",
        (QUEUE, (("AMQ_SCHEDULED_DELAY", "1000"), ("AMQ_SCHEDULED_PERIOD", "1000"), ("AMQ_SCHEDULED_REPEAT", "9"))): (
            "Curb does not repeat messages"
        ),
    }
    for (destination, headers), words in refused.items():
        producer, inbox = stomp_conn(broker.port)
        producer.send(destination, "", headers={**dict(headers), "receipt": "sent"})
        error = inbox.wait_error()
        assert words in error.headers["message"], error.headers
        assert error.body.strip(), "the body says what to do"
        inbox.wait_disconnected()
    counters = stats(http_port)
    assert (counters["rdy"], counters["delayed"], counters["sent"]) == (0, 0, 0), "nothing was stored"


def test_by_default_a_nacked_message_comes_back_after_a_second_not_at_once(curb_broker, stomp_conn):
    broker = curb_broker()
    send(stomp_conn, broker.port, "job")
    worker, inbox = stomp_conn(broker.port)
    worker.subscribe(QUEUE, id="w", ack="client-individual")
    [job] = inbox.wait_messages(1)
    nacked = time.monotonic()
    worker.nack(job.headers["ack"])
    again = inbox.wait_messages(2, timeout=10)[-1]
    assert time.monotonic() - nacked >= 1.0, "the default -redelivery-delay is a second"
    assert again.headers["curb-deliveries"] == "2"
