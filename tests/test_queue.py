"""The queue state machine: who gets which message, credit, redelivery order, and errors."""

import random
from collections import deque
from dataclasses import dataclass

import pytest

from curb.queue import Queue, QueueError, Subscription


@dataclass(eq=False, frozen=True)
class FakeMessage:
    id: int


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
    [(None, 7), (1, 1), (50, 50), (99, 99), (100, 99), (10**9, 99)],
)
def test_prefetch_defaults_and_is_clamped(requested, expected):
    queue, _ = make_queue(default_prefetch=7, max_prefetch=99)
    assert queue.subscribe("c", "0", "client-individual", requested).prefetch == expected


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
    assert queue.deliver() == []
    assert source.calls == 0
    queue.subscribe("c", "0", "client-individual")
    assert ids(queue.deliver()) == [1, 2, 3]


def test_nothing_is_taken_from_the_source_without_credit():
    queue, source = make_queue(3)
    queue.subscribe("c", "0", "client-individual", prefetch=1)
    assert ids(queue.deliver()) == [1]
    calls = source.calls
    assert queue.deliver() == []
    assert source.calls == calls
    assert len(source.pending) == 2


def test_delivery_is_fifo():
    queue, source = make_queue(4)
    sub = queue.subscribe("c", "0", "client-individual")
    pairs = queue.deliver()
    assert routes(pairs) == [("0", 1), ("0", 2), ("0", 3), ("0", 4)]
    assert all(s is sub for s, _ in pairs)
    assert queue.wip_count == 4
    source.add(1)
    assert ids(queue.deliver()) == [5]


def test_empty_queue_delivers_nothing():
    queue, _ = make_queue()
    queue.subscribe("c", "0")
    assert queue.deliver() == []
    assert queue.wip_count == 0


# --- ack / nack ----------------------------------------------------------------------


def test_client_individual_ack_finishes_only_that_message():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
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
    queue.deliver()
    assert [m.id for m in queue.ack("c", 3)] == [1, 2, 3]
    assert queue.wip_count == 1
    for gone in (1, 2, 3):
        with pytest.raises(QueueError):
            queue.ack("c", gone)
    assert [m.id for m in queue.ack("c", 4)] == [4]


def test_client_ack_follows_delivery_order_not_id_order():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client", prefetch=3)
    queue.deliver()
    assert [m.id for m in queue.nack("c", 1)] == [1]
    assert ids(queue.deliver()) == [1]  # now delivered after 2 and 3
    assert [m.id for m in queue.ack("c", 3)] == [2, 3]
    assert queue.wip_count == 1
    assert [m.id for m in queue.ack("c", 1)] == [1]


def test_client_ack_is_cumulative_per_subscription_only():
    queue, _ = make_queue(4)
    queue.subscribe("c", "a", "client", prefetch=2)
    queue.deliver()  # 1, 2 to a
    queue.unsubscribe("c", "a")
    queue.subscribe("c", "b", "client", prefetch=2)
    queue.deliver()  # 3, 4 to b
    assert [m.id for m in queue.ack("c", 4)] == [3, 4]
    assert queue.wip_count == 2


def test_client_nack_is_cumulative():
    queue, _ = make_queue(4)
    queue.subscribe("c", "0", "client")
    queue.deliver()
    assert [m.id for m in queue.nack("c", 2)] == [1, 2]
    assert queue.redeliver_count == 2
    assert queue.wip_count == 2


def test_client_individual_nack_returns_only_that_message():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
    assert [m.id for m in queue.nack("c", 2)] == [2]
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
    assert routes(queue.deliver()) == [("0", 1), ("0", 2)]
    queue.ack("c", 1)
    assert ids(queue.deliver()) == [3]
    with pytest.raises(QueueError, match=str(message_id)):
        getattr(queue, operation)(conn, message_id)
    assert (queue.wip_count, queue.redeliver_count) == (2, 0)


def test_errors_leave_the_state_unchanged():
    queue, _ = make_queue(2)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
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
    queue.deliver()
    queue.nack("c", 4)
    queue.nack("c", 2)
    source.add(2)  # 6, 7 never delivered
    queue.ack("c", 1)
    queue.ack("c", 3)
    queue.ack("c", 5)
    pairs = queue.deliver()
    assert ids(pairs) == [2, 4, 6, 7]
    assert queue.redeliver_count == 0


def test_close_puts_wip_back_ahead_of_never_delivered_messages():
    queue, _ = make_queue(6)
    queue.subscribe("gone", "0", "client-individual", prefetch=3)
    assert ids(queue.deliver()) == [1, 2, 3]
    queue.ack("gone", 2)
    assert sorted(m.id for m in queue.close("gone")) == [1, 3]
    assert (queue.wip_count, queue.redeliver_count, queue.subscription_count) == (0, 2, 0)
    queue.subscribe("next", "0", "client-individual")
    pairs = queue.deliver()
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
    assert ids(queue.deliver()) == [1, 2]


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
    assert ids(queue.deliver()) == [1, 2, 3]
    assert queue.deliver() == []
    assert not queue.has_credit()
    queue.ack("c", acked)
    assert queue.has_credit()
    assert ids(queue.deliver()) == list(range(4, 4 + freed))
    assert not queue.has_credit()


