"""Recovery's walk over copies (curb.log.scan): a copy that supersedes no earlier
occurrence in the walk, what a dead letter buried while running leaves, is kept in the
compact `copied` set, not in `last`; one that supersedes an earlier occurrence still
drops it, on the checked path and the skimmed one. And the compact id set itself
(curb.log.idset) against a Python set."""

from __future__ import annotations

import random

import pytest
from simdisk import SimDisk

from curb.log import LogCore, Record, shapes
from curb.log import reader as reader_module
from curb.log import record as fmt
from curb.log import scan as scan_module
from curb.log.idset import LOOSE, RUNS, IdSet
from curb.log.marks import Marks
from curb.log.record import RING_START
from curb.log.scan import Scan

WALL = 1_700_000_000_000
CAP = 256 * 1024


class World:
    """A LogCore on a SimDisk with a wall clock the test holds still."""

    def __init__(self, disk: SimDisk | None = None):
        self.disk = disk if disk is not None else SimDisk(random.Random(5))
        self.now = 0.0
        self.log = LogCore(self.disk, CAP, clock=lambda: self.now, wall_ms=lambda: WALL)

    def settle(self) -> None:
        for _ in range(6):
            self.now += 0.06
            self.log.flush()
            self.log.sync()

    def restart(self) -> World:
        return World(self.disk.crash("power"))

    def send(self, n: int) -> Record:
        return self.log.append(b"x-n:%d\n\n" % n + b"b" * 40)

    def take(self) -> Record:
        rec = self.log.next_ready()
        assert rec is not None
        self.log.delivered(rec)
        return rec

    def bury(self, rec: Record) -> None:
        """The holder buries the message and lets go of it: the log copies it to the head."""
        self.log.bury(rec, "max-deliveries")
        self.log.keep_dead(rec)
        self.settle()

    def scan(self) -> Scan:
        """Recovery's walk over the disk as it is now (it writes nothing)."""
        ckpt = fmt.latest_checkpoint(self.disk.pread(RING_START, 0))
        scan = Scan(self.disk, ckpt, self.log.end, now_ms=WALL)
        scan.run()
        return scan


def test_a_dead_letter_buried_while_running_leaves_a_copy_that_costs_no_dict_entry():
    """The copy supersedes nothing in the walk (the tail passed its original): it is
    indexed like any parked record and `last` stays empty, so a million of them cost the
    index's bytes and no more."""
    w = World()
    for n in range(5):
        w.send(n)
    w.settle()
    held = [w.take() for _ in range(5)]
    keep = w.send(99)  # unread: the tail stops here, past the originals
    w.settle()
    for rec in held:
        w.bury(rec)
    scan = w.scan()
    assert scan.first_fresh == keep.id, "the walk starts past the originals: the test proves nothing"
    assert scan.last == {} and sorted(scan.copied.runs[0]) == [rec.id for rec in held]
    assert (scan.messages, scan.parked.dead) == (1, 5)
    w2 = w.restart()
    assert w2.log._cursor.last == {} and w2.log.dead == 5
    assert [rec.id for rec in iter(w2.log.next_ready, None)] == [keep.id]
    last, _ = w2.log.dead_letters()
    assert sorted(w2.log.dead_after(0, last, 1 << 30)[0]) == [rec.id for rec in held]


def walk(records: list[tuple[bytes, int, bool]], skim: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Scan, list[int]]:
    """Recovery's walk over a log holding `records` (state, id, copy) from its checkpoint's
    tail, in that order; with `skim`, by headers alone (as for all but the newest 4 MiB of
    a large log). Returns the scan and the records' offsets."""
    image = bytearray(fmt.initial_header(CAP))
    offsets = []
    for wseq, (state, mid, copy) in enumerate(records, 1):
        offsets.append(len(image))
        payload = b"x-n:%d\n\nbody" % wseq
        image += b"".join(fmt.record_bytes(fmt.encode_record(state, 1, mid, wseq, WALL, payload, copy), payload))
    ckpt = fmt.Checkpoint(2, RING_START, len(image), 100, len(records) + 1)
    slot = ckpt.encode()
    image[fmt.SLOT_OFFSETS[0] : fmt.SLOT_OFFSETS[0] + len(slot)] = slot
    if skim:
        monkeypatch.setattr(scan_module, "VERIFY_NEAR_HEAD", 0)
    scan = Scan(SimDisk(random.Random(1), image=bytes(image)), ckpt, CAP, now_ms=WALL)
    scan.run()
    return scan, offsets


