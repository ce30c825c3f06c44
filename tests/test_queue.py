"""The queue state machine: who gets which message, credit, redelivery order, and errors."""

import random
from collections import deque
from dataclasses import dataclass

import pytest

from curb.queue import DEADLINE_SLACK, LATE_KEPT, MAX_PREFETCH, Queue, Subscription
from curb.queue_errors import Late, QueueError


@dataclass(eq=False, frozen=True)
class FakeMessage:
    id: int
    expires_ms: int = 0
    deliveries: int = 0


class FakeSource:
    """Never-delivered messages in FIFO order; counts how often the queue asked for one."""

    def __init__(self, count: int = 0):
        self.pending: deque[FakeMessage] = deque()
        self.next_id = 1
        self.calls = 0
        self.add(count)

    def add(self, count: int) -> None:
        for _ in range(count):
            self.pending.append(FakeMessage(self.next_id))
            self.next_id += 1

    def next_ready(self) -> FakeMessage | None:
        self.calls += 1
        return self.pending.popleft() if self.pending else None


# Connections are plain strings here: the queue only uses them as keys.
StrQueue = Queue[str, FakeMessage]
StrSubscription = Subscription[str, FakeMessage]


def make_queue(count: int = 0, **options) -> tuple[StrQueue, FakeSource]:
    source = FakeSource(count)
    return Queue(source, **options), source


def ids(pairs) -> list[int]:
    return [message.id for _, message in pairs]


def ids_of(messages) -> list[int]:
    return [message.id for message in messages]


def routes(pairs) -> list[tuple[str, int]]:
    return [(sub.id, message.id) for sub, message in pairs]


# --- subscribe / unsubscribe ---------------------------------------------------------


@pytest.mark.parametrize(
    "requested, expected",
    [(None, 7), (1, 1), (50, 50), (99, 99), (100, None), (10**9, None)],
)
def test_prefetch_defaults_and_is_honoured_or_refused_never_cut(requested, expected):
    queue, _ = make_queue(default_prefetch=7, max_prefetch=99)
    if expected is None:
        with pytest.raises(QueueError, match="from 1 to 99"):
            queue.subscribe("c", "0", "client-individual", requested)
        assert queue.subscription_count == 0
    else:
        assert queue.subscribe("c", "0", "client-individual", requested).prefetch == expected


def test_the_largest_prefetch_a_subscribe_may_ask_for_is_honoured():
    queue, _ = make_queue(MAX_PREFETCH)
    sub = queue.subscribe("c", "0", "client-individual", MAX_PREFETCH)
    assert sub.prefetch == MAX_PREFETCH == 1_000_000
    assert len(queue.deliver(0.0)) == MAX_PREFETCH


@pytest.mark.parametrize("default_prefetch, max_prefetch", [(0, 10), (-1, 10), (11, 10)])
def test_queue_rejects_an_impossible_prefetch_configuration(default_prefetch, max_prefetch):
    with pytest.raises(ValueError, match="prefetch"):
        Queue(FakeSource(), default_prefetch, max_prefetch)


@pytest.mark.parametrize(
    "ack_mode, prefetch, reason",
    [
        ("bogus", None, "ack mode"),
        ("", None, "ack mode"),
        ("Client", None, "ack mode"),
        ("client", 0, "prefetch"),
        ("auto", -3, "prefetch"),
    ],
)
def test_subscribe_rejects_bad_arguments(ack_mode, prefetch, reason):
    queue, _ = make_queue()
    with pytest.raises(QueueError, match=reason):
        queue.subscribe("c", "0", ack_mode, prefetch)
    assert queue.subscription_count == 0


@pytest.mark.parametrize("second_id", ["0", "1"])
def test_second_subscribe_on_a_connection_is_an_error(second_id):
    queue, _ = make_queue()
    queue.subscribe("c", "0")
    with pytest.raises(QueueError, match="already"):
        queue.subscribe("c", second_id)
    assert queue.subscription_count == 1


def test_subscribe_returns_the_subscription_with_its_settings():
    queue, _ = make_queue()
    sub = queue.subscribe("conn", "s1", "client", 5)
    assert isinstance(sub, Subscription)
    assert (sub.conn, sub.id, sub.ack_mode, sub.prefetch) == ("conn", "s1", "client", 5)
    assert queue.subscription_count == 1


def test_subscribing_again_after_unsubscribe_is_allowed():
    queue, _ = make_queue()
    queue.subscribe("c", "0")
    queue.unsubscribe("c", "0")
    queue.subscribe("c", "0")
    assert queue.subscription_count == 1


@pytest.mark.parametrize(
    "setup, conn, sub_id",
    [
        ([], "c", "0"),  # never subscribed
        ([("c", "0")], "c", "1"),  # wrong id
        ([("c", "0")], "other", "0"),  # someone else's subscription
    ],
)
def test_unsubscribe_without_that_active_subscription_is_an_error(setup, conn, sub_id):
    queue, _ = make_queue()
    for owner, existing in setup:
        queue.subscribe(owner, existing)
    with pytest.raises(QueueError, match=repr(sub_id)):
        queue.unsubscribe(conn, sub_id)
    assert queue.subscription_count == len(setup)