def test_nack_frees_credit_and_the_message_returns_to_the_same_consumer():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "client-individual", prefetch=2)
    queue.deliver()
    queue.nack("c", 1)
    assert ids(queue.deliver()) == [1]
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
    assert routes(queue.deliver()) == [
        ("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5), ("c", 6), ("a", 7),
    ]  # fmt: skip


def test_turns_continue_across_calls():
    queue, source = make_queue()
    for name in "ab":
        queue.subscribe(name, name, "client-individual")
    received = []
    for _ in range(4):
        source.add(1)
        received += routes(queue.deliver())
    assert received == [("a", 1), ("b", 2), ("a", 3), ("b", 4)]


def test_consumer_out_of_credit_is_skipped():
    queue, _ = make_queue(5)
    queue.subscribe("a", "a", "client-individual", prefetch=1)
    queue.subscribe("b", "b", "client-individual", prefetch=3)
    assert routes(queue.deliver()) == [("a", 1), ("b", 2), ("b", 3), ("b", 4)]
    queue.ack("a", 1)
    assert routes(queue.deliver()) == [("a", 5)]


def test_each_message_goes_to_exactly_one_consumer():
    queue, _ = make_queue(30)
    for name in "abc":
        queue.subscribe(name, name, "client-individual", prefetch=4)
    delivered = ids(queue.deliver())
    assert sorted(delivered) == list(range(1, 13))
    for name in "abc":
        queue.close(name)
    queue.subscribe("d", "d", "client-individual", prefetch=100)
    assert ids(queue.deliver()) == list(range(1, 31))


# --- writability ---------------------------------------------------------------------


def test_unwritable_connection_gets_nothing_until_writable_again():
    queue, source = make_queue(4)
    queue.subscribe("a", "a", "client-individual")
    queue.subscribe("b", "b", "client-individual")
    queue.set_writable("a", False)
    assert routes(queue.deliver()) == [("b", 1), ("b", 2), ("b", 3), ("b", 4)]
    queue.set_writable("b", False)
    source.add(1)
    assert queue.deliver() == []
    assert not queue.has_credit()
    assert source.calls == 5
    queue.set_writable("a", True)
    assert routes(queue.deliver()) == [("a", 5)]


def test_writability_set_before_subscribing_applies():
    queue, _ = make_queue(1)
    queue.set_writable("c", False)
    queue.subscribe("c", "0")
    assert queue.deliver() == []
    queue.set_writable("c", True)
    assert ids(queue.deliver()) == [1]


def test_writable_again_does_not_exceed_prefetch():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "client-individual", prefetch=2)
    queue.deliver()
    queue.set_writable("c", False)
    queue.set_writable("c", True)
    assert queue.deliver() == []
    assert not queue.has_credit()


# --- auto mode -----------------------------------------------------------------------


def test_auto_messages_are_wip_until_the_caller_acks_their_hand_off():
    queue, _ = make_queue(3)
    queue.subscribe("c", "0", "auto")
    pairs = queue.deliver()
    assert ids(pairs) == [1, 2, 3]
    assert queue.wip_count == 3
    assert ids_of(queue.ack("c", 1)) == [1], "auto ACKs one message, not cumulatively"
    assert ids_of(queue.ack("c", 2)) == [2]
    assert ids_of(queue.close("c")) == [3], "a message never handed off is rdy again"


def test_auto_holds_at_most_prefetch_messages():
    queue, _ = make_queue(5)
    queue.subscribe("c", "0", "auto", prefetch=2)
    assert ids(queue.deliver()) == [1, 2]
    assert not queue.has_credit()
    assert queue.deliver() == []
    queue.ack("c", 1)
    queue.ack("c", 2)
    assert ids(queue.deliver()) == [3, 4]


def test_auto_consumer_shares_with_a_client_consumer():
    queue, _ = make_queue(6)
    queue.subscribe("a", "a", "auto", prefetch=10)
    queue.subscribe("b", "b", "client-individual", prefetch=1)
    assert routes(queue.deliver()) == [("a", 1), ("b", 2), ("a", 3), ("a", 4), ("a", 5), ("a", 6)]


# --- unsubscribe (pause) -------------------------------------------------------------


def test_unsubscribe_pauses_delivery_but_wip_can_still_be_acked_and_nacked():
    queue, source = make_queue(3)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
    queue.unsubscribe("c", "0")
    source.add(1)
    assert queue.deliver() == []
    assert queue.wip_count == 3
    assert [m.id for m in queue.ack("c", 1)] == [1]
    assert [m.id for m in queue.nack("c", 2)] == [2]
    assert (queue.wip_count, queue.redeliver_count) == (1, 1)


