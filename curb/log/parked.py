"""Parked records: delayed messages and dead letters, kept in compact arrays, never as
one Python object each (the design is in curb.log.kept's docstring).

A record is parked when it is neither to be handed out now nor done: a `rdy` record whose
due time is ahead, or a dead letter. It stays where it is in the ring; this index keeps
it as an *entry*, numbered by `seq` in ring order:

- `offsets`, `sizes`, `ids` and `states`: parallel arrays in ring order, 17 bytes an
  entry (21 in a ring past 4 GiB, whose offsets take 8). Entries are appended in the
  order recovery's walk meets their records or the read cursor passes them, which is
  ring order, and only ever leave by turning GONE, so the first live entry is the
  oldest parked record in the ring: it bounds the logical tail, and compaction copies
  it first.
- The due order: sorted *runs* of (due time, seq), packed in 8 bytes each (`Run`), and
  a batch of new keys (`fresh`, one int each) sorted into a run once it holds RUN keys
  or one of them is due. A heap over the runs' first keys gives the earliest due time. A
  key leaves lazily: one whose entry is no longer DELAYED is stale and skipped where met;
  once stale keys outnumber live ones (and RUN), the runs are rebuilt from the live ones.
- The dead letters oldest first: `dead_order`, the seqs of dead entries (and of some that
  were), sorted by message id. A new dead entry is inserted at its id's place (burials
  come mostly in id order, so near the end); a compaction copy takes its original's
  place (`replaces`); recovery's batches come in ring order, which compaction may have
  made differ from id order, so they are sorted once when it is done (`sort_dead`).
  `dead_from` is where the next reader starts: every entry before it is handed out,
  redriven or gone, so a reader of a million dead letters never rescans the ones taken.
  Every DEAD_HELD entry stays in `dead_order` (a cut of the front keeps them,
  `_dead_kept`): it is a dead letter still, which `dead_entry` and a browse of the dead
  letters (`dead_after`, by id, from the start) must find.
- By id, for an ACK up to an id: `id_lo`, per block of ID_BLOCK seqs, an id no live
  entry of the block is below (8 bytes a block). Ids rise in ring order but for
  compaction's copies, so an ACK up to an id (`ack_upto`, `walk_upto`) reads only the
  blocks holding an id up to it and skips the others unread, a bounded slice at a time.
- The ready line: `ready_order`, the seqs of READY entries in the order they became
  ready (due, or redriven): they wait for a consumer as entries, not objects, and
  `take_ready` hands them out oldest first.

States of an entry: DELAYED (waits for its due time), READY (due or redriven, waiting in
the ready line), MAX and EXP (dead letters, by reason), HELD (taken from the ready line:
the log made it a Record, in a consumer's hands or waiting in the queue; `held` maps the
seq to it), DEAD_HELD (a dead letter handed out to a reader of the dead letters, also in
`held`), GONE (acked, or copied by compaction, whose copy becomes an entry of its own).

Invariants:
- At most one live key per DELAYED entry: a key is added when an entry becomes DELAYED,
  and an entry stops being DELAYED only by leaving (its key goes stale) or by `due`
  (which popped its key).
- `passed` is the seq below which the read cursor has stepped over the entries' records:
  recovery's entries lie ahead of the cursor until it gets there; the cursor's own appends
  are passed at once. Entries are trimmed from the front only below both `passed` and
  the first live entry, so the cursor always recognises a record it must step over.
- `bytes`, `delayed`, `ready` and `dead` are the live entries' record bytes, the DELAYED
  and READY entries and the dead letters (MAX, EXP, DEAD_HELD); while an ACK up to an id
  is being walked (`upto_at`) they still count the entries it has yet to remove.
- An entry with an id up to the watermark `upto` is acked: while the walk has yet to
  remove it, no reader hands it out or shows it (`take_ready`, `next_dead`,
  `dead_entry`, `dead_after`). Compaction may still copy it (`passed_live`): the copy is
  appended, ahead of the walk, which removes it too.
- `dead_after` takes the dead letters by id, never by place in `dead_order`, so a reader
  of them in slices (a browse of `./dead`) resumes right whatever was inserted, trimmed,
  handed out or copied since: a copy keeps its original's id.
"""

from __future__ import annotations

