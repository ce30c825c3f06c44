"""The streaming job the recovery tests run: Curb into Spark's parquet file sink, which is
exactly once when a replayed batch reads the same rows.

Run as a script, it runs in a Spark of its own (its own driver and JVM), so a test can kill
it with SIGKILL: `python sparkjob.py ENDPOINTS CHECKPOINT SINK TRIGGER [OPTION=VALUE ...]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from curb.spark.local import local_spark

# The trigger kinds a test can choose; processingTime leaves a window between a batch's
# commit and the next batch (where the old source duplicated whole batches).
TRIGGERS = ("default", "processingTime", "availableNow")
PROCESSING_TIME = "2 seconds"


def start_job(
    spark: SparkSession,
    endpoints: str,
    checkpoint: Path,
    sink: Path,
    trigger: str = "default",
    options: dict[str, str] | None = None,
) -> StreamingQuery:
    """Consume `endpoints` into parquet files under `sink`."""
    writer = (
        spark.readStream.format("curb")
        .option("endpoints", endpoints)
        .options(**(options or {}))
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
    )
    if trigger == "processingTime":
        writer = writer.trigger(processingTime=PROCESSING_TIME)
    elif trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    return writer.start()


if __name__ == "__main__":
    endpoints, checkpoint, sink, trigger, *pairs = sys.argv[1:]
    query = start_job(
        local_spark("curb-killed-job"),
        endpoints,
        Path(checkpoint),
        Path(sink),
        trigger,
        dict(pair.split("=", 1) for pair in pairs),
    )
    query.awaitTermination()
