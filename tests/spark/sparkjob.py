"""The streaming job the recovery tests run: Curb into parquet, each row tagged with its batch.

Run as a script, it runs in a Spark of its own (its own driver and JVM), so a test can kill
it with SIGKILL: `python sparkjob.py ENDPOINTS CHECKPOINT SINK BATCH_SIZE DELAY_S`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import lit
from pyspark.sql.streaming import StreamingQuery

from curb.spark.local import local_spark


class InjectedFailure(RuntimeError):
    """Raised by the job in the batch a test chose to fail."""


def start_job(
    spark: SparkSession,
    endpoints: str,
    checkpoint: Path,
    sink: Path,
    *,
    batch_size: int,
    available_now: bool = False,
    fail_batch: int | None = None,
    delay_s: float = 0.0,
) -> StreamingQuery:
    """Consume `endpoints` into parquet files under `sink`, each row tagged with its batch id.

    `fail_batch`: the first attempt of that batch raises before writing anything.
    `delay_s`: each batch waits this long before writing (a window for a kill)."""
    failed_once = sink.parent / f"{sink.name}.failed-once"

    def write(batch: DataFrame, batch_id: int) -> None:
        if batch_id == fail_batch and not failed_once.exists():
            failed_once.touch()
            raise InjectedFailure(f"injected failure in batch {batch_id}")
        time.sleep(delay_s)
        batch.withColumn("batch", lit(batch_id)).write.mode("append").parquet(str(sink))

    writer = (
        spark.readStream.format("curb")
        .option("endpoints", endpoints)
        .option("batchSize", batch_size)
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


if __name__ == "__main__":
    endpoints, checkpoint, sink, batch_size, delay_s = sys.argv[1:]
    query = start_job(
        local_spark("curb-killed-job"),
        endpoints,
        Path(checkpoint),
        Path(sink),
        batch_size=int(batch_size),
        delay_s=float(delay_s),
    )
    query.awaitTermination()
