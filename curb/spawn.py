"""Run a curb broker as a child process and learn where it listens from its start-up line.

Spark's local mode, the tests and the benchmark all start brokers this way. The broker
prints `curb: listening on HOST:PORT, ...` only once recovery is done and its port accepts
connections, so that one line is both the readiness signal and, for `-addr HOST:0`, the
port the kernel picked. Everything the broker writes to stderr is kept (and copied to a
file if asked), so a failure can show it.

Invariant: `output()` holds every line the broker wrote before the call. A thread reads
the pipe as lines come, but every read of the pipe, the thread's and `output()`'s own
drain of what the thread has not read yet, happens under one lock and reads what is
there without waiting: so a line the broker wrote before it answered a frame is seen by
a caller that got the answer, however far behind the thread is.
"""

from __future__ import annotations

import os
import re
import select
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
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lines: list[str] = []
        self._partial = b""  # the bytes of a line not yet ended
        self._stream: IO[bytes] | None = None  # the pipe, while it is open
        self._sink: IO[str] | None = None
        self._found: list[int] = []
        self._ready = threading.Event()
        self._lock = threading.Lock()

    @property
    def process(self) -> subprocess.Popen[bytes]:
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
            preexec_fn=self.preexec_fn,
        )
        self._process = process
        first_line = len(self._lines)
        found: list[int] = []
        ready = threading.Event()
        assert process.stderr is not None
        os.set_blocking(process.stderr.fileno(), False)
        with self._lock:
            self._stream, self._found, self._ready = process.stderr, found, ready
            self._sink = open(self.output_file, "a") if self.output_file is not None else None  # noqa: SIM115
        self._reader = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
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

    def _read(self, stream: IO[bytes]) -> None:
        """Wait for the pipe, drain it under the lock, until its end."""
        try:
            while True:
                select.select([stream], [], [])
                with self._lock:
                    if not self._drain():
                        return
        finally:
            with self._lock:
                self._close()

    def _drain(self) -> bool:
        """Under the lock: take what the pipe holds now, without waiting; False at its end."""
        stream = self._stream
        if stream is None:
            return False
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        """Keep every whole line; signal the first `listening on` line."""
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        for raw in whole:
            line = raw.decode(errors="replace") + "\n"
            self._lines.append(line)
            if self._sink is not None:
                self._sink.write(line)
                self._sink.flush()
            if not self._found and (match := LISTENING.search(line)):
                self._found.append(int(match.group(1)))
                self._ready.set()

    def _close(self) -> None:
        """Under the lock, at the pipe's end: keep an unended last line, close, and wake a
        start still waiting for the `listening on` line."""
        if self._partial:
            self._take(b"\n")
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
        self._ready.set()

    def output(self) -> str:
        """Everything the broker wrote to stderr so far, over all its starts."""
        with self._lock:
            self._drain()  # at the pipe's end the reading thread closes it
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