def test_unsubscribe_twice_is_an_error():
    queue, _ = make_queue()
    queue.subscribe("c", "0")
    queue.unsubscribe("c", "0")
    with pytest.raises(QueueError):
        queue.unsubscribe("c", "0")


# --- delivery --------------------------------------------------------------------------


def test_nothing_is_taken_from_the_source_without_a_subscription():
    queue, source = make_queue(3)
    assert queue.deliver(0.0) == []
    assert source.calls == 0
    queue.subscribe("c", "0", "client-individual")
    assert ids(queue.deliver(0.0)) == [1, 2, 3]


def test_nothing_is_taken_from_the_source_without_credit():
    queue, source = make_queue(3)
    queue.subscribe("c", "0", "client-individual", prefetch=1)
    assert ids(queue.deliver(0.0)) == [1]
    calls = source.calls
    assert queue.deliver(0.0) == []
    assert source.calls == calls
    assert len(source.pending) == 2


def test_delivery_is_fifo():
    queue, source = make_queue(4)
    sub = queue.subscribe("c", "0", "client-individual")
    pairs = queue.deliver(0.0)
    assert routes(pairs) == [("0", 1), ("0", 2), ("0", 3), ("0", 4)]
    assert all(s is sub for s, _ in pairs)
    assert queue.wip_count == 4
    source.add(1)
    assert ids(queue.deliver(0.0)) == [5]


def test_empty_queue_delivers_nothing():
    queue, _ = make_queue()
    queue.subscribe("c", "0")
    assert queue.deliver(0.0) == []
    assert queue.wip_count == 0


# --- ack / nack ----------------------------------------------------------------------


def test_client_individual_ack_finishes_only_that_message():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    assert [m.id for m in queue.ack("c", 2)] == [2]
    assert queue.wip_count == 2
    with pytest.raises(QueueError):
        queue.ack("c", 2)
    assert [m.id for m in queue.ack("c", 1)] == [1]
    assert [m.id for m in queue.ack("c", 3)] == [3]
    assert queue.wip_count == 0


def test_client_ack_is_cumulative():
    queue, _ = make_queue(4)
    queue.subscribe("c", "0", "client")
    queue.deliver(0.0)
    assert [m.id for m in queue.ack("c", 3)] == [1, 2, 3]
    assert queue.wip_count == 1
    for gone in (1, 2, 3):
        with pytest.raises(QueueError):
            queue.ack("c", gone)
    assert [m.id for m in queue.ack("c", 4)] == [4]


def test_client_ack_follows_delivery_order_not_id_order():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client", prefetch=3)
    queue.deliver(0.0)
    queue.requeue(nacked := queue.nack("c", 1))
    assert ids_of(nacked) == [1]
    assert ids(queue.deliver(0.0)) == [1]  # now delivered after 2 and 3
    assert [m.id for m in queue.ack("c", 3)] == [2, 3]
    assert queue.wip_count == 1
    assert [m.id for m in queue.ack("c", 1)] == [1]


def test_client_ack_is_cumulative_per_subscription_only():
    queue, _ = make_queue(4)
    queue.subscribe("c", "a", "client", prefetch=2)
    queue.deliver(0.0)  # 1, 2 to a
    queue.unsubscribe("c", "a")
    queue.subscribe("c", "b", "client", prefetch=2)
    queue.deliver(0.0)  # 3, 4 to b
    assert [m.id for m in queue.ack("c", 4)] == [3, 4]
    assert queue.wip_count == 2


def test_client_nack_is_cumulative():
    queue, _ = make_queue(4)
    queue.subscribe("c", "0", "client")
    queue.deliver(0.0)
    assert [m.id for m in queue.nack("c", 2)] == [1, 2]
    assert queue.redeliver_count == 0, "the caller places NACKed messages"
    assert queue.wip_count == 2


def test_client_individual_nack_returns_only_that_message():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    queue.requeue(nacked := queue.nack("c", 2))
    assert ids_of(nacked) == [2]
    assert queue.redeliver_count == 1
    assert queue.wip_count == 2


@pytest.mark.parametrize("operation", ["ack", "nack"])
@pytest.mark.parametrize(
    "conn, message_id",
    [
        ("c", 99),  # never existed
        ("c", 4),  # still rdy, never delivered
        ("c", 1),  # already acked
        ("c", 2),  # wip on another connection
        ("other", 3),  # wip on c, asked by another connection
    ],
)
def test_ack_or_nack_of_a_message_not_wip_on_the_connection_is_an_error(operation, conn, message_id):
    queue, _ = make_queue(4)
    queue.subscribe("c", "0", "client-individual", prefetch=1)
    queue.subscribe("other", "0", "client-individual", prefetch=1)
    assert routes(queue.deliver(0.0)) == [("0", 1), ("0", 2)]
    queue.ack("c", 1)
    assert ids(queue.deliver(0.0)) == [3]
    with pytest.raises(QueueError, match=str(message_id)):
        getattr(queue, operation)(conn, message_id)
    assert (queue.wip_count, queue.redeliver_count) == (2, 0)