import bisect
import heapq
import re
from array import array
from collections.abc import Callable, Iterator
from itertools import accumulate, compress, islice, repeat
from operator import le, lshift, or_, sub
from typing import Any

GONE, DELAYED, MAX, EXP, HELD, DEAD_HELD, READY = range(7)
DEAD = (MAX, EXP)
RUN = 4096
SEQ_BITS = 40  # a fresh key is due << SEQ_BITS | seq
SEQ_MASK = (1 << SEQ_BITS) - 1
TRIM = 4096  # GONE entries at the front worth a trim of the arrays
STEP = 4096  # entries `step_over` checks at once
OFFSETS = "I" if array("I").itemsize == 4 else "q"  # the offsets' type in a ring of up to 4 GiB
LIVE = re.compile(b"[^\\x00]")  # a state byte other than GONE
ID_BLOCK = 1024  # entries a block of `id_lo` covers
NO_ID = 1 << 62  # above every id: a block with no live entry


class Run:
    """A sorted run of due keys, consumed from the front: each (due, seq) packed in 8
    bytes as `(due - due_lo) << shift | (seq - seq_lo)`, `shift` the bits its seqs span
    (`packed_runs` splits keys until each run's spans fit)."""

    __slots__ = ("due_lo", "keys", "pos", "seq_lo", "shift")

    def __init__(self, keys: list[int], due_lo: int, seq_lo: int, shift: int):
        self.due_lo, self.seq_lo, self.shift = due_lo, seq_lo, shift
        if shift == SEQ_BITS and seq_lo == 0:  # each key less its due base: one pass in C
            self.keys = array("q", map(sub, keys, repeat(due_lo << SEQ_BITS)))
        else:
            self.keys = array("q", [((k >> SEQ_BITS) - due_lo) << shift | ((k & SEQ_MASK) - seq_lo) for k in keys])
        self.pos = 0

    def __len__(self) -> int:
        return len(self.keys)

    def at(self, i: int) -> tuple[int, int]:
        """The (due, seq) of the run's i-th key."""
        key = self.keys[i]
        return (key >> self.shift) + self.due_lo, (key & ((1 << self.shift) - 1)) + self.seq_lo


def packed_runs(keys: list[int]) -> list[Run]:
    """Runs holding sorted fresh keys (`due << SEQ_BITS | seq`), halved until each one's
    due and seq spans fit 63 bits together. Keys whose due times span less than 2**22 ms
    (about 70 minutes: a batch of recovery's, or of SENDs alike) keep their seq bits as
    they are, the cheap packing."""
    if not keys:
        return []
    if ((keys[-1] >> SEQ_BITS) - (keys[0] >> SEQ_BITS)).bit_length() + SEQ_BITS <= 62:
        return [Run(keys, keys[0] >> SEQ_BITS, 0, SEQ_BITS)]
    seqs = [k & SEQ_MASK for k in keys]
    due_lo, seq_lo = keys[0] >> SEQ_BITS, min(seqs)
    shift = (max(seqs) - seq_lo).bit_length()
    if ((keys[-1] >> SEQ_BITS) - due_lo).bit_length() + shift <= 62 or len(keys) == 1:
        return [Run(keys, due_lo, seq_lo, shift)]
    half = len(keys) // 2
    return packed_runs(keys[:half]) + packed_runs(keys[half:])


