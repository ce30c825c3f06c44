"""The capped log on its own: durability callbacks, recovery, torn tails, the cap,
copying in-flight records forward, and the offline reader."""

import asyncio
import os
import shutil

import pytest

from curb.log import Log, LogError, LogReader, QueueFull, Record, TooLarge
from curb.log.record import RECORD_HEADER

CAP = 64 * 1024


def payload(n: int, size: int = 100) -> bytes:
    body = (b"m%06d-" % n).ljust(size, b"x")
    return b"content-type:text/plain\n\n" + body


class Harness:
    """A Log driven from a private event loop, with helpers to wait for its syncs;
    `log` is its core."""

    def __init__(self, path, cap=CAP, **kw):
        self.loop = asyncio.new_event_loop()
        self.driver = Log(path, cap, **kw)
        self.log = self.driver.core
        self.driver.start(self.loop)
        self.path = path

    def settle(self, seconds: float = 0.0) -> None:
        """Run the loop until every write is synced and checkpointed."""

        async def wait():
            await asyncio.sleep(seconds)
            for _ in range(2000):
                if not self.driver.busy:
                    return
                await asyncio.sleep(0.001)
            raise AssertionError("log never settled")

        self.loop.run_until_complete(wait())

    def append(self, data: bytes) -> list[str | None]:
        result: list[str | None] = []
        self.log.append(data, result.append)
        return result

    def drain(self, ack: bool = True) -> list[Record]:
        out: list[Record] = []
        while (rec := self.log.next_ready()) is not None:
            out.append(rec)
            if ack:
                self.log.ack(rec)
        return out

    def close(self) -> None:
        self.loop.run_until_complete(self.driver.close())
        self.loop.close()


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "q.log")


def reopen(path, cap=CAP) -> Harness:
    return Harness(path, cap)


def filled(path, count: int) -> Harness:
    """A log holding payload(0) .. payload(count - 1), all synced."""
    h = Harness(path)
    for i in range(count):
        h.append(payload(i))
    h.settle()
    return h


def with_stuck_record(path) -> tuple[Harness, Record]:
    """A log whose first message is delivered and never acked."""
    h = filled(path, 1)
    rec = h.log.next_ready()
    assert rec is not None
    return h, rec


def churn(h: Harness, stuck, count: int, seen: set | None = None) -> None:
    """Send and drain `count` more messages while `stuck` stays in flight."""
    for n in range(1, count):
        h.log.append(payload(n))
        if seen is not None:
            seen.add(stuck.offset)
        if n % 50 == 0:
            h.settle()
            h.drain()
    h.settle()
    h.drain()


def test_append_is_durable_then_recovered_in_order(path):
    h = Harness(path)
    results = [h.append(payload(i)) for i in range(20)]
    h.settle()
    assert all(r == [None] for r in results)
    h.close()
    h = reopen(path)
    assert h.log.recovery.messages == 20
    assert [h.log.payload(r) for r in h.drain()] == [payload(i) for i in range(20)]
    h.close()


def test_acked_messages_never_come_back_and_wip_does(path):
    h = filled(path, 10)
    recs = h.drain(ack=False)
    for rec in recs[:4]:
        h.log.ack(rec)
    h.settle()
    h.close()
    h = reopen(path)
    assert [h.log.payload(r) for r in h.drain()] == [payload(i) for i in range(4, 10)]
    h.close()


def test_on_durable_runs_after_the_ack_is_synced(path):
    h = filled(path, 1)
    rec = h.log.next_ready()
    assert rec is not None
    h.log.ack(rec)
    done: list[str | None] = []
    h.log.on_durable(done.append)
    assert done == []
    h.settle()
    assert done == [None]
    h.close()


def test_requeue_keeps_the_delivery_count(path):
    h = filled(path, 1)
    rec = h.log.next_ready()
    assert rec is not None
    for _ in range(3):
        h.log.delivered(rec)
    h.log.requeue(rec)
    h.settle()
    h.close()
    h = reopen(path)
    again = h.log.next_ready()
    assert again is not None
    assert again.deliveries == 3
    h.close()


def crash_copy(h: Harness, dest) -> str:
    """The file as a crash would leave it now: synced data, no final checkpoint."""
    h.settle()
    shutil.copyfile(h.path, dest)
    return str(dest)


def test_records_written_after_the_last_checkpoint_are_recovered(path, tmp_path):
    h = filled(path, 5)
    crashed = crash_copy(h, tmp_path / "crash.log")
    h.close()
    with LogReader(crashed) as reader:
        assert [e.body[:7] for e in reader.entries()] == [b"m%06d" % i for i in range(5)]
    h2 = reopen(crashed)
    assert h2.log.recovery.messages == 5
    assert h2.log.recovery.torn is None
    h2.close()


@pytest.mark.parametrize("cut", [1, 30, 70, 120])
def test_torn_tail_is_dropped_and_reported(path, tmp_path, cut):
    h = filled(path, 5)
    crashed = crash_copy(h, tmp_path / "crash.log")
    h.close()
    last = list(LogReader(crashed).entries())[-1]
    os.truncate(crashed, last.offset + cut)
    h2 = reopen(crashed)
    assert h2.log.recovery.messages == 4
    assert h2.log.recovery.torn and "torn" in h2.log.recovery.torn
    assert [h2.log.payload(r) for r in h2.drain()] == [payload(i) for i in range(4)]
    h2.append(payload(99))
    h2.settle()
    h2.close()
    h3 = reopen(crashed)
    assert [h3.log.payload(r) for r in h3.drain()] == [payload(99)]
    h3.close()