def test_errors_leave_the_state_unchanged():
    queue, _ = make_queue(2)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    with pytest.raises(QueueError):
        queue.ack("c", 7)
    with pytest.raises(QueueError):
        queue.nack("d", 1)
    assert (queue.wip_count, queue.redeliver_count) == (2, 0)
    assert [m.id for m in queue.ack("c", 1)] == [1]


# --- redelivery ----------------------------------------------------------------------


def test_nacked_messages_come_back_first_oldest_first():
    queue, source = make_queue(5)
    queue.subscribe("c", "0", "client-individual", prefetch=5)
    queue.deliver(0.0)
    queue.requeue(queue.nack("c", 4))
    queue.requeue(queue.nack("c", 2))
    source.add(2)  # 6, 7 never delivered
    queue.ack("c", 1)
    queue.ack("c", 3)
    queue.ack("c", 5)
    pairs = queue.deliver(0.0)
    assert ids(pairs) == [2, 4, 6, 7]
    assert queue.redeliver_count == 0


def test_close_puts_wip_back_ahead_of_never_delivered_messages():
    queue, _ = make_queue(6)
    queue.subscribe("gone", "0", "client-individual", prefetch=3)
    assert ids(queue.deliver(0.0)) == [1, 2, 3]
    queue.ack("gone", 2)
    queue.requeue(returned := queue.close("gone"))
    assert sorted(ids_of(returned)) == [1, 3]
    assert (queue.wip_count, queue.redeliver_count, queue.subscription_count) == (0, 2, 0)
    queue.subscribe("next", "0", "client-individual")
    pairs = queue.deliver(0.0)
    assert ids(pairs) == [1, 3, 4, 5, 6]


def test_close_of_an_unknown_connection_returns_nothing():
    queue, _ = make_queue(1)
    assert queue.close("never") == []


def test_close_forgets_the_connection():
    queue, _ = make_queue(2)
    queue.set_writable("c", False)
    queue.subscribe("c", "0", "client-individual")
    queue.close("c")
    queue.subscribe("c", "0", "client-individual")  # a reused key starts afresh, writable
    assert ids(queue.deliver(0.0)) == [1, 2]


# --- prefetch credit -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ack_mode, acked, freed",
    [
        ("client-individual", 3, 1),  # one message, one credit
        ("client", 3, 3),  # cumulative: three messages, three credits
        ("client", 1, 1),
    ],
)
def test_ack_frees_credit(ack_mode, acked, freed):
    queue, _ = make_queue(10)
    queue.subscribe("c", "0", ack_mode, prefetch=3)
    assert ids(queue.deliver(0.0)) == [1, 2, 3]
    assert queue.deliver(0.0) == []
    assert not queue.has_credit()
    queue.ack("c", acked)
    assert queue.has_credit()
    assert ids(queue.deliver(0.0)) == list(range(4, 4 + freed))
    assert not queue.has_credit()


def test_nack_frees_credit_and_the_message_returns_to_the_same_consumer():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "client-individual", prefetch=2)
    queue.deliver(0.0)
    queue.requeue(queue.nack("c", 1))
    assert ids(queue.deliver(0.0)) == [1]
    assert queue.wip_count == 2


def test_has_credit_reflects_the_eligible_subscriptions():
    queue, _ = make_queue()
    assert not queue.has_credit()
    queue.subscribe("c", "0", "client-individual", prefetch=1)
    assert queue.has_credit()
    queue.unsubscribe("c", "0")
    assert not queue.has_credit()


# --- competing consumers -------------------------------------------------------------


