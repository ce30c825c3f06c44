"""The console page of `curb router -http` in a real headless Chromium (tests/browser.py):
a routed destination with its counts once messages are sent through the router, its
instance shown down once killed, a publish from the page's box landing on the
instance, and a destination's dead letters listed, one deleted and the rest redriven.
Without Chromium the tests are skipped, and say why."""

from __future__ import annotations

import pytest
from browser import Page
from conftest import wait_until
from test_router_web import WEB, http_port

from curb.client import Client

pytestmark = pytest.mark.slow
ROWS = (
    "[...document.querySelectorAll('#{} tbody tr')].map(r => [...r.cells].map(c => c.textContent).join('|')).join(',')"
)


def test_the_router_console_shows_destinations_instances_and_publishes(chromium, curb_broker, curb_router):
    instance, spare = curb_broker(extra_args=("-heartbeat", "1s")), curb_broker(file="spare.log")
    router = curb_router([f"orders=127.0.0.1:{instance.port}", f"audit=127.0.0.1:{spare.port}"], extra_args=WEB)
    page = Page(chromium, f"http://127.0.0.1:{http_port(router)}/")
    assert wait_until(lambda: page.text("status") == "live", timeout=20), page.text("status")
    with Client("127.0.0.1", router.port) as producer:
        for n in range(3):
            producer.send(b"order %d" % n, receipt=f"r{n}", destination="/queue/orders")
        producer.wait_receipt("r2")
    destinations = ROWS.format("destinations")
    # orders: 3 ready, nothing else, its one instance up, 3 sent
    assert wait_until(lambda: (page.evaluate(destinations) or "").startswith("orders|3|0|0|0|0|1 of 1|")), (
        page.evaluate(destinations)
    )
    assert "audit|0|0|0|0|0|1 of 1|" in page.evaluate(destinations)
    assert page.text("rdy") == "3" and page.evaluate("document.getElementById('log-box').hidden")

    # the publish box sends to the destination picked; it lands on that destination's instance
    page.evaluate(
        "const p = document.getElementById('destination'); p.value = 'orders'; p.dispatchEvent(new Event('change'));"
        "document.querySelector('#publish textarea').value = 'from the console';"
        "document.getElementById('send').click()"
    )
    assert wait_until(lambda: (page.text("published") or "").startswith("stored"), timeout=10), page.text("published")
    with Client("127.0.0.1", instance.port) as direct:
        assert [frame.body for frame in direct.browse()] == [b"order 0", b"order 1", b"order 2", b"from the console"]
    messages = "[...document.querySelectorAll('#messages tbody tr')].map(r => r.cells[2].textContent).join(',')"
    want = "order 0,order 1,order 2,from the console"
    assert wait_until(lambda: page.evaluate(messages) == want), page.evaluate(messages)  # browsed through the router

    with Client("127.0.0.1", router.port) as consumer:  # listed with its destination, prefetch and what it holds
        consumer.subscribe("s", destination="/queue/orders", prefetch=2, headers={"receipt": "s"})
        consumer.wait_receipt("s")
        clients = ROWS.format("clients")
        assert wait_until(lambda: "|orders: 2|2" in (page.evaluate(clients) or "")), page.evaluate(clients)

    instance.kill()
    instances = ROWS.format("instances")
    down = f"orders|127.0.0.1:{instance.port}|down|down|0|0|0|0"
    assert wait_until(lambda: down in (page.evaluate(instances) or ""), timeout=10), page.evaluate(instances)
    assert "orders|0|0|0|0|0|0 of 1|" in page.evaluate(destinations)


def test_the_router_console_lists_deletes_and_redrives_a_destinations_dead_letters(chromium, curb_broker, curb_router):
    """The dead-letter panel through the router: ./NAME/dead browsed with the router's
    ids, one deleted for good, the rest moved back by ./NAME/redrive."""
    instance = curb_broker(extra_args=("-max-deliveries", "1", "-redelivery-delay", "0"))
    router = curb_router([f"jobs=127.0.0.1:{instance.port}"], extra_args=WEB)
    page = Page(chromium, f"http://127.0.0.1:{http_port(router)}/")
    assert wait_until(lambda: page.text("status") == "live", timeout=20), page.text("status")
    with Client("127.0.0.1", router.port) as client:
        for n in range(3):
            client.send(b"poison %d" % n, receipt=f"p{n}", destination="/queue/jobs")
        client.wait_receipt("p2")
        client.subscribe("c", destination="/queue/jobs", ack="client-individual")
        ready: list = []
        for n in range(3):
            message = ready.pop(0) if ready else client.receive(10)
            assert message is not None and message.command == "MESSAGE"
            client.nack(message.headers["ack"], receipt=f"n{n}")  # past -max-deliveries 1: a dead letter
            ready += client.wait_receipt(f"n{n}")
        client.unsubscribe("c")
    page.evaluate(
        "const p = document.getElementById('destination'); p.value = 'jobs'; p.dispatchEvent(new Event('change'));"
    )
    assert wait_until(lambda: page.text("dead") == "3", timeout=10), page.text("dead")
    page.evaluate("document.getElementById('browse-dead').click()")
    rows = (
        "[...document.querySelectorAll('#dead-letters tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent).join('|')).join(',')"
    )
    ids = [(n + 1) << 12 for n in range(3)]  # the instance's ids 1 to 3, as the router numbers them
    want = ",".join(f"{ids[n]}|max-deliveries|1|poison {n}|Delete" for n in range(3))
    assert wait_until(lambda: page.evaluate(rows) == want), page.evaluate(rows)
    page.evaluate("document.querySelectorAll('#dead-letters .delete')[1].click()")  # the second, for good
    assert wait_until(lambda: page.text("redriven") == f"{ids[1]} deleted"), page.text("redriven")
    want = ",".join(f"{ids[n]}|max-deliveries|1|poison {n}|Delete" for n in (0, 2))
    assert wait_until(lambda: page.evaluate(rows) == want and page.text("dead") == "2"), page.evaluate(rows)
    page.evaluate("document.getElementById('redrive').click()")
    assert wait_until(lambda: page.text("redriven") == "2 moved back to the queue"), page.text("redriven")
    assert wait_until(lambda: page.text("dead") == "0" and page.text("rdy") == "2", timeout=10)
    with Client("127.0.0.1", instance.port) as direct:  # on the instance itself
        assert [frame.body for frame in direct.browse()] == [b"poison 0", b"poison 2"]
