"""The console page in a real headless Chromium (Debian's `chromium`), driven over the
Chrome DevTools Protocol with the `websockets` client: it shows the ready count pushed
live while a stomp.py producer sends, publishes from its box to a stomp.py consumer,
works under -users, and leaves a screenshot. Without Chromium the tests are skipped, and
say why (bin/test installs it where it may)."""

from __future__ import annotations

import datetime
import time
import zlib
from pathlib import Path

import pytest
from browser import Page
from conftest import wait_until
from webrig import running, users_file

from curb.redelivery import Redelivery

pytestmark = pytest.mark.slow


def test_the_console_shows_pushed_counts_and_publishes_to_a_stomp_consumer(chromium, stomp_conn, tmp_path):
    with running(tmp_path) as web:
        page = Page(chromium, f"{web.base}/")
        assert wait_until(lambda: page.text("status") == "live", timeout=20), page.text("status")
        assert page.text("rdy") == "0"
        producer, inbox = stomp_conn(web.stomp_port)
        for i in range(5):
            producer.send("/queue/curb", f"job {i}", receipt=f"r{i}")
        inbox.wait_receipt("r4")
        assert wait_until(lambda: page.text("rdy") == "5", timeout=10), page.text("rdy")  # pushed, not asked for
        page.evaluate("document.getElementById('browse').click()")  # the first messages, browsed over /ws
        rows = "[...document.querySelectorAll('#messages tbody tr')].map(r => r.cells[2].textContent).join(',')"
        assert wait_until(lambda: page.evaluate(rows) == "job 0,job 1,job 2,job 3,job 4"), page.evaluate(rows)

        consumer, got = stomp_conn(web.stomp_port)
        consumer.subscribe("/queue/curb", id="c", ack="client-individual")
        got.wait_messages(5)
        page.evaluate(
            "document.querySelector('#publish textarea').value = 'from the console';"
            "document.getElementById('send').click()"
        )
        [*_, mine] = got.wait_messages(6)
        assert mine.body == "from the console" and mine.headers["content-type"] == "text/plain"
        assert wait_until(lambda: (page.text("published") or "").startswith("stored"), timeout=10)
        # the consumer is listed with its prefetch and the six messages it holds
        assert wait_until(
            lambda: (
                "6"
                in (
                    page.evaluate(
                        "[...document.querySelectorAll('#clients tbody tr')].map(r => r.cells[3].textContent).join(' ')"
                    )
                    or ""
                )
            )
        )
        page.screenshot(tmp_path / "console.png")
        assert (tmp_path / "console.png").read_bytes().startswith(b"\x89PNG")


def test_the_console_logs_in_under_users_and_a_page_from_elsewhere_is_refused(chromium, tmp_path):
    path = users_file(tmp_path, alice="send,consume,count")
    with running(tmp_path, users_path=path) as web:
        page = Page(chromium, f"{web.base}/")
        assert wait_until(lambda: page.text("status") == "log in", timeout=20), page.text("status")
        time.sleep(0.5)  # what the page does before anyone logs in counts no refused login
        assert web.instance.metrics.access_refused == 0
        page.evaluate(
            "const f = document.getElementById('login'); f.login.value = 'alice'; f.passcode.value = 'correct horse';"
            "f.requestSubmit()"
        )
        assert wait_until(lambda: page.text("status") == "live", timeout=20), page.text("status")
        page.evaluate(
            "document.querySelector('#publish textarea').value = 'hi'; document.getElementById('send').click()"
        )
        assert wait_until(lambda: page.text("rdy") == "1", timeout=10)
        # a page of another origin opening the live feed with the same browser is refused
        other = Page(chromium, "about:blank")
        status = other.evaluate(
            f"new Promise(done => {{ const ws = new WebSocket('ws://127.0.0.1:{web.http_port}/console/live');"
            "ws.onopen = () => done('open'); ws.onerror = () => done('refused'); })"
        )
        assert status == "refused"  # about:blank's origin is not the broker's


