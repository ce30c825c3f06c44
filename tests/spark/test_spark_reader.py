"""The streaming source's reader called as Spark calls it, against a fake broker: offsets are
message ids, ranges are planned by the driver and read by tasks, replays read the same rows,
commits acknowledge up to the end, and outages cost a reconnect."""

from __future__ import annotations

import random

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from curb.spark.connection import EndpointError
from curb.spark.options import parse_source
from curb.spark.stream import CurbStreamReader, IdSpan, spans

from .fakebroker import FakeBroker


@pytest.fixture
def fakes():
    started: list[FakeBroker] = []
    yield started
    for fake in started:
        fake.close()


def fake(fakes, order=sorted) -> FakeBroker:
    broker = FakeBroker(order)
    fakes.append(broker)
    return broker


def reader_for(*brokers: FakeBroker, **options: str) -> CurbStreamReader:
    endpoints = ",".join(broker.endpoint for broker in brokers)
    return CurbStreamReader(parse_source({"endpoints": endpoints, **options}))


def rows(reader: CurbStreamReader, start: dict, end: dict) -> list[tuple[str, int, bytes]]:
    """What a batch (start, end] gives, each partition read by a fresh copy of the reader, as on an executor."""
    found: list[tuple[str, int, bytes]] = []
    for partition in reader.partitions(start, end):
        for batch in CurbStreamReader(reader.options).read(partition):
            found += zip(
                batch["endpoint"].to_pylist(), batch["seq"].to_pylist(), batch["body"].to_pylist(), strict=True
            )
    return found


@pytest.mark.parametrize(
    "after, skip, last, size, expected",
    [
        (0, 0, 0, 10, []),
        (0, 0, 10, 10, [(0, 10)]),
        (0, 0, 25, 10, [(0, 10), (10, 20), (20, 25)]),
        (7, 7, 8, 10, [(7, 8)]),
        (0, 65_540, 65_560, 10, [(0, 65_550), (65_550, 65_560)]),
        (5, 30, 30, 10, []),
    ],
)
def test_a_range_is_cut_into_spans_from_its_first_live_id(after, skip, last, size, expected):
    endpoint = parse_source({"endpoints": "h:1"}).endpoints[0]
    assert [(span.after, span.last) for span in spans(endpoint, after, skip, last, size)] == expected


def probes(broker: FakeBroker) -> list[tuple[int, int]]:
    """The browses that were not asking for the highest id (those start above every id): before
    any span is read, the driver's probes for the first live id."""
    return [(first, last) for first, last in broker.browses if first < 1 << 62]


@pytest.mark.parametrize(
    "order",
    [sorted, lambda ids: sorted(ids, reverse=True), lambda ids: random.Random(7).sample(ids, len(ids))],
    ids=["ascending", "descending", "shuffled"],
)
@pytest.mark.parametrize("acked", [0, 1, 37, 99, 100])
def test_a_new_query_finds_its_start_in_one_browse_and_reads_every_live_message(fakes, order, acked):
    """However far up the live ids begin, and in whatever order compaction left them."""
    broker = fake(fakes, order)
    broker.highest = 1_000_000  # ids below were acknowledged long ago
    ids = broker.add(100)
    for number in ids[:acked]:
        del broker.messages[number]
    reader = reader_for(broker, rowsPerPartition="10")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {broker.endpoint: 1_000_100}
    assert len(reader.partitions(start, end)) <= 11
    assert len(probes(broker)) == 1, "finding where the live ids begin takes one browse"
    assert sorted(seq for _, seq, _ in rows(reader, start, end)) == ids[acked:]


def test_an_empty_broker_starts_at_zero(fakes):
    broker = fake(fakes)
    reader = reader_for(broker)
    start = reader.initialOffset()
    assert start == {broker.endpoint: 0}
    assert reader.latestOffset(start, ReadAllAvailable()) == start


def test_a_batch_covers_up_to_the_highest_id_and_replays_the_same_rows(fakes):
    a, b = fake(fakes), fake(fakes, lambda ids: sorted(ids, reverse=True))
    a.add(30)
    b.add(5)
    reader = reader_for(a, b, rowsPerPartition="8")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {a.endpoint: 30, b.endpoint: 5}
    assert len(reader.partitions(start, end)) == 4 + 1
    first = rows(reader, start, end)
    assert sorted(first) == sorted(
        [(a.endpoint, n, b"body-%d" % n) for n in range(1, 31)] + [(b.endpoint, n, b"body-%d" % n) for n in range(1, 6)]
    )
    a.add(10)  # new messages get ids above the planned range: the replay does not see them
    assert sorted(rows(reader, start, end)) == sorted(first)


def test_commit_acknowledges_up_to_the_end_and_the_next_batch_starts_there(fakes):
    broker = fake(fakes)
    broker.add(20)
    reader = reader_for(broker)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    reader.commit(end)
    assert broker.messages == {}
    broker.add(3)
    following = reader.latestOffset(end, ReadAllAvailable())
    assert [seq for _, seq, _ in rows(reader, end, following)] == [21, 22, 23]


def test_the_start_of_a_batch_is_acknowledged_when_the_commit_was_lost(fakes):
    """A driver killed after Spark's commit log but before `commit`: the restarted query asks
    for the next batch from that committed offset, and the messages below it go then."""
    broker = fake(fakes)
    broker.add(20)
    restarted = reader_for(broker)
    restarted.latestOffset({broker.endpoint: 15}, ReadAllAvailable())
    assert sorted(broker.messages) == [16, 17, 18, 19, 20]


