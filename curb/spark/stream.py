"""Curb as a Spark Structured Streaming source, exactly once into an idempotent sink.

The offset is, per endpoint, the highest message id a batch covers (JSON: {"host:port": id}).
Message ids only grow and are never reused, so a batch is the id range (start, end] of each
endpoint, fixed when the driver plans it:

- `latestOffset` asks each endpoint for its highest id (a browse that returns only its end
  marker), at most `maxRowsPerBatch` ids past the start, and at most what was there when an
  availableNow run began.
- `partitions` cuts each range into spans of `rowsPerPartition` ids, and `read` runs on the
  executors: each task opens its own connection and browses its span. A browse changes
  nothing in the broker, so a batch replayed after a failure reads exactly the same rows.
- `commit(end)` acknowledges every message up to `end` (`ACK curb-upto`) and waits for the
  receipt: only then are they gone, and only once Spark has the batch in its commit log.
  Spark asks for the next batch from a committed offset only, so `latestOffset` acknowledges
  up to its start too: a driver killed between the commit log and `commit` leaves nothing behind.

The rule this needs: the query is the only consumer of those brokers. Messages another
consumer acknowledges before a batch reads them are not in the batch (at most once for
them); a message cannot appear in a range already planned, since new messages get higher ids.
A new query starts just before the lowest live id (a binary search by browse), so it reads
what is queued; an endpoint added to an existing query joins at its highest id (later messages).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from curb.client import Client
from curb.spark.browse import BROKER_HEADERS, browse, first_live_id
from curb.spark.connection import EndpointLost, Link, reporting
from curb.spark.options import MAX_ROWS_NONE, Endpoint, SourceOptions
from curb.spark.schema import MESSAGE_SCHEMA, ROWS_PER_BATCH, record_batch


@dataclass(frozen=True)
class IdSpan(InputPartition):
    """What one Spark task reads: the live messages of `endpoint` with `after` < id <= `last`."""

    endpoint: Endpoint
    after: int
    last: int


def spans(endpoint: Endpoint, after: int, last: int, size: int) -> list[IdSpan]:
    """(after, last] cut into consecutive spans of at most `size` ids."""
    return [IdSpan(endpoint, start, min(start + size, last)) for start in range(after, last, size)]


class CurbStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._links: dict[str, Link] = {}  # driver side, opened on first use
        self._acked: dict[str, int] = {}  # per endpoint, the highest id acknowledged by this process
        self._available_now: dict[str, int] | None = None  # the highest ids when an availableNow run began

    def __getstate__(self) -> dict:
        """Executors and Spark's planner get the options only, never the driver's connections."""
        return {"options": self.options, "_links": {}, "_acked": {}, "_available_now": None}

    def initialOffset(self) -> dict:
        return {endpoint.label: self._before_lowest_live(endpoint) for endpoint in self.options.endpoints}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_batch == MAX_ROWS_NONE:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_batch * len(self.options.endpoints))

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {endpoint.label: self._highest(endpoint) for endpoint in self.options.endpoints}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._acknowledge(start)
        per_endpoint = None
        if isinstance(limit, ReadMaxRows):
            per_endpoint = max(1, limit.max_rows // len(self.options.endpoints))
        end = {}
        for endpoint in self.options.endpoints:
            highest = self._highest(endpoint)
            if self._available_now is not None:
                highest = min(highest, self._available_now[endpoint.label])
            if endpoint.label not in start:
                end[endpoint.label] = highest
                continue
            first = start[endpoint.label]
            if per_endpoint is not None:
                highest = min(highest, first + per_endpoint)
            end[endpoint.label] = max(first, highest)
        return end

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        planned: list[InputPartition] = []
        for endpoint in self.options.endpoints:
            last = end.get(endpoint.label)
            if last is None:
                continue
            planned += spans(endpoint, start.get(endpoint.label, last), last, self.options.rows_per_partition)
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """On an executor: the span's messages as Arrow batches, from a connection of this task's own."""
        assert isinstance(partition, IdSpan)
        link = Link(partition.endpoint, self.options.connection, self.options.reconnect_timeout_s)
        try:
            yield from _browse_span(link, partition)
        finally:
            link.close()

    def commit(self, end: dict) -> None:
        self._acknowledge(end)

    def stop(self) -> None:
        for link in self._links.values():
            link.close()

    def _link(self, endpoint: Endpoint) -> Link:
        link = self._links.get(endpoint.label)
        if link is None:
            link = self._links[endpoint.label] = Link(
                endpoint, self.options.connection, self.options.reconnect_timeout_s
            )
        return link

    def _highest(self, endpoint: Endpoint) -> int:
        def ask(client: Client) -> int:
            with reporting(endpoint, "asking for the highest message id"):
                return client.last_id()

        return self._link(endpoint).run(ask)

    def _acknowledge(self, offset: dict) -> None:
        """ACK every message up to `offset` on each endpoint it moves past what this process acknowledged."""
        for endpoint in self.options.endpoints:
            last = offset.get(endpoint.label, 0)
            if last <= self._acked.get(endpoint.label, 0):
                continue

            def ack(client: Client, endpoint: Endpoint = endpoint, last: int = last) -> None:
                """ACK curb-upto, returning once its RECEIPT says the acknowledgement is durable."""
                with reporting(endpoint, f"acknowledging up to id {last}"):
                    client.ack_upto(last, receipt="upto")
                    client.wait_receipt("upto")

            self._link(endpoint).run(ack)
            self._acked[endpoint.label] = last

    def _before_lowest_live(self, endpoint: Endpoint) -> int:
        """The id just below the lowest live message (the highest id if none is live).

        A browse lists messages in log order, which is id order except where compaction moved
        a message, so the first one listed is only an upper bound: a binary search narrows
        (no live id <= low, a live id at high) with browses that stop at their first message."""
        link = self._link(endpoint)
        high = self._highest(endpoint)

        def first_at_most(last: int) -> int | None:
            def probe(client: Client) -> int | None:
                with reporting(endpoint, "looking for the lowest live message id"):
                    return first_live_id(client, last)

            try:
                return link.run(probe)
            finally:
                link.close()  # the browse is still streaming: this connection is done

        found = first_at_most(high) if high else None
        if found is None:
            return high
        low, high = 0, found
        while high - low > 1:
            middle = (low + high) // 2
            found = first_at_most(middle)
            low, high = (middle, high) if found is None else (low, found)
        return high - 1


def _browse_span(link: Link, span: IdSpan) -> Iterator[pa.RecordBatch]:
    """The span's rows in batches of ROWS_PER_BATCH. After an outage the browse starts over and
    skips the ids already given: a retried browse lists the same messages, maybe in another order."""
    label = span.endpoint.label
    given: set[int] = set()
    columns: list[list] = [[] for _ in MESSAGE_SCHEMA.fields]
    endpoints, seqs, message_ids, header_maps, bodies = columns
    while True:
        try:
            with reporting(span.endpoint, f"reading ids {span.after + 1}..{span.last}"):
                for frame in browse(link.client(), span.after + 1, span.last):
                    headers = frame.headers
                    message_id = headers["message-id"]
                    seq = int(message_id)
                    if seq in given:
                        continue
                    given.add(seq)
                    endpoints.append(label)
                    seqs.append(seq)
                    message_ids.append(message_id)
                    header_maps.append({name: value for name, value in headers.items() if name not in BROKER_HEADERS})
                    bodies.append(frame.body)
                    if len(seqs) == ROWS_PER_BATCH:
                        yield record_batch(MESSAGE_SCHEMA, columns)
                        columns = [[] for _ in MESSAGE_SCHEMA.fields]
                        endpoints, seqs, message_ids, header_maps, bodies = columns
        except EndpointLost as err:
            link.lost(err)
            continue
        link.working()
        break
    if seqs:
        yield record_batch(MESSAGE_SCHEMA, columns)
