"""The log core over a simulated disk, step by step: each finding of the crash-promise
review reproduced deterministically (flush and sync are called by hand, crashes are
taken where they hurt), plus the suspected hazards the review named, each settled.

The seeded random search over the same core lives in tests/sim/log_driver.py; these are the
cases it and the review found, kept readable."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from simdisk import Crashed, SimDisk

from curb.log import LogCore, QueueFull, Record, TooLarge
from curb.log import record as fmt
from curb.log.disk import FileDisk
from curb.log.record import PAD_SIZE, RECORD_HEADER, RING_START

CAP = 64 * 1024


class Clock:
    """A clock the test moves: the log's checkpoint cadence reads it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Core:
    """A LogCore on a SimDisk with the steps the asyncio driver would take."""

    def __init__(self, disk: SimDisk | None = None, cap: int = CAP):
        self.disk = disk if disk is not None else SimDisk(random.Random(7))
        self.cap = cap
        self.clock = Clock()
        self.log = LogCore(self.disk, cap, clock=self.clock)

    def round(self) -> None:
        """What one pass of the driver does: time passes, pending writes go out, sync."""
        self.clock.now += 0.06
        self.log.flush()
        self.log.sync()

    def settle(self, rounds: int = 8) -> None:
        for _ in range(rounds):
            self.round()

    def send(self, body: bytes) -> list[str | None]:
        answers: list[str | None] = []
        self.log.append(b"\n" + body, answers.append)
        return answers

    def take(self) -> Record:
        rec = self.log.next_ready()
        assert rec is not None, "no message to take"
        self.log.delivered(rec)
        return rec

    def ack_durably(self, rec: Record) -> None:
        answers: list[str | None] = []
        self.log.ack(rec)
        self.log.on_durable(answers.append)
        self.settle(2)
        assert answers == [None]

    def crash(self, mode: str = "kill") -> Core:
        return Core(self.disk.crash(mode), self.cap)

    def drain(self) -> list[bytes]:
        out = []
        while (rec := self.log.next_ready()) is not None:
            out.append(bytes(self.log.payload(rec)[1:]))
        return out


def body(n: int, size: int = 100) -> bytes:
    return (b"m%06d-" % n).ljust(size, b"x")


def answered(answers: list[str | None]) -> Callable[[], bool]:
    """A condition: the message behind `answers` got its RECEIPT."""
    return lambda: answers == [None]


def until(core: Core, done: Callable[[], bool], rounds: int = 30) -> int:
    """Rounds until `done()`; fails past `rounds` (a wedge)."""
    for n in range(rounds):
        if done():
            return n
        core.round()
    raise AssertionError(f"not done after {rounds} rounds")


def wrap_with_a_held_message(core: Core, laps: int = 3, size: int = 900) -> Record:
    """One message taken and held while others go through the ring `laps` times."""
    core.send(body(0))
    core.settle(1)
    held = core.take()
    n = 1
    while n * size < laps * core.log.capacity:
        answers = core.send(body(n, size))
        until(core, answered(answers))
        core.log.ack(core.take())
        n += 1
    return held


# ---------------------------------------------------------------- finding 1: copy-forward vs crash


def test_a_crash_between_a_copy_and_its_checkpoint_leaves_the_message_live_once():
    """A held message copied forward, synced, then kill -9 before the checkpoint that
    retires the original: the restarted log hands the message out once, an ACK with a
    receipt sticks, and a second crash does not bring it back."""
    core = Core()
    held = wrap_with_a_held_message(core)
    copies_before = held.offset
    core.send(body(9999, 2000))
    core.log.flush()  # compaction copies the held message to the head
    core.log.sync()  # the copy is durable; the checkpoint retiring the original is not
    assert held.offset != copies_before or core.log.metrics is None
    restarted = core.crash("kill")
    ids = []
    found = None
    while (rec := restarted.log.next_ready()) is not None:
        ids.append(rec.id)
        if restarted.log.payload(rec)[1:] == body(0):
            found = rec
    assert ids.count(held.id) == 1 and len(ids) == len(set(ids))
    assert found is not None
    restarted.ack_durably(found)
    again = restarted.crash("power")
    assert body(0) not in again.drain()


def test_an_ack_after_a_copy_reaches_the_live_copy_across_crashes():
    core = Core()
    held = wrap_with_a_held_message(core)
    core.ack_durably(held)
    for mode in ("kill", "power", "kill"):
        core = core.crash(mode)
        assert body(0) not in core.drain()


