"""Curb as a Spark Structured Streaming source, at least once.

Spark runs this reader in one long-lived driver-side process per query run, so it keeps one
STOMP connection per endpoint across micro-batches (opened lazily: the reader is also pickled
by a planner process). A message is ACKed only once the micro-batch holding it is in Spark's
commit log, which is the case for every batch up to `start` when Spark asks for the next batch
in `read(start)`, and up to `end` in `commit(end)`. Spark does not call `commit` for the last
batch of an `availableNow` run, so `read` acknowledges too. The final ACK of each round carries
a receipt and is awaited, so an acknowledgement is durable in Curb before the batch after it runs.

The offset is, per endpoint, how many messages this query has taken from it: it only grows,
so a batch with rows always moves it. Nothing is replayed from an offset: when a query dies,
its connections drop and Curb redelivers every message not yet ACKed to the restarted query.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from curb.client import Client
from curb.frame import Frame
from curb.spark.connection import EndpointError, open_client, reporting
from curb.spark.options import Endpoint, SourceOptions
from curb.spark.schema import MESSAGE_SCHEMA, record_batch

QUEUE_SUBSCRIPTION = "queue"
COUNT_SUBSCRIPTION = "count"
# Headers the broker adds to a MESSAGE; the rest are the producer's and go to the `headers` column.
BROKER_HEADERS = frozenset(
    {"subscription", "message-id", "ack", "destination", "content-length", "redelivered", "curb-deliveries"}
)
# How long one wait on one endpoint may block while others may have messages.
WAIT_SLICE_S = 0.01
# A pause this long ends a burst of frames: what came so far makes the batch.
GAP_S = 0.005


class _Consumer:
    """One endpoint: its connection, messages received but not yet in a batch, and batches awaiting ACK."""

    def __init__(self, endpoint: Endpoint, client: Client, prefetch: int) -> None:
        self.endpoint = endpoint
        self.client = client
        self.received: deque[Frame] = deque()
        # (the endpoint's offset at the end of a batch, the ack ids of that batch), oldest first
        self.unacked: deque[tuple[int, list[str]]] = deque()
        self.ready: int | None = None  # the broker's rdy count, once subscribed to ./count
        self.receipts = 0
        with reporting(endpoint, "subscribing"):
            client.subscribe(sub_id=QUEUE_SUBSCRIPTION, ack="client-individual", prefetch=prefetch)

    def receive(self, limit: int, timeout: float) -> None:
        """Take frames until `limit` messages wait, the first frame took longer than `timeout`,
        or a later one longer than GAP_S."""
        with reporting(self.endpoint, "receiving"):
            while len(self.received) < limit:
                frame = self.client.receive(timeout)
                if frame is None:
                    return
                self._take(frame)
                timeout = GAP_S

    def _take(self, frame: Frame) -> None:
        if frame.command != "MESSAGE":
            return
        subscription = frame.headers.get("subscription")
        if subscription == QUEUE_SUBSCRIPTION:
            self.received.append(frame)
        elif subscription == COUNT_SUBSCRIPTION:
            self.ready = int(frame.headers["rdy"])

    def ack_through(self, offset: int) -> None:
        """ACK every emitted batch that ends at or before `offset`; the last ACK's RECEIPT is awaited."""
        ids: list[str] = []
        while self.unacked and self.unacked[0][0] <= offset:
            ids.extend(self.unacked.popleft()[1])
        if not ids:
            return
        self.receipts += 1
        receipt = f"ack-{self.receipts}"
        with reporting(self.endpoint, "acknowledging"):
            for ack_id in ids[:-1]:
                self.client.ack(ack_id)
            self.client.ack(ids[-1], receipt=receipt)
            for frame in self.client.wait_receipt(receipt):
                self._take(frame)

    def count(self) -> int:
        """Subscribe to ./count and return how many messages are ready for this query right now."""
        with reporting(self.endpoint, "subscribing to ./count"):
            self.client.subscribe(sub_id=COUNT_SUBSCRIPTION, destination="./count", ack="auto")
            while self.ready is None:
                frame = self.client.receive(self.client.timeout)
                if frame is None:
                    raise EndpointError(
                        f"curb endpoint {self.endpoint.label}: no reply on ./count within {self.client.timeout:.0f}s"
                    )
                self._take(frame)
        return self.ready + len(self.received)

    def drained(self) -> bool:
        return self.ready == 0 and not self.received

    def emit(self, limit: int, offset: int, columns: list[list]) -> int:
        """Move up to `limit` received messages into `columns`; record them as a batch ending past `offset`."""
        taken = min(limit, len(self.received))
        if not taken:
            return 0
        ids = []
        for _ in range(taken):
            frame = self.received.popleft()
            headers = frame.headers
            ids.append(headers["ack"])
            row = (
                self.endpoint.label,
                int(headers["message-id"]),
                headers["message-id"],
                headers.get("redelivered") == "true",
                {name: value for name, value in headers.items() if name not in BROKER_HEADERS},
                frame.body,
            )
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        self.unacked.append((offset + taken, ids))
        return taken


class CurbStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumers: list[_Consumer] | None = None
        # messages each endpoint may still give in an availableNow run (None: no such limit)
        self._remaining: dict[str, int] | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "_consumers": None, "_remaining": None}

    def initialOffset(self) -> dict:
        return {endpoint.label: 0 for endpoint in self.options.endpoints}

    def prepareForTriggerAvailableNow(self) -> None:
        self._remaining = {consumer.endpoint.label: consumer.count() for consumer in self._connected()}

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        consumers = self._connected()
        for consumer in consumers:
            consumer.ack_through(start.get(consumer.endpoint.label, 0))
        self._wait_for_messages(consumers)
        columns: list[list] = [[] for _ in MESSAGE_SCHEMA.fields]
        end = dict(start)
        for consumer in consumers:
            label = consumer.endpoint.label
            taken = consumer.emit(self._limit(consumer), start.get(label, 0), columns)
            end[label] = start.get(label, 0) + taken
            if self._remaining is not None:
                self._remaining[label] -= taken
        if not columns[0]:
            return iter([]), start
        return iter([record_batch(MESSAGE_SCHEMA, columns)]), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        """Replay of a batch that was planned but not committed before a restart: nothing.

        Its messages were never ACKed, so Curb redelivers them and they come in a later batch."""
        return iter([])

    def commit(self, end: dict) -> None:
        for consumer in self._connected():
            consumer.ack_through(end.get(consumer.endpoint.label, 0))

    def _connected(self) -> list[_Consumer]:
        if self._consumers is None:
            self._consumers = [
                _Consumer(endpoint, open_client(endpoint, self.options.connection), self.options.prefetch)
                for endpoint in self.options.endpoints
            ]
        return self._consumers

    def _limit(self, consumer: _Consumer) -> int:
        """How many messages the next batch may take from this consumer's endpoint."""
        if self._remaining is None:
            return self.options.batch_size
        return min(self.options.batch_size, self._remaining[consumer.endpoint.label])

    def _wait_for_messages(self, consumers: list[_Consumer]) -> None:
        """Take in what has arrived; if that gives no row, wait: up to `pollMs` in a continuous
        query, until every endpoint is drained or exhausted in an availableNow run."""
        for consumer in consumers:
            consumer.receive(self._limit(consumer), 0)
        deadline = time.monotonic() + self.options.poll_ms / 1000
        while not any(min(len(consumer.received), self._limit(consumer)) for consumer in consumers):
            if self._remaining is None:
                if time.monotonic() >= deadline:
                    return
            elif all(consumer.drained() or not self._limit(consumer) for consumer in consumers):
                return
            for consumer in consumers:
                consumer.receive(self._limit(consumer), WAIT_SLICE_S)
