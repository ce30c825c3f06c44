"""Run a curb broker as a child process and learn where it listens from its start-up line.

Spark's local mode, the tests and the benchmark all start brokers this way. The broker
prints `curb: listening on HOST:PORT, ...` only once recovery is done and its port accepts
connections, so that one line is both the readiness signal and, for `-addr HOST:0`, the
port the kernel picked. Everything the broker writes to stderr is kept (and copied to a
file if asked), so a failure can show it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

STARTUP_S = 30.0
# The port after the last colon of the first address (IPv6 hosts are bracketed), in text
# and JSON log lines alike.
LISTENING = re.compile(r"listening on \S*?:(\d+)(?=[,\s\"]|$)")


class StartError(RuntimeError):
    """The broker exited, or did not say it listens in time; the message carries its stderr."""


class BrokerProcess:
    """One `python -m curb` child, started (and restarted) on demand with the flags given.

    `output` names a file that gets a copy of the broker's stderr, appended across starts;
    `preexec_fn` runs in the child before curb does (e.g. to lower its resource limits);
    `interpreter` is the command that runs `-m curb` (e.g. the Python under a profiler).
    """

    def __init__(
        self,
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        output: Path | None = None,
        timeout: float = STARTUP_S,
        preexec_fn: Callable[[], None] | None = None,
        interpreter: Sequence[str] = (sys.executable,),
    ) -> None:
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.output_file = output
        self.timeout = timeout
        self.preexec_fn = preexec_fn
        self.interpreter = tuple(interpreter)
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()

    @property
    def process(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError("the broker was never started")
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, flags: Sequence[str]) -> int:
        """Run `INTERPRETER -m curb FLAGS`; return its port once it says it listens. Raises
        StartError (the process killed) if it exits or stays silent for `timeout` seconds."""
        self._join_reader()
        process = subprocess.Popen(
            [*self.interpreter, "-m", "curb", *flags],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=self.preexec_fn,
        )
        self._process = process
        first_line = len(self._lines)
        found: list[int] = []
        ready = threading.Event()
        assert process.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(process.stderr, found, ready), daemon=True)
        self._reader.start()
        if not ready.wait(self.timeout) or not found:
            if process.poll() is None:
                process.kill()
            process.wait()
            self._join_reader()
            flags_text = " ".join(flags)
            why = (
                f"exited with status {process.returncode}"
                if ready.is_set()
                else f"did not say it listens within {self.timeout:g} s"
            )
            raise StartError(f"curb {flags_text} {why}:\n{''.join(self._lines[first_line:]) or '(no output)'}")
        self.port = found[0]
        return self.port

    def _read(self, stream: IO[str], found: list[int], ready: threading.Event) -> None:
        """Keep every line; signal the first `listening on` line, or the end of the output."""
        sink = open(self.output_file, "a") if self.output_file is not None else None  # noqa: SIM115
        try:
            for line in stream:
                with self._lock:
                    self._lines.append(line)
                if sink is not None:
                    sink.write(line)
                    sink.flush()
                if not found and (match := LISTENING.search(line)):
                    found.append(int(match.group(1)))
                    ready.set()
        finally:
            stream.close()
            if sink is not None:
                sink.close()
            ready.set()

    def output(self) -> str:
        """Everything the broker wrote to stderr so far, over all its starts."""
        with self._lock:
            return "".join(self._lines)

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int:
        """Signal the broker (SIGTERM: finish syncs and receipts, exit) and return its exit
        status; subprocess.TimeoutExpired if it is still running after `timeout` seconds."""
        process = self.process
        if process.poll() is None:
            process.send_signal(sig)
        status = process.wait(self.timeout if timeout is None else timeout)
        self._join_reader()
        return status

    def kill(self) -> None:
        """SIGKILL, a crash: no chance to sync or say goodbye."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._join_reader()

    def _join_reader(self) -> None:
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join()
            self._reader = None
