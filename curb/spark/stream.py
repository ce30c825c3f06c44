"""Curb as a Spark Structured Streaming source, exactly once into an idempotent sink.

The offset is, per endpoint, the highest message id a batch covers (JSON: {"host:port": id}).
Message ids only grow and are never reused, so a batch is the id range (start, end] of each
endpoint, fixed when the driver plans it:

- `latestOffset` asks each endpoint for its highest id (a browse that returns only its end
  marker), at most what was there when an availableNow run began, and at most
  `maxRowsPerBatch` ids past the first live one after the start.
- `partitions` cuts each range into spans of `rowsPerPartition` ids from the first live one
  on, the first span reaching down to the start, and `read` runs on the executors: each task
  opens its own connection and browses its span. A browse changes nothing in the broker, so
  a batch replayed after a failure reads exactly the same rows.
- `commit(end)` acknowledges every message up to `end` (`ACK curb-upto`) and waits for the
  receipt: only then are they gone, and only once Spark has the batch in its commit log.
  Spark asks for the next batch from a committed offset only, so `latestOffset` acknowledges
  up to its start too: a driver killed between the commit log and `commit` leaves nothing behind.

The rule this needs: the query is the only consumer of those brokers. Messages another
consumer acknowledges before a batch reads them are not in the batch (at most once for
them); a message cannot appear in a range already planned, since new messages get higher ids.
A new query starts before every id, so it reads what is queued; an endpoint added to an
existing query joins at its highest id (later messages). An endpoint whose highest id is below
the query's offset (its log replaced) fails the query: its ids no longer mean what was read.

Ids have gaps (a restart after a crash skips 65,536; messages acknowledged), so where a range
is longer than a batch or a partition, one browse from its start, stopped at its first message,
says where the live ids begin: a gap of any size costs one request, not empty batches or tasks.
The first message a browse lists is the lowest live id but for ones compaction moved behind it,
which lie in (start, first) and so stay in the first span.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from curb.client import Client
from curb.spark.browse import BROKER_HEADERS, browse, first_live_id
from curb.spark.connection import EndpointError, EndpointLost, Link, reporting
from curb.spark.options import MAX_ROWS_NONE, Endpoint, SourceOptions
from curb.spark.schema import MESSAGE_SCHEMA, ROWS_PER_BATCH, record_batch


@dataclass(frozen=True)
class IdSpan(InputPartition):
    """What one Spark task reads: the live messages of `endpoint` with `after` < id <= `last`."""

    endpoint: Endpoint
    after: int
    last: int


def spans(endpoint: Endpoint, after: int, skip: int, last: int, size: int) -> list[IdSpan]:
    """(after, last] to read: spans of at most `size` ids cut from `skip` (just below the first
    live id) on, the first reaching down to `after` for the live ids compaction moved behind
    that one; none when `skip` is `last` (nothing live)."""
    cut = [IdSpan(endpoint, start, min(start + size, last)) for start in range(skip, last, size)]
    if cut:
        cut[0] = IdSpan(endpoint, after, cut[0].last)
    return cut


class CurbStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._links: dict[str, Link] = {}  # driver side, opened on first use
        self._acked: dict[str, int] = {}  # per endpoint, the highest id acknowledged by this process
        self._available_now: dict[str, int] | None = None  # the highest ids when an availableNow run began
        self._first_live: dict[str, tuple[int, int]] = {}  # per endpoint, (after, the first live id after it)

    def __getstate__(self) -> dict[str, object]:
        """Executors and Spark's planner get the options only, never the driver's connections."""
        return {"options": self.options, "_links": {}, "_acked": {}, "_available_now": None, "_first_live": {}}

    def initialOffset(self) -> dict[str, int]:
        """Before every id: the first batch skips to the live ones (`latestOffset`, `partitions`)."""
        return {endpoint.label: 0 for endpoint in self.options.endpoints}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_batch == MAX_ROWS_NONE:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_batch * len(self.options.endpoints))

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {endpoint.label: self._highest(endpoint) for endpoint in self.options.endpoints}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        highest = {
            endpoint.label: self._highest(endpoint, start.get(endpoint.label)) for endpoint in self.options.endpoints
        }
        self._acknowledge(start)
        per_endpoint = None
        if isinstance(limit, ReadMaxRows):
            per_endpoint = max(1, limit.max_rows // len(self.options.endpoints))
        end = {}
        for endpoint in self.options.endpoints:
            last = highest[endpoint.label]
            if self._available_now is not None:
                last = min(last, self._available_now[endpoint.label])
            first = start.get(endpoint.label)
            if first is not None and per_endpoint is not None and last - first > per_endpoint:
                live = self._first_live_after(endpoint, first, last)
                if live is not None:
                    last = min(last, live - 1 + per_endpoint)
            end[endpoint.label] = last if first is None else max(first, last)
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        size = self.options.rows_per_partition
        planned: list[InputPartition] = []
        for endpoint in self.options.endpoints:
            last = end.get(endpoint.label)
            if last is None:
                continue
            after = skip = start.get(endpoint.label, last)
            if last - after > size:
                live = self._first_live_after(endpoint, after, last)
                skip = last if live is None else live - 1
            planned += spans(endpoint, after, skip, last, size)
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """On an executor: the span's messages as Arrow batches, from a connection of this task's own."""
        assert isinstance(partition, IdSpan)
        link = Link(partition.endpoint, self.options.connection, self.options.reconnect_timeout_s)
        try:
            yield from _browse_span(link, partition)
        finally:
            link.close()

    def commit(self, end: dict[str, int]) -> None:
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

    def _highest(self, endpoint: Endpoint, offset: int | None = None) -> int:
        """The endpoint's highest message id; EndpointError if it is below `offset`, this query's."""

        def ask(client: Client) -> int:
            with reporting(endpoint, "asking for the highest message id"):
                return client.last_id()

        highest = self._link(endpoint).run(ask)
        if offset is not None and highest < offset:
            raise EndpointError(
                f"curb endpoint {endpoint.label}: its highest message id is {highest}, below this query's "
                f"offset {offset}: its log was replaced or reset, so its ids are not the ones this query "
                "read; restore that log, or read this one with a new query (a new checkpointLocation)"
            )
        return highest

    def _acknowledge(self, offset: dict[str, int]) -> None:
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

    def _first_live_after(self, endpoint: Endpoint, after: int, last: int) -> int | None:
        """The first live id a browse of (after, last] lists, None if there is none; one browse,
        whose answer the same batch's `partitions` reuses."""
        known = self._first_live.get(endpoint.label)
        if known is not None and known[0] == after and known[1] <= last:
            return known[1]
        link = self._link(endpoint)

        def probe(client: Client) -> int | None:
            with reporting(endpoint, f"looking for the first live message id after {after}"):
                return first_live_id(client, after, last)

        try:
            found = link.run(probe)
        finally:
            link.close()  # the browse is still streaming: this connection is done
        if found is not None:
            self._first_live[endpoint.label] = (after, found)
        return found


def _browse_span(link: Link, span: IdSpan) -> Iterator[pa.RecordBatch]:
    """The span's rows in batches of ROWS_PER_BATCH. After an outage the browse starts over and
    skips the ids already given: a retried browse lists the same messages, maybe in another order."""
    label = span.endpoint.label
    given: set[int] = set()
    columns: list[list[object]] = [[] for _ in MESSAGE_SCHEMA.fields]
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
