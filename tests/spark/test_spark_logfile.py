"""Batch reads of log files written by a real broker, while it runs and after it stopped."""

from __future__ import annotations

import time

import pytest


def test_log_files_read_as_rows_while_running_and_after_stop(spark, brokers):
    a, b = brokers
    before_ms = int(time.time() * 1000)
    a.send([f"m{i}".encode() for i in range(5)], {"content-type": "text/plain", "team": "x"})
    b.send([b"other\x00bytes"])
    client = a.client()
    client.subscribe(sub_id="0", ack="client-individual", prefetch=2)
    first, second = client.receive(timeout=10), client.receive(timeout=10)
    client.ack(first.headers["ack"])
    client.ack(second.headers["ack"], receipt="acked")
    client.wait_receipt("acked")
    client.close()

    def check(rows) -> None:
        ready = sorted((row for row in rows if row.state == "rdy"), key=lambda row: row.id)
        assert [row.body for row in ready] == [b"m2", b"m3", b"m4"]
        assert all(row.headers == {"content-type": "text/plain", "team": "x"} for row in ready)
        assert all(row.file == str(a.log) for row in rows)
        assert {row.body for row in rows if row.state == "ack"} <= {b"m0", b"m1"}
        assert all(row.timestamp.timestamp() * 1000 >= before_ms - 1000 for row in rows)

    check(spark.read.format("curb").load(str(a.log)).collect())
    a.stop()
    b.stop()
    rows = spark.read.format("curb").load([str(a.log), str(b.log)]).collect()
    check([row for row in rows if row.file == str(a.log)])
    assert [(row.body, row.state, row.deliveries) for row in rows if row.file == str(b.log)] == [
        (b"other\x00bytes", "rdy", 0)
    ]


def test_a_file_that_is_not_a_log_fails_with_its_name(spark, tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("002 ack second\n")
    with pytest.raises(Exception, match=r"notes\.txt"):
        spark.read.format("curb").load(str(bogus)).collect()


def test_a_batch_read_without_files_points_at_read_stream(spark):
    with pytest.raises(Exception, match="readStream"):
        spark.read.format("curb").option("endpoints", "127.0.0.1:61613").load().collect()
