"""docs/guide.md's promise about SEND headers Curb does not act on ("The STOMP 1.2 subset"):
they come back unchanged on MESSAGE and change nothing about delivery, whatever other
brokers make of them (priority, persistence, other brokers' delays). The delay and expiry
headers Curb acts on are tested in tests/test_work_queue_e2e.py."""

import time

from curb.client import Client

NOW_MS = int(time.time() * 1000)
OTHER_BROKERS_HEADERS = {
    "priority": "9",
    "persistent": "false",
    "reply-to": "/queue/replies",
    "correlation-id": "order-17",
    "x-delay": "60000",
    "deliverAt": str(NOW_MS + 3_600_000),
}


def test_headers_curb_does_not_act_on_pass_through_and_change_nothing(curb_broker):
    broker = curb_broker()
    with Client("127.0.0.1", broker.port) as client:
        client.send(b"plain", headers={"priority": "0"}, receipt="r1")
        client.send(b"with headers", headers=OTHER_BROKERS_HEADERS, receipt="r2")
        client.wait_receipt("r2")
    broker.restart()  # persistent:false is kept all the same
    with Client("127.0.0.1", broker.port) as client:
        client.subscribe(prefetch=10)
        # Within seconds, where the delays asked for are a minute and an hour.
        first, second = client.receive(timeout=10), client.receive(timeout=10)
    assert first is not None and second is not None, "a message was held back or dropped"
    assert (first.body, second.body) == (b"plain", b"with headers"), "send order, not priority"
    assert second.headers.items() >= OTHER_BROKERS_HEADERS.items()
    assert first.headers["priority"] == "0"
