"""The router under the simulator (tests/sim/router_driver.py): one RouterCore in front of
four instances on simulated disks, with link drops, instance and router crashes and a
jumping clock. A few seeds on every run, the seeds that once broke an invariant, kept by
name (those that showed a router bug as well, each fixed), and the simulator's own
checks: a seed replays exactly, and a broken router is caught.

CURB_ROUTER_SIM_SEEDS sets how many seeds the range has (default 30); long runs belong to
`bin/crashsim --router --seeds 10000 --jobs 2` (docs/testing.md).
"""

from __future__ import annotations

import os
import re

import pytest
from sim import router_driver
from sim.router_driver import STEPS, Switches, play_seed, run_many

LATE = b"curb-late:true\n"
SEEDS = int(os.environ.get("CURB_ROUTER_SIM_SEEDS", "30"))
# Every feature on: ack deadlines, SENDs refused for want of an instance, hand-back loops
# left to run (no link cut to break one).
ALL = Switches()
# The switches the simulator had to turn off while the router had the bugs below.
SPARING = Switches(ack_timeouts=False, refusals=False, bounce_loops=False)
# Seeds that broke an invariant through a fault of the simulator, fixed there: they must pass.
FIXED = {
    # The drain began while the links of an instance restarted at the end were still in
    # their growing pause (up to 2 s): it got nothing, and promised SENDs looked lost.
    "the_drain_waits_for_every_link": (123, Switches(ack_timeouts=False, bounce_loops=False)),
    # A loop of hand-backs that moves to another link of the destination every few
    # passes was not cut; the check now runs every LOOP_PASSES passes.
    "a_bounce_loop_that_moves_between_links_is_cut": (715, SPARING),
    "a_bounce_loop_that_moves_between_links_is_cut_2": (740, SPARING),
    # With delays, a message came due in a clock jump and went into a link's pipe just as
    # the router dropped that link for silence: a delivery nobody got, which the count's
    # bound now allows as a cut amid a step.
    "a_message_due_in_a_jump_lost_in_a_link_dropped_for_silence": (11487, Switches(delays=True, dead_letters=True)),
    "a_message_due_in_a_jump_lost_in_a_link_dropped_for_silence_2": (
        13946,
        Switches(delays=True, dead_letters=True),
    ),
    # A ./count watcher whose SEND an instance refused: the router had decided to close
    # the connection (its ERROR owed behind earlier receipts) and rightly sent it no more
    # counts, but the check still compared its last ones. A connection the router is
    # ending is no longer compared.
    "a_connection_the_router_is_ending_gets_no_more_counts": (8002394, Switches(delays=True, dead_letters=True)),
}
# Seeds that showed a router bug, each fixed in the router: they must pass, under the
# switches they were found with and with every feature on.
ROUTER_BUGS = {
    # The router never learned that an instance's ack deadline passed: the instance took
    # the message back and delivered it again, and the first holder's late ACK got a
    # plain RECEIPT and settled the new holder's delivery. Fixed: the router keeps its
    # clients' deadlines and asks the instances for none (curb-ack-timeout:0).
    "an_instance_deadline_acked_late_gets_a_plain_receipt": (47, Switches(refusals=False, bounce_loops=False)),
    "an_instance_deadline_the_old_holder_settles_the_new_delivery": (
        41,
        Switches(refusals=False, bounce_loops=False),
    ),
    "an_instance_deadline_the_same_ack_id_twice_on_one_client": (77, Switches(refusals=False, bounce_loops=False)),
    "an_instance_deadline_a_stale_nack_makes_a_hand_back_count": (71, Switches(refusals=False, bounce_loops=False)),
    "an_instance_deadline_the_same_copy_held_twice": (148, Switches(refusals=False, bounce_loops=False)),
    # A closing client's credit still counted in the instances' windows: a hot loop of
    # hand-backs. Fixed: a closing session cannot take output, so it has no share.
    "a_closing_client_keeps_its_credit_a_loop_of_hand_backs": (4, Switches(ack_timeouts=False, refusals=False)),
    "a_closing_client_keeps_its_credit_a_loop_of_hand_backs_2": (5, Switches(ack_timeouts=False, refusals=False)),
    # A MESSAGE that crossed the router's UNSUBSCRIBE took credit the new window counted
    # as free: a hot loop of hand-backs. Fixed: the window is checked again after it.
    "a_crossing_message_leaves_the_window_too_wide_a_loop_of_hand_backs": (
        1,
        Switches(ack_timeouts=False, refusals=False, mixed=False),
    ),
    # Two SENDs refused out of frame order wedged the connection. Fixed: the session's
    # receipt line puts each ERROR in its frame's place.
    "two_sends_refused_out_of_order_wedge_the_connection": (108, Switches(ack_timeouts=False, bounce_loops=False)),
    "two_sends_refused_out_of_order_wedge_the_connection_2": (75, Switches(ack_timeouts=False, bounce_loops=False)),
    # A SEND's RECEIPT left before an earlier SEND of its connection, parked for another
    # destination, was refused: a RECEIPT promised a SEND that was never stored. Fixed: a
    # SEND's RECEIPT waits for every earlier frame of its session, and one that failed
    # fails it.
    "a_receipt_after_a_send_refused_for_want_of_an_instance": (9, ALL),
    "a_receipt_after_a_send_that_failed_first": (123, ALL),
    # MESSAGEs read from a link but not yet handed on (curb.router.links hands on 32 a
    # pass) were handed to clients when the link was lost, after the instance had taken
    # them back: clients held copies the instance no longer counted. Fixed: of what a lost
    # connection read, only RECEIPTs are handled.
    "messages_read_before_a_link_was_lost_reach_clients_after_it": (2005008, ALL),
    # A client that held its whole prefetch from two instances had its shares moved by
    # their counts: the instance with the larger share was offered credit the client did
    # not have, handed the MESSAGEs back, its count rose and the shares moved again, a
    # livelock. Fixed: a client's credit for an instance is at most its prefetch less what
    # it holds from all of them (curb.router.credit).
    "a_full_clients_credit_moves_between_instances_a_loop_of_hand_backs": (9302341, ALL),
}


