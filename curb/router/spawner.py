"""The router's operator (-spawn DIR): a Curb instance per destination that no route names.

Each instance is `python -m curb` started through `curb.spawn.BrokerProcess` (off the
event loop, since it waits for the `listening on` line) on 127.0.0.1 with a port the
kernel picks, its log at DIR/NAME.log and its stderr at DIR/NAME.stderr, with the cap
-spawn-cap. A watch every WATCH_SECONDS restarts one that died, on the same port and file.
At start-up the destinations of the logs already in DIR are spawned again, so their
messages are served before anyone names them. Children are asked to get SIGTERM when the
router dies (PR_SET_PDEATHSIG), so a router killed with SIGKILL leaves no instance
holding a log's lock. At most -spawn-max instances; past that a new name is refused.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
from collections.abc import Callable
from pathlib import Path

from curb.router import routes as routing
from curb.spawn import BrokerProcess, StartError

WATCH_SECONDS = 1.0
PR_SET_PDEATHSIG = 1
INSTANCE_HEARTBEAT = "1s"  # short, so that the router notices a lost instance soon


def _die_with_parent() -> None:
    """In the child, before curb runs: SIGTERM when the router goes."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Spawner:
    """Spawned instances by destination name; `on_ready(name, port)` once one listens."""

    def __init__(
        self,
        directory: Path,
        cap: str,
        most: int,
        extra_args: tuple[str, ...],
        on_ready: Callable[[str, int], None],
        events: Callable[..., None],
    ):
        self.directory = directory
        self.cap = cap
        self.most = most
        self.extra_args = extra_args
        self.on_ready = on_ready
        self.events = events
        self.children: dict[str, BrokerProcess] = {}
        self.ports: dict[str, int] = {}
        self._starting: set[str] = set()
        self._loop = asyncio.get_running_loop()
        self._watch: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Spawn the destinations whose logs are in the directory, and start watching."""
        for log in sorted(self.directory.glob("*.log")):
            name = log.stem
            if routing.SPAWN_NAME.fullmatch(name):
                self.want(name)
        self._watch = self._loop.call_later(WATCH_SECONDS, self._check)

    def want(self, name: str) -> bool:
        """Spawn an instance for `name` unless there is one; False past -spawn-max."""
        if name in self.children:
            return True
        if len(self.children) >= self.most:
            self.events(
                "spawn_refused",
                f"not spawning an instance for {name!r}: -spawn-max {self.most} reached",
                dest=name,
            )
            return False
        self.children[name] = BrokerProcess(
            cwd=self.directory, output=self.directory / f"{name}.stderr", preexec_fn=_die_with_parent
        )
        self._run(name)
        return True

    def _flags(self, name: str) -> list[str]:
        port = self.ports.get(name, 0)
        return [
            "-addr",
            f"127.0.0.1:{port}",
            "-file",
            str(self.directory / f"{name}.log"),
            "-cap",
            self.cap,
            "-heartbeat",
            INSTANCE_HEARTBEAT,
            *self.extra_args,
        ]

    def _run(self, name: str) -> None:
        """Start (or restart) the instance off the loop; route to it once it listens."""
        child = self.children[name]
        self._starting.add(name)
        task = self._loop.run_in_executor(None, child.start, self._flags(name))
        task.add_done_callback(lambda done: self._started(name, child, done))

    def _started(self, name: str, child: BrokerProcess, done: asyncio.Future[int]) -> None:
        self._starting.discard(name)
        try:
            port = done.result()
        except StartError as err:
            self.events("spawn_failed", f"cannot spawn an instance for {name!r}: {err}", dest=name)
            return
        first = name not in self.ports
        self.ports[name] = port
        self.events(
            "spawned",
            f"{'spawned' if first else 'restarted'} an instance for {name!r} (pid {child.pid}) on 127.0.0.1:{port}, "
            f"log {self.directory / (name + '.log')}",
            dest=name,
            pid=child.pid,
            port=port,
        )
        if first:
            self.on_ready(name, port)

    def _check(self) -> None:
        """Restart what died (or never came up)."""
        for name, child in self.children.items():
            if name not in self._starting and not child.running():
                self.events("spawn_died", f"the instance for {name!r} is not running; starting it again", dest=name)
                self._run(name)
        self._watch = self._loop.call_later(WATCH_SECONDS, self._check)

    def stop(self) -> None:
        """SIGTERM every instance (they drain and exit) and stop watching."""
        if self._watch is not None:
            self._watch.cancel()
        for child in self.children.values():
            if child.running():
                child.process.terminate()
