"""The streaming source against real brokers: draining into parquet, a failed batch replayed
with the same rows, availableNow runs, brokers restarted (a reconnect, and after a crash no
empty batches over the gap in ids), with a replaced log or gone (a failure naming them), and
options refused at load()."""

from __future__ import annotations

import json
import re
import signal
import time
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
    query = start_job(spark, f"{a.endpoint},{b.endpoint}", tmp_path / "checkpoint", tmp_path / "sink")
    try:
        wait_until(lambda: a.is_empty() and b.is_empty(), "both queues drained and acknowledged")
    finally:
        query.stop()
    rows = parquet_rows(spark, tmp_path / "sink")
    assert sorted(row.body for row in rows) == sorted(bodies("a", 150) + bodies("b", 120))
    for broker, prefix in ((a, "a"), (b, "b")):
        mine = sorted((row for row in rows if row.endpoint == broker.endpoint), key=lambda row: row.seq)
        assert [row.body for row in mine] == bodies(prefix, len(mine)), "seq follows send order"
        assert all(row.seq == int(row.message_id) for row in mine)
        assert all(row.headers == headers for row in mine)


def committed_ends(checkpoint: Path, batches: frozenset[int]) -> dict[str, int]:
    """Per endpoint, the highest end offset among those batches (the last line of each offsets file)."""
    ends: dict[str, int] = {}
    for batch in batches:
        offsets = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
        for endpoint, last in offsets.items():
            ends[endpoint] = max(ends.get(endpoint, 0), last)
    return ends


def test_a_failed_batch_is_replayed_with_the_same_rows(spark, brokers, tmp_path):
    """The first attempt of batch 1 fails before writing; the query restarted from its
    checkpoint reads that batch again, and no row is lost or written twice. Every ACK passed
    only once Spark had committed a batch reaching up to it."""
    proxies = [AckProxy(broker.port, tmp_path / "checkpoint" / "commits") for broker in brokers]
    endpoints = ",".join(proxy.endpoint for proxy in proxies)
    sink, checkpoint, failed_once = tmp_path / "sink", tmp_path / "checkpoint", tmp_path / "failed-once"

    def write(batch, batch_id: int) -> None:
        if batch_id == 1 and not failed_once.exists():
            failed_once.touch()
            raise RuntimeError("injected failure in batch 1")
        batch.write.mode("append").parquet(str(sink))

    def run(available_now: bool):
        reader = spark.readStream.format("curb").option("endpoints", endpoints).option("maxRowsPerBatch", 30).load()
        writer = reader.writeStream.foreachBatch(write).option("checkpointLocation", str(checkpoint))
        return (writer.trigger(availableNow=True) if available_now else writer).start()

    try:
        for broker, prefix in zip(brokers, "ab", strict=True):
            broker.send(bodies(prefix, 100))
        with pytest.raises(StreamingQueryException, match="injected failure in batch 1"):
            run(available_now=False).awaitTermination(DEADLINE_S)
        assert run(available_now=True).awaitTermination(DEADLINE_S)
        rows = parquet_rows(spark, sink)
        assert sorted(row.body for row in rows) == sorted(bodies("a", 100) + bodies("b", 100))
        for proxy in proxies:
            assert proxy.acks, "the query acknowledged nothing"
            for ack in proxy.acks:
                assert ack.upto <= committed_ends(checkpoint, ack.committed).get(proxy.endpoint, 0), (
                    f"ACK up to {ack.upto} passed before a batch reaching it was committed"
                )
    finally:
        for proxy in proxies:
            proxy.close()


def test_a_second_available_now_run_reads_nothing(spark, brokers, tmp_path):
    a, b = brokers
    a.send(bodies("a", 60))
    b.send(bodies("b", 60))

    def run():
        query = start_job(
            spark, f"{a.endpoint},{b.endpoint}", tmp_path / "checkpoint", tmp_path / "sink", "availableNow"
        )
        assert query.awaitTermination(DEADLINE_S), "an availableNow run must end once the queues are drained"
        return sum(progress["numInputRows"] for progress in query.recentProgress)

    assert run() == 120
    assert run() == 0
    assert a.is_empty() and b.is_empty()
    rows = parquet_rows(spark, tmp_path / "sink")
    assert sorted(row.body for row in rows) == sorted(bodies("a", 60) + bodies("b", 60))