def test_seeds_in_the_default_range_keep_every_invariant():
    totals = run_many(0, SEEDS, ALL)
    examples = [o.report(STEPS) for o in sorted(totals.failed, key=lambda o: o.seed)[:3]]
    assert not totals.failed, "\n\n".join(examples)
    stats = totals.stats
    # The range plays every path the invariants are about.
    assert stats.kills and stats.powers and stats.mid_op and stats.router_crashes, stats.line()
    assert stats.promised and stats.deliveries and stats.again and stats.acks and stats.nacks, stats.line()
    assert stats.late and stats.unconfirmed and stats.link_drops and stats.lost_clients and stats.count_checks, (
        stats.line()
    )


@pytest.mark.parametrize("seed,switches", FIXED.values(), ids=FIXED.keys())
def test_a_seed_the_simulator_once_failed_keeps_the_invariants(seed: int, switches: Switches):
    outcome = play_seed(seed, switches)
    assert outcome.kind is None, outcome.report(STEPS)


@pytest.mark.parametrize("seed,switches", ROUTER_BUGS.values(), ids=ROUTER_BUGS.keys())
def test_a_seed_that_showed_a_router_bug_keeps_the_invariants(seed: int, switches: Switches):
    for each in (switches, ALL):
        outcome = play_seed(seed, each)
        assert outcome.kind is None, outcome.report(STEPS)


def test_seeds_with_delays_and_dead_letters_keep_every_invariant():
    """SENDs and NACKs with curb-delay, and instances with a delivery limit (their dead
    letters drained through ./NAME/dead at the end): a few seeds on every run."""
    totals = run_many(5000, max(1, SEEDS // 3), Switches(delays=True, dead_letters=True))
    examples = [o.report(STEPS) for o in sorted(totals.failed, key=lambda o: o.seed)[:3]]
    assert not totals.failed, "\n\n".join(examples)


def test_a_seed_replays_exactly():
    lines: list[list[str]] = [[], []]
    for run in lines:
        play_seed(1234, ALL, verbose=True, out=run.append)
    assert lines[0] == lines[1] and len(lines[0]) > STEPS


def caught(kinds: set[str], seeds: int) -> bool:
    """Whether some seed of the first `seeds` fails with one of these kinds."""
    return any(play_seed(seed, ALL).kind in kinds for seed in range(seeds))


def test_a_router_that_never_says_late_is_caught(monkeypatch):
    """An ACK of a delivery whose link was lost answered with a plain RECEIPT: the
    router's output to its clients loses its curb-late headers (the receipt line is
    compiled, so the fault goes in one layer out)."""
    take = router_driver.ClientSide.take
    monkeypatch.setattr(router_driver.ClientSide, "take", lambda side, conn: take(side, conn).replace(LATE, b""))
    assert caught({"late RECEIPT wrong"}, 20)


def test_a_router_that_keeps_what_a_lost_client_held_is_caught(monkeypatch):
    """Plain ACKs and NACKs never reach the instances (a client gone among them): the
    instances hold those messages for ever."""
    plain = re.compile(rb"(?:ACK|NACK)\nid:\d+\n\n\x00")  # curb.router.links.Links.answer's frames
    monkeypatch.setattr(router_driver, "carried", lambda data: plain.sub(b"", data))
    assert caught({"wip count", "receipted SEND lost", "wedge"}, 20)