def test_competing_consumers_take_turns_one_message_at_a_time():
    queue, _ = make_queue(7)
    for name in "abc":
        queue.subscribe(name, name, "client-individual")
    assert routes(queue.deliver(0.0)) == [
        ("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5), ("c", 6), ("a", 7),
    ]  # fmt: skip


def test_turns_continue_across_calls():
    queue, source = make_queue()
    for name in "ab":
        queue.subscribe(name, name, "client-individual")
    received = []
    for _ in range(4):
        source.add(1)
        received += routes(queue.deliver(0.0))
    assert received == [("a", 1), ("b", 2), ("a", 3), ("b", 4)]


def test_consumer_out_of_credit_is_skipped():
    queue, _ = make_queue(5)
    queue.subscribe("a", "a", "client-individual", prefetch=1)
    queue.subscribe("b", "b", "client-individual", prefetch=3)
    assert routes(queue.deliver(0.0)) == [("a", 1), ("b", 2), ("b", 3), ("b", 4)]
    queue.ack("a", 1)
    assert routes(queue.deliver(0.0)) == [("a", 5)]


def test_each_message_goes_to_exactly_one_consumer():
    queue, _ = make_queue(30)
    for name in "abc":
        queue.subscribe(name, name, "client-individual", prefetch=4)
    delivered = ids(queue.deliver(0.0))
    assert sorted(delivered) == list(range(1, 13))
    for name in "abc":
        queue.requeue(queue.close(name))
    queue.subscribe("d", "d", "client-individual", prefetch=100)
    assert ids(queue.deliver(0.0)) == list(range(1, 31))


# --- writability ---------------------------------------------------------------------


def test_unwritable_connection_gets_nothing_until_writable_again():
    queue, source = make_queue(4)
    queue.subscribe("a", "a", "client-individual")
    queue.subscribe("b", "b", "client-individual")
    queue.set_writable("a", False)
    assert routes(queue.deliver(0.0)) == [("b", 1), ("b", 2), ("b", 3), ("b", 4)]
    queue.set_writable("b", False)
    source.add(1)
    assert queue.deliver(0.0) == []
    assert not queue.has_credit()
    assert source.calls == 5
    queue.set_writable("a", True)
    assert routes(queue.deliver(0.0)) == [("a", 5)]


def test_writability_set_before_subscribing_applies():
    queue, _ = make_queue(1)
    queue.set_writable("c", False)
    queue.subscribe("c", "0")
    assert queue.deliver(0.0) == []
    queue.set_writable("c", True)
    assert ids(queue.deliver(0.0)) == [1]


def test_writable_again_does_not_exceed_prefetch():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "client-individual", prefetch=2)
    queue.deliver(0.0)
    queue.set_writable("c", False)
    queue.set_writable("c", True)
    assert queue.deliver(0.0) == []
    assert not queue.has_credit()


# --- auto mode -----------------------------------------------------------------------


def test_auto_messages_are_wip_until_the_caller_acks_their_hand_off():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "auto")
    pairs = queue.deliver(0.0)
    assert ids(pairs) == [1, 2, 3]
    assert queue.wip_count == 3
    assert ids_of(queue.ack("c", 1)) == [1], "auto ACKs one message, not cumulatively"
    assert ids_of(queue.ack("c", 2)) == [2]
    assert ids_of(queue.close("c")) == [3], "a message never handed off is rdy again"


def test_auto_holds_at_most_prefetch_messages():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "auto", prefetch=2)
    assert ids(queue.deliver(0.0)) == [1, 2]
    assert not queue.has_credit()
    assert queue.deliver(0.0) == []
    queue.ack("c", 1)
    queue.ack("c", 2)
    assert ids(queue.deliver(0.0)) == [3, 4]


def test_auto_consumer_shares_with_a_client_consumer():
    queue, _ = make_queue(6)
    queue.subscribe("a", "a", "auto", prefetch=10)
    queue.subscribe("b", "b", "client-individual", prefetch=1)
    assert routes(queue.deliver(0.0)) == [("a", 1), ("b", 2), ("a", 3), ("a", 4), ("a", 5), ("a", 6)]


# --- unsubscribe (pause) -------------------------------------------------------------


def test_unsubscribe_pauses_delivery_but_wip_can_still_be_acked_and_nacked():
    queue, source = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    queue.unsubscribe("c", "0")
    source.add(1)
    assert queue.deliver(0.0) == []
    assert queue.wip_count == 3
    assert [m.id for m in queue.ack("c", 1)] == [1]
    queue.requeue(queue.nack("c", 2))
    assert (queue.wip_count, queue.redeliver_count) == (1, 1)


def test_paused_wip_stays_after_resubscribing_and_close_returns_all_of_it():
    queue, _ = make_queue(4)
    queue.subscribe("c", "old", "client", prefetch=2)
    queue.deliver(0.0)  # 1, 2
    queue.unsubscribe("c", "old")
    queue.subscribe("c", "new", "client-individual", prefetch=1)
    assert routes(queue.deliver(0.0)) == [("new", 3)]
    queue.ack("c", 2)  # cumulative on the paused subscription: 1 and 2
    queue.subscribe("d", "0", "client-individual", prefetch=1)
    queue.deliver(0.0)  # 4 to d
    queue.unsubscribe("c", "new")
    assert [m.id for m in queue.close("c")] == [3]
    assert queue.wip_count == 1


def test_acking_paused_wip_does_not_restart_delivery():
    queue, source = make_queue(1)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    queue.unsubscribe("c", "0")
    queue.ack("c", 1)
    source.add(1)
    assert queue.deliver(0.0) == []
    assert source.calls == 2


# --- ack deadlines -------------------------------------------------------------------