def planned_batches(checkpoint: Path) -> int:
    return len(list((checkpoint / "offsets").glob("[0-9]*")))


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed"])
def test_a_restarted_broker_costs_a_reconnect_not_the_query(spark, brokers, tmp_path, crash):
    """Killed with -9, a broker resumes its ids 65,536 higher: with maxRowsPerBatch 100, a source
    stepping by ids would plan 656 empty batches before reaching what was sent after the restart."""
    a = brokers[0]
    checkpoint = tmp_path / "checkpoint"
    a.send(bodies("a", 50))
    query = start_job(spark, a.endpoint, checkpoint, tmp_path / "sink", options={"maxRowsPerBatch": "100"})
    try:
        wait_until(lambda: a.is_empty(), "the query to consume the queue")
        if crash:
            a.kill()
        else:
            a.stop()
        time.sleep(2)  # the query polls meanwhile: an outage it must ride out
        a.start()
        time.sleep(1)  # and may plan a batch of nothing but the gap
        before = planned_batches(checkpoint)
        a.send(bodies("b", 50))
        wait_until(lambda: a.is_empty() or planned_batches(checkpoint) > before + 20, "the new messages or 20 batches")
        assert a.is_empty() and planned_batches(checkpoint) <= before + 2, (
            f"{planned_batches(checkpoint) - before} batches to reach the messages sent after the restart"
        )
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    rows = parquet_rows(spark, tmp_path / "sink")
    assert sorted(row.body for row in rows) == sorted(bodies("a", 50) + bodies("b", 50))


def test_a_broker_whose_log_was_replaced_fails_the_query_naming_it(spark, brokers, tmp_path):
    """Its ids start again from 1, below what the query has committed: no silent empty batches."""
    a = brokers[0]
    a.send(bodies("a", 20))
    query = start_job(spark, a.endpoint, tmp_path / "checkpoint", tmp_path / "sink")
    try:
        wait_until(lambda: a.is_empty(), "the query to consume the queue")
        a.stop()
        a.log.unlink()
        a.start()
        a.send(bodies("b", 3))
        expected = (
            rf"curb endpoint {re.escape(a.endpoint)}: its highest message id is \d+, below this query's offset 20"
        )
        with pytest.raises(StreamingQueryException, match=expected):
            query.awaitTermination(60)
    finally:
        query.stop()
    assert len(a.drain()) == 3, "the new log's messages are left alone"


def test_a_broker_that_stays_away_fails_the_query_naming_it(spark, brokers, tmp_path):
    a = brokers[0]
    a.send(bodies("a", 10))
    query = start_job(spark, a.endpoint, tmp_path / "checkpoint", tmp_path / "sink", options={"reconnectTimeout": "2"})
    try:
        wait_until(lambda: a.is_empty(), "the query to consume the queue")
        a.stop()
        with pytest.raises(StreamingQueryException, match=f"curb endpoint {a.endpoint}: unreachable for 2 s"):
            query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()


def test_with_heartbeat_a_frozen_broker_fails_the_query(spark, tmp_path):
    frozen = LocalBroker(tmp_path / "frozen.curb", flags=["-heartbeat", "200ms"])
    frozen.start()
    process = frozen.process
    options = {"heartbeat": "200", "reconnectTimeout": "2", "timeout": "1"}
    query = start_job(spark, frozen.endpoint, tmp_path / "checkpoint", tmp_path / "sink", options=options)
    try:
        wait_until(lambda: query.lastProgress is not None, "the query to run a first batch")
        process.send_signal(signal.SIGSTOP)
        with pytest.raises(StreamingQueryException, match=f"curb endpoint {frozen.endpoint}: unreachable for 2 s"):
            query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()
        process.send_signal(signal.SIGCONT)
        frozen.stop()


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({}, "curb option 'endpoints' is required"),
        ({"endpoints": "localhost"}, "curb option 'endpoints': 'localhost' is not HOST:PORT"),
        ({"endpoints": "127.0.0.1:1", "batch_size": "abc"}, "curb option 'batch_size' is unknown"),
        ({"endpoints": "127.0.0.1:1", "maxRowsPerBatch": "lots"}, "option 'maxRowsPerBatch' must be an integer"),
        (
            {"endpoints": "127.0.0.1:1", "batchSize": "1000"},
            "curb option 'batchSize' was removed: use 'maxRowsPerBatch'",
        ),
    ],
)
def test_bad_options_fail_at_load_in_a_short_message(spark, options, fragment):
    with pytest.raises(Exception) as raised:
        spark.readStream.format("curb").options(**options).load()
    message = str(raised.value)
    assert fragment in message
    assert len(message) < 800, "the option's line must not be buried in a long traceback"


def test_an_unreachable_endpoint_fails_the_query_at_start(spark, tmp_path):
    query = start_job(
        spark, "127.0.0.1:1", tmp_path / "checkpoint", tmp_path / "sink", options={"reconnectTimeout": "1"}
    )
    try:
        with pytest.raises(StreamingQueryException, match=re.escape("curb endpoint 127.0.0.1:1: unreachable for 1 s")):
            query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()
