"""Delayed messages, dead letters and delivery counts in the log core, over a simulated
disk with a wall clock the test moves: what is parked, when it comes back, what a crash
keeps (a due time, a dead mark, a count once synced), how compaction copies parked
records forward and how recovery rebuilds their index."""

from __future__ import annotations

import random

import pytest
from simdisk import SimDisk

from curb.log import LogCore, Record
from curb.log.parked import DELAYED, SEQ_BITS, Parked, packed_runs

WALL = 1_700_000_000_000
CAP = 64 * 1024


class World:
    """A LogCore on a SimDisk; `wall` is its wall clock in ms, `now` its monotonic one."""

    def __init__(self, cap: int = CAP, disk: SimDisk | None = None, wall: int = WALL):
        self.cap = cap
        self.disk = disk if disk is not None else SimDisk(random.Random(11))
        self.now = 0.0
        self.wall = wall
        self.log = LogCore(self.disk, cap, clock=lambda: self.now, wall_ms=lambda: self.wall)

    def settle(self, rounds: int = 6) -> None:
        for _ in range(rounds):
            self.now += 0.06
            self.log.flush()
            self.log.sync()

    def restart(self, mode: str = "power") -> World:
        """A crash of this kind (after everything settled, so all of it is durable), then start-up."""
        return World(self.cap, self.disk.crash(mode), self.wall)

    def send(self, n: int, due_ms: int = 0) -> Record:
        return self.log.append(b"x-n:%d\n\n" % n + b"b" * 40, due_ms=due_ms)

    def ready(self) -> list[Record]:
        out = []
        while (rec := self.log.next_ready()) is not None:
            out.append(rec)
        return out

    def due(self, now_ms: int) -> list[Record]:
        """The messages due by `now_ms`, taken from the ready line (as consumers would)."""
        self.log.release(now_ms, 1 << 62)
        out = []
        while self.log.ready_waiting and (rec := self.log.next_ready()) is not None:
            out.append(rec)
        return out

    def dead_records(self) -> list[Record]:
        last, kept = self.log.dead_letters()
        ids, _ = self.log.dead_after(0, last, 1 << 62)
        return [rec for mid in ids if (rec := self.log.read_dead(mid)) is not None] + kept


def ids(records: list[Record]) -> list[int]:
    return [rec.id for rec in records]


def test_a_delayed_send_is_parked_until_due_and_keeps_its_due_time_across_a_crash():
    w = World()
    a = w.send(1)
    b = w.send(2, due_ms=WALL + 5_000)
    c = w.send(3)
    w.settle()
    assert ids(w.ready()) == [a.id, c.id], "the delayed one is never handed out early"
    assert w.log.delayed == 1 and w.log.next_due() == WALL + 5_000
    assert w.due(WALL + 4_999) == []
    w2 = w.restart("power")
    again = w2.ready()
    assert ids(again) == [a.id, c.id] and w2.log.delayed == 1
    for rec in again:
        w2.log.ack(rec)
    assert w2.log.next_due() == WALL + 5_000 and w2.due(WALL + 4_999) == []
    w2.wall = WALL + 5_000
    back = w2.due(w2.wall)
    assert ids(back) == [b.id] and back[0].due_ms == WALL + 5_000 and w2.log.delayed == 0
    assert bytes(w2.log.payload(back[0])).startswith(b"x-n:2\n")
    w2.log.ack(back[0])
    w2.settle()
    w3 = w2.restart("power")
    assert w3.ready() == [] and w3.due(WALL + 10**9) == [] and w3.log.live_bytes == 0


def test_a_requeue_with_a_delay_is_durable_with_its_count_and_comes_back_when_due():
    w = World()
    a = w.send(1)
    w.settle()
    (got,) = w.ready()
    for _ in range(3):
        w.log.delivered(got)
    w.log.requeue(got, WALL + 60_000)
    assert w.log.delayed == 1 and w.log.next_due() == WALL + 60_000
    durable: list[str | None] = []
    w.log.on_durable(durable.append)
    w.settle()
    assert durable == [None]
    w2 = w.restart("power")
    assert w2.ready() == [] and w2.log.delayed == 1, "not handed out before its due time, after a crash"
    w2.wall = WALL + 60_000
    (back,) = w2.due(w2.wall)
    assert (back.id, back.deliveries) == (a.id, 3), "the delivery count came through the crash"