@pytest.mark.parametrize(
    "queue_default, asked, ack_mode, expected",
    [
        (0.0, None, "client-individual", 0),  # deadlines off
        (30.0, None, "client-individual", 30000),  # the queue's default
        (30.0, 2.5, "client", 2500),  # the subscription's own
        (30.0, 0.0, "client-individual", 0),  # a subscription may turn them off
        (30.0, 2.5, "auto", 0),  # auto messages are done once handed over: no deadline
    ],
)
def test_a_subscription_takes_its_own_ack_timeout_or_the_queues(queue_default, asked, ack_mode, expected):
    queue, _ = make_queue(ack_timeout=queue_default)
    assert queue.subscribe("c", "0", ack_mode, None, asked).ack_timeout_ms == expected


def test_a_negative_ack_timeout_is_refused():
    queue, _ = make_queue()
    with pytest.raises(QueueError, match="ack timeout"):
        queue.subscribe("c", "0", "client", None, -1.0)
    with pytest.raises(ValueError, match="ack_timeout"):
        Queue(FakeSource(), ack_timeout=-1.0)


@pytest.mark.parametrize(
    "delivered_at, timeout, now, expired",
    [
        (0.0, 10.0, 9.999, False),
        (0.0, 10.0, 10.0, True),  # due at the deadline itself
        (5.0, 10.0, 14.0, False),  # the deadline runs from the delivery
        (5.0, 10.0, 15.5, True),
        (0.0, 0.0, 1e9, False),  # no deadline
    ],
)
def test_a_delivery_expires_at_its_deadline(delivered_at, timeout, now, expired):
    queue, _ = make_queue(1)
    queue.subscribe("c", "0", "client-individual", None, timeout)
    queue.deliver(delivered_at)
    assert queue.next_deadline() == (delivered_at + timeout if timeout else None)
    assert ids(queue.expire(now)) == ([1] if expired else [])
    assert queue.wip_count == (0 if expired else 1)


def test_expiry_takes_only_the_due_message_and_frees_its_credit():
    queue, source = make_queue(2)
    queue.subscribe("c", "0", "client-individual", prefetch=2, ack_timeout=10.0)
    queue.deliver(0.0)  # 1 and 2, due at 10
    queue.touch("c", 2, 50.0)
    assert not queue.has_credit()
    [(sub, message)] = queue.expire(10.0)
    assert (sub.conn, message.id) == ("c", 1)
    assert queue.wip_count == 1 and queue.redeliver_count == 0, "the caller places an expired message"
    assert queue.has_credit()
    source.add(1)
    assert ids(queue.deliver(10.0)) == [3]
    assert ids_of(queue.ack("c", 2)) == [2], "the connection's other message is still its to ACK"


def test_an_expired_message_requeued_goes_to_the_front_like_a_nack():
    queue, source = make_queue(1)
    queue.subscribe("hung", "0", "client-individual", prefetch=1, ack_timeout=1.0)
    queue.deliver(0.0)
    queue.subscribe("worker", "0", "client-individual", prefetch=5, ack_timeout=1.0)
    source.add(2)  # 2 and 3, never delivered
    assert routes(queue.deliver(0.5)) == [("0", 2), ("0", 3)]
    queue.requeue([m for _, m in queue.expire(1.0)])
    queue.ack("worker", 2)
    # the worker is first in line (the hung consumer's credit came back after it)
    assert [(sub.conn, m.id) for sub, m in queue.deliver(1.0)] == [("worker", 1)]


def test_client_mode_expiry_takes_one_message_and_a_later_cumulative_ack_skips_it():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client", prefetch=3, ack_timeout=10.0)
    queue.deliver(0.0)
    queue.touch("c", 1, 20.0)
    queue.touch("c", 3, 20.0)
    assert ids(queue.expire(10.0)) == [2]
    assert ids_of(queue.ack("c", 3)) == [1, 3]


@pytest.mark.parametrize(
    "touches, now, expired",
    [
        ([(4.0, 25.0)], 10.0, False),  # extended past the original deadline
        ([(4.0, 25.0)], 25.0, True),  # ... until the new one
        ([(4.0, 6.0)], 6.0, True),  # shortened
        ([(4.0, 25.0), (5.0, 7.0)], 8.0, True),  # the last touch counts
        ([(4.0, 7.0), (5.0, 25.0)], 8.0, False),
    ],
)
def test_touch_moves_one_deliverys_deadline(touches, now, expired):
    queue, _ = make_queue(1)
    queue.subscribe("c", "0", "client-individual", None, 10.0)
    queue.deliver(0.0)
    for _, deadline in touches:
        queue.touch("c", 1, deadline)
    assert queue.next_deadline() == touches[-1][1]
    assert ids(queue.expire(now)) == ([1] if expired else [])


def test_touch_gives_a_deadline_to_a_subscription_without_one():
    queue, _ = make_queue(1)
    queue.subscribe("c", "0", "client-individual", None, 0.0)
    queue.deliver(0.0)
    queue.touch("c", 1, 3.0)
    assert ids(queue.expire(3.0)) == [1]


