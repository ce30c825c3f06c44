"""Curb brokers the benchmark runs itself (loopback, a file in its own directory), and
the resident memory of any broker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

from curb.bench.wire import BrokerError, Connection, Target

PROBE_INTERVAL_SECONDS = 0.005
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
    port and file stay the same across restarts."""

    def __init__(self, path: str, cap: str, timeout: float, extra_args: tuple[str, ...] = ()):
        self.path = path
        self.cap = cap
        self.timeout = timeout
        self.extra_args = extra_args
        self.target = Target("127.0.0.1", free_port())
        self._process: subprocess.Popen | None = None
        self._log: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._log_reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def start(self) -> float:
        """Start the broker and return the seconds from launch until a STOMP CONNECT got CONNECTED."""
        launched = time.monotonic()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "curb", "-cap", self.cap, "-addr", f"127.0.0.1:{self.target.port}",
             "-file", self.path, *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._log_reader = threading.Thread(target=self._keep_log, args=(self._process.stderr,), daemon=True)
        self._log_reader.start()
        while True:
            if self._process.poll() is not None:
                raise BrokerError(f"curb exited with status {self._process.returncode} while starting:\n"
                                  f"{self.log_tail()}")
            try:
                conn = Connection(self.target, self.timeout)
            except ConnectionRefusedError:
                if time.monotonic() - launched > self.timeout:
                    self.kill()
                    raise BrokerError(f"curb did not accept connections within {self.timeout:g} s:\n"
                                      f"{self.log_tail()}") from None
                time.sleep(PROBE_INTERVAL_SECONDS)
                continue
            connected = time.monotonic()
            conn.close()
            return connected - launched

    def stop(self) -> None:
        """SIGTERM, and insist on a clean exit (status 0) within the timeout."""
        process = self._process
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerError(f"curb did not exit within {self.timeout:g} s of SIGTERM:\n{self.log_tail()}") from None
        self._finish()
        if status != 0:
            raise BrokerError(f"curb exited with status {status} after SIGTERM:\n{self.log_tail()}")

    def kill(self) -> None:
        """Make sure the broker is gone (used when the benchmark itself fails)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._finish()

    def _finish(self) -> None:
        if self._log_reader is not None:
            self._log_reader.join()
        self._process = self._log_reader = None

    def _keep_log(self, stream) -> None:
        for line in stream:
            self._log.append(line.rstrip("\n"))
        stream.close()

    def log_tail(self) -> str:
        return "\n".join(self._log) or "(no output)"