def test_max_rows_per_batch_limits_each_endpoint(fakes):
    a, b = fake(fakes), fake(fakes)
    a.add(50)
    b.add(3)
    reader = reader_for(a, b, maxRowsPerBatch="10")
    assert reader.getDefaultReadLimit() == ReadMaxRows(20)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMaxRows(20)) == {a.endpoint: 10, b.endpoint: 3}
    assert reader.latestOffset(start, ReadAllAvailable()) == {a.endpoint: 50, b.endpoint: 3}


@pytest.mark.parametrize("gap", [65_536, 10**12])
def test_a_gap_in_the_ids_costs_one_batch_not_one_per_max_rows(fakes, gap):
    """A restart after a crash moves ids up by 65,536: the batch after it reaches the next live id."""
    broker = fake(fakes)
    broker.add(5)
    broker.highest += gap
    after_gap = broker.add(3)
    reader = reader_for(broker, maxRowsPerBatch="2", rowsPerPartition="10")
    limit = reader.getDefaultReadLimit()
    start = {broker.endpoint: 5}
    end = reader.latestOffset(start, limit)
    assert end == {broker.endpoint: after_gap[1]}
    assert len(reader.partitions(start, end)) == 1
    assert len(probes(broker)) == 1, "partitions reuse the probe latestOffset made"
    assert [seq for _, seq, _ in rows(reader, start, end)] == after_gap[:2]
    assert reader.latestOffset(end, limit) == {broker.endpoint: after_gap[2]}


def test_a_range_with_nothing_live_gets_no_partitions(fakes):
    broker = fake(fakes)
    broker.highest = 100_000
    reader = reader_for(broker, rowsPerPartition="10")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {broker.endpoint: 100_000}
    assert reader.partitions(start, end) == []


def test_an_endpoint_whose_ids_went_backwards_fails_with_one_line_naming_it(fakes):
    """Its log replaced under a running query: the highest id is below the offset it committed."""
    broker = fake(fakes)
    broker.add(500)
    reader = reader_for(broker)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    reader.commit(end)
    broker.highest = 0  # a new, empty log
    broker.add(10)
    with pytest.raises(EndpointError) as raised:
        reader.latestOffset(end, ReadAllAvailable())
    message = str(raised.value)
    assert message.startswith(
        f"curb endpoint {broker.endpoint}: its highest message id is 10, below this query's offset 500"
    )
    assert "\n" not in message
    assert sorted(broker.messages) == list(range(1, 11)), "nothing of the new log is acknowledged"


def test_available_now_stops_at_what_was_there_when_it_began(fakes):
    broker = fake(fakes)
    broker.add(10)
    reader = reader_for(broker)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    broker.add(5)
    assert reader.latestOffset(start, ReadAllAvailable()) == {broker.endpoint: 10}


def test_an_endpoint_added_to_a_query_joins_at_its_highest_id(fakes):
    a, b = fake(fakes), fake(fakes)
    a.add(4)
    b.add(6)
    reader = reader_for(a, b)
    end = reader.latestOffset({a.endpoint: 0}, ReadAllAvailable())
    assert end == {a.endpoint: 4, b.endpoint: 6}
    assert {endpoint for endpoint, _, _ in rows(reader, {a.endpoint: 0}, end)} == {a.endpoint}


def test_a_dropped_connection_is_reopened_with_one_log_line_each_way(fakes, caplog):
    broker = fake(fakes)
    broker.add(10)
    reader = reader_for(broker)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    broker.drop_connections()
    reader.commit(end)
    broker.drop_connections()
    broker.add(5)
    assert reader.latestOffset(end, ReadAllAvailable()) == {broker.endpoint: 15}
    assert sorted(broker.messages) == [11, 12, 13, 14, 15]
    lines = [record.getMessage() for record in caplog.records if record.name == "curb.spark"]
    assert len(lines) == 4, lines
    assert [line.startswith(f"curb endpoint {broker.endpoint}: ") for line in lines] == [True] * 4
    assert ["reconnecting for up to 60 s" in line for line in lines] == [True, False, True, False]
    assert ["back after" in line for line in lines] == [False, True, False, True]


def test_a_task_reads_its_span_again_after_an_outage_without_repeating_rows(fakes):
    broker = fake(fakes, lambda ids: random.Random(len(ids)).sample(ids, len(ids)))
    broker.add(10_000)
    broker.cut_next_browse = 6000
    reader = reader_for(broker)
    batches = reader.read(IdSpan(reader.options.endpoints[0], 0, 10_000))
    seqs = [seq for batch in batches for seq in batch["seq"].to_pylist()]
    assert sorted(seqs) == list(range(1, 10_001))
    assert len(broker.browses) == 2


def test_an_endpoint_that_stays_away_fails_with_one_line_naming_it(fakes):
    broker = fake(fakes)
    reader = reader_for(broker, reconnectTimeout="1")
    broker.close()
    with pytest.raises(EndpointError) as raised:
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    message = str(raised.value)
    assert message.startswith(f"curb endpoint {broker.endpoint}: unreachable for 1 s (option 'reconnectTimeout')")
    assert "\n" not in message
