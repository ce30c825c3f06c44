"""An in-process broker with its web front for the web tests: an Instance on an event loop
in a thread, so that the tests drive it with blocking clients (urllib, curb.client,
websockets' sync client) as a user would, and read its state between steps."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from curb import users
from curb.instance import Config, Instance

PASSWORD = "correct horse"


@dataclass
class Web:
    """A running instance: its STOMP and HTTP ports, and the instance (read it with `call`)."""

    instance: Instance
    loop: asyncio.AbstractEventLoop
    stomp_port: int
    http_port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def call(self, function):
        """Run `function()` on the broker's loop and return what it returns."""

        async def run():
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def gauges(self) -> dict[str, int]:
        return self.call(self.instance.broker.gauges)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    json: dict = field(default_factory=dict)


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30
) -> Answer:
    """One request; every status is an Answer (JSON bodies parsed into `json`)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, got, data = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        status, got, data = err.code, dict(err.headers), err.read()
    parsed = json.loads(data) if got.get("Content-Type", "").startswith("application/json") else {}
    return Answer(status, got, data, parsed)


def basic(name: str, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def users_file(where: Path, **people: str) -> str:
    """A users file with these users (name=comma-separated permissions), all with PASSWORD."""
    path = where / "users"
    path.write_text(
        users.format_users(
            users.User(name, users.hash_password(PASSWORD, n=1 << 4), frozenset(perms.split(",")))
            for name, perms in people.items()
        )
    )
    return str(path)


@contextmanager
def running(tmp_path: Path, **settings) -> Iterator[Web]:
    """A broker (Config defaults, STOMP and HTTP on loopback ports) until the block ends;
    `events=` takes its event lines (curb.instance's events callback)."""
    events = settings.pop("events", None)
    config = Config(
        path=str(tmp_path / "q.log"),
        cap=settings.pop("cap", 8 << 20),
        addr=("127.0.0.1", 0),
        http=("127.0.0.1", 0),
        heartbeat_ms=settings.pop("heartbeat_ms", 0),
        **settings,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    instance = Instance(config) if events is None else Instance(config, events)
    try:
        asyncio.run_coroutine_threadsafe(instance.start(), loop).result(timeout=30)
        assert instance.http_address is not None
        yield Web(instance, loop, instance.addresses[0][1], instance.http_address[1])
    finally:
        if hasattr(instance, "broker"):
            asyncio.run_coroutine_threadsafe(instance.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
