"""The queue state machine's expiry, as tables in memory: an expired message is never
handed out and goes to `expired` for the caller; a queue made untimed (the dead
letters') never looks. (Due times are the log's: tests/test_broker_policy.py.)"""

from __future__ import annotations

from collections import deque

import pytest
from test_queue import FakeMessage, ids, ids_of

from curb.queue import Queue


class TimedSource:
    """Never-delivered messages in FIFO order, each with its own expiry."""

    def __init__(self, *messages: FakeMessage):
        self.pending = deque(messages)

    def next_ready(self) -> FakeMessage | None:
        return self.pending.popleft() if self.pending else None


def timed_queue(*messages: FakeMessage, timed: bool = True) -> Queue[str, FakeMessage]:
    queue: Queue[str, FakeMessage] = Queue(TimedSource(*messages), timed=timed)
    queue.subscribe("c", "s", "client-individual", prefetch=100)
    return queue


# (messages as (id, expires_ms), wall_ms) -> (ids delivered, ids expired)
CASES = {
    "never expires": ([(1, 0), (2, 0)], 1000, ([1, 2], [])),
    "expiry in the future is delivered": ([(1, 1001)], 1000, ([1], [])),
    "expiry now is not delivered": ([(1, 1000), (2, 0)], 1000, ([2], [1])),
    "expiry in the past is not delivered": ([(1, 1), (2, 5), (3, 0)], 1000, ([3], [1, 2])),
    "order is kept around expired ones": ([(1, 0), (2, 1), (3, 0), (4, 1)], 10, ([1, 3], [2, 4])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_expiry_decides_what_is_handed_out(name):
    messages, wall_ms, (delivered, expired) = CASES[name]
    queue = timed_queue(*(FakeMessage(i, expires) for i, expires in messages))
    assert ids(queue.deliver(0.0, wall_ms)) == delivered
    assert ids_of(queue.take_expired()) == expired
    assert queue.take_expired() == []


def test_an_expired_message_that_was_put_back_is_not_redelivered():
    queue = timed_queue(FakeMessage(1, 150), FakeMessage(2))
    assert ids(queue.deliver(0.0, 100)) == [1, 2]
    queue.requeue(queue.nack("c", 1))
    assert queue.deliver(0.0, 150) == []
    assert ids_of(queue.take_expired()) == [1]


def test_an_expired_message_costs_no_credit():
    queue: Queue[str, FakeMessage] = Queue(TimedSource(FakeMessage(1, 5), FakeMessage(2, 5), FakeMessage(3)))
    queue.subscribe("c", "s", "client-individual", prefetch=1)
    assert ids(queue.deliver(0.0, 10)) == [3]
    assert ids_of(queue.take_expired()) == [1, 2]


def test_an_untimed_queue_hands_out_everything():
    queue = timed_queue(FakeMessage(1, 1), FakeMessage(2, 0), timed=False)
    assert ids(queue.deliver(0.0, 1000)) == [1, 2]
    assert queue.take_expired() == []


def test_holds_says_which_messages_are_wip_here_on_a_connection():
    queue = timed_queue(FakeMessage(1), FakeMessage(2))
    queue.deliver(0.0, 0)
    queue.ack("c", 1)
    assert [queue.holds("c", i) for i in (1, 2, 3)] == [False, True, False]
    assert not queue.holds("other", 2)


def test_a_message_delivered_the_limit_times_already_is_spent_not_handed_out():
    source = TimedSource(FakeMessage(1, deliveries=3), FakeMessage(2, deliveries=2), FakeMessage(3, deliveries=9))
    queue: Queue[str, FakeMessage] = Queue(source, max_deliveries=3)
    queue.subscribe("c", "s", "client-individual", prefetch=10)
    assert ids(queue.deliver(0.0, 0)) == [2]
    assert ids_of(queue.take_spent()) == [1, 3] and queue.take_spent() == []


def test_no_limit_or_an_untimed_queue_hands_out_any_count():
    queues: list[Queue[str, FakeMessage]] = [
        Queue(TimedSource(FakeMessage(1, deliveries=50))),
        Queue(TimedSource(FakeMessage(1, deliveries=50)), timed=False, max_deliveries=3),
    ]
    for queue in queues:
        queue.subscribe("c", "s", "client-individual")
        assert ids(queue.deliver(0.0, 0)) == [1] and queue.spent == []