@pytest.mark.parametrize("reason", ["max-deliveries", "expired"])
def test_a_burial_is_durable_and_a_dead_letter_is_never_handed_out_again(reason):
    w = World()
    a, b = w.send(1), w.send(2)
    w.settle()
    got, other = w.ready()
    w.log.delivered(got)
    w.log.bury(got, reason)
    assert got.dead == reason
    w.log.ack(other)
    w.settle()
    w2 = w.restart("power")
    assert w2.ready() == [] and w2.log.dead == 1 and w2.log.delayed == 0
    (snapshot,) = w2.dead_records()
    assert (snapshot.id, snapshot.dead, snapshot.deliveries) == (a.id, reason, 1) and w2.log.dead == 1
    dead = w2.log.next_dead()
    assert dead is not None and (dead.id, dead.dead, dead.deliveries) == (a.id, reason, 1)
    assert w2.log.next_dead() is None, "handed out once"
    assert w2.log.dead == 0, "its holder counts it now"
    w2.log.requeue(dead)  # given back by a reader of the dead letters: still dead, still theirs
    assert w2.log.next_dead() is None and w2.log.dead == 0
    w2.log.ack(dead)
    w2.settle()
    w3 = w2.restart("power")
    assert w3.log.next_dead() is None and w3.ready() == [] and w3.log.live_bytes == 0
    assert b.id not in ids(w3.ready())


def test_a_redrive_moves_dead_letters_back_oldest_first_with_their_count_reset():
    w = World()
    sent = [w.send(i) for i in range(4)]
    w.settle()
    for rec in w.ready():
        w.log.delivered(rec)
        w.log.bury(rec, "max-deliveries")
    w.settle()
    w2 = w.restart("kill")
    assert w2.log.dead == 4
    answers: list[str | None] = []
    assert len(w2.log.redrive(3)) == 3
    w2.log.on_durable(answers.append)
    assert w2.log.dead == 1
    w2.settle()
    assert answers == [None]
    back = w2.due(w2.wall)
    assert ids(back) == ids(sent[:3]) and all(rec.deliveries == 0 and not rec.dead for rec in back)
    w3 = w2.restart("power")  # the redrive was durable: rdy again, count 0
    assert [(r.id, r.deliveries) for r in w3.ready()] == [(rec.id, 0) for rec in sent[:3]]
    assert w3.log.dead == 1
    last = w3.log.next_dead()
    assert last is not None and last.id == sent[3].id


def test_revive_makes_a_held_dead_letter_rdy_with_its_count_reset():
    w = World()
    a = w.send(1)
    w.settle()
    (got,) = w.ready()
    w.log.delivered(got)
    w.log.bury(got, "expired")
    w.log.revive(got)
    assert got.dead == "" and got.deliveries == 0
    w.settle()
    w2 = w.restart("power")
    assert [(r.id, r.deliveries) for r in w2.ready()] == [(a.id, 0)] and w2.log.dead == 0


def test_a_delivery_count_past_65535_is_kept():
    w = World()
    w.send(1)
    w.settle()
    (got,) = w.ready()
    got.deliveries = 70_000
    w.log.requeue(got)
    w.settle()
    (back,) = w.restart("power").ready()
    assert back.deliveries == 70_000


def test_compaction_copies_parked_records_forward_so_they_never_pin_the_tail():
    """A small ring, a few messages delayed far ahead and a dead letter, then many laps of
    traffic: the parked records are copied forward (never blocking space), and after a
    crash at the end each is still parked with its due time or reason."""
    w = World(cap=32 * 1024)
    delayed = [w.send(i, due_ms=WALL + 3_600_000 + i) for i in range(5)]
    w.send(99)
    w.settle()
    (dead,) = w.ready()
    w.log.bury(dead, "max-deliveries")
    for n in range(600):  # about 20 laps of the ring
        w.send(1000 + n)
        w.settle(1)
        for rec in w.ready():
            w.log.ack(rec)
    w.settle()
    assert w.log.delayed == 5
    w2 = w.restart("power")
    assert w2.ready() == [] and w2.log.delayed == 5 and w2.log.dead == 1
    assert w2.log.next_due() == WALL + 3_600_000
    w2.wall = WALL + 3_600_000 + 4
    assert ids(w2.due(w2.wall)) == ids(delayed)
    found = w2.log.next_dead()
    assert found is not None and found.id == dead.id


def copies_of_parked(w: World, entries: int) -> int:
    """How many copies compaction made of parked records since the index had `entries`
    entries (a copy is a new entry; the test sends no delayed message meanwhile)."""
    return w.log._parked.end - entries


def test_parked_records_count_while_their_copies_lie_ahead_of_the_cursor():
    """Compaction copies a parked record (delayed, or a dead letter found at start-up) to
    the head, ahead of the cursor: it still counts as delayed or dead (./count, /stats
    and the metrics read these), before and after the cursor steps over the copy."""
    w = World(cap=32 * 1024)
    for i in range(5):
        w.send(i, due_ms=WALL + 3_600_000 + i)
    w.send(99)
    w.settle()
    (dead,) = w.ready()
    w.log.bury(dead, "max-deliveries")
    w.settle()
    w = w.restart("power")
    entries = w.log._parked.end
    for n in range(600):
        w.send(1000 + n)
        w.settle(1)
        assert (w.log.delayed, w.log.dead) == (5, 1), f"after {n + 1} sends"
        for rec in w.ready():
            w.log.ack(rec)
    assert copies_of_parked(w, entries), "compaction copied no parked record: the test proves nothing"


