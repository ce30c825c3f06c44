"""The source and the sink given a `curb router`'s address and a destination partitioned
over two instances: the router names the instances, and the connector reads and writes them
exactly once, as with `endpoints`; a destination the router refuses fails with its reason."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from pyspark.sql.functions import col, format_string

from curb.client import Client

DEADLINE_S = 180


def test_a_stream_through_the_router_reads_every_message_of_both_instances_once(spark, brokers, router, tmp_path):
    with Client("127.0.0.1", router) as producer:
        for n in range(60):
            producer.send(b"m-%d" % n, receipt=f"r{n}", destination="/queue/orders")  # round robin: 30 each
        producer.wait_receipt("r59")
    query = (
        spark.readStream.format("curb")
        .option("router", f"127.0.0.1:{router}")
        .option("destination", "orders")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not all(broker.is_empty() for broker in brokers):
            assert time.monotonic() < deadline, [broker.counts() for broker in brokers]
            time.sleep(0.2)
    finally:
        query.stop()
    rows = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert sorted(row.body for row in rows) == sorted(b"m-%d" % n for n in range(60))
    assert Counter(row.endpoint for row in rows) == {broker.endpoint: 30 for broker in brokers}


def test_a_write_through_the_router_reaches_both_instances_once_and_a_refusal_says_why(spark, brokers, router):
    frame = spark.range(0, 100, numPartitions=4).select(format_string("w-%d", col("id")).alias("body"))
    frame.write.format("curb").option("router", f"127.0.0.1:{router}").option("destination", "/queue/orders").mode(
        "append"
    ).save()
    held = [[message.body for message in broker.drain()] for broker in brokers]
    assert all(held), "each task writes to one instance: partitions 0 and 2 to one, 1 and 3 to the other"
    assert sorted(held[0] + held[1]) == sorted(b"w-%d" % n for n in range(100))
    with pytest.raises(Exception, match=r"curb router .*: unknown destination '\./nope/count'"):
        frame.write.format("curb").option("router", f"127.0.0.1:{router}").option("destination", "nope").mode(
            "append"
        ).save()
