"""One tab of a real headless Chromium, driven over the Chrome DevTools Protocol with the
`websockets` client: what the console tests (tests/test_web_console.py,
tests/test_router_console.py) read the page with. The browser itself is conftest's
`chromium` fixture."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection


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

    def screenshot(self, path: Path, clip: dict[str, float] | None = None) -> None:
        extra = {} if clip is None else {"clip": {**clip, "scale": 1}, "captureBeyondViewport": True}
        data = self.command("Page.captureScreenshot", self.session, format="png", **extra)["data"]
        path.write_bytes(base64.b64decode(data))