class Parked:
    """The parked entries, in ring order, by due time and the dead ones in order."""

    def __init__(self, end: int = 1 << 62) -> None:
        # Offsets lie below the ring's `end`: 4 bytes each where that is below 2**32.
        self.offsets = array(OFFSETS if end <= 1 << 32 else "q")
        self.sizes = array("i")
        self.ids = array("q")
        self.states = bytearray()
        self.base = 0  # the seq of the arrays' first entry
        self.first = 0  # no live entry below this seq
        self.valid = 0  # entries below this seq name bytes that may have been reused (`freed`)
        self.passed = 0
        self.fresh: list[int] = []
        self.fresh_min: int | None = None
        self.runs: list[tuple[int, int, Run]] = []  # heap of (first due, tie, run)
        self._ties = 0
        self.keys = 0  # keys in runs and fresh, stale ones included
        self.stale = 0
        self.dead_order = array("q")
        self.dead_from = 0
        self.dead_front = 0  # entries in a reader's hands a cut of the front kept there
        self.id_lo = array("q")  # per block of ID_BLOCK seqs from block0 * ID_BLOCK
        self.block0 = 0
        self.upto = 0  # the ack-up-to watermark
        self.upto_at: int | None = None  # the next seq the walk of an ACK up to an id looks at
        self.dead_sorted = True  # False once a batch of recovery's broke the id order
        self.ready_order = array("q")
        self.ready_from = 0
        self.held: dict[int, Any] = {}
        self.bytes = 0
        self.unpassed_bytes = 0  # of live entries the cursor has yet to step over
        self.delayed = 0
        self.ready = 0
        self.dead = 0

    @property
    def end(self) -> int:
        """The seq the next entry gets."""
        return self.base + len(self.states)

    def state(self, seq: int) -> int:
        return self.states[seq - self.base] if seq >= self.base else GONE

    def offset(self, seq: int) -> int:
        return self.offsets[seq - self.base]

    def size(self, seq: int) -> int:
        return self.sizes[seq - self.base]

    def id(self, seq: int) -> int:
        return self.ids[seq - self.base]

    # ---------------------------------------------------------------- entries

    def add(
        self,
        offset: int,
        size: int,
        mid: int,
        state: int,
        due_ms: int = 0,
        passed: bool = True,
        replaces: int | None = None,
    ) -> int:
        """A parked record (DELAYED with its due time, READY, MAX or EXP); returns its seq.
        `replaces`: the entry whose record this is a copy of (its place in the orders)."""
        seq = self.end
        self.offsets.append(offset)
        self.sizes.append(size)
        self.ids.append(mid)
        self.states.append(state)
        self._note_id(seq, mid)
        self.bytes += size
        if state == DELAYED:
            self.delayed += 1
            self._key(due_ms, seq)
        elif state == READY:
            self._make_ready(seq)
        else:
            self.dead += 1
            self._order_dead(seq, replaces)
        if passed:
            self.passed = seq + 1
        else:
            self.unpassed_bytes += size
        return seq

    def extend(self, offsets: list[int], sizes: list[int], ids: list[int], states: bytearray, dues: list[int]) -> None:
        """Many parked records the cursor has yet to pass, in ring order (recovery's walk):
        `add` for each, in bulk."""
        first = self.end
        self.offsets.extend(offsets)
        self.sizes.extend(sizes)
        self.ids.extend(ids)
        self.states.extend(states)
        seq, base = first, self.base
        while seq < self.end:
            stop = min(self.end, (seq // ID_BLOCK + 1) * ID_BLOCK)
            self._note_id(seq, min(self.ids[seq - base : stop - base]))
            seq = stop
        total = sum(sizes)
        self.bytes += total
        self.unpassed_bytes += total
        # A batch is mostly all delayed or all dead: those are done in passes in C.
        seqs = range(first, first + len(states))
        delayed = states.count(DELAYED)
        dead: range | list[int]
        if delayed == len(states):
            keys, dead, dead_ids = list(map(or_, map(lshift, dues, repeat(SEQ_BITS)), seqs)), [], []
        elif delayed == 0:
            keys, dead, dead_ids = [], seqs, ids
        else:
            keys = [due << SEQ_BITS | (first + at) for at, due in enumerate(dues) if states[at] == DELAYED]
            dead = [first + at for at in range(len(states)) if states[at] != DELAYED]
            dead_ids = [ids[seq - first] for seq in dead]
        self.delayed += len(keys)
        self.dead += len(dead)
        if self.dead_sorted and dead:
            order = self.dead_order
            prev = self.ids[order[-1] - self.base] if order else -1
            self.dead_sorted = prev <= dead_ids[0] and all(map(le, dead_ids, islice(dead_ids, 1, None)))
        self.dead_order.extend(dead)
        for at in range(0, len(keys), RUN):
            self.fresh.extend(keys[at : at + RUN])
            self.keys += len(keys[at : at + RUN])
            self._seal()

    def set(self, seq: int, state: int, due_ms: int = 0) -> None:
        """A live entry changes state (a release, a requeue with a delay, a burial, a
        redrive, a dead letter handed out or back)."""
        i = seq - self.base
        old = self.states[i]
        if old == state and state != DELAYED:
            return
        self.states[i] = state
        self._uncount(old)
        if old == DELAYED:
            self.stale += 1
        if state == DELAYED:
            self.delayed += 1
            self._key(due_ms, seq)
        elif state == READY:
            self._make_ready(seq)
        elif state in DEAD or state == DEAD_HELD:
            self.dead += 1
            at = self._dead_at(seq)
            if at is None:
                self._order_dead(seq, None)
            elif state != DEAD_HELD and at < self.dead_from:
                self.dead_from = at
        if state != HELD and state != DEAD_HELD:
            self.held.pop(seq, None)

    def remove(self, seq: int) -> None:
        """The entry leaves: its message was acked, or compaction copied its record."""
        i = seq - self.base
        old = self.states[i]
        if old == GONE:
            return
        self.states[i] = GONE
        self._uncount(old)
        if old == DELAYED:
            self.stale += 1
        self.bytes -= self.sizes[i]
        if seq >= self.passed:
            self.unpassed_bytes -= self.sizes[i]
        self.held.pop(seq, None)
        self._trim()

    def _uncount(self, state: int) -> None:
        if state == DELAYED:
            self.delayed -= 1
        elif state == READY:
            self.ready -= 1
        elif state in DEAD or state == DEAD_HELD:
            self.dead -= 1

    def passed_live(self) -> Iterator[int]:
        """The seqs of the live entries the cursor has passed, oldest first: the parked
        records that pin the tail, in the order compaction copies them."""
        seq = self._first_live()
        while seq < self.passed:
            if self.states[seq - self.base] != GONE:
                yield seq
            seq += 1

    def first_passed_live(self) -> int | None:
        """`passed_live`'s first seq, or None when it has none."""
        if self.first >= self.passed:  # no live entry below `first`: none passed (no search)
            return None
        seq = self._first_live()
        return seq if seq < self.passed else None

    def _first_live(self) -> int:
        # GONE is 0: the first other byte, found in C (an ACK up to an id may have left
        # a million GONE entries at the front).
        found = LIVE.search(self.states, max(self.first - self.base, 0))
        self.first = self.base + (found.start() if found else len(self.states))
        return self.first

    def freed(self, distance: Callable[[int, int], int], old_tail: int, new_tail: int) -> None:
        """Space in [old_tail, new_tail) may be reused: entries there (all GONE: a live one
        pins the tail) no longer name their records."""
        span = distance(old_tail, new_tail)
        lo = max(self.valid, self.base) - self.base
        # From `valid` on, entries lie within one lap in ring order (see `find`): their
        # distance from the old tail rises, so the first beyond the span is found by
        # bisection (a tail moving past a million entries at once costs no walk of them).
        at = bisect.bisect_left(self.offsets, span, lo, key=lambda o: distance(old_tail, o))
        self.valid = self.base + at

    def find(self, pos: int, distance: Callable[[int, int], int], gone: bool = False) -> int | None:
        """The seq of the live entry at ring offset `pos` (with `gone`, of a GONE one
        too: its record is still there, dead), if any; `distance(a, b)` is the bytes from
        a forward to b. From `valid` on, entries lie within one lap, in order, and no
        byte they name has been reused."""
        lo = (max(self.valid, self.base) if gone else self._first_live()) - self.base
        if lo >= len(self.states):
            return None
        offsets = self.offsets
        start = offsets[lo]
        at = bisect.bisect_left(offsets, distance(start, pos), lo, key=lambda o: distance(start, o))
        if at < len(offsets) and offsets[at] == pos and (gone or self.states[at] != GONE):
            return self.base + at
        return None

    def _trim(self) -> None:
        """Drop GONE entries at the front, once there are enough to be worth it."""
        upto = min(self.first, self.passed, self.valid)
        cut = upto - self.base
        if cut >= TRIM and cut * 2 >= len(self.states):
            del self.offsets[:cut]
            del self.sizes[:cut]
            del self.ids[:cut]
            del self.states[:cut]
            self.base = upto
            del self.id_lo[: upto // ID_BLOCK - self.block0]
            self.block0 = upto // ID_BLOCK
            # The orders name no entry below the base (all GONE): they look ids up by seq.
            self.dead_order, self.dead_from = self._dead_kept(self.dead_from, upto)
            self.dead_front = self.dead_from
            self.ready_order = array("q", (s for s in self.ready_order[self.ready_from :] if s >= upto))
            self.ready_from = 0

    # ---------------------------------------------------------------- ACK up to an id

    def _note_id(self, seq: int, mid: int) -> None:
        """Entry `seq` (the newest) has id `mid`: its block's lowest id is no higher."""
        k, lo = seq // ID_BLOCK - self.block0, self.id_lo
        if k < len(lo):
            lo[k] = min(lo[k], mid)
        else:
            lo.append(mid)

    def ack_upto(self, upto: int) -> None:
        """Raise the watermark: entries with ids up to it are acked from now on, and
        `walk_upto` finds them for removal."""
        if upto > self.upto:
            self.upto = upto
            self.upto_at = self.base

    @property
    def walking(self) -> bool:
        """Whether an ACK up to an id's walk is under way. Callers that test again after a
        `walk_upto` ask this rather than `upto_at is None`: a compiled caller keeps the type
        the first test narrowed `upto_at` to, across the call that changed it."""
        return self.upto_at is not None

    def _acked(self, seq: int) -> bool:
        """Whether the entry is acked by the watermark and not yet removed."""
        return self.upto_at is not None and self.ids[seq - self.base] <= self.upto

    def walk_upto(self, limit: int) -> list[int]:
        """The next live entries with ids up to the watermark, for the caller to remove,
        looking at about `limit` entries: blocks whose ids all lie above it cost nothing.
        `upto_at` is None once the walk has reached the end."""
        at = self.upto_at
        if at is None:
            return []
        base, ids, states, lo, upto = self.base, self.ids, self.states, self.id_lo, self.upto
        at, end, looked = max(at, base), self.end, 0
        found: list[int] = []
        while at < end and looked < limit:
            block = at // ID_BLOCK
            stop = min(end, (block + 1) * ID_BLOCK)
            k = block - self.block0
            if lo[k] <= upto:
                i = at - base
                found.extend(
                    base + i + n for n, mid in enumerate(ids[i : stop - base]) if mid <= upto and states[i + n]
                )
                if at == block * ID_BLOCK and stop - at == ID_BLOCK:  # the whole block: its lowest id left
                    left = (mid for n, mid in enumerate(ids[i : i + ID_BLOCK]) if mid > upto and states[i + n])
                    lo[k] = min(left, default=NO_ID)
                looked += stop - at
            at = stop
        self.upto_at = at if at < end else None
        return found

    # ---------------------------------------------------------------- the cursor's path

    def step_over(self, pos: int, stop: int, limit: int) -> tuple[int, int] | None:
        """What the cursor steps over if the record at `pos` is the next entry it has not
        yet passed: that record and the entries right after it, up to `stop` (the write
        head: an entry is made when its record is placed, and may lie at or past what is
        written yet) and `limit` entries in all, as (bytes, the highest id among them);
        None otherwise."""
        seq, end, base = self.passed, self.end, self.base
        offsets = self.offsets
        if seq >= end or offsets[seq - base] != pos:
            return None
        sizes, states = self.sizes, self.states
        at, first = pos, seq
        end = min(end, seq + max(1, limit))
        while seq < end and at != stop:  # STEP entries at a time while they lie end to end, in C
            i = seq - base
            j = min(end - base, i + STEP)
            chain = list(accumulate(sizes[i:j], initial=at))  # where each would start if they do
            del chain[-1:]
            if offsets[i:j].tolist() != chain or stop in chain:
                break
            self.unpassed_bytes -= sum(compress(sizes[i:j], states[i:j]))  # (GONE is 0)
            at += sum(sizes[i:j])
            seq = base + j
        while seq < end and offsets[seq - base] == at and at != stop:  # and the records right after it
            size = sizes[seq - base]
            if states[seq - base] != GONE:
                self.unpassed_bytes -= size
            at += size
            seq += 1
        self.passed = seq
        return at - pos, max(self.ids[first - base : seq - base])

    def _pass(self, seq: int) -> None:
        self.passed = seq + 1
        if self.states[seq - self.base] != GONE:
            self.unpassed_bytes -= self.sizes[seq - self.base]

    def pass_span(self, start: int, stop: int, distance: Callable[[int, int], int]) -> None:
        """The cursor jumped from `start` to `stop` past damage: it has passed the entries
        in between too."""
        span = distance(start, stop)
        while self.passed < self.end and distance(start, self.offsets[self.passed - self.base]) < span:
            self._pass(self.passed)

    # ---------------------------------------------------------------- the due order

    def _key(self, due_ms: int, seq: int) -> None:
        self.fresh.append(due_ms << SEQ_BITS | seq)
        self.keys += 1
        if self.fresh_min is None or due_ms < self.fresh_min:
            self.fresh_min = due_ms
        if len(self.fresh) >= RUN:
            self._seal()

    def _seal(self) -> None:
        if self.fresh:
            self.fresh.sort()
            self._push(self.fresh)
        self.fresh = []
        self.fresh_min = None

    def _push(self, keys: list[int]) -> None:
        for run in packed_runs(keys):
            self._ties += 1
            heapq.heappush(self.runs, (run.at(0)[0], self._ties, run))

    def next_due(self) -> int | None:
        """The earliest due time of a DELAYED entry (never later; it may be a stale key's,
        which `due` then drops)."""
        soonest = self.fresh_min
        if self.runs and (soonest is None or self.runs[0][0] < soonest):
            soonest = self.runs[0][0]
        return soonest

    def release(self, now_ms: int, limit: int) -> int:
        """Move up to `limit` DELAYED entries due by `now_ms` to the ready line, earliest
        first (no record is read); returns how many moved."""
        if self.fresh_min is not None and self.fresh_min <= now_ms:
            self._seal()
        moved = 0
        runs, states, base = self.runs, self.states, self.base
        while runs and runs[0][0] <= now_ms and moved < limit:
            _, tie, run = runs[0]
            seq = run.at(run.pos)[1]
            run.pos += 1
            self.keys -= 1
            if run.pos < len(run):
                heapq.heapreplace(runs, (run.at(run.pos)[0], tie, run))
            else:
                heapq.heappop(runs)
            if seq >= base and states[seq - base] == DELAYED:
                states[seq - base] = READY
                self.delayed -= 1
                self._make_ready(seq)
                moved += 1
            else:
                self.stale -= 1
        if self.stale > max(RUN, self.keys - self.stale):
            self._rebuild()
        return moved

    def _make_ready(self, seq: int) -> None:
        self.ready += 1
        self.ready_order.append(seq)

    def take_ready(self) -> int | None:
        """The oldest READY entry, now HELD (the caller makes it a Record), if any."""
        order, base, states = self.ready_order, self.base, self.states
        at, end = self.ready_from, len(order)
        while at < end:
            seq = order[at]
            at += 1
            if seq >= base and states[seq - base] == READY and not self._acked(seq):
                states[seq - base] = HELD
                self.ready -= 1
                self.ready_from = at
                return seq
        self.ready_from = at
        if at >= TRIM and at * 2 >= end:
            del order[:at]
            self.ready_from = 0
        return None

    def _rebuild(self) -> None:
        """Drop the stale keys: the runs again, from the live ones."""
        states, base = self.states, self.base
        keys = [k for k in self.fresh if states[(k & SEQ_MASK) - base] == DELAYED]
        for _, _, run in self.runs:
            for due, seq in map(run.at, range(run.pos, len(run))):
                if seq >= base and states[seq - base] == DELAYED:
                    keys.append(due << SEQ_BITS | seq)
        keys.sort()
        self.runs = []
        self.fresh = []
        self.fresh_min = None
        for at in range(0, len(keys), RUN):
            self._push(keys[at : at + RUN])
        self.keys = len(keys)
        self.stale = 0

    # ---------------------------------------------------------------- dead letters

    def _id_of(self, seq: int) -> int:
        return self.ids[seq - self.base]

    def _dead_at(self, seq: int) -> int | None:
        """Where `seq` stands in `dead_order`, if it does."""
        order, mid = self.dead_order, self.ids[seq - self.base]
        at = bisect.bisect_left(order, mid, key=self._id_of) if self.dead_sorted else len(order)
        while at < len(order) and self._id_of(order[at]) == mid:
            if order[at] == seq:
                return at
            at += 1
        return None if self.dead_sorted else next((i for i, s in enumerate(order) if s == seq), None)

    def _order_dead(self, seq: int, replaces: int | None) -> None:
        """A new dead entry takes its place by id (a copy, its original's)."""
        order = self.dead_order
        at = None if replaces is None else self._dead_at(replaces)
        if at is not None:
            order[at] = seq
        elif self.dead_sorted:
            at = bisect.bisect_right(order, self.ids[seq - self.base], key=self._id_of)
            order.insert(at, seq)
        else:
            at = len(order)
            order.append(seq)
        self.dead_from = min(self.dead_from, at)

    def sort_dead(self) -> None:
        """Put recovery's dead letters in id order, if its batches were not."""
        if not self.dead_sorted:
            order, _ = self._dead_kept(self.dead_from)
            self.dead_order = array("q", sorted(order, key=self._id_of))
            self.dead_from = self.dead_front = 0
            self.dead_sorted = True

    def _dead_kept(self, cut: int, upto: int | None = None) -> tuple[array[int], int]:
        """`dead_order` without its first `cut` entries but for those in a reader's hands
        (DEAD_HELD: dead letters still, which a browse and `dead_entry` must find; they
        are all among the first `cut`, found through `held`, as few as readers hold), and
        without seqs below `upto`; and how many of the first it kept."""
        base, states = self.base, self.states
        floor = base if upto is None else max(base, upto)
        held = sorted((s for s in self.held if s >= floor and states[s - base] == DEAD_HELD), key=self._id_of)
        rest = self.dead_order[cut:]
        kept = array("q", held)
        kept.extend(rest if upto is None else (s for s in rest if s >= upto))
        return kept, len(held)

    def last_dead(self) -> int:
        """The highest id of a dead letter not handed out (0: none)."""
        order, base, states = self.dead_order, self.base, self.states
        self.sort_dead()
        for at in range(len(order) - 1, self.dead_from - 1, -1):
            seq = order[at]
            if seq >= base and states[seq - base] in DEAD and not self._acked(seq):
                return self.ids[seq - base]
        return 0

    def dead_after(self, after: int, last: int, limit: int) -> tuple[list[int], int | None]:
        """The ids of the dead letters with ids in (after, last], handed out to a reader
        of the dead letters or not (they are dead until acked or redriven), oldest first,
        looking at about `limit` entries of `dead_order` (those no longer dead too); and
        the id to go on after (None: there are no more)."""
        self.sort_dead()
        order, base, states, ids = self.dead_order, self.base, self.states, self.ids
        at = bisect.bisect_right(order, after, key=self._id_of)  # those handed out lie before dead_from too
        found: list[int] = []
        mid = after
        while at < len(order):
            seq = order[at]
            if seq >= base:
                if ids[seq - base] > last:
                    return found, None
                if limit <= 0 and ids[seq - base] != mid:
                    return found, mid  # never between two entries of one id
                mid = ids[seq - base]
                state = states[seq - base]
                if (state in DEAD or state == DEAD_HELD) and not self._acked(seq) and (not found or found[-1] != mid):
                    found.append(mid)
            limit -= 1
            at += 1
        return found, None

    def dead_entry(self, mid: int) -> int | None:
        """The seq of message `mid`'s entry if it is a dead letter, handed out to a reader
        of the dead letters or not (found by id, so wherever compaction has copied it
        since)."""
        order, base, states = self.dead_order, self.base, self.states
        at = bisect.bisect_left(order, mid, key=self._id_of)
        while at < len(order) and self._id_of(order[at]) == mid:
            seq = order[at]
            if (states[seq - base] in DEAD or states[seq - base] == DEAD_HELD) and not self._acked(seq):
                return seq
            at += 1
        return None

    def next_dead(self) -> int | None:
        """The oldest dead letter not handed out, if any."""
        order, base, states = self.dead_order, self.base, self.states
        at, end = self.dead_from, len(order)
        while at < end:
            seq = order[at]
            if seq >= base and states[seq - base] in DEAD and not self._acked(seq):
                break
            at += 1  # handed out, redriven or gone (or acked, for the walk to remove)
        self.dead_from = at
        cut = at - self.dead_front  # what a cut would drop (those kept before stay again)
        if cut >= TRIM and cut * 2 >= end:
            self.dead_order, self.dead_from = order, at = self._dead_kept(at)
            self.dead_front = at
        return order[at] if at < len(order) else None
