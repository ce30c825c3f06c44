"""Curb brokers the benchmark runs itself (loopback, a file in its own directory), and
the resident memory of any broker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from benchmark.target import BrokerError, Target, close
from curb.spawn import BrokerProcess, StartError

LOG_TAIL_LINES = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process now (VmRSS in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise BrokerError(f"process {pid} has no VmRSS (has it exited?)")


class CurbBroker:
    """`curb -cap CAP -addr 127.0.0.1:PORT -file PATH`, started and stopped on demand; the
    port and file stay the same across restarts. `interpreter` runs `-m curb` (default:
    this Python; the instruction count runs it under callgrind)."""

    def __init__(
        self,
        path: str,
        cap: str,
        timeout: float,
        extra_args: tuple[str, ...] = (),
        interpreter: tuple[str, ...] = (sys.executable,),
    ):
        self.path = path
        self.cap = cap
        self.timeout = timeout
        self.extra_args = extra_args
        self.target = Target("127.0.0.1", free_port())
        self._child = BrokerProcess(timeout=timeout, interpreter=interpreter)
        self._started = False

    @property
    def pid(self) -> int:
        return self._child.pid

    def start(self) -> float:
        """Start the broker and return the seconds from launch until a STOMP CONNECT got CONNECTED."""
        launched = time.monotonic()
        self._started = True
        try:
            self._child.start(
                ["-cap", self.cap, "-addr", f"127.0.0.1:{self.target.port}", "-file", self.path, *self.extra_args]
            )
        except StartError as err:
            raise BrokerError(str(err)) from None
        close(self.target.connect(self.timeout)[0])
        return time.monotonic() - launched

    def stop(self) -> None:
        """SIGTERM, and insist on a clean exit (status 0) within the timeout."""
        if not self._started:
            return
        self._started = False
        try:
            status = self._child.stop(signal.SIGTERM, self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerError(f"curb did not exit within {self.timeout:g} s of SIGTERM:\n{self.log_tail()}") from None
        if status != 0:
            raise BrokerError(f"curb exited with status {status} after SIGTERM:\n{self.log_tail()}")

    def kill(self) -> None:
        """Make sure the broker is gone (used when the benchmark itself fails)."""
        self._child.kill()

    def log_tail(self) -> str:
        return "\n".join(self._child.output().splitlines()[-LOG_TAIL_LINES:]) or "(no output)"


class RoutedCurb:
    """A Curb instance behind `curb router` (route `bench`, the benchmark's destination),
    each a child process; the one `measured` ("router" or "instance") runs under
    `interpreter`, the other under this Python. `pid` is the measured one's."""

    def __init__(
        self,
        path: str,
        cap: str,
        timeout: float,
        extra_args: tuple[str, ...],
        interpreter: tuple[str, ...],
        measured: str,
    ):
        plain = (sys.executable,)
        self.measured = measured
        self.timeout = timeout
        self.instance = CurbBroker(path, cap, timeout, extra_args, interpreter if measured == "instance" else plain)
        self.target = Target("127.0.0.1", free_port())
        self._router = BrokerProcess(timeout=timeout, interpreter=interpreter if measured == "router" else plain)

    @property
    def pid(self) -> int:
        return self._router.pid if self.measured == "router" else self.instance.pid

    def start(self) -> None:
        self.instance.start()
        route = f"bench=127.0.0.1:{self.instance.target.port}"
        try:
            self._router.start(["router", "-addr", f"127.0.0.1:{self.target.port}", "-route", route])
        except StartError as err:
            self.instance.kill()
            raise BrokerError(str(err)) from None
        close(self.target.connect(self.timeout)[0])

    def stop(self) -> None:
        """SIGTERM to the router, then to the instance; each must exit cleanly."""
        try:
            status = self._router.stop(signal.SIGTERM, self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerError(f"curb router did not exit within {self.timeout:g} s of SIGTERM") from None
        if status != 0:
            self.instance.kill()
            raise BrokerError(f"curb router exited with status {status} after SIGTERM")
        self.instance.stop()

    def kill(self) -> None:
        self._router.kill()
        self.instance.kill()