MAX, RDY, ACK = fmt.STATE_MAX, fmt.STATE_RDY, fmt.STATE_ACK


@pytest.mark.parametrize("skim", [False, True], ids=["checked", "skimmed"])
def test_copies_supersede_exactly_their_earlier_occurrences_in_the_walk(skim: bool, monkeypatch: pytest.MonkeyPatch):
    """Message 5's original lies before the walk; message 7's in it. A copy with no
    earlier occurrence goes to `copied`; one with an earlier occurrence (an original, a
    copy in `copied` or in `last`) is the message in `last`, and the earlier one is
    uncounted or its parked entry dropped."""
    scan, at = walk(
        [(MAX, 5, True), (RDY, 7, False), (MAX, 5, True), (MAX, 7, True), (RDY, 9, False)], skim, monkeypatch
    )
    assert scan.last == {5: at[2], 7: at[3]} and 5 in scan.copied and 7 not in scan.copied
    assert (scan.messages, scan.parked.dead) == (1, 2), "message 9 rdy; 5 and 7 dead once each"
    live = [scan.parked.offset(seq) for seq in range(scan.parked.base, scan.parked.end) if scan.parked.state(seq)]
    assert live == [at[2], at[3]]
    assert [pos for pos, *_ in scan.records()] == [at[2], at[3], at[4]]


@pytest.mark.parametrize("skim", [False, True], ids=["checked", "skimmed"])
def test_copies_that_supersede_nothing_cost_no_entry_in_last(skim: bool, monkeypatch: pytest.MonkeyPatch):
    """Dead letters and an acked message whose originals lie before the walk: in
    `copied`, indexed or counted as acked, and `last` stays empty. A copy that counts as
    a message is in `last` (the cursor vouches for it by it: curb.log.cursor)."""
    scan, at = walk(
        [(MAX, 2, True), (MAX, 3, True), (ACK, 4, True), (RDY, 5, True), (RDY, 9, False)], skim, monkeypatch
    )
    assert scan.last == {5: at[3]} and sorted(scan.copied.runs[0]) == [2, 3, 4]
    assert (scan.messages, scan.acked, scan.parked.dead) == (2, 1, 2)


@pytest.mark.parametrize("skim", [False, True], ids=["checked", "skimmed"])
def test_a_rdy_copy_after_a_parked_one_is_the_message(skim: bool, monkeypatch: pytest.MonkeyPatch):
    scan, at = walk([(MAX, 5, True), (RDY, 5, True), (RDY, 9, False)], skim, monkeypatch)
    assert scan.last == {5: at[1]} and (scan.messages, scan.parked.dead) == (2, 0)