def test_paused_wip_stays_after_resubscribing_and_close_returns_all_of_it():
    queue, _ = make_queue(4)
    queue.subscribe("c", "old", "client", prefetch=2)
    queue.deliver()  # 1, 2
    queue.unsubscribe("c", "old")
    queue.subscribe("c", "new", "client-individual", prefetch=1)
    assert routes(queue.deliver()) == [("new", 3)]
    queue.ack("c", 2)  # cumulative on the paused subscription: 1 and 2
    queue.subscribe("d", "0", "client-individual", prefetch=1)
    queue.deliver()  # 4 to d
    queue.unsubscribe("c", "new")
    assert [m.id for m in queue.close("c")] == [3]
    assert queue.wip_count == 1


def test_acking_paused_wip_does_not_restart_delivery():
    queue, source = make_queue(1)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
    queue.unsubscribe("c", "0")
    queue.ack("c", 1)
    source.add(1)
    assert queue.deliver() == []
    assert source.calls == 2


# --- random operation sequences ------------------------------------------------------


class Model:
    """What must hold after any sequence of operations, tracked outside the queue."""

    def __init__(self, queue: StrQueue, source: FakeSource, rng: random.Random):
        self.queue, self.source, self.rng = queue, source, rng
        self.conns = ["a", "b", "c"]
        self.active: dict[str, StrSubscription] = {}
        self.writable = dict.fromkeys(self.conns, True)
        self.wip: dict[int, StrSubscription] = {}
        self.rdy_again: set[int] = set()
        self.done: set[int] = set()

    def step(self) -> None:
        rng, queue = self.rng, self.queue
        conn = rng.choice(self.conns)
        action = rng.choice(
            ["subscribe", "unsubscribe", "deliver", "deliver", "ack", "ack", "nack", "bad-ack",
             "writable", "close", "send", "send"]
        )  # fmt: skip
        if action == "subscribe":
            mode = rng.choice(["auto", "client", "client-individual"])
            if conn in self.active:
                with pytest.raises(QueueError):
                    queue.subscribe(conn, "x", mode, rng.randint(1, 4))
            else:
                self.active[conn] = queue.subscribe(conn, "x", mode, rng.randint(1, 4))
        elif action == "unsubscribe":
            if conn in self.active:
                queue.unsubscribe(conn, "x")
                del self.active[conn]
            else:
                with pytest.raises(QueueError):
                    queue.unsubscribe(conn, "x")
        elif action == "deliver":
            self.check_delivery(queue.deliver())
        elif action in ("ack", "nack"):
            mine = [i for i, sub in self.wip.items() if sub.conn == conn]
            if mine:
                message_id = rng.choice(mine)
                finished = getattr(queue, action)(conn, message_id)
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
            expected = {i for i, sub in self.wip.items() if sub.conn == conn}
            assert {m.id for m in returned} == expected
            assert len(returned) == len(expected)
            for message_id in expected:
                del self.wip[message_id]
            self.rdy_again |= expected
            self.active.pop(conn, None)
            self.writable[conn] = True
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
        assert redelivered == sorted(redelivered)

    def check_finished(self, action, conn, message_id, finished) -> None:
        sub = self.wip[message_id]
        finished_ids = [m.id for m in finished]
        assert message_id in finished_ids
        if sub.ack_mode != "client":
            assert finished_ids == [message_id]
        for i in finished_ids:
            assert self.wip.pop(i) is sub
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
        held: dict[StrSubscription, int] = {}
        for sub in self.wip.values():
            held[sub] = held.get(sub, 0) + 1
        assert all(count <= sub.prefetch for sub, count in held.items())
        can_take = any(self.writable[c] and held.get(sub, 0) < sub.prefetch for c, sub in self.active.items())
        assert queue.has_credit() == can_take

    def drain(self) -> None:
        for conn in self.conns:
            self.rdy_again |= {m.id for m in self.queue.close(conn)}
        self.wip.clear()
        self.active = {"z": self.queue.subscribe("z", "z", "auto")}
        self.writable["z"] = True
        while pairs := self.queue.deliver():
            self.check_delivery(pairs)
            for _, message in pairs:
                self.check_finished("ack", "z", message.id, self.queue.ack("z", message.id))
        assert self.done == set(range(1, self.source.next_id))


@pytest.mark.parametrize("seed", range(60))
def test_random_operations_never_lose_or_duplicate_a_message(seed):
    rng = random.Random(seed)
    queue, source = make_queue(rng.randint(0, 5))
    model = Model(queue, source, rng)
    for _ in range(400):
        model.step()
    model.drain()


def test_the_queue_never_changes_a_message():
    """Messages are the log's records: the queue reads their ids, the log counts deliveries."""
    queue, _ = make_queue(2)
    queue.subscribe("c", "0", "client-individual")
    queue.deliver()
    queue.nack("c", 1)
    queue.close("c")
    queue.subscribe("d", "0", "client-individual")
    assert ids(queue.deliver()) == [1, 2]  # frozen messages: any write would have raised