# ---------------------------------------------------------------- finding 2: the read cursor vs the ring wrap


def test_reading_across_a_lap_end_never_uses_bytes_from_the_lap_before():
    """-cap 64KiB, one consumer ACKing: 64 messages whose records are exactly 1 KiB,
    then 64 one byte longer, so the second lap's pad lands where the first lap's bytes
    sat in the cursor's window."""
    core = Core()
    got = []
    for n, size in enumerate([932 - 26] * 64 + [933 - 26] * 64):
        answers = core.send(body(n, size))
        until(core, answered(answers))
        rec = core.take()
        got.append(core.log.payload(rec)[1:])
        core.log.ack(rec)
    assert got == [body(n, 906 if n < 64 else 907) for n in range(128)]


# ---------------------------------------------------------------- finding 3: one held message must not pin the ring


def test_one_held_message_does_not_make_the_queue_full():
    """Nothing queued, one message held, 1,000-byte messages going through many laps:
    every one is accepted and stored; the held one is still there, once."""
    core = Core(cap=60 * 1024)
    held = wrap_with_a_held_message(core, laps=6, size=1000)
    assert core.log.live_bytes < 2 * 1100
    core.log.requeue(held)
    core.settle(2)
    core = core.crash("kill")
    assert core.drain() == [body(0)]


# ---------------------------------------------------------------- finding 4: no hang after a restart


def full_ring_all_acked(core: Core) -> int:
    """Messages up to the admission limit, written, synced, taken and ACKed: the ring has
    no room at the head until a synced checkpoint moves its tail past them. Returns how many."""
    n = 0
    while True:
        try:
            core.send(body(n, 1500))
        except QueueFull:
            break
        n += 1
    core.log.flush()
    core.log.sync()
    for _ in range(n):
        core.log.ack(core.take())
    return n


