"""The console page in a real headless Chromium (Debian's `chromium`), driven over the
Chrome DevTools Protocol with the `websockets` client: it shows the ready count pushed
live while a stomp.py producer sends, publishes from its box to a stomp.py consumer,
works under -users, and leaves a screenshot. Without Chromium the tests are skipped, and
say why (bin/test installs it where it may)."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from webrig import running, users_file
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.slow
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


class Page:
    """One tab of a headless Chromium, through the DevTools protocol."""

    def __init__(self, browser: ClientConnection, url: str):
        self.browser = browser
        self._ids = itertools.count(1)
        target = self.command("Target.createTarget", url=url)["targetId"]
        self.session = self.command("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def command(self, method: str, session: str | None = None, **params: Any) -> dict:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.browser.send(json.dumps(message))
        while True:
            answer = json.loads(self.browser.recv(timeout=30))
            if answer.get("id") == number:
                assert "error" not in answer, answer
                return answer["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.command(
            "Runtime.evaluate", self.session, expression=expression, returnByValue=True, awaitPromise=True
        )
        return result["result"].get("value")

    def text(self, element_id: str) -> str | None:
        return self.evaluate(f"document.getElementById({element_id!r})?.textContent")

    def screenshot(self, path: Path) -> None:
        data = self.command("Page.captureScreenshot", self.session, format="png")["data"]
        path.write_bytes(base64.b64decode(data))


@pytest.fixture
def chromium(tmp_path) -> Iterator[ClientConnection]:
    """A headless Chromium's DevTools connection; skipped, with the reason, without one."""
    path = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if path is None:
        pytest.skip("no Chromium: install Debian's chromium (apt-get install chromium) to run the console tests")
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [
            path,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1100,900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        active = profile / "DevToolsActivePort"
        assert wait_until(active.exists, timeout=30), "Chromium did not open its DevTools port"
        time.sleep(0.1)
        port, browser_path = active.read_text().split()[:2]
        with connect(f"ws://127.0.0.1:{port}{browser_path}", max_size=None) as browser:
            yield browser
    finally:
        process.terminate()
        process.wait(timeout=30)


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
