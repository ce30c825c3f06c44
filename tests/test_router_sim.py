"""The router under the simulator (tests/sim/router_driver.py): one RouterCore in front of
four instances on simulated disks, with link drops, instance and router crashes and a
jumping clock. A few seeds on every run, the seeds that once broke an invariant, kept by
name (those that show a known router bug are expected to fail until it is fixed), and
the simulator's own checks: a seed replays exactly, and a broken router is caught.

CURB_ROUTER_SIM_SEEDS sets how many seeds the range has (default 30); long runs belong to
`bin/crashsim --router --seeds 10000 --jobs 2` (docs/testing.md).
"""

from __future__ import annotations

import os

import pytest
from sim.router_driver import STEPS, Switches, play_seed, run_many

from curb import receipts
from curb.router import core

SEEDS = int(os.environ.get("CURB_ROUTER_SIM_SEEDS", "30"))
# The switches the range plays with: each takes out a feature whose router bug is known
# (below, and docs/testing.md), so that the range can find others.
CLEAR = Switches(ack_timeouts=False, refusals=False, bounce_loops=False)

# Seeds that broke an invariant through a fault of the simulator, fixed there: they must pass.
FIXED = {
    # The drain began while the links of an instance restarted at the end were still in
    # their growing pause (up to 2 s): it got nothing, and promised SENDs looked lost.
    "the_drain_waits_for_every_link": (123, Switches(ack_timeouts=False, bounce_loops=False)),
    # A loop of hand-backs that moves to another link of the destination every few
    # passes was not cut; the check now runs every LOOP_PASSES passes.
    "a_bounce_loop_that_moves_between_links_is_cut": (715, CLEAR),
    "a_bounce_loop_that_moves_between_links_is_cut_2": (740, CLEAR),
}

# Seeds that show a router bug (curb/router/core.py), with the kind of finding: each is
# expected to fail until the bug is fixed (strict: a pass means the mark should go).
ROUTER_BUGS = {
    # The router never learns that an instance's ack deadline passed: the instance takes
    # the message back and delivers it again on the same link connection, under the same
    # ack id LINK.EPOCH.ID. The first holder's later ACK gets a RECEIPT without curb-late
    # (the instance said curb-late:true; the router drops the header), and its ACK, NACK
    # or going away settles the new holder's delivery.
    "an_instance_deadline_acked_late_gets_a_plain_receipt": (
        47,
        Switches(refusals=False, bounce_loops=False),
        "late RECEIPT wrong",
    ),
    "an_instance_deadline_the_old_holder_settles_the_new_delivery": (
        41,
        Switches(refusals=False, bounce_loops=False),
        "wip count",
    ),
    "an_instance_deadline_the_same_ack_id_twice_on_one_client": (
        77,
        Switches(refusals=False, bounce_loops=False),
        "unexpected ERROR",
    ),
    "an_instance_deadline_a_stale_nack_makes_a_hand_back_count": (
        71,
        Switches(refusals=False, bounce_loops=False),
        "delivery count past its bound",
    ),
    "an_instance_deadline_the_same_copy_held_twice": (
        148,
        Switches(refusals=False, bounce_loops=False),
        "held by two consumers",
    ),
    # A client that sent DISCONNECT (or got its ERROR decided) while earlier receipts wait
    # is CLOSING: no MESSAGE is given to it, yet its subscription's credit still counts in
    # the instances' windows. An instance delivers, the router hands it back
    # (curb-undelivered), the instance delivers it again at once: a hot loop until the
    # receipts come.
    "a_closing_client_keeps_its_credit_a_loop_of_hand_backs": (
        4,
        Switches(ack_timeouts=False, refusals=False),
        "livelock",
    ),
    "a_closing_client_keeps_its_credit_a_loop_of_hand_backs_2": (
        5,
        Switches(ack_timeouts=False, refusals=False),
        "livelock",
    ),
    # A MESSAGE of an old upstream subscription (it crossed the router's UNSUBSCRIBE) that
    # finds a client takes credit the new subscription's window counted as free: the
    # instance may send more than the clients can take, and what it sends is handed back
    # and delivered again at once, in a hot loop (window - on_current > free, and nothing
    # rebalances after a hand-back).
    "a_crossing_message_leaves_the_window_too_wide_a_loop_of_hand_backs": (
        1,
        Switches(ack_timeouts=False, refusals=False, mixed=False),
        "livelock",
    ),
    # Two SENDs of a connection refused at one tick for want of an instance (link_wait),
    # out of frame order (parked for two destinations, or one parked again behind a later
    # one after a link loss): the later one's ERROR is placed first, and the earlier
    # one's `_error` returns at once (the connection is erring) without filling its
    # place, which blocks the line: the ERROR never leaves, the connection never closes.
    "two_sends_refused_out_of_order_wedge_the_connection": (
        108,
        Switches(ack_timeouts=False, bounce_loops=False),
        "wedge",
    ),
    "two_sends_refused_out_of_order_wedge_the_connection_2": (
        75,
        Switches(ack_timeouts=False, bounce_loops=False),
        "wedge",
    ),
}


