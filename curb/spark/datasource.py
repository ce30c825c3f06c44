"""The `curb` format: one Python data source for streaming reads, batch and streaming writes,
and batch reads of log files. Options are checked when Spark asks for a reader or writer,
so a bad option fails the query at start, naming the option."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from curb.spark.logfile import LogFileReader
from curb.spark.options import parse_endpoints, parse_paths, parse_sink, parse_source
from curb.spark.schema import LOG_SCHEMA, MESSAGE_SCHEMA
from curb.spark.sink import CurbStreamWriter, CurbWriter, row_layout
from curb.spark.stream import CurbStreamReader


class CurbDataSource(DataSource):
    """Register with `spark.dataSource.register(CurbDataSource)`, then use `format("curb")`."""

    @classmethod
    def name(cls) -> str:
        return "curb"

    def schema(self) -> StructType:
        if _reads_files(self.options):
            return LOG_SCHEMA
        parse_endpoints(self.options)
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> LogFileReader:
        return LogFileReader(parse_paths(self.options))

    def simpleStreamReader(self, schema: StructType) -> CurbStreamReader:
        return CurbStreamReader(parse_source(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> CurbWriter:
        options = parse_sink(self.options)
        _refuse_overwrite(overwrite)
        return CurbWriter(options, row_layout(schema, options.key))

    def streamWriter(self, schema: StructType, overwrite: bool) -> CurbStreamWriter:
        options = parse_sink(self.options)
        _refuse_overwrite(overwrite)
        return CurbStreamWriter(options, row_layout(schema, options.key))


def _reads_files(options: Mapping[str, str]) -> bool:
    return "path" in options or "paths" in options


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ValueError(
            "curb sink: a queue can only be appended to; use mode('append') "
            "(or outputMode('append') / 'update' in a streaming query)"
        )