def test_a_parked_copy_that_comes_due_ahead_of_the_cursor_comes_back_once():
    """Compaction copied the delayed record to the head; its due time passes before the
    cursor reaches the copy: `due` hands it back, once, and the cursor steps over it."""
    w = World(cap=32 * 1024)
    late = w.send(0, due_ms=WALL + 1_000)
    w.settle(1)
    entries = w.log._parked.end
    seen: list[int] = []
    for n in range(600):
        w.send(1 + n)
        w.settle(1)
        if copies_of_parked(w, entries) and w.wall < late.due_ms:
            w.wall = late.due_ms  # due while its copy lies ahead of the cursor
        for rec in w.due(w.wall) + w.ready():
            assert rec.id != late.id or w.wall >= late.due_ms, "handed out early"
            seen.append(rec.id)
            w.log.ack(rec)
        if late.id in seen:
            break
    assert w.wall == late.due_ms, "compaction never copied the delayed record"
    assert seen.count(late.id) == 1 and w.log.delayed == 0


def test_an_ack_up_to_an_id_takes_parked_records_too():
    w = World()
    a = w.send(1, due_ms=WALL + 10_000)
    b = w.send(2)
    w.settle()
    (got,) = w.ready()
    assert got.id == b.id
    w.log.ack_upto(b.id)
    w.settle()
    assert w.log.delayed == 0 and w.due(WALL + 10**6) == []
    w2 = w.restart("power")
    assert w2.ready() == [] and w2.due(WALL + 10**6) == [] and a.id <= w2.log.acked_upto


# ---------------------------------------------------------------- the index, as tables


def ready(parked: Parked, now_ms: int) -> list[int]:
    """The entries due by `now_ms`, through the ready line, oldest first."""
    parked.release(now_ms, 1 << 62)
    out = []
    while (seq := parked.take_ready()) is not None:
        out.append(seq)
    return out


def test_the_index_releases_in_due_order_and_skips_entries_that_left():
    parked = Parked()
    dues = [50, 10, 40, 10, 30]
    seqs = [parked.add(1000 + 32 * i, 32, i + 1, DELAYED, due) for i, due in enumerate(dues)]
    parked.remove(seqs[2])  # copied by compaction: its key goes stale
    assert parked.next_due() == 10 and parked.delayed == 4
    assert ready(parked, 10) == [seqs[1], seqs[3]]
    assert ready(parked, 45) == [seqs[4]]
    assert ready(parked, 10**9) == [seqs[0]] and parked.delayed == 0


def test_the_index_holds_its_entries_in_compact_arrays():
    n = 200_000
    parked = Parked()
    for i in range(n):
        parked.add(512 + 32 * i, 160, i + 1, DELAYED, WALL + (i * 7919) % 100_000)
    per_entry = sum(a.itemsize for a in (parked.offsets, parked.sizes, parked.ids)) + 1
    runs = sum(run.keys.itemsize for _, _, run in parked.runs[:1])
    assert per_entry + runs <= 30
    assert len(parked.fresh) < 4096 and sum(len(r) for _, _, r in parked.runs) + len(parked.fresh) == n
    out = ready(parked, WALL + 10)
    assert len(out) == len([i for i in range(n) if (i * 7919) % 100_000 <= 10])


@pytest.mark.parametrize(
    "pairs",
    [
        [(WALL + 5, 1), (WALL + 7, 2), (WALL + 9, 3)],
        [(WALL, 1), (WALL + (1 << 45), 2)],  # due times far apart: they still pack
        [(WALL, 1), (WALL + 1, (1 << 39) + 5), (WALL + (1 << 40), 7)],  # wide seqs too: split
    ],
)
def test_runs_pack_each_key_in_eight_bytes_and_give_back_what_they_hold(pairs):
    keys = sorted(due << SEQ_BITS | seq for due, seq in pairs)
    runs = packed_runs(keys)
    assert [run.at(i) for run in runs for i in range(len(run))] == sorted(pairs)
    assert all(run.keys.itemsize == 8 for run in runs)


def test_next_due_knows_a_delayed_send_before_it_is_written():
    """The broker arms its timer from next_due right after the SEND, before the log wrote
    (and indexed) the record; once due, `due` hands it out, and the cursor never does."""
    w = World()
    late = w.send(1, due_ms=WALL + 2_000)
    assert w.log.next_due() == WALL + 2_000, "known at once, while pending"
    w.settle()
    assert w.log.next_due() == WALL + 2_000, "and once written"
    assert w.ready() == [], "never handed out early"
    w.wall = WALL + 2_000
    assert ids(w.due(w.wall)) == [late.id] and w.ready() == []
    assert w.log.next_due() is None