def test_a_restart_after_acks_that_no_checkpoint_recorded_frees_their_room():
    """Everything ACKed (durably) within the last checkpoint interval, then kill -9:
    the restarted log frees that room without a consumer, so SENDs are answered."""
    core = Core()
    n = full_ring_all_acked(core)
    core.log.flush()
    core.log.sync()  # the ACKs are durable; no checkpoint has named the new tail
    core = core.crash("kill")
    answers = [core.send(body(10_000 + i, 1500)) for i in range(n // 2)]
    until(core, lambda: all(a == [None] for a in answers), rounds=10)


# ---------------------------------------------------------------- finding 7: compaction keeps pace


def test_compaction_moves_held_messages_in_batches_not_one_per_checkpoint():
    """A consumer holds 40 messages while the ring wraps: producers wait a few rounds
    per lap at most, never a round per held message."""
    core = Core(cap=256 * 1024)
    for n in range(40):
        core.send(body(n, 500))
    core.settle(1)
    held = [core.take() for _ in range(40)]
    waits = placed = 0
    n = 40
    while placed * 600 < 5 * core.log.capacity:
        batch = [core.send(body(n + i, 500)) for i in range(16)]
        n += 16
        core.round()
        while not all(batch):
            waits += 1
            core.round()
        for _ in range(16):
            core.log.ack(core.take())
        placed += 16
    assert waits <= 5 * 4, f"{waits} rounds waited over 5 laps"
    assert all(rec.offset >= RING_START for rec in held)


# ---------------------------------------------------------------- finding 7 (issue item 7): large messages


def test_a_message_of_an_eighth_of_the_cap_is_stored_and_a_too_large_one_says_the_limit():
    core = Core()
    big = b"b" * (CAP // 8)
    answers = core.send(big)
    until(core, lambda: answers == [None])
    assert core.drain() == [big]
    with pytest.raises(TooLarge, match=r"larger than this broker can ever store \(the limit is \d+ bytes"):
        core.send(b"x" * (core.log.max_message + 1))


# ---------------------------------------------------------------- the suspected hazards


def test_recovery_syncs_what_it_found_before_a_checkpoint_names_it():
    """The review suspected recovery wrote its checkpoint in the same fdatasync as the
    records it names; the order of disk calls at start-up says otherwise."""
    core = Core()
    for n in range(5):
        core.send(body(n))
    core.log.flush()  # written, never synced: kill -9 keeps them in the page cache
    calls: list[str] = []
    disk = core.disk.crash("kill")
    real_sync, real_pwrite = disk.sync, disk.pwrite

    def sync() -> None:
        calls.append("sync")
        real_sync()

    def pwrite(data: bytes, offset: int) -> None:
        calls.append("slot" if offset in fmt.SLOT_OFFSETS else "write")
        real_pwrite(data, offset)

    disk.sync, disk.pwrite = sync, pwrite  # type: ignore[method-assign]
    restarted = Core(disk)
    assert calls == ["sync", "slot", "sync"]
    assert restarted.drain() == [body(n) for n in range(5)]


def test_a_checkpoint_never_overwrites_the_newest_durable_slot_while_another_is_unsynced():
    """The review suspected a checkpoint write could land in the slot holding the last
    durable checkpoint while the other slot's write was unsynced: every slot write must
    come after a sync that followed the previous slot write."""
    core = Core()
    slots: list[int] = []
    synced_since_slot = [True]
    real_pwrite, real_sync = core.disk.pwrite, core.disk.sync

    def pwrite(data: bytes, offset: int) -> None:
        if offset in fmt.SLOT_OFFSETS:
            assert synced_since_slot[0], "a checkpoint was written while the previous one was unsynced"
            synced_since_slot[0] = False
            slots.append(offset)
        real_pwrite(data, offset)

    def sync() -> None:
        synced_since_slot[0] = True
        real_sync()

    core.disk.pwrite, core.disk.sync = pwrite, sync  # type: ignore[method-assign]
    for n in range(300):
        core.send(body(n))
        core.clock.now += 0.06
        core.log.flush()
        if n % 3 == 0:
            core.log.sync()
        if n % 5 == 0:
            core.log.ack(core.take())
    assert len(slots) > 10 and set(slots) == set(fmt.SLOT_OFFSETS)


def test_bytes_an_earlier_run_left_past_a_torn_record_never_continue_the_chain(tmp_path):
    """Records A and B were written unsynced; power loss kept B but not A. Recovery stops
    at A's place, and the next run writes C there. If C were exactly A's size and took
    A's write sequence, B would look like C's successor after the next crash: recovery
    moves the write sequence past anything a stale record can hold."""
    path = tmp_path / "q.log"
    disk = FileDisk(str(path))
    log = LogCore(disk, CAP)
    log.append(b"\n" + body(1))
    log.flush()
    log.sync()
    a = log.append(b"\n" + body(2))
    log.append(b"\n" + body(3))
    log.flush()
    disk.close()
    raw = bytearray(path.read_bytes())
    raw[a.offset : a.offset + a.size] = bytes(a.size)  # A lost, B kept
    path.write_bytes(bytes(raw))
    disk = FileDisk(str(path))
    log = LogCore(disk, CAP)
    assert [log.payload(r)[1:] for r in iter(log.next_ready, None)] == [body(1)]
    c = log.append(b"\n" + body(4))  # the same size as A: ends where B starts
    log.flush()
    log.sync()
    assert c.offset == a.offset and c.size == a.size
    disk.close()
    disk = FileDisk(str(path))
    log = LogCore(disk, CAP)
    payloads = [log.payload(r)[1:] for r in iter(log.next_ready, None)]
    disk.close()
    assert payloads == [body(1), body(4)], "the stale record B came back after C"


def test_recovered_count_counts_each_message_once():
    """The 'recovered N messages' line counted a copied message twice."""
    core = Core()
    wrap_with_a_held_message(core)
    core.send(body(9999, 2000))
    core.log.flush()
    core.log.sync()
    restarted = core.crash("kill")
    assert restarted.log.recovery.messages == len(restarted.drain())


def test_disk_full_refuses_with_a_clear_reason_and_recovers_once_space_is_freed():
    """The file grows by what a record needs when the file system is nearly full."""
    disk = SimDisk(random.Random(3), free_bytes=8192)
    core = Core(disk, cap=1 << 20)
    first = core.send(body(1, 1000))
    until(core, answered(first))
    refused = core.send(body(2, 8000))
    until(core, lambda: bool(refused))
    assert refused[0] is not None and refused[0].startswith("disk full")
    disk.free_bytes = None
    later = core.send(body(3, 8000))
    until(core, answered(later))
    assert core.drain() == [body(1, 1000), body(3, 8000)]
    assert disk.size() <= 1 << 20


def test_a_record_header_line_has_a_fixed_width():
    line = fmt.encode_record(fmt.STATE_RDY, 0, 1, 1, 1, b"x", copy=True)
    assert len(line) == RECORD_HEADER and PAD_SIZE == fmt.record_size(0) == 4 * fmt.ALIGN


def test_a_lap_old_pad_state_left_on_a_new_message_by_a_torn_write_is_not_a_pad():
    """The state is outside the CRC. A message written where a pad lay a lap earlier, its
    first sector lost to a power cut (crash simulator, seed 191836 of an earlier
    generator): the old `pad ` with the new id, length and CRC must not end the lap, or
    the records after it, synced and receipted, would be cut off at the next start."""
    payload = b"\n" + body(1)
    line = fmt.encode_record(fmt.STATE_RDY, 0, 37, 1239, 1, payload)
    torn = b"pad" + line[3:] + payload + b"\n"
    with pytest.raises(fmt.FormatError, match="does not match"):
        fmt.parse_header(torn, 0)
    pad = fmt.encode_record(fmt.STATE_PAD, 0, 0, 7, 0, b"") + b"\n"
    with pytest.raises(fmt.FormatError, match="does not match"):
        fmt.parse_header(b"rdy" + pad[3:], 0)
    assert fmt.parse_header(pad, 0).state == fmt.STATE_PAD
    assert fmt.parse_header(line + payload + b"\n", 0).id == 37


# ---------------------------------------------------------------- ACKs the checkpoint's tail retires


def state_on_disk(core: Core, rec: Record) -> bytes:
    return core.disk.visible_image()[rec.offset : rec.offset + 3]


def two_taken(core: Core) -> tuple[Record, Record]:
    for n in (1, 2):
        until(core, answered(core.send(body(n))))
    return core.take(), core.take()


def test_an_ack_of_the_oldest_message_held_writes_nothing_and_the_checkpoint_retires_it():
    core = Core()
    first, _ = two_taken(core)
    core.log.ack(first)
    core.log.flush()
    assert state_on_disk(core, first) == fmt.STATE_RDY  # no patch
    answers: list[str | None] = []
    core.log.on_durable(answers.append)
    until(core, answered(answers))
    # Durable now: the message never comes back, whatever the crash.
    for mode in ("power", "kill"):
        assert core.crash(mode).drain() == [body(2)]


def test_an_ack_out_of_order_is_a_patch():
    core = Core()
    first, second = two_taken(core)
    core.log.ack(second)
    core.log.flush()
    assert state_on_disk(core, second) == fmt.STATE_ACK
    core.ack_durably(first)  # now the oldest: retired, and the tail passes both
    assert core.crash("power").drain() == []


def test_the_answer_for_a_retired_ack_comes_with_the_checkpoint_that_retires_it():
    """The ACK writes nothing, so a crash before the checkpoint brings the message back
    (as a lost patch would); on_durable answers only once that checkpoint is synced."""
    core = Core()
    first, _ = two_taken(core)
    core.log.flush()
    core.log.sync()
    core.log.ack(first)
    answers: list[str | None] = []
    core.log.on_durable(answers.append)
    assert body(1) in core.crash("kill").drain()  # nothing on disk says it was ACKed yet
    core.log.flush()  # the checkpoint whose tail passes the message
    assert answers == []
    core.log.sync()
    assert answers == [None]
    assert core.crash("power").drain() == [body(2)]


def test_retired_acks_become_durable_with_no_receipt_asked_and_no_other_traffic():
    """Nobody waits and nothing else is written: the log still writes and syncs the
    checkpoint that retires the ACK within a few rounds (the no-receipt promise)."""
    core = Core()
    first, second = two_taken(core)
    core.settle(2)
    core.log.ack(first)
    core.log.ack(second)
    core.settle(2)
    assert core.crash("power").drain() == []


def test_a_crash_that_undoes_a_retired_ack_leaves_room_to_copy_the_message_back():
    """The oldest held message is acked (nothing written: the next synced checkpoint
    retires it) just before a flush that must make room. Compaction copies nothing until
    that checkpoint: a kill before it brings the message back at the tail, and copies of
    the held messages after it, had they spent the reserve, would leave no room to copy
    it there. The restarted log, the message held and never acked, still stores SENDs."""
    core = Core()
    log = core.log
    core.send(body(0, 1500))
    log.flush()
    log.sync()
    oldest = core.take()
    # Messages of 400 bytes until the ring is nearly full, every third one held: no early
    # compaction (the clock stands still, so the tail is never pinned for long).
    n = 1
    while n * fmt.record_size(401) < log.capacity - 6 * 1024:
        core.send(body(n, 400))
        log.flush()
        log.sync()
        got = core.take()
        if n % 3:
            log.ack(got)
        n += 1
    log.ack(oldest)
    for n in range(8):
        core.send(body(1000 + n, 400))
    log.flush()  # no room for them all: the room comes with the checkpoint, not copies
    restarted = core.crash("kill")
    taken = []
    while (rec := restarted.log.next_ready()) is not None:
        restarted.log.delivered(rec)
        taken.append(rec)
    assert [rec.id for rec in taken if rec.id == oldest.id] == [oldest.id]
    for rec in taken:
        if rec.id != oldest.id:
            restarted.log.ack(rec)
    answers: list[list[str | None]] = []
    for n in range(40):
        answers.append(restarted.send(body(2000 + n, 100)))
        restarted.settle(2)
    until(restarted, lambda: all(a == [None] for a in answers), rounds=10)


def two_held_then_nearly_full(core: Core, first: int, second: int, hold_every: int) -> tuple[Record, Record]:
    """Two messages taken and held, of `first` and `second` bytes, then messages of 400
    bytes until the free bytes are little more than the reserve the larger of the two
    needs, every `hold_every`-th held (0: none) and the rest acked, all of it synced.
    No early compaction: the clock stands still, so the tail is never pinned for long."""
    log = core.log
    held = []
    for n, size in enumerate((first, second)):
        core.send(body(n, size))
        log.flush()
        log.sync()
        held.append(core.take())
    n = 2
    while log._ring.free() > 2 * (max(first, second) + 200) + 3 * 1024:
        core.send(body(n, 400))
        log.flush()
        log.sync()
        got = core.take()
        if not hold_every or n % hold_every:
            log.ack(got)
        n += 1
    core.settle(2)
    return held[0], held[1]


def holds_it_and_still_stores_sends(restarted: Core, held_id: int) -> None:
    """The restarted log hands out `held_id` once, a consumer holds it for good and acks
    everything else: SENDs are still stored (the log can copy the held message forward)."""
    log = restarted.log
    taken = []
    while (rec := log.next_ready()) is not None:
        log.delivered(rec)
        taken.append(rec)
    assert [rec.id for rec in taken].count(held_id) == 1
    for rec in taken:
        if rec.id != held_id:
            log.ack(rec)
    answers: list[list[str | None]] = []
    for n in range(40):
        answers.append(restarted.send(body(2000 + n, 100)))
        restarted.settle(2)
    until(restarted, lambda: all(a == [None] for a in answers), rounds=10)


@pytest.mark.parametrize("hold_every", [0, 3])
def test_a_power_loss_that_undoes_an_ack_patch_leaves_room_to_copy_the_message_back(hold_every):
    """A large held message just after the oldest one is acked: a patch, written in the
    flush that fills the ring and copies the held messages forward (hold_every=3) or
    the oldest one only (0). A power loss keeps that flush's appends and copies and
    loses the patch: the message is back, just after the first copied one. Had the
    appends spent the reserve its size needed, or copies past it the room its copy
    needs, the restarted log would refuse every SEND with 4 KB queued of 64 KB."""
    core = Core()
    log = core.log
    _, acked = two_held_then_nearly_full(core, 200, 4000, hold_every)
    log.ack(acked)
    for n in range(24):
        core.send(body(1000 + n, 400))
    log.flush()
    assert state_on_disk(core, acked) == fmt.STATE_ACK  # a patch, unsynced
    holds_it_and_still_stores_sends(Core(core.disk.power_loss_without({acked.offset}), core.cap), acked.id)


def test_a_kill_that_undoes_a_retired_ack_of_a_large_message_leaves_room_to_copy_it_back():
    """The oldest held message, larger than any other, is acked (retired: nothing
    written) and appends fill the ring in the same flush. A kill before the checkpoint
    brings it back: had the appends spent the reserve its size needed, the restarted
    log could not copy it."""
    core = Core()
    log = core.log
    oldest, _ = two_held_then_nearly_full(core, 4000, 200, 0)
    log.ack(oldest)
    for n in range(24):
        core.send(body(1000 + n, 400))
    log.flush()
    holds_it_and_still_stores_sends(core.crash("kill"), oldest.id)


def test_a_power_loss_that_undoes_an_ack_upto_leaves_room_to_copy_the_message_back():
    """An ACK up to the oldest held message (large) takes it: appends fill the ring in
    the same flush, and a power loss keeps them but not the checkpoint carrying the
    watermark. The message is back; the appends must have left room to copy it."""
    core = Core()
    log = core.log
    oldest, _ = two_held_then_nearly_full(core, 4000, 200, 0)
    log.ack_upto(oldest.id)
    for n in range(24):
        core.send(body(1000 + n, 400))
    log.flush()
    restarted = Core(core.disk.power_loss_without(set(fmt.SLOT_OFFSETS)), core.cap)
    holds_it_and_still_stores_sends(restarted, oldest.id)


@pytest.mark.parametrize("seed", range(20))
def test_a_crash_while_recovery_records_a_new_cap_loses_nothing_and_the_next_start_records_it(seed):
    """The header's cap line is rewritten when a broker opens the file with another -cap:
    a crash at each step of that start (before the line is written, before it is synced,
    before and after the checkpoint) costs no message, and the start after it records
    the cap it was given."""
    core = Core(SimDisk(random.Random(seed)))
    for n in range(5):
        core.send(body(n))
    core.settle(2)
    for step, cap in enumerate([2 * CAP, CAP, 2 * CAP, CAP]):
        disk = core.disk.crash("kill")
        disk.arm_crash(step)
        with pytest.raises(Crashed):
            LogCore(disk, cap)
        disk.arm_crash(None)
        core = Core(disk.crash("power"), cap)
        assert core.drain() == [body(n) for n in range(5)]
        assert fmt.recorded_cap(core.disk.visible_image()[:RING_START]) == cap


# ---------------------------------------------------------------- on_durable covers pending appends


def test_on_durable_waits_for_a_receiptless_append_still_waiting_for_room():
    """A SEND with no receipt waits for room, then a DISCONNECT asks for its RECEIPT:
    the answer comes only once that SEND is on disk, whatever the crash after it."""
    core = Core()
    full_ring_all_acked(core)
    sent: list[tuple[bytes, Record]] = []
    while not sent or sent[-1][1].offset >= 0:  # until one is not written: it waits for room
        payload = b"\n" + body(len(sent), core.log.max_message - 1)
        sent.append((payload[1:], core.log.append(payload, None, urgent=False)))
        core.log.flush()
    answers: list[str | None] = []
    core.log.on_durable(answers.append)
    until(core, answered(answers))
    for mode in ("power", "kill"):
        assert core.crash(mode).drain() == [each for each, _ in sent]


def test_on_durable_fails_after_the_append_it_covers_is_refused():
    """The pending append is refused (disk full): its own callback says so first, then
    the on_durable callback gets the same reason instead of None."""
    disk = SimDisk(random.Random(3), free_bytes=8192)
    core = Core(disk, cap=1 << 20)
    until(core, answered(core.send(body(1, 1000))))
    answers: list[str] = []
    core.log.append(b"\n" + body(2, 8000), lambda err: answers.append(f"send: {err}"), urgent=False)
    core.log.on_durable(lambda err: answers.append(f"durable: {err}"))
    until(core, lambda: len(answers) == 2)
    assert answers[0].startswith("send: disk full") and answers[1].startswith("durable: disk full")


def test_the_log_stamps_sends_with_the_wall_clock_it_is_given_and_recovery_keeps_the_stamp():
    """The core reads no clock of its own: a simulator's wall time is what a send is
    stamped with, what the cursor hands out, and what recovery reads back (so a test of
    delays and expiry can move time without waiting for it)."""
    disk = SimDisk(random.Random(5))
    wall = [1_234_567_890_123]
    log = LogCore(disk, CAP, clock=Clock(), wall_ms=lambda: wall[0])
    first = log.append(b"\nfirst")
    wall[0] += 60_000
    log.append(b"\nsecond")
    log.flush()
    log.sync()
    assert first.timestamp_ms == 1_234_567_890_123
    after = LogCore(disk.crash("power"), CAP, clock=Clock(), wall_ms=lambda: 0)
    assert [rec.timestamp_ms for rec in iter(after.next_ready, None)] == [1_234_567_890_123, 1_234_567_950_123]