def held(count: int, conn: str = "c") -> StrQueue:
    """A queue whose `count` messages were delivered to `conn` at 0, due back at 1."""
    queue, _ = make_queue(count)
    queue.subscribe(conn, "0", "client-individual", None, 1.0)
    queue.deliver(0.0)
    return queue


def expired_from(conn: str) -> StrQueue:
    """A queue whose one message was delivered to `conn` at 0 and passed its 1 s deadline
    at 1 (rdy again, at the front)."""
    queue = held(1, conn)
    queue.requeue([m for _, m in queue.expire(1.0)])
    return queue


def assert_unknown(queue: StrQueue, conn: str, message_id: int) -> None:
    """An ACK gets the error of an id not wip on the connection, not Late."""
    with pytest.raises(QueueError) as unknown:
        queue.ack(conn, message_id)
    assert not isinstance(unknown.value, Late)


@pytest.mark.parametrize("operation", ["ack", "nack", "touch"])
def test_a_late_ack_nack_or_touch_is_late_and_leaves_the_new_holder_alone(operation):
    queue, _ = make_queue(1)
    queue.subscribe("old", "0", "client-individual", 1, 1.0)
    queue.deliver(0.0)
    queue.subscribe("new", "0", "client-individual", 1, 1.0)
    queue.requeue([m for _, m in queue.expire(1.0)])
    assert [(sub.conn, m.id) for sub, m in queue.deliver(1.0)] == [("new", 1)]
    args = ("old", 1, 9.0) if operation == "touch" else ("old", 1)
    with pytest.raises(Late, match="message 1 passed its ack deadline"):
        getattr(queue, operation)(*args)
    assert (queue.wip_count, queue.redeliver_count, queue.next_deadline()) == (1, 0, 2.0)
    assert ids_of(queue.ack("new", 1)) == [1]
    with pytest.raises(Late):
        queue.ack("old", 1)  # still late, and not the error of an unknown id
    assert_unknown(queue, "new", 1)  # acked by its holder: unknown to it


def test_a_late_ack_is_only_late_on_the_connection_that_held_the_message():
    assert_unknown(expired_from("old"), "bystander", 1)


def test_a_message_expired_and_redelivered_to_the_same_connection_is_its_to_ack():
    queue = expired_from("c")
    assert ids(queue.deliver(1.0)) == [1]
    assert ids_of(queue.ack("c", 1)) == [1], "the id names no delivery: the current one is acked"


