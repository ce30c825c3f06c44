"""A crew of load processes: each runs one task at a time, and all start at the same instant.

The processes live as long as the benchmark, so starting a workload costs a message, not
an interpreter. A task is a module-level function `fn(worker, **kwargs)`; it connects,
calls `worker.start()` once it is ready to go (which returns the common start time on the
system-wide monotonic clock) and returns a picklable result.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any


class LoadError(Exception):
    """A load process failed; the message carries its traceback."""


class Worker:
    """A task's handle on its crew: its index, the common start, and the shared progress
    counters (`sent`, `done`, one slot per worker) that balanced workloads steer by."""

    def __init__(self, index: int, results, go, start_time, sent, done):
        self.index = index
        self._results = results
        self._go = go
        self._start_time = start_time
        self.sent = sent
        self.done = done

    def start(self) -> float:
        self._results.put((self.index, "ready", None))
        self._go.wait()
        return self._start_time.value


def _serve(index: int, inbox, results, go, start_time, sent, done) -> None:
    worker = Worker(index, results, go, start_time, sent, done)
    while (job := inbox.get()) is not None:
        task, kwargs = job
        try:
            results.put((index, "done", task(worker, **kwargs)))
        except BaseException:
            results.put((index, "error", traceback.format_exc()))


class Crew:
    def __init__(self, size: int):
        context = multiprocessing.get_context("spawn")
        self.size = size
        self._go = context.Event()
        self._start_time = context.RawValue("d")
        self._sent = context.RawArray("q", size)
        self._done = context.RawArray("q", size)
        self._results = context.Queue()
        self._inboxes = [context.SimpleQueue() for _ in range(size)]
        self._processes = [
            context.Process(
                target=_serve,
                name=f"curb-bench-load-{index}",
                daemon=True,
                args=(index, inbox, self._results, self._go, self._start_time, self._sent, self._done),
            )
            for index, inbox in enumerate(self._inboxes)
        ]
        for process in self._processes:
            process.start()

    def run(self, tasks: list[tuple[Callable[..., Any], dict[str, Any]]]) -> list[Any]:
        """Run tasks[i] on worker i, release them together once all are ready, and return
        their results in order. Raises LoadError as soon as one fails."""
        if len(tasks) > self.size:
            raise ValueError(f"{len(tasks)} tasks for a crew of {self.size}")
        self._go.clear()
        for counters in (self._sent, self._done):
            counters[:] = [0] * self.size
        for inbox, task in zip(self._inboxes, tasks, strict=False):  # there may be fewer tasks than workers
            inbox.put(task)
        results: list[Any] = [None] * len(tasks)
        ready = finished = 0
        while finished < len(tasks):
            try:
                index, kind, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self._processes if not p.is_alive()]
                if dead:
                    raise LoadError(f"load process(es) died: {', '.join(dead)}") from None
                continue
            if kind == "error":
                raise LoadError(f"load process {index} failed:\n{payload}")
            if kind == "ready":
                ready += 1
                if ready == len(tasks):
                    self._start_time.value = time.monotonic()
                    self._go.set()
            else:
                results[index] = payload
                finished += 1
        return results

    def close(self) -> None:
        """Stop the processes: politely when idle, by force when a failed run left them busy."""
        for inbox in self._inboxes:
            inbox.put(None)
        for process in self._processes:
            process.join(timeout=2.0)
            if process.is_alive():
                process.terminate()
                process.join()
