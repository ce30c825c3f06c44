"""The whole broker under the simulator (tests/sim): sessions, the broker, the queue and
the log on a simulated disk, under a clock that jumps, crashing at every step. A fixed
range of seeds on every run, the seeds that once broke an invariant, kept by name, and
the simulator's own checks: a seed replays exactly, and a broken broker is caught.

CURB_BROKER_SIM_SEEDS sets how many seeds the range has (default 100); long runs belong
to `bin/crashsim --broker --seeds 20000 --jobs N`.
"""

from __future__ import annotations

import os

import pytest
from sim import driver
from sim.driver import STEPS, run_many, run_seed
from simdisk import SimDisk

from curb import send_rule, timing
from curb.broker import Broker
from curb.queue import Queue
from curb.redelivery import Redelivery

SEEDS = int(os.environ.get("CURB_BROKER_SIM_SEEDS", "100"))
JOBS = min(2, os.cpu_count() or 1)

# Seeds that broke an invariant, with the kind of finding they showed. A seed replays
# the same run only with the same --steps and the same workload: when the workload's
# choices change, find new seeds for these. These were found before the extra steps
# (redrives of some, UNSUBSCRIBE, ACK up to an id, browses, ./count) and the disk's
# faults existed, so they play without them (extra=False), which replays them exactly.
REGRESSIONS = {
    # A delayed SEND was never released: the broker armed its due timer from the log's
    # soonest due time before the log had the still-pending record in its index.
    "delayed_send_never_released": (2, "accepted SEND never delivered"),
    # A dead letter found at start-up and held by a ./dead subscriber was counted twice:
    # by the log's parked index and by the dead letters' queue.
    "held_dead_letter_counted_twice": (0, "counts"),
    # Compaction copied parked dead letters to the head and uncounted them until the
    # cursor passed the copies: ./count said dead 0 with four dead letters in the log.
    "parked_copies_in_transit_uncounted": (8, "counts"),
    # A message held at a kill -9 whose in-flight delivery reached the disk came back
    # with its count at -max-deliveries and was delivered once more, past the limit.
    "recovered_at_the_limit_delivered_again": (36, "delivered past the delivery limit"),
    # A redrive skipped the dead letters found at start-up whose compaction copies were
    # in transit (counted as dead, not in the parked index the redrive walked): its
    # RECEIPT came and they stayed dead, or a ./dead reader never got them.
    "redrive_skips_dead_letters_in_transit_never_delivered": (100366, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_never_delivered_2": (4200190, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_never_delivered_3": (4200992, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_never_delivered_4": (4200993, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_never_delivered_5": (4201265, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_never_delivered_6": (4201774, "accepted SEND never delivered"),
    "redrive_skips_dead_letters_in_transit_dead_after_restart": (100742, "dead letter from nowhere"),
    "redrive_skips_dead_letters_in_transit_dead_after_restart_2": (4200386, "dead letter from nowhere"),
    "redrive_skips_dead_letters_in_transit_dead_after_restart_3": (4200462, "dead letter from nowhere"),
    "redrive_skips_dead_letters_in_transit_dead_after_restart_4": (4201803, "dead letter from nowhere"),
    "redrive_skips_dead_letters_in_transit_read_from_dead": (4202183, "a dead letter that is not dead"),
    "redrive_skips_dead_letters_in_transit_read_from_dead_2": (4202594, "a dead letter that is not dead"),
    # A redrive lost at a crash left a compaction copy's count (written as it was in
    # memory, in-flight deliveries included) at the limit: the queue rightly buried the
    # message again; the checker had taken that for a dead letter from nowhere.
    "redrive_lost_with_a_copys_count_at_the_limit": (4202166, "dead letter from nowhere"),
    # The log keeps buried and delayed records in its index (copied to the head): a
    # stale copy of such a record ahead of the cursor was handed out again, early,
    # because stepping over parked entries taught the cursor no ids.
    "a_stale_copy_of_a_kept_record_handed_out_early": (4201096, "delivered before it was due"),
    # Copies of kept records took the room a receipted SEND had been admitted to.
    "kept_records_copied_into_the_room_of_an_admitted_send": (4201819, "counts"),
    # The checker: a redrive lost at a crash may leave the count as it was on disk.
    "redrive_lost_keeps_the_count_on_disk": (4201284, "delivery count after a redrive"),
    # The checker: met expired and at the limit at once, either reason is right.
    "met_expired_and_at_the_limit": (4203630, "dead letter's reason"),
}


# Seeds found with the extra steps and the disk's faults, which they play with.
REGRESSIONS_WITH_EXTRA_STEPS = {
    # ACK curb-upto took a message requeued with a delay, which the log kept (held, in
    # its heap of delayed records), and ./count went on counting it as delayed: a delayed
    # SEND then ACK curb-upto:4 with its RECEIPT left delayed:1 and no message (seed 33).
    "ack_upto_leaves_a_delayed_message_counted": (33, "counts"),
    "ack_upto_leaves_a_delayed_message_counted_after_a_restart": (7, "counts"),
    "ack_upto_leaves_a_delayed_message_counted_past_its_due_time": (595, "counts"),
    # A receipted SEND's write failed with EIO after its sectors reached the page cache:
    # the producer heard "message not stored ... will not be delivered", yet the record
    # was whole and was delivered, at once or after a restart. The ERROR now says "message
    # may not be stored" (the log failed after writing it), and the checker holds the
    # broker to that.
    "a_send_the_log_failed_after_writing_is_delivered_at_once": (5001705, "refused SEND stored"),
    "a_send_the_log_failed_after_writing_is_found_after_a_restart": (5000002, "refused SEND stored"),
    "a_full_disk_while_copying_kept_dead_letters_broke_the_log": (6000902, "redrive moved more than curb-count"),
    "a_full_disk_while_copying_kept_dead_letters_broke_the_log_2": (6001603, "redrive moved more than curb-count"),
    # An ACK up to an id without a receipt of its own, then a receipted frame on the same
    # connection: its RECEIPT came once its own write was synced, before a checkpoint
    # carried the watermark, and a power loss took the ACK back. on_durable now waits for
    # the watermark too.
    "a_receipt_after_an_ack_upto_waits_for_its_watermark": (7002780, "receipted ACK up to an id undone"),
    "a_receipt_after_an_ack_upto_waits_for_its_watermark_2": (7003267, "receipted ACK up to an id undone"),
    # The checker: a ./count watcher that can take no output gets the latest counts once
    # it can, not before.
    "a_count_watcher_that_cannot_take_output_is_owed": (7013627, "./count stale"),
    # The checker: a redrive "moves" an expired message that may be a dead letter, though
    # its SEND may still wait for room; a full disk then refused it, and its ERROR waited
    # behind the connection's earlier receipt, so the checker still counted it queued.
    "a_full_disk_refuses_an_expired_send_a_redrive_may_have_moved": (9005337, "counts"),
    # The simulator: a write error broke the log amid a redrive of some (copying a kept
    # dead letter), and the dead letters it then failed to read looked moved; and (later
    # seeds) the letters it did move were delivered before the broken broker stopped,
    # to a checker that still had them dead. Which moved is now read from the log's
    # index, unread.
    "a_redrive_of_some_amid_a_write_error_that_breaks_the_log": (9019904, "redrive moved more than curb-count"),
    "a_redrive_of_some_delivers_before_a_write_error_breaks_the_log": (
        30011592,
        "dead letter delivered to a queue subscriber",
    ),
    "a_redrive_of_some_delivers_before_a_write_error_breaks_the_log_2": (
        30014218,
        "dead letter delivered to a queue subscriber",
    ),
}


# Seeds found once the log's walks were drawn in small slices, which they play with (before
# NACKs with curb-undelivered were drawn, which they play without).
REGRESSIONS_WITH_SLICES = {
    # The simulator: a drain consumer's few rounds were fewer than the slices its walk
    # of the log took; rounds now run loop passes while the log walks.
    "a_drain_outlasts_a_few_rounds_of_small_slices": (20000002, "accepted SEND never delivered"),
    # The checker: rdy still counts what an ACK up to an id took until its walk passes
    # it (docs/guide.md), so while the log walks only the lower bound holds.
    "counts_while_an_ack_upto_is_walked": (20000008, "counts"),
    # A slice of a walk that passed records without reaching a message to hand out did
    # not tell the broker: ./count watchers kept the counts from before it.
    "a_slice_of_a_walk_leaves_count_watchers_stale": (20000024, "./count stale"),
    # The checker: a message a disk fault left unsure, delivered (so stored) before a
    # browse that began meanwhile returned it.
    "a_browse_returns_a_message_a_fault_left_unsure": (20000094, "browse returned a message that is not live"),
    # A dead letter a ./dead reader took while a browse of ./dead was under way was no
    # longer "one still" to the browse, which skipped it.
    "a_dead_browse_skips_a_dead_letter_handed_out_meanwhile": (20000015, "dead browse missed a dead letter"),
    "a_dead_browse_skips_a_dead_letter_handed_out_meanwhile_2": (20000391, "dead browse missed a dead letter"),
    # The checker: a redrive of some moved an expired dead letter, which the queue buried
    # again at once; a crash between the redrive's rewrite and the new burial's left it
    # queued (expired: it is buried again when met), and the burial before it, receipted,
    # no longer binds once a redrive may have moved it.
    "a_redriven_expired_letter_reburied_is_queued_after_a_crash": (31016791, "dead letter came back to life"),
}


# Seeds found once NACKs with curb-undelivered were drawn, which they play with.
REGRESSIONS_WITH_BOUNCES = {
    # A dead letter buried for the delivery limit, then taken by an ACK up to an id that a
    # power loss undid, came back queued with its count at the limit, and the queue buried
    # it again when it met it: the checker had forgotten it was at the limit.
    "an_undone_ack_upto_of_a_dead_letter_at_the_limit": (38102880, "dead browse returned a message that is not dead"),
    # A failed write of the copies of two messages parked by a passed ack deadline left
    # the index naming copies past the written head; a browse then missed both and still
    # ended. Once the log failed, no browse is stepped and nothing is delivered.
    "a_browse_after_a_failed_write_misses_parked_messages": (60017037, "browse missed a live message"),
    # The checker: a redrive (of all) moved a message it had queued at the limit, which
    # the queue had just buried; a power loss kept the burial and lost the unsynced
    # redrive. Which letters a redrive moves is now read from the broker for every redrive.
    "a_redrive_of_a_letter_the_model_had_queued_is_lost_at_a_power_loss": (60007593, "dead letter from nowhere"),
    # The checker, twice over: a bounce lowered the count of a message held at the limit,
    # and a crash lost the bounce's write while a copy compaction had kept the count at
    # the limit; the queue buried it when it met it. The model forgot the lowered count,
    # so it took a redrive of it for a redrive of a live message, and its burial for a
    # browse missing a live one.
    "a_crash_loses_a_bounce_at_the_limit_then_a_redrive_moves_it": (
        88109162,
        "redrive moved a message that is not dead",
    ),
    "a_crash_loses_a_bounce_at_the_limit_then_a_browse_skips_it": (88113818, "browse missed a live message"),
}


def test_seeds_in_the_default_range_keep_every_invariant():
    totals = run_many(0, SEEDS, STEPS, JOBS)
    examples = [o.report(STEPS) for o in sorted(totals.failed, key=lambda o: o.seed)[:3]]
    assert not totals.failed, "\n\n".join(examples)
    stats = totals.stats
    # The range plays every path the invariants are about.
    assert stats.kills and stats.powers and stats.mid_op, stats.line()
    assert stats.refused and stats.acks and stats.nacks and stats.bounces and stats.touches, stats.line()
    assert stats.late and stats.deadlines and stats.beats_lost and stats.redeliveries, stats.line()
    assert stats.delayed and stats.expiring and stats.dead_letters and stats.redrives, stats.line()
    assert stats.uptos and stats.browses and stats.browsed and stats.unsubscribes, stats.line()
    assert stats.faults and stats.fatal, stats.line()


@pytest.mark.parametrize("seed,kind", REGRESSIONS.values(), ids=REGRESSIONS.keys())
def test_a_seed_that_once_failed_keeps_the_invariant(seed: int, kind: str):
    outcome = run_seed(seed, STEPS, extra=False)
    assert outcome.kind != kind, outcome.report(STEPS)


@pytest.mark.parametrize("seed,kind", REGRESSIONS_WITH_EXTRA_STEPS.values(), ids=REGRESSIONS_WITH_EXTRA_STEPS.keys())
def test_a_seed_found_with_the_extra_steps_keeps_the_invariant(seed: int, kind: str):
    outcome = run_seed(seed, STEPS, slices=False, bounces=False)
    assert outcome.kind is None, outcome.report(STEPS)


@pytest.mark.parametrize("seed,kind", REGRESSIONS_WITH_SLICES.values(), ids=REGRESSIONS_WITH_SLICES.keys())
def test_a_seed_found_with_small_slices_keeps_the_invariant(seed: int, kind: str):
    outcome = run_seed(seed, STEPS, bounces=False)
    assert outcome.kind is None, outcome.report(STEPS)


@pytest.mark.parametrize("seed,kind", REGRESSIONS_WITH_BOUNCES.values(), ids=REGRESSIONS_WITH_BOUNCES.keys())
def test_a_seed_found_with_undelivered_nacks_keeps_the_invariant(seed: int, kind: str):
    outcome = run_seed(seed, STEPS)
    assert outcome.kind is None, outcome.report(STEPS)


def test_a_seed_replays_exactly():
    lines: list[list[str]] = [[], []]
    for run in lines:
        run_seed(1234, STEPS, verbose=True, out=run.append)
    assert lines[0] == lines[1] and len(lines[0]) > STEPS


def caught(kinds: set[str], seeds: int) -> bool:
    """Whether some seed of the first `seeds` fails with one of these kinds."""
    return any(run_seed(seed, STEPS).kind in kinds for seed in range(seeds))


def test_a_disk_that_lies_about_sync_is_caught(monkeypatch):
    monkeypatch.setattr(SimDisk, "sync", lambda self: None)
    assert caught({"receipted SEND lost", "receipted ACK undone"}, 40)


def test_a_queue_that_puts_a_message_back_twice_is_caught(monkeypatch):
    """A message back in the line twice is delivered to two consumers at once."""
    requeue = Queue.requeue

    def twice(self, messages):
        requeue(self, messages)
        requeue(self, messages)

    monkeypatch.setattr(Queue, "requeue", twice)
    assert caught({"held by two consumers"}, 40)


def test_a_broker_that_ignores_touches_is_caught(monkeypatch):
    """A touch that does not move the deadline releases the message too soon: the queue
    holds fewer messages than the checker."""
    monkeypatch.setattr(Broker, "touch", lambda self, session, msg_id, seconds: None)
    assert caught({"wip count"}, 60)


def test_a_deadline_that_never_releases_is_caught(monkeypatch):
    """A queue whose expire returns nothing leaves the broker's timer firing for ever."""
    monkeypatch.setattr(Queue, "expire", lambda self, now: [])
    assert caught({"livelock"}, 20)


def test_a_broker_that_ignores_due_times_is_caught(monkeypatch):
    """A SEND's delay read as none: its message is delivered before it is due."""
    send_times = timing.send_times  # the function curb.send_rule calls by that name
    monkeypatch.setattr(send_rule, "send_times", lambda headers, wall_ms: (0, send_times(headers, wall_ms)[1]))
    assert caught({"delivered before it was due"}, 40)


def test_a_broker_that_ignores_expiry_is_caught(monkeypatch):
    send_times = timing.send_times  # the function curb.send_rule calls by that name
    monkeypatch.setattr(send_rule, "send_times", lambda headers, wall_ms: (send_times(headers, wall_ms)[0], 0))
    assert caught({"delivered after it expired"}, 40)


def test_a_broker_without_a_delivery_limit_is_caught(monkeypatch):
    """A broker that ignores -max-deliveries: a message past the limit is put back in the
    queue, not buried."""
    monkeypatch.setattr(
        driver, "Redelivery", lambda delay, multiplier, max_delay, limit: Redelivery(delay, multiplier, max_delay, 0)
    )
    assert caught(
        {
            "delivered past the delivery limit",
            "dead letter delivered to a queue subscriber",
            "dead letter never delivered",
        },
        40,
    )
