"""No frame stalls the broker: walks of the ring (an ACK up to an id passing what it
made dead, a browse reaching its range) run in bounded slices, and a browse far from
the read position starts at a mark near its range, also after a restart.

In memory over the real log on a SimDisk (the work per slice is counted in records, not
timed), and once against the real broker: another client is answered in the middle of
an ACK up to an id over a large queue.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from simdisk import SimDisk

from curb.client import Client
from curb.frame import Frame, FrameParser, encode
from curb.log import LogCore, QueueFull
from curb.log.browse import Browse
from curb.log.cursor import RECORD_WORK, SLICE_WORK
from curb.log.record import RECORD_HEADER, RecordHeader

CAP = 8 << 20
N = 20_000
PER_SLICE = SLICE_WORK // RECORD_WORK + 1  # records a slice may pass, at the least work each


def filled(disk: SimDisk, n: int = N) -> LogCore:
    """A log on `disk` holding messages 1..n, written and synced."""
    log = LogCore(disk, CAP)
    for i in range(1, n + 1):
        log.append(b"\n%d" % i)
        if i % 1000 == 0:
            log.flush()
    log.flush()
    log.sync()
    return log


def reopened(log: LogCore, cap: int = CAP) -> LogCore:
    """The same file after a clean stop and a start-up."""
    log.final_checkpoint()
    return LogCore(log.disk, cap)


def test_an_ack_upto_passes_at_most_a_slice_of_records_per_call_and_its_receipt_waits_for_no_walk() -> None:
    log = filled(SimDisk(random.Random(1)))
    answers: list[str | None] = []
    log.ack_upto(N - 10, answers.append)
    passed = [N - log.unread]
    assert log.walking
    while log.walking:
        before = log.unread
        log.flush()
        log.sync()
        passed.append(before - log.unread)
    assert max(passed) <= PER_SLICE
    assert len(passed) >= N // PER_SLICE  # the walk took many calls, none of them long
    assert answers == [None]
    assert log.unread == 10
    rec = log.next_ready()
    assert rec is not None and rec.id == N - 9


def test_an_ack_upto_is_durable_before_its_walk_ends() -> None:
    disk = SimDisk(random.Random(1))
    log = filled(disk)
    answers: list[str | None] = []
    log.ack_upto(N - 10, answers.append)
    for _ in range(3):
        log.flush()
        log.sync()
    assert answers == [None] and log.walking  # the RECEIPT left while the walk goes on
    after = LogCore(disk.crash("power"), CAP)
    assert after.acked_upto == N - 10
    assert [after.payload(rec)[1:] for rec in iter(after.next_ready, None)] == [b"%d" % i for i in range(N - 9, N + 1)]


def test_an_ack_upto_a_crash_interrupts_between_slices_takes_all_or_nothing() -> None:
    for flushes in range(4):
        disk = SimDisk(random.Random(1))
        log = filled(disk)
        log.ack_upto(N - 10)  # no receipt: a crash may come before its checkpoint
        for _ in range(flushes):
            log.flush()
        after = LogCore(disk.crash("power"), CAP)
        ids = []
        while (rec := after.next_ready()) is not None or after.walking:
            if rec is None:
                after.flush()
            else:
                ids.append(int(after.payload(rec)[1:]))
        first = 1 if after.acked_upto < N - 10 else N - 9
        assert ids == list(range(first, N + 1)), flushes


def counted(browse: Browse) -> list[int]:
    """Count the records a browse reads, one entry per step taken through `step`."""
    plain = browse._plain
    reads = [0]

    def counting(pos: int, limit: int) -> tuple[RecordHeader, bytes, int] | None:
        reads[0] += 1
        return plain(pos, limit)

    browse._plain = counting  # type: ignore[method-assign]
    return reads


def test_a_browse_step_reads_at_most_a_slice_of_records() -> None:
    log = filled(SimDisk(random.Random(1)))
    browse = log.browse(N - 10, N)
    browse.pos, browse.last_wseq = log._cursor.tail(), -1  # from the oldest message: no mark
    reads = counted(browse)
    got: list[int] = []
    steps = 0
    while not browse.done:
        before = reads[0]
        step = browse.step(1 << 20)
        got += [mid for mid, _ in step.messages]
        steps += 1
        assert reads[0] - before <= PER_SLICE + 1
    assert got == list(range(N - 10, N + 1))
    assert steps >= N // PER_SLICE


def test_a_browse_far_ahead_after_a_restart_starts_at_a_mark_near_its_range() -> None:
    log = reopened(filled(SimDisk(random.Random(1))))
    browse = log.browse(N - 100, N - 90)
    reads = counted(browse)
    got: list[int] = []
    while not browse.done:
        got += [mid for mid, _ in browse.step(1 << 20).messages]
    assert got == list(range(N - 100, N - 89))
    record = RECORD_HEADER + len(b"\n%d" % N) + 1
    # Two spacings of marks at most, not the N - 100 records from the read position.
    assert reads[0] <= 2 * log.marks.spacing // record + 10 < N // 2


def test_marks_stay_right_as_the_ring_wraps_and_compaction_moves_held_messages() -> None:
    """Small rings, many laps, held messages copied forward, restarts: every browse from
    every from-id returns exactly the live messages in its range."""
    rng = random.Random(7)
    disk = SimDisk(rng)
    log = LogCore(disk, 64 * 1024, mark_spacing=300, slice_work=3 * RECORD_WORK)
    now = [0.0]
    log.clock = lambda: now[0]
    live: set[int] = set()
    held = []
    for round_ in range(40):
        for _ in range(rng.randrange(20, 120)):
            try:
                live.add(log.append(b"\n" + b"m" * rng.randrange(10, 300)).id)
            except Exception:  # queue full: the held messages pin the ring
                break
        for _ in range(8):
            now[0] += 0.06
            log.flush()
            log.sync()
        while (rec := log.next_ready()) is not None:
            if rng.random() < 0.05:
                held.append(rec)  # pinned: compaction copies it forward
            else:
                log.ack(rec)
                live.discard(rec.id)
        if round_ % 10 == 9:
            if rng.random() < 0.5:
                log.final_checkpoint()
            else:
                disk = disk.crash("kill")
            log = LogCore(disk, 64 * 1024, mark_spacing=300, slice_work=3 * RECORD_WORK)
            log.clock = lambda: now[0]
            held.clear()  # a restart makes every held message rdy again
        for first in rng.sample(range(1, log.last_id + 2), 5):
            browse = log.browse(first, log.last_id)
            got: list[int] = []
            while not browse.done:
                got += [mid for mid, _ in browse.step(rng.choice((1, 1 << 20))).messages]
            log.end_browse(browse)
            assert sorted(got) == sorted(i for i in live if i >= first), (round_, first)
            assert len(got) == len(set(got))


def write_log(path: Path, n: int) -> None:
    """A log file holding n small messages, written without a broker (fast)."""
    from curb.log.driver import open_disk

    log = LogCore(open_disk(str(path)), 64 << 20)
    i = 1
    while i <= n:
        try:
            log.append(b"\n%d" % i)
            i += 1
        except QueueFull:  # ids are reserved by the next checkpoint
            log.flush()
            log.sync()
    log.final_checkpoint()
    log.disk.close()


def test_another_client_is_answered_in_the_middle_of_an_ack_upto_over_a_large_queue(tmp_path, curb_broker) -> None:
    """Client A ACKs up to an id over 200,000 queued messages and gets its RECEIPT;
    then client B asks for the counts (answered at once), and gets them while the walk
    that ACK started is not done: rdy still counts messages the ACK took. On a broker
    that walked them all in A's frame, B would only ever see the final count."""
    n = 200_000
    write_log(tmp_path / "curb.log", n)
    broker = curb_broker(cap="64MiB")
    with Client("127.0.0.1", broker.port) as a, socket.create_connection(("127.0.0.1", broker.port)) as b:
        b.sendall(encode("CONNECT", {"accept-version": "1.2"}))
        parser = FrameParser()
        frames: list[Frame] = []
        while not frames:
            frames += parser.feed(b.recv(65536))
        assert frames[0].command == "CONNECTED"
        a.ack_upto(n - 1, receipt="upto")
        a.wait_receipt("upto")
        b.sendall(encode("SUBSCRIBE", {"id": "c", "destination": "./count"}))
        counts: list[int] = []
        while not counts or counts[-1] != 1:
            for frame in parser.feed(b.recv(65536)):
                counts.append(int(frame.headers["rdy"]))
    assert counts[0] > 1, counts  # answered amid the walk
    assert counts[-1] == 1  # and the walk ends
