"""The `curb` format: one Python data source for streaming reads, batch and streaming writes,
and batch reads of log files. Options are checked when Spark asks for a reader or writer,
and a streaming read's already when `load()` asks for the schema, so a bad option fails
before the query starts, in one line that names the option. With `router` and
`destination`, the router is asked for the destination's instances when the reader or
writer is made (curb.spark.routed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from curb.spark.logfile import LogFileReader
from curb.spark.options import OptionError, parse_paths, parse_sink, parse_source
from curb.spark.routed import resolved
from curb.spark.schema import LOG_SCHEMA, MESSAGE_SCHEMA
from curb.spark.sink import CurbStreamWriter, CurbWriter, row_layout
from curb.spark.stream import CurbStreamReader

T = TypeVar("T")


class CurbDataSource(DataSource):
    """Register with `spark.dataSource.register(CurbDataSource)`, then use `format("curb")`."""

    @classmethod
    def name(cls) -> str:
        return "curb"

    def schema(self) -> StructType:
        if _reads_files(self.options):
            return LOG_SCHEMA
        self._parsed(parse_source)
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> LogFileReader:
        return LogFileReader(self._parsed(parse_paths))

    def streamReader(self, schema: StructType) -> CurbStreamReader:
        return CurbStreamReader(resolved(self._parsed(parse_source)))

    def writer(self, schema: StructType, overwrite: bool) -> CurbWriter:
        options = self._parsed(parse_sink)
        _refuse_overwrite(overwrite)
        return CurbWriter(resolved(options), row_layout(schema, options.key))

    def streamWriter(self, schema: StructType, overwrite: bool) -> CurbStreamWriter:
        options = self._parsed(parse_sink)
        _refuse_overwrite(overwrite)
        return CurbStreamWriter(resolved(options), row_layout(schema, options.key))

    def _parsed(self, parse: Callable[[Mapping[str, str]], T]) -> T:
        """`parse(self.options)`; an OptionError loses the parser's frames, so the user sees its one
        line under a short traceback rather than at the end of a long one."""
        try:
            return parse(self.options)
        except OptionError as err:
            raise err.with_traceback(None) from None


def _reads_files(options: Mapping[str, str]) -> bool:
    return "path" in options or "paths" in options


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ValueError(
            "curb sink: a queue can only be appended to; use mode('append') "
            "(or outputMode('append') / 'update' in a streaming query)"
        )