@pytest.mark.parametrize("prefetch, kept", [(1, LATE_KEPT), (LATE_KEPT + 500, LATE_KEPT + 500)])
def test_late_acks_are_recognised_for_the_last_late_kept_or_prefetch_expiries(prefetch, kept):
    total = kept + 10
    queue, _ = make_queue(total, max_prefetch=LATE_KEPT + 500)
    queue.subscribe("c", "0", "client-individual", prefetch, 1.0)
    for step in range(total // prefetch + 1):  # deliver, expire, requeue nothing (done elsewhere)
        queue.deliver(float(step))
        queue.expire(float(step + 1))
    with pytest.raises(Late):
        queue.ack("c", total)
    with pytest.raises(Late):
        queue.ack("c", total - kept + 1)
    assert_unknown(queue, "c", total - kept)  # forgotten


def test_close_forgets_deadlines_and_late_ids():
    queue = held(2)
    queue.touch("c", 2, 5.0)
    queue.expire(1.0)
    assert ids_of(queue.close("c")) == [2]
    assert queue.next_deadline() is None and queue.expire(100.0) == []
    assert_unknown(queue, "c", 1)


def test_ack_upto_forgets_the_deadlines_of_what_it_finishes():
    queue = held(3)
    queue.touch("c", 3, 9.0)
    queue.ack_upto(2)
    assert queue.next_deadline() == 9.0
    assert ids(queue.expire(5.0)) == []


def test_settling_makes_the_next_deadline_the_earliest_still_held():
    queue, source = make_queue(1)
    queue.subscribe("c", "0", "client-individual", prefetch=5, ack_timeout=10.0)
    queue.deliver(0.0)
    source.add(1)
    queue.deliver(3.0)
    assert queue.next_deadline() == 10.0
    queue.ack("c", 1)
    assert queue.next_deadline() == 13.0
    queue.requeue(queue.nack("c", 2))
    assert queue.next_deadline() is None


def test_soonest_is_the_soonest_deadline_set_since_next_deadline_was_asked():
    """What a caller keeping one timer compares with it, at no cost per settled message."""
    queue, source = make_queue(2)
    queue.subscribe("c", "0", "client-individual", None, 10.0)

    def soonest() -> float | None:
        return queue.soonest

    assert soonest() is None
    queue.deliver(0.0)
    assert soonest() == 10.0
    queue.ack("c", 1)
    assert soonest() == 10.0, "settling does not move it"
    queue.touch("c", 2, 4.0)
    assert soonest() == 4.0
    queue.touch("c", 2, 30.0)
    assert (soonest(), queue.next_deadline(), soonest()) == (4.0, 30.0, None)
    source.add(1)
    queue.deliver(5.0)
    assert soonest() == 15.0


def test_the_deadline_heap_stays_near_the_timed_wip_however_many_deliveries():
    """Settling leaves a stale entry behind; they are dropped long before they outnumber
    the live ones by more than DEADLINE_SLACK, so memory follows the wip."""
    queue, source = make_queue(0)
    queue.subscribe("c", "0", "client-individual", prefetch=100, ack_timeout=1800.0)
    held: list[int] = []
    for step in range(200):
        source.add(100)
        delivered = ids(queue.deliver(float(step)))
        for message_id in held + delivered[:-10]:  # the last 10 of each batch stay held a while
            queue.ack("c", message_id)
        held = delivered[-10:]
        assert queue._entries <= 2 * 100 + DEADLINE_SLACK, "bounded by the prefetch, not the deliveries"
        assert len(queue._deadlines) == len(queue._buckets) <= queue._entries
    assert (queue.wip_count, queue.next_deadline()) == (10, 1800.0 + 199)


def test_with_100000_timed_wip_messages_an_expiry_pass_returns_exactly_what_is_due():
    queue, source = make_queue(0)
    queue.subscribe("c", "0", "client-individual", prefetch=10000, ack_timeout=60.0)
    source.add(1)
    queue.deliver(0.0)
    for step in range(10):
        source.add(10000 if step < 9 else 9999)
        queue.subscribe(f"c{step}", "0", "client-individual", prefetch=10000, ack_timeout=60.0)
        queue.deliver(1.0 + step)
    assert queue.wip_count == 100_000
    assert ids(queue.expire(60.0)) == [1]
    assert queue.next_deadline() == 61.0
    assert len(queue.expire(61.0)) == 10000
    assert queue.wip_count == 89_999


# --- random operation sequences ------------------------------------------------------


class Model:
    """What must hold after any sequence of operations, tracked outside the queue. Time
    passes in steps ("tick"), and deliveries have deadlines (the queue's default is 2)."""

    def __init__(self, queue: StrQueue, source: FakeSource, rng: random.Random):
        self.queue, self.source, self.rng = queue, source, rng
        self.conns = ["a", "b", "c"]
        self.active: dict[str, StrSubscription] = {}
        self.writable = dict.fromkeys(self.conns, True)
        self.wip: dict[int, StrSubscription] = {}
        self.rdy_again: set[int] = set()
        self.done: set[int] = set()
        self.now = 0.0
        self.due: dict[int, float] = {}  # wip id -> its deadline
        self.late: dict[str, set[int]] = {conn: set() for conn in self.conns}

    def step(self) -> None:
        rng, queue = self.rng, self.queue
        conn = rng.choice(self.conns)
        action = rng.choice(
            ["subscribe", "unsubscribe", "deliver", "deliver", "ack", "ack", "nack", "bad-ack",
             "writable", "close", "send", "send", "tick", "touch", "late-ack"]
        )  # fmt: skip
        if action == "subscribe":
            mode = rng.choice(["auto", "client", "client-individual"])
            timeout = rng.choice([None, None, 0.0, 1.0, 5.0])
            if conn in self.active:
                with pytest.raises(QueueError):
                    queue.subscribe(conn, "x", mode, rng.randint(1, 4), timeout)
            else:
                sub = queue.subscribe(conn, "x", mode, rng.randint(1, 4), timeout)
                assert sub.ack_timeout_ms == (0 if mode == "auto" else 2000 if timeout is None else 1000 * timeout)
                self.active[conn] = sub
        elif action == "unsubscribe":
            if conn in self.active:
                queue.unsubscribe(conn, "x")
                del self.active[conn]
            else:
                with pytest.raises(QueueError):
                    queue.unsubscribe(conn, "x")
        elif action == "deliver":
            self.check_delivery(queue.deliver(self.now))
        elif action in ("ack", "nack"):
            mine = [i for i, sub in self.wip.items() if sub.conn == conn]
            if mine:
                message_id = rng.choice(mine)
                finished = getattr(queue, action)(conn, message_id)
                if action == "nack":
                    queue.requeue(finished)
                self.check_finished(action, conn, message_id, finished)
        elif action == "bad-ack":
            foreign = [i for i, sub in self.wip.items() if sub.conn != conn]
            with pytest.raises(QueueError):
                queue.ack(conn, rng.choice(foreign or [10**9]))
        elif action == "writable":
            self.writable[conn] = not self.writable[conn]
            queue.set_writable(conn, self.writable[conn])
        elif action == "close":
            returned = queue.close(conn)
            queue.requeue(returned)
            expected = {i for i, sub in self.wip.items() if sub.conn == conn}
            assert {m.id for m in returned} == expected
            assert len(returned) == len(expected)
            for message_id in expected:
                del self.wip[message_id]
                self.due.pop(message_id, None)
            self.rdy_again |= expected
            self.active.pop(conn, None)
            self.writable[conn] = True
            self.late[conn].clear()
        elif action == "tick":
            self.now += rng.choice([0.5, 1.0, 3.0])
            expired = queue.expire(self.now)
            expected = {i for i, deadline in self.due.items() if deadline <= self.now}
            assert {m.id for _, m in expired} == expected and len(expired) == len(expected)
            queue.requeue([m for _, m in expired])
            for sub, message in expired:
                assert self.wip.pop(message.id) is sub
                del self.due[message.id]
                self.late[sub.conn].add(message.id)
            self.rdy_again |= expected
        elif action == "touch":
            mine = [i for i, sub in self.wip.items() if sub.conn == conn]
            if mine:
                message_id = rng.choice(mine)
                self.due[message_id] = self.now + rng.choice([0.5, 4.0])
                queue.touch(conn, message_id, self.due[message_id])
        elif action == "late-ack":
            late = sorted(i for i in self.late[conn] if not (i in self.wip and self.wip[i].conn == conn))
            if late:
                with pytest.raises(Late):
                    getattr(queue, rng.choice(["ack", "nack"]))(conn, rng.choice(late))
        else:
            self.source.add(rng.randint(1, 3))
        self.check_invariants()

    def check_delivery(self, pairs: list[tuple[StrSubscription, FakeMessage]]) -> None:
        redelivered = [m.id for _, m in pairs if m.id in self.rdy_again]
        fresh_started = False
        for sub, message in pairs:
            assert message.id not in self.wip and message.id not in self.done
            assert self.active.get(sub.conn) is sub and self.writable[sub.conn]
            if message.id in self.rdy_again:
                assert not fresh_started, "redelivered messages come before new ones"
                self.rdy_again.remove(message.id)
            else:
                fresh_started = True
            self.wip[message.id] = sub
            if sub.ack_timeout_ms:
                self.due[message.id] = self.now + sub.ack_timeout_ms / 1000
        assert redelivered == sorted(redelivered)

    def check_finished(self, action, conn, message_id, finished) -> None:
        sub = self.wip[message_id]
        finished_ids = [m.id for m in finished]
        assert message_id in finished_ids
        if sub.ack_mode != "client":
            assert finished_ids == [message_id]
        for i in finished_ids:
            assert self.wip.pop(i) is sub
            self.due.pop(i, None)
        if action == "ack":
            assert self.done.isdisjoint(finished_ids)
            self.done.update(finished_ids)
        else:
            self.rdy_again.update(finished_ids)

    def check_invariants(self) -> None:
        queue = self.queue
        pending = {m.id for m in self.source.pending}
        everything = set(range(1, self.source.next_id))
        parts = [self.done, set(self.wip), self.rdy_again, pending]
        assert sum(map(len, parts)) == len(everything) and set().union(*parts) == everything
        assert queue.wip_count == len(self.wip)
        assert queue.redeliver_count == len(self.rdy_again)
        assert queue.subscription_count == len(self.active)
        assert queue.next_deadline() == min(self.due.values(), default=None)
        held: dict[StrSubscription, int] = {}
        for sub in self.wip.values():
            held[sub] = held.get(sub, 0) + 1
        assert all(count <= sub.prefetch for sub, count in held.items())
        can_take = any(self.writable[c] and held.get(sub, 0) < sub.prefetch for c, sub in self.active.items())
        assert queue.has_credit() == can_take

    def drain(self) -> None:
        for conn in self.conns:
            returned = self.queue.close(conn)
            self.queue.requeue(returned)
            self.rdy_again |= {m.id for m in returned}
        self.wip.clear()
        self.due.clear()
        self.active = {"z": self.queue.subscribe("z", "z", "auto")}
        self.writable["z"] = True
        while pairs := self.queue.deliver(self.now):
            self.check_delivery(pairs)
            for _, message in pairs:
                self.check_finished("ack", "z", message.id, self.queue.ack("z", message.id))
        assert self.done == set(range(1, self.source.next_id))


@pytest.mark.parametrize("seed", range(60))
def test_random_operations_never_lose_or_duplicate_a_message(seed):
    rng = random.Random(seed)
    queue, source = make_queue(rng.randint(0, 5), ack_timeout=2.0)
    model = Model(queue, source, rng)
    for _ in range(400):
        model.step()
    model.drain()


def test_the_queue_never_changes_a_message():
    """Messages are the log's records: the queue reads their ids, the log counts deliveries."""
    queue, _ = make_queue(2)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver(0.0)
    queue.requeue(queue.nack("c", 1))
    queue.requeue(queue.close("c"))
    queue.subscribe("d", "0", "client-individual")
    assert ids(queue.deliver(0.0)) == [1, 2]  # frozen messages: any write would have raised
