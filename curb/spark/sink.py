"""Writing DataFrames into Curb, in batch and streaming queries.

Each task sends its rows to one endpoint (its partition id modulo the number of endpoints),
or, with the `key` option, each row to the endpoint its key hashes to. Every SEND asks for a
receipt; at most `window` receipts are outstanding per connection, and a task reports success
only when all of them came back, i.e. when every row it sent is on disk in Curb. A failed task
may have sent part of its rows: a retry sends them again (at least once).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, DataType, MapType, StringType, StructType

from curb.client import Client
from curb.spark.connection import open_client, reporting
from curb.spark.options import Endpoint, SinkOptions


@dataclass(frozen=True, slots=True)
class RowLayout:
    """Where the sink finds each row's body, headers and routing key (column positions)."""

    body: int
    headers: int | None
    key: int | None


def row_layout(schema: StructType, key: str | None) -> RowLayout:
    """Check the DataFrame's columns against what the sink needs; errors name the column."""
    names = schema.fieldNames()
    if "body" not in names:
        raise ValueError(f"curb sink: the DataFrame needs a 'body' column (binary or string); it has {names}")
    if not isinstance(schema["body"].dataType, (BinaryType, StringType)):
        raise ValueError(
            f"curb sink: column 'body' must be binary or string, not {schema['body'].dataType.simpleString()}"
        )
    if "headers" in names and not _is_string_map(schema["headers"].dataType):
        raise ValueError(
            f"curb sink: column 'headers' must be map<string,string>, not {schema['headers'].dataType.simpleString()}"
        )
    if key is not None and key not in names:
        raise ValueError(f"curb option 'key': the DataFrame has no column {key!r}; it has {names}")
    return RowLayout(
        names.index("body"),
        names.index("headers") if "headers" in names else None,
        names.index(key) if key is not None else None,
    )


def _is_string_map(data_type: DataType) -> bool:
    return (
        isinstance(data_type, MapType)
        and isinstance(data_type.keyType, StringType)
        and isinstance(data_type.valueType, StringType)
    )


def endpoint_of_key(key: object, count: int) -> int:
    """The endpoint index for a key: CRC-32 of its bytes (text as UTF-8), the same in every process."""
    data = key if isinstance(key, bytes) else str(key).encode()
    return zlib.crc32(data) % count


class _Link:
    """One connection a task sends on, with the receipts it still waits for (oldest first)."""

    def __init__(self, endpoint: Endpoint, client: Client, window: int) -> None:
        self.endpoint = endpoint
        self.client = client
        self.window = window
        self.outstanding: deque[str] = deque()
        self.arrived: set[str] = set()  # receipts that came while an older one was awaited
        self.sent = 0

    def send(self, body: bytes, headers: dict[str, str] | None) -> None:
        if len(self.outstanding) >= self.window:
            self._await_oldest()
        self.sent += 1
        receipt = str(self.sent)
        with reporting(self.endpoint, "sending"):
            self.client.send(body, headers=headers, receipt=receipt)
        self.outstanding.append(receipt)

    def finish(self) -> None:
        while self.outstanding:
            self._await_oldest()

    def _await_oldest(self) -> None:
        receipt = self.outstanding.popleft()
        if receipt in self.arrived:
            self.arrived.remove(receipt)
            return
        with reporting(self.endpoint, "waiting for a receipt"):
            for frame in self.client.wait_receipt(receipt):
                if frame.command == "RECEIPT":
                    self.arrived.add(frame.headers["receipt-id"])


def send_rows(options: SinkOptions, layout: RowLayout, batches: Iterable[pa.RecordBatch]) -> None:
    """Send every row of a task and return once Curb has them all on disk."""
    links: dict[int, _Link] = {}
    task = TaskContext.get()
    if task is None:
        raise RuntimeError("curb sink: rows are sent from a Spark task, and this is none")
    fixed = task.partitionId() % len(options.endpoints)
    try:
        for batch in batches:
            for body, headers, target in _messages(batch, layout, fixed, len(options.endpoints)):
                link = links.get(target)
                if link is None:
                    endpoint = options.endpoints[target]
                    link = links[target] = _Link(endpoint, open_client(endpoint, options.connection), options.window)
                link.send(body, headers)
        for link in links.values():
            link.finish()
    finally:
        for link in links.values():
            link.client.close()


def _messages(
    batch: pa.RecordBatch, layout: RowLayout, fixed: int, count: int
) -> Iterator[tuple[bytes, dict[str, str] | None, int]]:
    bodies = batch.column(layout.body).to_pylist()
    headers: Iterable[dict[str, str] | None] = repeat(None)
    if layout.headers is not None:
        headers = (dict(pairs) if pairs else None for pairs in batch.column(layout.headers).to_pylist())
    targets: Iterable[int] = repeat(fixed)
    if layout.key is not None:
        targets = (endpoint_of_key(key, count) for key in batch.column(layout.key).to_pylist())
    for body, header_map, target in zip(bodies, headers, targets, strict=False):  # the last two may repeat()
        if body is None:
            raise ValueError("curb sink: a row has a null 'body'")
        yield (body.encode() if isinstance(body, str) else body), header_map, target


class _Sender:
    """What both writers do with a partition's rows: send them, then wait for every receipt."""

    def __init__(self, options: SinkOptions, layout: RowLayout) -> None:
        self.options = options
        self.layout = layout

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        send_rows(self.options, self.layout, iterator)
        return WriterCommitMessage()


class CurbWriter(_Sender, DataSourceArrowWriter):
    """Batch writes."""


class CurbStreamWriter(_Sender, DataSourceStreamArrowWriter):
    """Each micro-batch is written like a batch write: the batch commits only after every receipt."""
