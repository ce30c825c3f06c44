"""Exactly once through crashes: a streaming job from two brokers into parquet, its driver and
JVM killed with SIGKILL again and again (right after a batch's commit, and in the middle of a
batch), one broker killed with -9 and restarted mid-stream, the job restarted from its
checkpoint each time, while producers keep sending. At the end an availableNow run drains the
rest, and the parquet output must hold every message a broker acknowledged exactly once.

`CURB_SPARK_KILLS` sets the driver kills per trigger kind (default 2, to keep `bin/test`
short; `CURB_SPARK_KILLS=10 bin/test tests/spark/test_spark_kills.py -s` is the full proof).
The kill table is printed (`-s` shows it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from curb.client import Client, StompError

from .sparkjob import start_job

KILLS = int(os.environ.get("CURB_SPARK_KILLS", "2"))
DEADLINE_S = 180
CHUNK = 25  # messages a producer sends before it waits for their receipts
PAUSE_S = 0.05  # between chunks: about 500 messages/s per broker
BROKER_KILL_AT = 1  # during which driver run a broker is killed with -9 and restarted


class Producers:
    """One thread per broker sending receipted messages whose bodies are unique ids (`b<broker>-<n>`).
    `acked` holds the ids whose RECEIPT came back, `sent` every id ever written to a socket."""

    def __init__(self, brokers) -> None:
        self.acked: set[str] = set()
        self.sent: set[str] = set()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(broker, index), daemon=True)
            for index, broker in enumerate(brokers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _produce(self, broker, index: int) -> None:
        number = 0
        while not self._stop.is_set():
            try:
                with Client("127.0.0.1", broker.port, timeout=10) as client:
                    while not self._stop.is_set():
                        chunk = [f"b{index}-{number + offset}" for offset in range(CHUNK)]
                        number += CHUNK
                        self.sent.update(chunk)
                        for body in chunk:
                            client.send(body.encode(), receipt=body)
                        early = client.wait_receipt(chunk[-1])
                        self.acked.update(frame.headers["receipt-id"] for frame in early if frame.command == "RECEIPT")
                        self.acked.add(chunk[-1])
                        time.sleep(PAUSE_S)
            except (StompError, OSError):
                time.sleep(0.2)  # the broker is down: try again


def batch_files(checkpoint: Path, kind: str) -> int:
    return len(list((checkpoint / kind).glob("[0-9]*")))


class Driver:
    """The job in a process group of its own (its Python driver and its JVM), killed with SIGKILL."""

    def __init__(self, endpoints: str, checkpoint: Path, sink: Path, trigger: str, log: Path) -> None:
        self.checkpoint = checkpoint
        self.log = log
        job = Path(__file__).with_name("sparkjob.py")
        with open(log, "a") as out:
            self.child = subprocess.Popen(
                [sys.executable, str(job), endpoints, str(checkpoint), str(sink), trigger],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_until(self, condition, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert self.child.poll() is None, f"the job died:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"gave up waiting for {what}:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.02)

    def kill(self) -> None:
        os.killpg(self.child.pid, signal.SIGKILL)
        self.child.wait()


@pytest.mark.parametrize("trigger", ["default", "processingTime"])
def test_killed_drivers_and_a_killed_broker_lose_and_repeat_nothing(spark, brokers, tmp_path, trigger):
    endpoints = ",".join(broker.endpoint for broker in brokers)
    checkpoint, sink, log = tmp_path / "checkpoint", tmp_path / "sink", tmp_path / "job.out"
    chance = random.Random(KILLS)
    producers = Producers(brokers)
    moments: Counter[str] = Counter()
    began = time.monotonic()
    try:
        for number in range(KILLS):
            driver = Driver(endpoints, checkpoint, sink, trigger, log)
            try:
                committed = batch_files(checkpoint, "commits")
                driver.wait_until(lambda seen=committed: batch_files(checkpoint, "commits") > seen, "a batch to commit")
                if number == BROKER_KILL_AT:
                    brokers[0].kill()
                    time.sleep(1)
                    brokers[0].start()
                    committed = batch_files(checkpoint, "commits")
                    driver.wait_until(
                        lambda seen=committed: batch_files(checkpoint, "commits") > seen, "a commit after it"
                    )
                if number % 2:  # in the middle of a batch: planned, not yet committed
                    driver.wait_until(
                        lambda: batch_files(checkpoint, "offsets") > batch_files(checkpoint, "commits"),
                        "a batch to be planned",
                    )
                    time.sleep(chance.uniform(0, 0.5))
                    moments["mid-batch"] += 1
                else:
                    moments["right after a commit"] += 1
            finally:
                driver.kill()
    finally:
        producers.stop()
    assert start_job(spark, endpoints, checkpoint, sink, "availableNow").awaitTermination(DEADLINE_S)
    bodies = [row.body.decode() for row in spark.read.parquet(str(sink)).select("body").collect()]
    counts = Counter(bodies)
    duplicates = sum(count - 1 for count in counts.values())
    missing = len(producers.acked - counts.keys())
    strangers = len(counts.keys() - producers.sent)
    print(
        f"\nkills ({trigger} trigger): {KILLS} of the driver and JVM ({dict(moments)}), 1 of a broker; "
        f"{time.monotonic() - began:.0f} s\n"
        f"{'kills':>6}{'rows':>9}{'distinct':>10}{'duplicates':>12}{'missing':>9}{'acked':>9}{'unacked in':>12}\n"
        f"{KILLS:>6}{len(bodies):>9}{len(counts):>10}{duplicates:>12}{missing:>9}{len(producers.acked):>9}"
        f"{len(counts.keys() - producers.acked):>12}"
    )
    assert (duplicates, missing, strangers) == (0, 0, 0)
    assert all(broker.is_empty() for broker in brokers), "the final run acknowledged everything it read"