@pytest.mark.parametrize("order", ["rising", "interleaved", "falling", "shuffled"])
def test_the_id_set_answers_as_a_set_does_in_any_order_of_adds(order: str):
    rng = random.Random(order)
    ids = list(range(1, 40_000, 3))
    if order == "interleaved":  # three rising streams, as burials and compaction write
        streams = [ids[0::3], ids[1::3], ids[2::3]]
        ids = []
        while any(streams):
            ids.append(rng.choice([s for s in streams if s]).pop(0))
    elif order == "falling":
        ids.reverse()
    elif order == "shuffled":
        rng.shuffle(ids)
    ids += rng.sample(ids, 500)  # some twice
    got, want = IdSet(), set()
    for mid in ids:
        assert got.add(mid) == (mid not in want)
        want.add(mid)
    assert len(got) == len(want)
    for mid in range(0, 40_005):
        assert (mid in got) == (mid in want)
    assert len(got.runs) <= RUNS and len(got.loose) <= max(LOOSE, len(want) // 4)
    lasts = [run[-1] for run in got.runs]
    assert lasts == sorted(set(lasts)) and all(list(run) == sorted(run) for run in got.runs)
    if order == "rising":
        assert len(got.runs) == 1 and not got.loose, "rising ids cost an append each"


def test_ids_above_every_id_held_join_in_one_go():
    got = IdSet()
    assert got.high == 0
    got.extend_above([3, 5, 9])
    assert got.add(4) and not got.add(5) and got.high == 9
    got.extend_above([10, 12])
    assert len(got) == 6 and all(mid in got for mid in (3, 4, 5, 9, 10, 12)) and 11 not in got


def random_log(rng: random.Random, n: int) -> list[tuple[bytes, int, bool, int, int]]:
    """(state, id, copy, due, payload length) of n records as a log holds them: originals
    in id order in runs of one shape, copies of earlier ids among them."""
    out: list[tuple[bytes, int, bool, int, int]] = []
    mid = 0
    while len(out) < n:
        state = rng.choice((RDY, RDY, ACK, MAX, fmt.STATE_EXP))
        due = rng.choice((0, 0, WALL - 5, WALL + 5)) if state == RDY else 0
        length = rng.choice((10, 40, 41, 200))
        copy = rng.random() < 0.3 and mid > 0
        for _ in range(rng.choice((1, 3, 20, 40, 70))):
            if rng.random() < 0.03:
                due = rng.choice((0, WALL + 9))  # the run's shape holds, its due times differ
            if copy:
                out.append(
                    (
                        state,
                        rng.randrange(1, mid + 1) if rng.random() < 0.2 else mid + 1000 + len(out),
                        True,
                        due,
                        length,
                    )
                )
            else:
                mid += 1
                out.append((state, mid, False, due, length))
    return out[:n]


def scan_of(records, path: str, upto: int, monkeypatch: pytest.MonkeyPatch) -> Scan:
    """A walk of `records` from a checkpoint with watermark `upto`: `checked` reads every
    record in full; `skimmed` by headers one at a time; `runs` with runs of one shape;
    `plain` one at a time where it can (no run is ever found, so the loop for plain
    records takes most of them)."""
    image = bytearray(fmt.initial_header(CAP * 8))
    for wseq, (state, mid, copy, due, length) in enumerate(records, 1):
        payload = b"x" * length
        header = fmt.encode_record(state, 1, mid, wseq, WALL - 1000 + wseq, payload, copy, due)
        image += b"".join(fmt.record_bytes(header, payload))
    ckpt = fmt.Checkpoint(2, RING_START, len(image), 10**6, len(records) + 1, upto)
    slot = ckpt.encode()
    image[fmt.SLOT_OFFSETS[0] : fmt.SLOT_OFFSETS[0] + len(slot)] = slot
    with monkeypatch.context() as patch:
        patch.setattr(scan_module, "VERIFY_NEAR_HEAD", 1 << 40 if path == "checked" else 3000)
        if path == "skimmed":
            patch.setattr(shapes, "FIRST", 1 << 40)
        if path == "plain":
            patch.setattr(shapes, "run_rows", lambda *_: [])
        scan = Scan(SimDisk(random.Random(1), image=bytes(image)), ckpt, CAP * 8, Marks(2048), now_ms=WALL)
        scan.run()
    return scan


def summary(scan: Scan) -> dict[str, object]:
    parked = scan.parked
    return {
        "counts": (scan.messages, scan.acked, scan.live_bytes, scan.dead_bytes, scan.max_id, scan.first_fresh),
        "oldest": scan.oldest_ms,
        "classes": (scan.classes.counts, scan.classes.total, scan.classes.largest),
        "parked": (list(parked.offsets), list(parked.sizes), list(parked.ids), bytes(parked.states)),
        "parked counts": (parked.delayed, parked.dead, parked.bytes, parked.unpassed_bytes),
        "due": released_keys(parked),
        "last": scan.last,
        "copied": sorted(set(scan.copied.loose).union(*scan.copied.runs)),
        "marks": scan.marks.entries,
        "end": (scan.head, scan.next_wseq, scan.torn),
    }


def released_keys(parked) -> list[int]:
    parked.release(1 << 60, 1 << 62)
    return list(iter(parked.take_ready, None))


@pytest.mark.parametrize("seed", range(40))
def test_runs_of_one_shape_count_as_one_record_at_a_time_does(seed: int, monkeypatch: pytest.MonkeyPatch):
    """The skim's runs (curb.log.shapes) leave the walk's every finding as reading one
    record at a time does, and as the checked path does but for where it puts marks
    and its size classes' bound (which differed before runs too)."""
    rng = random.Random(seed)
    records = random_log(rng, rng.choice((30, 300, 900)))
    upto = rng.choice((0, 0, len(records) // 4))
    if seed % 2:
        monkeypatch.setattr(reader_module, "CHUNK", 4096)  # runs cut by the read window's end
    skimmed = summary(scan_of(records, "skimmed", upto, monkeypatch))
    assert summary(scan_of(records, "runs", upto, monkeypatch)) == skimmed
    assert summary(scan_of(records, "plain", upto, monkeypatch)) == skimmed
    checked = summary(scan_of(records, "checked", upto, monkeypatch))
    for estimate in ("marks", "classes"):  # (placed a little differently by the checked path, as before runs)
        del checked[estimate], skimmed[estimate]
    assert skimmed == checked
