"""Curb and Spark on one machine: a local Spark session bound to loopback with the `curb`
format registered, and brokers run as child processes. For trying the connector out, for
the benchmark, and for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from curb.client import Client
from curb.spark.datasource import CurbDataSource
from curb.spawn import BrokerProcess

STARTUP_S = 30.0


def local_spark(app: str, cores: int = 2, workers_python: str = sys.executable) -> SparkSession:
    """A local[cores] session on 127.0.0.1 without web UI or progress bars; Python workers run
    `workers_python` (this interpreter unless told: it has Curb)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = workers_python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CurbDataSource)
    return spark


class LocalBroker:
    """A `curb` child process serving `log` on a loopback port the system picks."""

    def __init__(self, log: Path, cap: str = "10MiB", flags: Sequence[str] = ()) -> None:
        self.log = log
        self.cap = cap
        self.flags = list(flags)  # more command-line flags, e.g. ["-heartbeat", "500ms"]
        self.child = BrokerProcess(timeout=STARTUP_S)
        self.port = 0

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Return once the broker says where it listens; its other output is kept for errors.
        A restart listens on the port of the first start, so clients find it where it was."""
        address = f"127.0.0.1:{self.port}"
        self.port = self.child.start(["-cap", self.cap, "-addr", address, "-file", str(self.log), *self.flags])

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to sync or say goodbye."""
        self.child.kill()

    def stop(self) -> None:
        """SIGTERM: the broker drains its syncs and receipts and exits."""
        if self.child.running():
            self.child.stop()

    def client(self) -> Client:
        client = Client("127.0.0.1", self.port, timeout=STARTUP_S)
        client.connect()
        return client

    def send(self, bodies: list[bytes], headers: dict[str, str] | None = None) -> None:
        """Queue the bodies, pipelined; return once the broker has them all on disk."""
        with self.client() as client:
            for body in bodies[:-1]:
                client.send(body, headers=headers)
            client.send(bodies[-1], headers=headers, receipt="sent")
            client.wait_receipt("sent")

    def counts(self) -> dict[str, int]:
        """The queue's counts as the ./count subscription reports them (rdy, wip, subscriptions)."""
        with self.client() as client:
            client.subscribe(sub_id="count", destination="./count", ack="auto")
            frame = client.receive(timeout=STARTUP_S)
        if frame is None:
            raise RuntimeError(f"curb at {self.endpoint} sent no counts")
        counts: dict[str, int] = json.loads(frame.body)
        return counts
