"""The redelivery policy as a table: delivery limit, asked delay, default backoff."""

from __future__ import annotations

import pytest

from curb.redelivery import DEAD, MAX_DELAY_MS, Redelivery

# (policy, deliveries so far, delay the NACK asked for) -> fate
CASES = [
    ("defaults: a second first", Redelivery(), 1, None, 1000),
    ("defaults: doubling", Redelivery(), 4, None, 8000),
    ("defaults: at most a minute", Redelivery(), 7, None, 60_000),
    ("defaults: 19 deliveries is under the limit", Redelivery(), 19, None, 60_000),
    ("at once when asked", Redelivery(delay_ms=0), 19, None, 0),
    ("defaults: the 20th delivery coming back is dead", Redelivery(), 20, None, DEAD),
    ("past the limit is dead too", Redelivery(), 25, None, DEAD),
    ("an asked delay does not escape the limit", Redelivery(), 20, 500, DEAD),
    ("no limit", Redelivery(max_deliveries=0), 10**6, None, 60_000),
    ("limit 1: the first return is dead", Redelivery(max_deliveries=1), 1, None, DEAD),
    ("asked delay wins over the policy", Redelivery(delay_ms=100), 3, 7, 7),
    ("asked delay 0 is at once", Redelivery(delay_ms=100), 3, 0, 0),
    ("backoff: first return", Redelivery(delay_ms=100, multiplier=2), 1, None, 100),
    ("backoff: second return", Redelivery(delay_ms=100, multiplier=2), 2, None, 200),
    ("backoff: fifth return", Redelivery(delay_ms=100, multiplier=3), 5, None, 8100),
    ("backoff: capped", Redelivery(delay_ms=100, multiplier=2, max_delay_ms=1000), 8, None, 1000),
    ("multiplier 1: constant", Redelivery(delay_ms=250, multiplier=1), 9, None, 250),
    ("a huge count stays finite", Redelivery(delay_ms=1, multiplier=100, max_deliveries=0), 10**9, None, 60_000),
    ("never delivered (shutdown) counts as the first", Redelivery(delay_ms=100), 0, None, 100),
]


@pytest.mark.parametrize("name, policy, deliveries, asked, fate", CASES, ids=[c[0] for c in CASES])
def test_fate(name, policy, deliveries, asked, fate):
    assert policy.fate(deliveries, asked) == fate


@pytest.mark.parametrize(
    "options",
    [
        {"delay_ms": -1},
        {"delay_ms": MAX_DELAY_MS + 1},
        {"max_delay_ms": MAX_DELAY_MS + 1},
        {"multiplier": 0.5},
        {"multiplier": 101},
        {"max_deliveries": -1},
    ],
)
def test_impossible_policies_are_refused(options):
    with pytest.raises(ValueError):
        Redelivery(**options)


def test_the_default_policy_does_not_hot_loop_on_a_poison_message():
    """With the defaults a message NACKed at once every time takes minutes to reach the
    delivery limit, not milliseconds; and with no limit one NACKing consumer drives at
    most one redelivery of it a minute, once the backoff has grown."""
    policy = Redelivery()
    waits = [policy.fate(n) for n in range(1, policy.max_deliveries)]
    assert sum(waits) >= 10 * 60 * 1000, "19 returns take at least ten minutes"
    assert policy.fate(policy.max_deliveries) == DEAD
    endless = Redelivery(max_deliveries=0)
    assert min(endless.fate(n) for n in range(7, 10_000)) == 60_000
