"""A SEND's due and expiry times and a NACK's delay from their headers, as tables."""

from __future__ import annotations

import pytest

from curb.queue_errors import QueueError
from curb.redelivery import MAX_DELAY_MS
from curb.timing import MAX_EPOCH_MS, nack_delay, send_times

NOW = 1_800_000_000_000

# headers -> (due_ms, expires_ms); a delay counts from the clock's next millisecond, NOW + 1
CASES = {
    "none": ({}, (0, 0)),
    "other headers only": ({"priority": "9", "x-delay": "5000"}, (0, 0)),
    "curb-delay": ({"curb-delay": "1500"}, (NOW + 1 + 1500, 0)),
    "curb-delay 0": ({"curb-delay": "0"}, (0, 0)),
    "the longest delay": ({"curb-delay": str(MAX_DELAY_MS)}, (NOW + 1 + MAX_DELAY_MS, 0)),
    "AMQ_SCHEDULED_DELAY": ({"AMQ_SCHEDULED_DELAY": "250"}, (NOW + 1 + 250, 0)),
    "AMQ_SCHEDULED_TIME ahead": ({"AMQ_SCHEDULED_TIME": str(NOW + 9)}, (NOW + 9, 0)),
    "AMQ_SCHEDULED_TIME now": ({"AMQ_SCHEDULED_TIME": str(NOW)}, (0, 0)),
    "AMQ_SCHEDULED_TIME past": ({"AMQ_SCHEDULED_TIME": "5"}, (0, 0)),
    "expires": ({"expires": str(NOW + 60_000)}, (0, NOW + 60_000)),
    "expires 0 is never": ({"expires": "0"}, (0, 0)),
    "expires past": ({"expires": "1"}, (0, 1)),
    "curb-ttl": ({"curb-ttl": "1000"}, (0, NOW + 1000)),
    "curb-ttl 0 is never": ({"curb-ttl": "0"}, (0, 0)),
    "expires sooner than ttl": ({"expires": str(NOW + 10), "curb-ttl": "1000"}, (0, NOW + 10)),
    "ttl sooner than expires": ({"expires": str(NOW + 5000), "curb-ttl": "1000"}, (0, NOW + 1000)),
    "a huge ttl stops at the latest time kept": ({"curb-ttl": str(MAX_EPOCH_MS)}, (0, MAX_EPOCH_MS)),
    "delay and expiry": ({"curb-delay": "10", "curb-ttl": "20"}, (NOW + 1 + 10, NOW + 20)),
    "leading zeros": ({"curb-delay": "007"}, (NOW + 1 + 7, 0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_send_times(name):
    headers, times = CASES[name]
    assert send_times(headers, NOW) == times


REFUSED = {
    "negative delay": ({"curb-delay": "-1"}, "bad curb-delay header"),
    "not a number": ({"AMQ_SCHEDULED_DELAY": "soon"}, "bad AMQ_SCHEDULED_DELAY header"),
    "a delay past 30 days": ({"curb-delay": str(MAX_DELAY_MS + 1)}, "exceeds the limit of 2592000000"),
    "a time past 30 days ahead": (
        {"AMQ_SCHEDULED_TIME": str(NOW + MAX_DELAY_MS + 1)},
        f"is {MAX_DELAY_MS + 1} ms from now, more than",
    ),
    "a time past what the log keeps": ({"expires": str(MAX_EPOCH_MS + 1)}, "bad expires header"),
    "two due times": ({"curb-delay": "1", "AMQ_SCHEDULED_TIME": "1"}, "SEND names two due times"),
    "empty": ({"curb-ttl": ""}, "bad curb-ttl header"),
    "a fraction": ({"curb-ttl": "1.5"}, "bad curb-ttl header"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_bad_times_are_refused_with_what_the_header_takes(name):
    headers, reason = REFUSED[name]
    with pytest.raises(QueueError) as refused:
        send_times(headers, NOW)
    assert reason in str(refused.value)
    assert refused.value.advice.startswith("Give ")


@pytest.mark.parametrize(
    "headers, delay", [({}, None), ({"curb-delay": "0"}, 0), ({"curb-delay": "900"}, 900), ({"id": "3"}, None)]
)
def test_nack_delay(headers, delay):
    assert nack_delay(headers) == delay


def test_a_bad_nack_delay_is_refused():
    with pytest.raises(QueueError, match="bad curb-delay header"):
        nack_delay({"curb-delay": "later"})