def test_corrupt_last_record_is_never_delivered(path):
    h = filled(path, 5)
    h.close()
    last = list(LogReader(path).entries())[-1]
    with open(path, "r+b") as f:
        f.seek(last.offset + RECORD_HEADER + 2)  # in the payload
        f.write(b"!")
    h = reopen(path)
    assert h.log.recovery.torn
    assert [h.log.payload(r) for r in h.drain()] == [payload(i) for i in range(4)]
    h.close()


def test_corruption_in_the_middle_loses_only_that_record(path):
    h = filled(path, 5)
    h.close()
    third = list(LogReader(path).entries())[2]
    with open(path, "r+b") as f:
        f.seek(third.offset + 80)
        f.write(b"!!!")
    h = reopen(path)
    assert [h.log.payload(r) for r in h.drain()] == [payload(i) for i in (0, 1, 3, 4)]
    h.close()


def test_too_large_and_full_store_nothing(path):
    h = Harness(path)
    with pytest.raises(TooLarge):
        h.log.append(b"\n" + b"x" * CAP)
    n = 0
    with pytest.raises(QueueFull):
        while True:
            h.log.append(payload(n))
            n += 1
    h.settle()
    assert n > 0.7 * CAP / 200
    assert os.path.getsize(path) <= CAP
    h.close()
    h = reopen(path)
    assert h.log.recovery.messages == n
    h.close()


def test_the_ring_wraps_many_times_under_the_cap(path):
    h = Harness(path)
    sent = received = 0
    for _lap in range(12):
        try:
            while True:
                h.log.append(payload(sent))
                sent += 1
        except QueueFull:
            pass
        h.settle()
        assert os.path.getsize(path) <= CAP
        for rec in h.drain():
            assert h.log.payload(rec) == payload(received)
            received += 1
        h.settle()
    assert sent == received > 12 * 200
    h.close()


def test_an_unacked_record_does_not_pin_the_ring(path):
    """A consumer holding one message forever: the tail copies it forward, the queue
    keeps flowing through many laps, and the message is still there, once."""
    h, stuck = with_stuck_record(path)
    offsets = {stuck.offset}
    churn(h, stuck, 3000, offsets)
    h.settle()
    assert 5 * CAP < 3000 * 190
    assert len(offsets) >= 5
    assert h.log.payload(stuck) == payload(0)
    h.close()
    h = reopen(path)
    assert [h.log.payload(r) for r in h.drain()] == [payload(0)]
    h.close()


def test_a_moved_record_acked_stays_acked_after_restart(path):
    h, stuck = with_stuck_record(path)
    churn(h, stuck, 1000)
    h.log.ack(stuck)
    h.settle()
    h.close()
    h = reopen(path)
    assert h.drain() == []
    h.close()


def test_a_crash_right_after_a_move_delivers_the_message_once(path, tmp_path):
    """Between the copy's sync and the checkpoint that retires the original, the file
    holds the message twice; recovery hands it out once."""
    h, stuck = with_stuck_record(path)
    copies: list[str] = []
    n = 1
    while len(copies) < 3 and n < 5000:
        before = stuck.offset
        h.log.append(payload(n))
        n += 1
        h.loop.run_until_complete(asyncio.sleep(0))
        if stuck.offset != before:
            h.loop.run_until_complete(asyncio.sleep(0.01))
            copies.append(shutil.copyfile(path, tmp_path / f"crash{len(copies)}.log"))
        if n % 50 == 0:
            h.settle()
            h.drain()
    h.close()
    assert copies, "no record was ever moved"
    for crashed in copies:
        h = reopen(crashed)
        ids = [r.id for r in h.drain()]
        assert ids.count(stuck.id) == 1
        assert len(ids) == len(set(ids))
        h.close()


def test_a_second_broker_on_the_same_file_is_refused(path):
    h = Harness(path)
    with pytest.raises(LogError, match="in use by another running curb"):
        Log(path, CAP)
    h.close()


def test_a_file_that_is_not_a_log_is_refused(path):
    with open(path, "wb") as f:
        f.write(b"hello world\n" * 100)
    with pytest.raises(LogError, match="not a curb log"):
        Log(path, CAP)


def test_a_cap_smaller_than_the_file_is_refused(path):
    h = Harness(path, cap=256 * 1024)
    for i in range(1000):
        h.log.append(payload(i))
    h.settle()
    h.close()
    with pytest.raises(LogError, match="-cap"):
        Log(path, CAP)


def test_reader_reports_states_and_headers(path):
    h = Harness(path)
    for i in range(3):
        h.log.append(b"content-type:text/plain\nx-key:a\\cb\n\nbody%d" % i)
    h.settle()
    h.log.next_ready()
    second = h.log.next_ready()
    assert second is not None
    h.log.ack(second)
    h.settle()
    h.close()
    with LogReader(path) as reader:
        entries = list(reader.entries())
        summary = reader.summary()
    assert [e.state for e in entries] == ["rdy", "ack", "rdy"]
    assert entries[2].headers == {"content-type": "text/plain", "x-key": "a:b"}
    assert entries[2].body == b"body2"
    assert (summary.messages, summary.acked, summary.torn) == (2, 1, None)


def test_writes_of_more_buffers_than_one_call_takes(tmp_path):
    from curb.log.disk import FileDisk

    path = tmp_path / "f"
    path.write_bytes(b"")
    bufs = [b"%05d" % i for i in range(3000)]
    disk = FileDisk(str(path))
    try:
        disk.pwritev(list(bufs), 7)
    finally:
        disk.close()
    assert path.read_bytes() == b"\0" * 7 + b"".join(bufs)
