"""The streaming source against real brokers: draining, at-least-once recovery after a failed
batch and after SIGKILL of driver and JVM, availableNow runs, lost and silent brokers, bad options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from curb.spark.local import LocalBroker

from .ackproxy import AckProxy
from .sparkjob import start_job

DEADLINE_S = 180


def bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{number}".encode() for number in range(count)]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.2)


def parquet_rows(spark, path: Path) -> list:
    return spark.read.parquet(str(path)).collect()


def test_a_stream_drains_two_brokers_into_parquet(spark, brokers, tmp_path):
    a, b = brokers
    headers = {"content-type": "text/plain", "trace": "t-1"}
    a.send(bodies("a", 150), headers)
    b.send(bodies("b", 120), headers)
    query = (
        spark.readStream.format("curb")
        .option("endpoints", f"{a.endpoint},{b.endpoint}")
        .option("batchSize", 40)
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_until(lambda: a.is_empty() and b.is_empty(), "both queues drained and acknowledged")
    finally:
        query.stop()
    rows = parquet_rows(spark, tmp_path / "sink")
    assert sorted(row.body for row in rows) == sorted(bodies("a", 150) + bodies("b", 120))
    for broker, prefix in ((a, "a"), (b, "b")):
        mine = sorted((row for row in rows if row.endpoint == broker.endpoint), key=lambda row: row.seq)
        assert [row.body for row in mine] == bodies(prefix, len(mine)), "seq follows send order"
        assert all(row.seq == int(row.message_id) and not row.redelivered for row in mine)
        assert all(row.headers == headers for row in mine)


def check_recovered(spark, sink: Path, proxies: list[AckProxy], sent: dict[str, list[bytes]]) -> None:
    """Every message reached the sink, and every ACK followed the commit of a batch holding it."""
    rows = parquet_rows(spark, sink)
    for proxy in proxies:
        got = {row.body for row in rows if row.endpoint == proxy.endpoint}
        assert set(sent[proxy.endpoint]) <= got, "a message is missing from the sink"
    batches = defaultdict(set)
    for row in rows:
        batches[(row.endpoint, row.seq)].add(row.batch)
    for proxy in proxies:
        assert proxy.acks, "the query acknowledged nothing"
        for ack in proxy.acks:
            holding = batches[(proxy.endpoint, ack.message_id)]
            assert holding & ack.committed, (
                f"message {ack.message_id} of {proxy.endpoint} was ACKed while its batches {sorted(holding)} "
                f"were not committed (committed: {sorted(ack.committed)})"
            )


@pytest.fixture
def proxies(brokers, tmp_path):
    started = [AckProxy(broker.port, tmp_path / "checkpoint" / "commits") for broker in brokers]
    yield started
    for proxy in started:
        proxy.close()


def preload(brokers, proxies, count: int) -> dict[str, list[bytes]]:
    sent = {}
    for broker, proxy, prefix in zip(brokers, proxies, "ab", strict=True):
        sent[proxy.endpoint] = bodies(prefix, count)
        broker.send(sent[proxy.endpoint])
    return sent


def test_a_failed_batch_is_recovered_from_the_checkpoint(spark, brokers, proxies, tmp_path):
    sent = preload(brokers, proxies, 100)
    endpoints = ",".join(proxy.endpoint for proxy in proxies)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    failing = start_job(spark, endpoints, checkpoint, sink, batch_size=20, fail_batch=2)
    with pytest.raises(StreamingQueryException, match="injected failure in batch 2"):
        failing.awaitTermination(DEADLINE_S)
    restarted = start_job(spark, endpoints, checkpoint, sink, batch_size=20, available_now=True)
    assert restarted.awaitTermination(DEADLINE_S)
    check_recovered(spark, sink, proxies, sent)
    assert all(broker.is_empty() for broker in brokers)


def test_a_killed_driver_and_jvm_are_recovered_from_the_checkpoint(spark, brokers, proxies, tmp_path):
    sent = preload(brokers, proxies, 100)
    endpoints = ",".join(proxy.endpoint for proxy in proxies)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    job = Path(__file__).with_name("sparkjob.py")
    with open(tmp_path / "job.out", "w") as out:
        child = subprocess.Popen(
            [sys.executable, str(job), endpoints, str(checkpoint), str(sink), "20", "1.0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def batch_in_flight() -> bool:
            assert child.poll() is None, (tmp_path / "job.out").read_text()
            commits = [p for p in (checkpoint / "commits").glob("[0-9]*")]
            offsets = [p for p in (checkpoint / "offsets").glob("[0-9]*")]
            return len(commits) >= 2 and len(offsets) > len(commits)

        wait_until(batch_in_flight, "the job to commit two batches and start a third")
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    restarted = start_job(spark, endpoints, checkpoint, sink, batch_size=20, available_now=True)
    assert restarted.awaitTermination(DEADLINE_S)
    check_recovered(spark, sink, proxies, sent)
    assert all(broker.is_empty() for broker in brokers)


def test_a_second_available_now_run_reads_nothing(spark, brokers, tmp_path):
    a, b = brokers
    a.send(bodies("a", 60))
    b.send(bodies("b", 60))

    def run():
        query = (
            spark.readStream.format("curb")
            .option("endpoints", f"{a.endpoint},{b.endpoint}")
            .option("batchSize", 25)
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "sink"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(DEADLINE_S), "an availableNow run must end once the queues are drained"
        return sum(progress["numInputRows"] for progress in query.recentProgress)

    assert run() == 120
    assert a.is_empty() and b.is_empty()
    assert run() == 0
    rows = parquet_rows(spark, tmp_path / "sink")
    assert sorted(row.body for row in rows) == sorted(bodies("a", 60) + bodies("b", 60))
    assert len({(row.endpoint, row.seq) for row in rows}) == 120


def test_a_lost_connection_fails_the_query_naming_the_endpoint(spark, brokers, tmp_path):
    a = brokers[0]
    a.send(bodies("a", 10))
    query = (
        spark.readStream.format("curb")
        .option("endpoints", a.endpoint)
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_until(lambda: a.is_empty(), "the query to consume the queue")
        a.stop()
        with pytest.raises(StreamingQueryException, match=f"curb endpoint {a.endpoint}"):
            query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()


def test_with_heartbeat_a_frozen_broker_fails_the_query(spark, tmp_path):
    frozen = LocalBroker(tmp_path / "frozen.curb", flags=["-heartbeat", "200"])
    frozen.start()
    process = frozen.process
    assert process is not None
    query = (
        spark.readStream.format("curb")
        .option("endpoints", frozen.endpoint)
        .option("heartbeat", 200)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_until(lambda: query.lastProgress is not None, "the query to run a first batch")
        process.send_signal(signal.SIGSTOP)
        with pytest.raises(StreamingQueryException, match=f"curb endpoint {frozen.endpoint}: .*server silent"):
            query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()
        process.send_signal(signal.SIGCONT)
        frozen.stop()


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "option 'endpoints' is required"),
        ({"endpoints": "localhost"}, "'localhost' is not HOST:PORT"),
        ({"endpoints": "127.0.0.1:1", "batchSize": "lots"}, "option 'batchSize' must be an integer"),
        ({"endpoints": "127.0.0.1:1"}, "curb endpoint 127.0.0.1:1: connecting (option 'endpoints') failed"),
    ],
)
def test_bad_options_fail_the_query_at_start(spark, tmp_path, options, fragment):
    with pytest.raises(Exception) as raised:
        query = (
            spark.readStream.format("curb")
            .options(**options)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            query.awaitTermination(DEADLINE_S)
        finally:
            query.stop()
    assert fragment in str(raised.value)
