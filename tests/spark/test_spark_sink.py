"""The sink against real brokers: batch and streaming writes, consumed back and compared,
and the routing of rows to endpoints."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql.functions import col, concat, create_map, format_string, lit, spark_partition_id

from curb.spark.sink import endpoint_of_key


def consumed(broker) -> Counter:
    """What a broker holds, as (body, `part` header, `user` header): taken with a plain STOMP consumer."""
    return Counter((frame.body, frame.headers.get("part"), frame.headers.get("user")) for frame in broker.drain())


def test_a_batch_write_sends_each_partition_to_one_endpoint(spark, brokers):
    a, b = brokers
    frame = spark.range(0, 200, numPartitions=4).select(
        format_string("row-%d", col("id")).alias("body"),
        create_map(lit("part"), spark_partition_id().cast("string")).alias("headers"),
    )
    frame.write.format("curb").option("endpoints", f"{a.endpoint},{b.endpoint}").option("window", 7).mode(
        "append"
    ).save()
    on_a, on_b = consumed(a), consumed(b)
    assert {part for _, part, _ in on_a} == {"0", "2"} and {part for _, part, _ in on_b} == {"1", "3"}
    assert sorted(body for body, _, _ in (on_a + on_b).elements()) == sorted(f"row-{i}".encode() for i in range(200))


def test_a_key_column_routes_rows_by_its_hash(spark, brokers):
    a, b = brokers
    frame = (
        spark.range(0, 120, numPartitions=3)
        .select(
            concat(lit("u"), (col("id") % 10).cast("string")).alias("user"),
            col("id").cast("string").cast("binary").alias("body"),
        )
        .select("body", create_map(lit("user"), col("user")).alias("headers"), "user")
    )
    frame.write.format("curb").option("endpoints", f"{a.endpoint},{b.endpoint}").option("key", "user").mode(
        "append"
    ).save()
    for index, broker in enumerate((a, b)):
        users = {user for _, _, user in consumed(broker)}
        assert users == {f"u{i}" for i in range(10) if endpoint_of_key(f"u{i}", 2) == index}


def test_a_streaming_write_reaches_curb_and_reads_back_through_the_source(spark, brokers, tmp_path):
    a, b = brokers
    spark.range(0, 90, numPartitions=3).select(format_string("s-%d", col("id")).alias("body")).write.parquet(
        str(tmp_path / "input")
    )
    written = (
        spark.readStream.schema("body string")
        .parquet(str(tmp_path / "input"))
        .writeStream.format("curb")
        .option("endpoints", f"{a.endpoint},{b.endpoint}")
        .option("checkpointLocation", str(tmp_path / "write-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert written.awaitTermination(180)
    read = (
        spark.readStream.format("curb")
        .option("endpoints", f"{a.endpoint},{b.endpoint}")
        .load()
        .writeStream.format("memory")
        .queryName("read_back")
        .option("checkpointLocation", str(tmp_path / "read-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert read.awaitTermination(180)
    rows = spark.table("read_back").collect()
    assert sorted(row.body for row in rows) == sorted(f"s-{i}".encode() for i in range(90))
    assert {row.endpoint for row in rows} == {a.endpoint, b.endpoint}


@pytest.mark.parametrize(
    "columns, fragment",
    [
        ("CAST(id AS STRING) AS text", "needs a 'body' column"),
        ("id AS body", "column 'body' must be binary or string"),
        ("'x' AS body, 'y' AS headers", "column 'headers' must be map<string,string>"),
    ],
)
def test_a_frame_without_the_needed_columns_is_refused(spark, brokers, columns, fragment):
    with pytest.raises(Exception, match=fragment):
        spark.range(1).selectExpr(*columns.split(", ")).write.format("curb").option(
            "endpoints", brokers[0].endpoint
        ).mode("append").save()


def test_overwrite_is_refused(spark, brokers):
    with pytest.raises(Exception, match="can only be appended to"):
        spark.range(1).selectExpr("'x' AS body").write.format("curb").option("endpoints", brokers[0].endpoint).mode(
            "overwrite"
        ).save()
