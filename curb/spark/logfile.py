"""Batch read of Curb log files: every record still on disk becomes a row, one Spark partition per file.

Reads go through `curb.log.scan.LogReader`, which takes no lock, so the files of running brokers
can be read too; nothing is ever written to them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from curb.log.scan import LogReader
from curb.spark.schema import LOG_SCHEMA, ROWS_PER_BATCH, record_batch


class LogFileReader(DataSourceReader):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(path) for path in self.paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        path = partition.value
        columns: list[list[object]] = [[] for _ in LOG_SCHEMA.fields]
        with LogReader(path) as log:
            for entry in log.entries():
                for column, value in zip(
                    columns,
                    (
                        path,
                        entry.id,
                        entry.state,
                        entry.deliveries,
                        entry.timestamp_ms * 1000,
                        entry.offset,
                        entry.headers,
                        entry.body,
                    ),
                    strict=True,
                ):
                    column.append(value)
                if len(columns[0]) == ROWS_PER_BATCH:
                    yield record_batch(LOG_SCHEMA, columns)
                    columns = [[] for _ in LOG_SCHEMA.fields]
        if columns[0]:
            yield record_batch(LOG_SCHEMA, columns)
