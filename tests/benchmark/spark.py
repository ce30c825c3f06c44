"""Throughput of the Spark connector on this machine: `bin/bench-spark` (`python -m benchmark.spark`
with tests/ on the path).

For 1 and 2 local brokers, preloads N messages per broker and measures rows/s
- through the source's reader alone, called as Spark calls it but without Spark, every
  partition read in turn in this one process (its own cost, with the broker's),
- through the source in an availableNow query into a `noop` sink and into parquet,
- through the sink (a batch write of N rows per broker).
Each run starts from fresh log files, after one unmeasured warm-up query. The source runs
with its default options; `--cores` sets Spark's local[N] (executor cores reading partitions).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, format_string, lpad
from pyspark.sql.streaming.datasource import ReadAllAvailable

from curb.spark.local import LocalBroker, local_spark
from curb.spark.options import parse_source
from curb.spark.stream import CurbStreamReader


def reader_alone(endpoints: str, expected: int) -> None:
    """Plan one batch of everything as the driver does, read its partitions here, then commit."""
    reader = CurbStreamReader(parse_source({"endpoints": endpoints}))
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = sum(batch.num_rows for partition in reader.partitions(start, end) for batch in reader.read(partition))
    reader.commit(end)
    reader.stop()
    if rows != expected:
        raise RuntimeError(f"the reader gave {rows} rows, expected {expected}")


def source_query(spark: SparkSession, endpoints: str, sink: str, work: Path) -> float:
    """Run an availableNow query to the end; return the seconds its micro-batches took (start-up excluded)."""
    reader = spark.readStream.format("curb").option("endpoints", endpoints).load()
    writer = reader.writeStream.trigger(availableNow=True).option("checkpointLocation", str(work / "checkpoint"))
    writer = writer.format("parquet").option("path", str(work / "out")) if sink == "parquet" else writer.format("noop")
    query = writer.start()
    query.awaitTermination()
    return sum(progress["durationMs"]["triggerExecution"] for progress in query.recentProgress) / 1000


def sink_write(spark: SparkSession, endpoints: str, rows: int, size: int) -> None:
    spark.range(rows, numPartitions=2 * len(endpoints.split(","))).select(
        lpad(format_string("%d", col("id")), size, "x").alias("body")
    ).write.format("curb").option("endpoints", endpoints).mode("append").save()


def measure(
    work: Path, brokers: int, preload: int, size: int, run: Callable[[str, Path], float | None]
) -> tuple[float, float | None]:
    """Seconds `run(endpoints, work)` takes against fresh brokers, each preloaded with `preload` messages,
    and what `run` returns (the seconds spent in micro-batches, for queries)."""
    started = [LocalBroker(work / f"{index}.curb", cap="1GiB") for index in range(brokers)]
    try:
        for broker in started:
            broker.start()
            if preload:
                broker.send([b"x" * size] * preload)
        endpoints = ",".join(broker.endpoint for broker in started)
        began = time.perf_counter()
        in_batches = run(endpoints, work)
        return time.perf_counter() - began, in_batches
    finally:
        for broker in started:
            broker.stop()


def paths(
    spark: SparkSession, args: argparse.Namespace, total: int
) -> dict[str, tuple[int, Callable[[str, Path], float | None]]]:
    """What is measured, by name: (messages preloaded per broker, run(endpoints, work)), `total`
    messages in all."""
    return {
        "reader alone": (args.messages, lambda e, w: reader_alone(e, total)),
        "source -> noop": (args.messages, lambda e, w: source_query(spark, e, "noop", w)),
        "source -> parquet": (args.messages, lambda e, w: source_query(spark, e, "parquet", w)),
        "sink (batch write)": (0, lambda e, w: sink_write(spark, e, total, args.size)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bin/bench-spark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=100_000, help="messages per broker (default 100000)")
    parser.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N] (default 2)")
    args = parser.parse_args()
    spark = local_spark("curb-bench", cores=args.cores)
    with tempfile.TemporaryDirectory() as temp:  # the first query pays for warming up the JVM: not measured
        measure(Path(temp), 1, 1000, args.size, lambda e, w: source_query(spark, e, "noop", w))
    print(
        f"{args.messages} messages of {args.size} bytes per broker, default source options, local[{args.cores}]; "
        "rows/s from start to end (query start-up included), per broker, and within micro-batches "
        "(start-up excluded)"
    )
    print(f"{'path':<22}{'brokers':>8}{'rows':>8}{'seconds':>9}{'rows/s':>8}{'/broker':>8}{'in batches':>11}")
    for brokers in (1, 2):
        total = brokers * args.messages
        for name, (preload, run) in paths(spark, args, total).items():
            with tempfile.TemporaryDirectory() as temp:
                seconds, in_batches = measure(Path(temp), brokers, preload, args.size, run)
            batch_rate = f"{total / in_batches:>11.0f}" if in_batches else f"{'':>11}"
            print(
                f"{name:<22}{brokers:>8}{total:>8}{seconds:>9.2f}{total / seconds:>8.0f}"
                f"{total / seconds / brokers:>8.0f}{batch_rate}",
                flush=True,
            )
    spark.stop()


if __name__ == "__main__":
    main()