def dead_letters_copied_ahead(n: int) -> World:
    """A log with `n` dead letters found at start-up that compaction copied to the head,
    ahead of the cursor: a consumer read a lap past them, then unread messages came after
    the copies."""
    w = World(cap=32 * 1024)
    for i in range(n):
        w.send(i)
    w.settle()
    for rec in w.ready():
        w.log.bury(rec, "max-deliveries")
    w.settle()
    w = w.restart("power")
    entries = w.log._parked.end
    for i in range(600):
        w.send(1000 + i)
        w.settle(1)
        if copies_of_parked(w, entries):
            break
        for rec in w.ready():
            w.log.ack(rec)
    assert copies_of_parked(w, entries) == n, "compaction copied no dead letter: the test proves nothing"
    for i in range(5):
        w.send(2000 + i)  # unread, after the copies: the cursor stays behind them
    w.settle()
    return w


def test_a_redrive_moves_dead_letters_whose_copies_lie_ahead_of_the_cursor():
    """Every dead letter the log counts is one a redrive moves, durably: the copies
    compaction made of dead letters found at start-up, before the cursor reaches them."""
    w = dead_letters_copied_ahead(3)
    assert w.log.dead == 3
    assert len(w.log.redrive(10)) == 3
    assert w.log.dead == 0
    back = w.due(w.wall)
    assert len(back) == 3 and all(rec.deliveries == 0 and not rec.dead for rec in back)
    w.settle()
    w2 = w.restart("power")
    assert w2.log.dead == 0 and w2.log.next_dead() is None, "the redrive was not durable"
    assert set(ids(back)) <= set(ids(w2.ready())), "the redriven dead letters are queued after a crash"


def test_a_redrive_with_a_count_takes_copies_ahead_one_by_one():
    w = dead_letters_copied_ahead(3)
    assert len(w.log.redrive(2)) == 2 and w.log.dead == 1
    assert len(w.log.redrive(5)) == 1 and w.log.dead == 0


def test_a_reader_of_dead_letters_gets_the_copies_ahead_and_its_ack_deletes_them():
    w = dead_letters_copied_ahead(2)
    assert len(w.dead_records()) == 2, "a browse of ./dead misses no dead letter"
    first, second = w.log.next_dead(), w.log.next_dead()
    assert first is not None and second is not None and first.dead == second.dead == "max-deliveries"
    assert w.log.next_dead() is None and w.log.dead == 0
    w.log.ack(first)
    w.log.requeue(second)  # back in its reader's hands: stays dead
    queued = w.ready()
    assert first.id not in ids(queued) and second.id not in ids(queued), "a dead letter delivered from the queue"
    w.settle()
    w2 = w.restart("power")
    dead = [rec.id for rec in w2.dead_records()]
    assert dead == [second.id]


def test_a_delayed_send_counts_as_delayed_from_its_acceptance_with_unread_messages_before_it():
    """./count and the metrics count a delayed SEND as delayed at once, not as rdy until
    the cursor reaches it, also behind unread messages."""
    w = World()
    w.send(1)
    w.send(2, due_ms=WALL + 3_600_000)
    assert (w.log.unread, w.log.delayed) == (1, 1), "pending"
    w.settle()
    assert (w.log.unread, w.log.delayed) == (1, 1), "written, the cursor behind it"
    assert len(w.ready()) == 1 and (w.log.unread, w.log.delayed) == (0, 1)


def test_dead_letters_kept_while_the_disk_is_full_wait_for_room_and_the_log_stays_up():
    """Copying the dead letters the log keeps (`keep_dead`) to the head may need the file
    to grow: with no room on the file system, the copies made so far are written, the rest
    wait, and the log does not break (broker simulator, seed 6000902: an entry was indexed
    whose copy was never written, and the log stopped)."""
    disk = SimDisk(random.Random(11), free_bytes=64 * 1024)  # the file grows page by page
    w = World(cap=256 * 1024, disk=disk)
    for n in range(40):
        w.send(n)
    w.settle()
    held = w.ready()
    w.settle()
    disk.free_bytes = disk.size() + 1024  # room for a few copies, not for all
    for rec in held:
        w.log.delivered(rec)
        w.log.bury(rec, "max-deliveries")
        w.log.keep_dead(rec)
    w.settle()
    assert w.log.broken is None and disk.faults
    assert sorted(rec.id for rec in w.dead_records()) == ids(held) and w.log.dead == 40
    disk.free_bytes = None
    w.settle()
    w2 = w.restart("power")
    assert sorted(rec.id for rec in w2.dead_records()) == ids(held)