def test_the_console_shows_every_state_charts_rates_lists_dead_letters_and_redrives_them(
    chromium, stomp_conn, tmp_path
):
    with running(tmp_path, redelivery=Redelivery(delay_ms=0, max_deliveries=1)) as web:
        page = Page(chromium, f"{web.base}/")
        assert wait_until(lambda: page.text("status") == "live", timeout=20), page.text("status")
        producer, inbox = stomp_conn(web.stomp_port)
        for i in range(3):
            producer.send("/queue/curb", f"poison {i}", receipt=f"p{i}")
        producer.send("/queue/curb", "later", headers={"curb-delay": "3600000", "receipt": "d"})
        inbox.wait_receipt("d")
        consumer, got = stomp_conn(web.stomp_port)
        consumer.subscribe("/queue/curb", id="c", ack="client-individual")
        for message in got.wait_messages(3):
            consumer.nack(message.headers["message-id"], "c")  # past -max-deliveries 1: dead letters
        assert wait_until(lambda: page.text("dead") == "3", timeout=10), page.text("dead")
        assert page.text("delayed") == "1" and "MiB" in (page.text("log-use") or "")
        page.evaluate("document.getElementById('browse-dead').click()")
        rows = (
            "[...document.querySelectorAll('#dead-letters tbody tr')]"
            ".map(r => [...r.cells].map(c => c.textContent).join('|')).join(',')"
        )
        want = ",".join(f"{i + 1}|max-deliveries|1|poison {i}|Delete" for i in range(3))
        assert wait_until(lambda: page.evaluate(rows) == want), page.evaluate(rows)
        page.evaluate("document.querySelectorAll('#dead-letters .delete')[1].click()")  # the second, for good
        assert wait_until(lambda: page.text("redriven") == "2 deleted"), page.text("redriven")
        want = ",".join(f"{i + 1}|max-deliveries|1|poison {i}|Delete" for i in (0, 2))
        assert wait_until(lambda: page.evaluate(rows) == want and page.text("dead") == "2"), page.evaluate(rows)
        drawn = (
            "(() => { const d = document.getElementById('chart').getContext('2d').getImageData(0, 0, 900, 180).data;"
            " let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n; })()"
        )
        assert wait_until(lambda: page.evaluate(drawn) > 100)  # the rates' lines are drawn
        consumer.unsubscribe("c")
        page.evaluate("document.getElementById('redrive').click()")
        assert wait_until(lambda: page.text("redriven") == "2 moved back to the queue"), page.text("redriven")
        assert wait_until(lambda: page.text("dead") == "0" and page.text("rdy") == "2", timeout=10)
        # the queue's next messages, and the delayed one apart, with its due time, an hour ahead
        page.evaluate("document.getElementById('browse').click()")
        ready = "[...document.querySelectorAll('#messages tbody tr')].map(r => r.cells[2].textContent).join(',')"
        assert wait_until(lambda: page.evaluate(ready) == "poison 0,poison 2"), page.evaluate(ready)
        delayed = (
            "[...document.querySelectorAll('#delayed-messages tbody tr')]"
            ".map(r => r.cells[0].textContent + '|' + r.cells[3].textContent).join(',')"
        )
        assert wait_until(lambda: page.evaluate(delayed) == "4|later"), page.evaluate(delayed)
        due = page.evaluate("document.querySelector('#delayed-messages tbody tr').cells[1].textContent")
        due_at = datetime.datetime.strptime(due, "%Y-%m-%d %H:%M:%SZ").replace(tzinfo=datetime.UTC)
        assert abs(due_at.timestamp() - (time.time() + 3600)) < 120, due
        # each panel renders: a screenshot of every section holds more than a blank area
        boxes = page.evaluate(
            "[...document.querySelectorAll('main section:not([hidden])')]"
            ".map(s => { const r = s.getBoundingClientRect();"
            " return {x: r.x, y: r.y + window.scrollY, width: r.width, height: r.height}; })"
        )
        assert len(boxes) == 7
        for n, box in enumerate(boxes):
            shot = tmp_path / f"panel-{n}.png"
            page.screenshot(shot, box)
            assert drawn_on(shot), n


def drawn_on(png: Path) -> bool:
    """Whether a screenshot shows more than one flat colour: its pixel rows (PNG's
    IDAT, inflated) hold many distinct byte values, where a blank area holds a few."""
    data, chunks, at = png.read_bytes(), [], 8
    assert data.startswith(b"\x89PNG")
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        if data[at + 4 : at + 8] == b"IDAT":
            chunks.append(data[at + 8 : at + 8 + size])
        at += 12 + size
    return len(set(zlib.decompress(b"".join(chunks)))) > 16
