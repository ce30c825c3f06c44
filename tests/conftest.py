"""Shared fixtures for tests that run the real `curb` command and talk to it from outside.

- `curb_broker`: start `python -m curb` on a loopback port with its log in tmp_path.
- `curb_router`: start `python -m curb router` on a loopback port in front of such brokers.
- `stomp_conn`: a connected stomp.py `Connection12` plus an `Inbox` of what it received.
- `raw`: a plain socket for bytes no well-behaved client would send, read back through
  curb's own frame parser.
- `chromium`: a headless Chromium's DevTools connection, for the console tests (their
  tab is tests/browser.py's `Page`); skipped without one.
- `free_port`, `wait_until`, `run_curb`: the plain helpers below, as fixtures, since test
  modules cannot import this file by name (tests/spark has a conftest.py of its own).

Every helper waits for a condition with a deadline instead of sleeping a fixed time, and
every process and connection a test opens is closed when the test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import pytest
import stomp
from websockets.sync.client import ClientConnection, connect

from curb.frame import Frame, FrameParser, ProtocolError, encode
from curb.spawn import BrokerProcess, StartError

STARTUP_S = 15.0
WAIT_S = 10.0
QUIET_S = 0.3
CURB = [sys.executable, "-m", "curb"]
# The real processes a test started (brokers, routers), named: when the test fails, each
# one's stderr goes into its report, since its files go with the test's temporary directory.
PROCESSES = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for name, output in item.stash.get(PROCESSES, []):
            report.sections.append((f"stderr of {name}", output() or "(nothing)"))
    return report


def _watch(request: pytest.FixtureRequest, name: str, output: Callable[[], str]) -> None:
    request.node.stash.setdefault(PROCESSES, []).append((name, output))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float = WAIT_S, interval: float = 0.01) -> bool:
    """Poll `condition` until it is true or `timeout` seconds pass; returns its last truth."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(interval)
    return True