def test_seeds_in_the_default_range_keep_every_invariant():
    totals = run_many(0, SEEDS, CLEAR)
    examples = [o.report(STEPS) for o in sorted(totals.failed, key=lambda o: o.seed)[:3]]
    assert not totals.failed, "\n\n".join(examples)
    stats = totals.stats
    # The range plays every path the invariants are about.
    assert stats.kills and stats.powers and stats.mid_op and stats.router_crashes, stats.line()
    assert stats.promised and stats.deliveries and stats.again and stats.acks and stats.nacks, stats.line()
    assert stats.late and stats.link_drops and stats.lost_clients and stats.count_checks, stats.line()


@pytest.mark.parametrize("seed,switches", FIXED.values(), ids=FIXED.keys())
def test_a_seed_the_simulator_once_failed_keeps_the_invariants(seed: int, switches: Switches):
    outcome = play_seed(seed, switches)
    assert outcome.kind is None, outcome.report(STEPS)


@pytest.mark.parametrize(
    "seed,switches,kind",
    [
        pytest.param(seed, switches, kind, id=name, marks=pytest.mark.xfail(strict=True, reason=f"router bug: {kind}"))
        for name, (seed, switches, kind) in ROUTER_BUGS.items()
    ],
)
def test_a_seed_that_shows_a_router_bug_keeps_the_invariants(seed: int, switches: Switches, kind: str):
    """Fails with its kind while the bug is there; any other outcome (the bug fixed, or
    another finding first) passes, which the strict mark turns red: look again."""
    outcome = play_seed(seed, switches)
    assert outcome.kind != kind, outcome.report(STEPS)


def test_a_seed_replays_exactly():
    lines: list[list[str]] = [[], []]
    for run in lines:
        play_seed(1234, CLEAR, verbose=True, out=run.append)
    assert lines[0] == lines[1] and len(lines[0]) > STEPS


def caught(kinds: set[str], seeds: int) -> bool:
    """Whether some seed of the first `seeds` fails with one of these kinds."""
    return any(play_seed(seed, CLEAR).kind in kinds for seed in range(seeds))


def test_a_router_that_never_says_late_is_caught(monkeypatch):
    """An ACK of a delivery whose link was lost answered with a plain RECEIPT."""
    monkeypatch.setattr(receipts, "late_receipt", receipts.receipt)
    assert caught({"late RECEIPT wrong"}, 20)


def test_a_router_that_keeps_what_a_lost_client_held_is_caught(monkeypatch):
    """A client gone without its held messages NACKed: the instance holds them for ever."""
    monkeypatch.setattr(core.RouterCore, "_write_link", lambda self, link, command, headers: None)
    assert caught({"wip count", "receipted SEND lost", "wedge"}, 20)
