"""Fixtures for the Spark connector tests: one shared local Spark session and real `curb`
brokers on loopback ports. Skipped, with the reason, when PySpark or Java is missing."""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from curb.frame import Frame

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install '.[spark]' in the checkout)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install '.[spark]' in the checkout)")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Java is not installed: PySpark needs a JVM (Java 17 or later)", allow_module_level=True)

from curb.spark.local import LocalBroker, local_spark
from curb.spawn import BrokerProcess


class Broker(LocalBroker):
    def drain(self) -> list[Frame]:
        """Take and ACK every message; returns the MESSAGE frames in delivery order."""
        frames: list[Frame] = []
        early: deque[Frame] = deque()
        client = self.client()
        try:
            client.subscribe(sub_id="drain", ack="client-individual")
            while (frame := early.popleft() if early else client.receive(timeout=1.0)) is not None:
                frames.append(frame)
                client.ack(frame.headers["ack"], receipt="acked")
                early.extend(client.wait_receipt("acked"))
        finally:
            client.close()
        return frames

    def is_empty(self) -> bool:
        counts = self.counts()
        return counts["rdy"] == 0 and counts["wip"] == 0


@pytest.fixture(scope="session")
def spark():
    session = local_spark("curb-tests")
    yield session
    session.stop()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[Broker]]:
    """Two brokers, each with its own log file in tmp_path."""
    started = []
    try:
        for name in ("a", "b"):
            broker = Broker(tmp_path / f"{name}.curb")
            broker.start()
            started.append(broker)
        yield started
    finally:
        for broker in started:
            broker.stop()


@pytest.fixture
def router(brokers: list[Broker]) -> Iterator[int]:
    """A `curb router` in front of both brokers, as the destination `orders` partitioned
    over them; yields its port."""
    child = BrokerProcess()
    try:
        route = "orders=" + ",".join(broker.endpoint for broker in brokers)
        yield child.start(["router", "-addr", "127.0.0.1:0", "-route", route])
    finally:
        child.kill()