def run_curb(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = STARTUP_S
) -> subprocess.CompletedProcess[str]:
    """Run a `curb` command that is expected to exit by itself (usage errors, --help)."""
    return subprocess.run([*CURB, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[..., int]:
    return free_port


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., bool]:
    return wait_until


@pytest.fixture(name="run_curb")
def run_curb_fixture(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_curb(*args, cwd=tmp_path, env=None, timeout=15)`."""

    def run(*args: str, cwd: Path = tmp_path, **kwargs) -> subprocess.CompletedProcess[str]:
        return run_curb(*args, cwd=cwd, **kwargs)

    return run


class Broker:
    """One real `curb` process, started at construction and ready to accept connections.

    `file=None` passes no -file flag, so the broker picks its default log file; `.file` then
    names that default ($STATE_DIRECTORY/curb.log or ./curb.log). An `addr` with port 0 lets
    the kernel pick the port; `.port` is read from the broker's `listening on` line and
    `restart()` reuses it. Everything the process writes to stderr, across restarts, is kept
    in a file next to the log and returned by `stderr_text()`. Started and watched by
    `curb.spawn.BrokerProcess`, as Spark's local mode and the benchmark start theirs.
    """

    def __init__(
        self,
        cwd: Path,
        *,
        cap: str = "10MiB",
        addr: str = "127.0.0.1:0",
        file: Path | str | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        self.cwd = Path(cwd)
        self.cap = cap
        self.addr = addr
        self.extra_args = tuple(extra_args)
        self.env = env
        self.file_arg = None if file is None else str(file)
        state = (env if env is not None else os.environ).get("STATE_DIRECTORY")
        default = Path(state.split(":")[0]) / "curb.log" if state else self.cwd / "curb.log"
        self.file = default if file is None else self.cwd / file
        self.port = 0
        self._stderr_path = self._free_stderr_path()
        self.child = BrokerProcess(cwd=self.cwd, env=env, output=self._stderr_path, timeout=STARTUP_S)
        self.start()

    def _free_stderr_path(self) -> Path:
        n = 0
        while (path := self.cwd / f"curb-{n}.stderr").exists():
            n += 1
        path.touch()
        return path

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.process

    def argv(self) -> list[str]:
        return [*CURB, *self.flags()]

    def flags(self) -> list[str]:
        host, _, port = self.addr.rpartition(":")
        addr = f"{host}:{self.port}" if port == "0" and self.port else self.addr
        file = ["-file", self.file_arg] if self.file_arg is not None else []
        return ["-cap", self.cap, "-addr", addr, *file, *self.extra_args]

    def start(self) -> None:
        """Start the process and wait for its `listening on` line (fail with its stderr)."""
        try:
            port = self.child.start(self.flags())
        except StartError as err:
            pytest.fail(f"curb did not start listening: {err}")
        self.port = self.port or port

    def stderr_text(self) -> str:
        return self.child.output()

    def running(self) -> bool:
        return self.child.running()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STARTUP_S) -> int:
        """Signal the process (SIGTERM: drain and exit) and return its exit code."""
        return self.child.stop(sig, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to sync or say goodbye."""
        self.child.kill()

    def restart(self) -> None:
        """Stop cleanly (if still running) and start again on the same file and port."""
        if self.running():
            self.stop()
        self.start()


@pytest.fixture
def curb_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Broker]]:
    """Factory: `curb_broker(cap="10MiB", extra_args=(), file=None, addr="127.0.0.1:0",
    env=None, cwd=None, default_file=False)` starts a broker (see Broker) with cwd tmp_path
    and its log at cwd/curb.log, or at `file` (relative to cwd), or, with default_file=True,
    wherever the broker puts it without a -file flag. Every broker it started is killed at
    the end of the test."""
    brokers: list[Broker] = []

    def start(
        cap: str = "10MiB",
        extra_args: Sequence[str] = (),
        file: Path | str | None = None,
        addr: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        default_file: bool = False,
    ) -> Broker:
        broker = Broker(
            cwd or tmp_path,
            cap=cap,
            addr=addr,
            file=None if default_file else file or "curb.log",
            extra_args=extra_args,
            env=env,
        )
        brokers.append(broker)
        _watch(request, f"broker {len(brokers)} (port {broker.port})", broker.stderr_text)
        return broker

    yield start
    for broker in brokers:
        broker.kill()


class RouterProcess:
    """One real `curb router` process in front of instances, started at construction.

    `routes` are `-route` values; `extra_args` any other flags. Like Broker, it is run by
    `curb.spawn.BrokerProcess` (a router prints the same `listening on` line); `restart()`
    keeps its port."""

    def __init__(self, cwd: Path, routes: Sequence[str], extra_args: Sequence[str] = ()):
        self.routes = list(routes)
        self.extra_args = tuple(extra_args)
        self.port = 0
        self.child = BrokerProcess(cwd=cwd, timeout=STARTUP_S)
        self.start()

    def flags(self) -> list[str]:
        route_flags = [flag for route in self.routes for flag in ("-route", route)]
        return ["router", "-addr", f"127.0.0.1:{self.port}", *route_flags, *self.extra_args]

    def start(self) -> None:
        try:
            self.port = self.child.start(self.flags())
        except StartError as err:
            pytest.fail(f"curb router did not start listening: {err}")

    def stderr_text(self) -> str:
        return self.child.output()

    def kill(self) -> None:
        self.child.kill()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return self.child.stop(sig)


@pytest.fixture
def curb_router(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., RouterProcess]]:
    """Factory: `curb_router(routes, extra_args=())` starts a router (see RouterProcess);
    each is killed at the end of the test."""
    routers: list[RouterProcess] = []

    def start(routes: Sequence[str], extra_args: Sequence[str] = ()) -> RouterProcess:
        router = RouterProcess(tmp_path, routes, extra_args)
        routers.append(router)
        _watch(request, f"router {len(routers)} (port {router.port})", router.stderr_text)
        return router

    yield start
    for router in routers:
        router.kill()


@pytest.fixture
def broker(curb_broker) -> Broker:
    """A broker with the default settings and a 10 MiB cap."""
    return curb_broker()


class Inbox(stomp.ConnectionListener):
    """Everything one stomp.py connection received, and waits on it.

    Waits raise AssertionError naming what did not arrive, with what did.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.connected: stomp.utils.Frame | None = None
        self.messages: list[stomp.utils.Frame] = []
        self.receipts: list[str] = []
        self.errors: list[stomp.utils.Frame] = []
        self.disconnected = False

    def _record(self, update: Callable[[], None]) -> None:
        with self._changed:
            update()
            self._changed.notify_all()

    def on_connected(self, frame) -> None:
        self._record(lambda: setattr(self, "connected", frame))

    def on_message(self, frame) -> None:
        self._record(lambda: self.messages.append(frame))

    def on_receipt(self, frame) -> None:
        self._record(lambda: self.receipts.append(frame.headers["receipt-id"]))

    def on_error(self, frame) -> None:
        self._record(lambda: self.errors.append(frame))

    def on_disconnected(self) -> None:
        self._record(lambda: setattr(self, "disconnected", True))

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout):
                raise AssertionError(
                    f"waited {timeout}s for {what}; got {len(self.messages)} messages, "
                    f"receipts {self.receipts}, errors {[e.headers for e in self.errors]}, "
                    f"disconnected={self.disconnected}"
                )

    def wait_connected(self, timeout: float = WAIT_S) -> stomp.utils.Frame:
        self._wait(lambda: self.connected is not None, "CONNECTED", timeout)
        return self.connected

    def wait_messages(self, count: int, timeout: float = WAIT_S) -> list[stomp.utils.Frame]:
        """Wait until at least `count` MESSAGEs arrived; returns all of them so far."""
        self._wait(lambda: len(self.messages) >= count, f"{count} messages", timeout)
        return list(self.messages)

    def wait_receipt(self, receipt_id: str, timeout: float = WAIT_S) -> None:
        self._wait(lambda: receipt_id in self.receipts, f"RECEIPT {receipt_id!r}", timeout)

    def wait_error(self, timeout: float = WAIT_S) -> stomp.utils.Frame:
        self._wait(lambda: bool(self.errors), "an ERROR frame", timeout)
        return self.errors[0]

    def wait_disconnected(self, timeout: float = WAIT_S) -> None:
        self._wait(lambda: self.disconnected, "the connection to close", timeout)

    def wait_for(self, condition: Callable[[Inbox], bool], what: str, timeout: float = WAIT_S) -> None:
        """Wait until `condition(inbox)` holds, e.g. for a message with certain content."""
        self._wait(lambda: condition(self), what, timeout)

    def quiet(self, seconds: float = QUIET_S) -> list[stomp.utils.Frame]:
        """Give the broker a moment to send what it should not; returns the messages by then.

        Only for proving that nothing MORE arrives: a wait for absence needs a window."""
        time.sleep(seconds)
        with self._changed:
            return list(self.messages)


@pytest.fixture
def stomp_conn() -> Iterator[Callable[..., tuple[stomp.Connection12, Inbox]]]:
    """Factory: `stomp_conn(port, heartbeats=(0, 0), connect=True, **connection_kwargs)`
    returns a stomp.py Connection12 (CONNECTED already received unless connect=False) and
    its Inbox. Pass auto_decode=False to get bodies as bytes. Closed at the end of the test."""
    conns: list[stomp.Connection12] = []

    def open_conn(
        port: int, heartbeats: tuple[int, int] = (0, 0), connect: bool = True, host: str = "127.0.0.1", **kwargs
    ) -> tuple[stomp.Connection12, Inbox]:
        conn = stomp.Connection12([(host, port)], heartbeats=heartbeats, reconnect_attempts_max=1, **kwargs)
        inbox = Inbox()
        conn.set_listener("inbox", inbox)
        conns.append(conn)
        if connect:
            conn.connect()
            inbox.wait_connected()
        return conn, inbox

    yield open_conn
    for conn in conns:
        if conn.is_connected():
            try:
                conn.disconnect()
            except stomp.exception.NotConnectedException:
                continue  # the broker closed it (after an ERROR) while stomp.py still said connected
            wait_until(lambda: not conn.is_connected())  # noqa: B023 (called before the loop moves on)
        conn.transport.disconnect_socket()


class RawClient:
    """A plain TCP connection: send any bytes, read frames back with curb's FrameParser."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser()
        self.frames: deque[Frame] = deque()
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send(encode(command, headers or {}, body))

    def connect(self, **headers: str) -> Frame:
        """CONNECT with accept-version 1.2 (plus `headers`, '_' read as '-'); returns CONNECTED."""
        fields = {"accept-version": "1.2", "host": "localhost"}
        fields.update({name.replace("_", "-"): value for name, value in headers.items()})
        self.send_frame("CONNECT", fields)
        frame = self.read_frame()
        assert frame is not None and frame.command == "CONNECTED", f"no CONNECTED: {frame}"
        return frame

    def read_bytes(self, timeout: float = WAIT_S) -> bytes:
        """The next bytes received within `timeout` (b"" if none came or the peer closed).
        Complete frames among them are also kept for read_frame."""
        if self.eof:
            return b""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return b""
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return b""
        try:
            self.frames.extend(self.parser.feed(data))
        except ProtocolError as err:
            raise AssertionError(f"the broker sent bad STOMP ({err}): {data!r}") from None
        return data

    def read_frame(self, timeout: float = WAIT_S) -> Frame | None:
        """The next frame, or None if none came within `timeout` or the broker closed."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                return None
            self.read_bytes(left)
        return self.frames.popleft()

    def closed(self, timeout: float = WAIT_S) -> bool:
        """True once the broker closed the connection (frames before the close are kept)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.read_bytes(left)
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawClient]]:
    """Factory: `raw(port, host="127.0.0.1")` opens a RawClient; closed at the end of the test."""
    clients: list[RawClient] = []

    def open_raw(port: int, host: str = "127.0.0.1") -> RawClient:
        client = RawClient(port, host)
        clients.append(client)
        return client

    yield open_raw
    for client in clients:
        client.close()


# The headless browsers the console tests drive (tests/browser.py), the first found.
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


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
