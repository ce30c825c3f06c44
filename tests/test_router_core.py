"""The router's forwarding rules, in memory: frames from clients and from stand-in instances
in, frames out (curb.router.core). Each test names the rule it checks."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from curb import users
from curb.frame import Frame, FrameParser, encode
from curb.logins import Answer
from curb.peer import Peer
from curb.router import routes
from curb.router.config import RouterConfig
from curb.router.core import RouterCore
from curb.router.links import UP, Link
from curb.router.placement import INDEX_BITS
from curb.session import Session


class World:
    """A router core, its client sessions and links, with every output parsed back into
    frames; the world runs what the core schedules, as the event loop would."""

    def __init__(self, *route: str, prefetch: int = 100):
        self.now = 0.0
        self.later: list[Callable[[], None]] = []
        self.core = RouterCore(
            routes.build(list(route)), RouterConfig(prefetch=prefetch), schedule=self.schedule, clock=self.clock
        )
        self.parsers: dict[object, FrameParser] = {}
        self.pending: list[tuple[Callable[[Answer], None], users.User | None]] = []  # login checks

    def clock(self) -> float:
        return self.now

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self.later.append(callback)

    def run(self) -> None:
        while self.later:
            self.later.pop(0)()

    def link(self, dest: str, index: int = 0) -> Link:
        """The link that consumes from a destination's instance number `index`."""
        return self.core.placement.dests[dest][index]

    def sender(self, dest: str, index: int = 0) -> Link:
        """The link that sends to it."""
        return self.core.placement.senders[dest][index]

    def up(self, dest: str, index: int = 0) -> Link:
        """Connect both links to the instance and answer their CONNECTs; returns the
        consuming one (its output read; `sender` has the other)."""
        for link in (self.sender(dest, index), self.link(dest, index)):
            self.core.links.connected(link, self.now)
            assert [f.command for f in self.out(link)] == ["CONNECT"]
            self.core.links.data(link, encode("CONNECTED", {"version": "1.2", "heart-beat": "0,0"}), self.now)
        return self.link(dest, index)

    def lose(self, link: Link, why: str = "connection lost") -> None:
        self.core.links.lost(link, why)
        self.run()

    def open(self) -> Session:
        return Session(self.core, self.now, "test")

    def client(self, **headers: str) -> Session:
        client = self.open()
        self.send(client, "CONNECT", {"accept-version": "1.2", **headers})
        assert [f.command for f in self.out(client)] == ["CONNECTED"]
        return client

    def send(self, client: Session, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        client.receive_data(encode(command, headers, body), self.now)
        self.run()

    def answer(self, link: Link, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.core.links.data(link, encode(command, headers, body), self.now)
        self.run()

    def tick(self, *clients: Session) -> None:
        """Time passed: the core's tick, and each client's (a silent one is dropped)."""
        self.core.tick(self.now)
        for client in clients:
            client.tick(self.now)
            if client.close_wanted == "abort":
                client.connection_lost()
        self.run()

    def may_send(self, link: Link) -> int:
        """How many more MESSAGEs the router's subscription lets the link's instance send."""
        upstream = self.core.credit.of(link)
        return upstream.window - upstream.on_current

    def out(self, endpoint: Session | Link) -> list[Frame]:
        """The frames written to an endpoint since the last look (heart-beats dropped)."""
        self.run()
        if isinstance(endpoint, Link):
            self.core.links.take_dirty(self.now)
            data = b"".join(endpoint.out)
            endpoint.out.clear()
        else:
            data = endpoint.data_to_send(self.now)
        parser = self.parsers.setdefault(endpoint, FrameParser(max_frame_bytes=1 << 26))
        return parser.feed(data)


def stable_id(w: World, link: Link, instance_id: int) -> str:
    """A message's id through the router: the instance's id and the instance's index."""
    return str(instance_id << INDEX_BITS | w.core.placement.indexes[(link.dest, link.address)])


def message(sub: str, msg_id: int, body: bytes = b"x", **headers: str) -> tuple[str, dict[str, str], bytes]:
    return (
        "MESSAGE",
        {"subscription": sub, "message-id": str(msg_id), "ack": str(msg_id), "destination": "/queue/q", **headers},
        body,
    )


def test_send_is_forwarded_and_the_receipt_waits_for_the_instance():
    w = World("orders=127.0.0.1:1")
    w.up("orders")
    link = w.sender("orders")
    c = w.client()
    w.send(c, "SEND", {"destination": "/queue/orders", "receipt": "a", "color": "red"}, b"hi")
    sent = w.out(link)
    assert [(f.command, f.headers["destination"], f.headers["color"], f.body) for f in sent] == [
        ("SEND", "/queue/orders", "red", b"hi")
    ]
    assert "transaction" not in sent[0].headers and sent[0].headers["receipt"] != "a"
    assert w.out(c) == []  # no RECEIPT before the instance's
    w.answer(link, "RECEIPT", {"receipt-id": sent[0].headers["receipt"]})
    assert [(f.command, f.headers) for f in w.out(c)] == [("RECEIPT", {"receipt-id": "a"})]


@pytest.mark.parametrize("destination", ["/queue/orders", "./orders"])
def test_both_destination_forms_name_a_route(destination):
    w = World("orders=127.0.0.1:1")
    w.up("orders")
    link = w.sender("orders")
    c = w.client()
    w.send(c, "SEND", {"destination": destination}, b"x")
    assert [f.command for f in w.out(link)] == ["SEND"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"destination": "/queue/nope"}, "unknown destination '/queue/nope'"),
        ({"destination": "/topic/orders"}, "unknown destination '/topic/orders'"),
        ({}, "SEND needs a destination"),
    ],
)
def test_an_unknown_destination_is_an_error_that_lists_the_routes(headers, message):
    w = World("orders=127.0.0.1:1", "mail=127.0.0.1:2")
    w.up("orders")
    c = w.client()
    w.send(c, "SEND", {**headers, "receipt": "r1"}, b"x")
    [error] = w.out(c)
    assert error.command == "ERROR" and error.headers["message"] == message
    assert error.headers["receipt-id"] == "r1"
    assert b"/queue/mail, /queue/orders" in error.body
    assert c.close_wanted


def test_receipts_leave_in_frame_order_even_when_instances_answer_out_of_order():
    w = World("a=127.0.0.1:1", "b=127.0.0.1:2")
    w.up("a"), w.up("b")
    la, lb = w.sender("a"), w.sender("b")
    c = w.client()
    w.send(c, "SEND", {"destination": "/queue/a", "receipt": "1"}, b"x")
    w.send(c, "SEND", {"destination": "/queue/b", "receipt": "2"}, b"y")
    w.send(c, "SEND", {"destination": "/queue/b"}, b"z")  # no receipt: still waited for
    w.send(c, "SUBSCRIBE", {"destination": "/queue/a", "id": "s", "receipt": "3"})
    [sa], [sb1, sb2] = w.out(la), w.out(lb)
    w.answer(lb, "RECEIPT", {"receipt-id": sb1.headers["receipt"]})
    w.answer(lb, "RECEIPT", {"receipt-id": sb2.headers["receipt"]})
    assert w.out(c) == []
    w.answer(la, "RECEIPT", {"receipt-id": sa.headers["receipt"]})
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["1", "2", "3"]


def test_the_first_subscriber_opens_one_upstream_subscription_with_its_credit():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    assert [f.headers["destination"] for f in w.out(link)] == ["./count"]
    c1, c2 = w.client(), w.client()
    w.send(c1, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual", "prefetch-count": "2"})
    [sub] = w.out(link)
    assert sub.command == "SUBSCRIBE" and sub.headers["prefetch-count"] == "2"
    assert sub.headers["ack"] == "client-individual"
    w.send(c2, "SUBSCRIBE", {"destination": "/queue/q", "id": "b", "ack": "client-individual", "prefetch-count": "3"})
    unsub, resub = w.out(link)
    assert (unsub.command, unsub.headers["id"]) == ("UNSUBSCRIBE", sub.headers["id"])
    assert resub.headers["prefetch-count"] == "5"


def test_each_message_goes_to_one_client_with_credit_and_prefetch_is_respected():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c1, c2 = w.client(), w.client()
    for c, sid in ((c1, "a"), (c2, "b")):
        w.send(
            c, "SUBSCRIBE", {"destination": "/queue/q", "id": sid, "ack": "client-individual", "prefetch-count": "1"}
        )
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    w.answer(link, *message(sub_id, 2))
    [m1], [m2] = w.out(c1), w.out(c2)
    assert (m1.headers["subscription"], m2.headers["subscription"]) == ("a", "b")
    assert m1.headers["message-id"] == stable_id(w, link, 1) == m1.headers["ack"]
    assert m1.headers["destination"] == "/queue/q"
    # Both are full: a third MESSAGE (sent before the instance saw an UNSUBSCRIBE) goes back at
    # once, undelivered: the instance counts no delivery (curb-undelivered).
    w.answer(link, *message(sub_id, 3))
    [bounce] = w.out(link)
    assert (bounce.command, bounce.headers["id"], bounce.headers.get("curb-undelivered")) == ("NACK", "3", "true")
    assert w.out(c1) == [] and w.out(c2) == []


def test_ack_and_nack_reach_the_right_instance_and_their_receipts_wait_for_it():
    w = World("p=127.0.0.1:1,127.0.0.1:2")
    l1, l2 = w.up("p", 0), w.up("p", 1)
    w.out(l1), w.out(l2)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/p", "id": "s", "ack": "client-individual", "prefetch-count": "4"})
    s1, s2 = w.out(l1)[-1].headers["id"], w.out(l2)[-1].headers["id"]
    w.answer(l1, *message(s1, 7))
    w.answer(l2, *message(s2, 7))
    m1, m2 = w.out(c)
    assert m1.headers["ack"] != m2.headers["ack"]
    w.send(c, "ACK", {"id": m2.headers["ack"], "receipt": "k"})
    w.send(c, "NACK", {"id": m1.headers["ack"]})
    # The ACK goes without a receipt; the RECEIPT that waits for it sends a marker after it.
    assert [(f.command, f.headers["id"]) for f in w.out(l2)] == [("ACK", "7"), ("ACK", "count-0")]
    [nack] = w.out(l1)
    assert (nack.command, nack.headers["id"]) == ("NACK", "7")
    assert w.out(c) == []
    w.answer(l2, "RECEIPT", {"receipt-id": next(reversed(l2.forwarded))})
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["k"]


def test_an_unknown_or_malformed_ack_id_is_an_error():
    w = World("q=127.0.0.1:1")
    w.up("q")
    c = w.client()
    w.send(c, "ACK", {"id": "12"})
    [error] = w.out(c)
    assert error.command == "ERROR"
    assert error.headers["message"] == "message 12 is not awaiting ACK or NACK on this connection"


def test_a_client_that_goes_has_its_messages_nacked_and_its_credit_leaves():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client", "prefetch-count": "2"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    w.answer(link, *message(sub_id, 2))
    c.connection_lost()
    frames = w.out(link)
    assert sorted((f.command, f.headers["id"]) for f in frames) == [
        ("NACK", "1"),
        ("NACK", "2"),
        ("UNSUBSCRIBE", sub_id),
    ]
    assert w.core.credit.of(link).free == 0 and w.core.credit.of(link).window == 0


def test_client_mode_ack_acknowledges_every_earlier_message_of_the_subscription():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client", "prefetch-count": "3"})
    sub_id = w.out(link)[-1].headers["id"]
    for n in (1, 2, 3):
        w.answer(link, *message(sub_id, n))
    frames = w.out(c)
    w.send(c, "ACK", {"id": frames[1].headers["ack"]})
    assert [(f.command, f.headers["id"]) for f in w.out(link)] == [("ACK", "1"), ("ACK", "2")]


def test_an_auto_subscription_is_acked_upstream_as_its_message_is_forwarded():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "prefetch-count": "1"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 5))
    [m] = w.out(c)
    assert "ack" not in m.headers
    assert [(f.command, f.headers["id"]) for f in w.out(link)] == [("ACK", "5")]
    assert w.core.credit.of(link).free == 1


def test_a_lost_link_makes_held_messages_late_and_sends_its_unanswered_sends_again():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    consumer, producer = w.client(), w.client()
    w.send(consumer, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m] = w.out(consumer)
    w.send(producer, "SEND", {"destination": "/queue/q", "receipt": "p"}, b"x")
    w.lose(link, "connection lost")
    w.lose(w.sender("q"), "connection lost")
    assert w.out(producer) == []  # parked until the instance is back
    # The consumer stays; its ACK of a message the instance has queued again changes nothing.
    w.send(consumer, "ACK", {"id": m.headers["ack"], "receipt": "k"})
    [late] = w.out(consumer)
    assert late.headers == {"receipt-id": "k", "curb-late": "true"}
    w.up("q")
    [again] = w.out(w.sender("q"))
    assert again.body == b"x"
    w.answer(w.sender("q"), "RECEIPT", {"receipt-id": again.headers["receipt"]})
    assert [f.headers["receipt-id"] for f in w.out(producer)] == ["p"]


def test_an_ack_lost_with_its_link_gets_an_unconfirmed_receipt_that_promises_nothing():
    """Not curb-late:true, which says the ACK changed nothing: this one may have removed
    its message."""
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m] = w.out(c)
    w.send(c, "ACK", {"id": m.headers["ack"], "receipt": "k"})
    w.lose(link, "connection lost")
    [late] = w.out(c)
    assert late.headers == {"receipt-id": "k", "curb-unconfirmed": "true"}
    assert not c.close_wanted


def test_a_touch_that_brings_a_deadline_nearer_is_kept_though_ticks_look_only_from_the_soonest():
    """Ticks look at deadlines only once the soonest has passed (Deliveries.soonest): a
    curb-touch that moves one nearer than every other moves that soonest too."""
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(
        c, "SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual", "curb-ack-timeout": "60000"}
    )
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m] = w.out(c)
    w.now = 1.0
    w.tick()
    assert w.out(link) == []
    w.send(c, "NACK", {"id": m.headers["ack"], "curb-touch": "1000"})  # due at 2.0, not 60.0
    assert [f.headers for f in w.out(link)] == [{"id": "1", "curb-touch": "1000"}]
    w.now = 1.9
    w.tick()
    assert w.out(link) == []
    w.now = 2.1
    w.tick()
    assert [(f.command, f.headers) for f in w.out(link)] == [("NACK", {"id": "1"})]


def test_what_a_lost_link_read_is_handed_on_32_at_a_time_and_at_its_loss_only_its_receipts():
    """A link's MESSAGEs of one read go to clients handle_each a call, the rest in later
    calls; when the link is lost with some unhandled, its RECEIPTs still answer (a plain
    RECEIPT, confirmed) and its MESSAGEs never reach a client (the instance took them back)."""
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    w.core.links.handle_each = 1
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m1] = w.out(c)
    w.send(c, "ACK", {"id": m1.headers["ack"], "receipt": "k"})
    marker = w.out(link)[-1]
    assert marker.headers["id"] == "count-0"
    read = b"".join(
        [
            encode(*message(sub_id, 2)),
            encode(*message(sub_id, 3)),
            encode("RECEIPT", {"receipt-id": marker.headers["receipt"]}),
        ]
    )
    assert w.core.links.data(link, read, w.now)  # one of three handed on, two wait
    w.run()
    assert [f.headers["message-id"] for f in w.out(c)] == [stable_id(w, link, 2)]
    w.lose(link, "connection lost")
    assert [(f.command, f.headers) for f in w.out(c)] == [("RECEIPT", {"receipt-id": "k"})]


def test_a_commit_whose_ack_was_lost_with_its_link_is_an_error():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m] = w.out(c)
    w.send(c, "BEGIN", {"transaction": "t"})
    w.send(c, "ACK", {"id": m.headers["ack"], "transaction": "t"})
    w.send(c, "COMMIT", {"transaction": "t", "receipt": "c"})
    w.lose(link, "connection lost")
    [error] = w.out(c)
    assert (error.command, error.headers["message"], error.headers["receipt-id"]) == (
        "ERROR",
        "COMMIT not confirmed",
        "c",
    )
    assert b"Whether every frame of this transaction took effect is unknown" in error.body


def test_a_partitioned_send_goes_round_robin_and_to_another_instance_when_one_is_down():
    w = World("p=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    for i in range(3):
        w.up("p", i)
    links = [w.sender("p", i) for i in range(3)]
    c = w.client()
    for n in range(6):
        w.send(c, "SEND", {"destination": "/queue/p"}, b"%d" % n)
    assert [[f.body for f in w.out(link)] for link in links] == [[b"0", b"3"], [b"1", b"4"], [b"2", b"5"]]
    w.lose(links[1], "connection lost")  # its two unanswered SENDs go to the others
    moved = [f.body for link in (links[0], links[2]) for f in w.out(link)]
    assert sorted(moved) == [b"1", b"4"]
    for _ in range(4):
        w.send(c, "SEND", {"destination": "/queue/p"}, b"n")
    assert len(w.out(links[0])) + len(w.out(links[2])) == 4 and w.out(links[1]) == []


def test_a_partition_key_keeps_one_instance():
    w = World("p=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    for i in range(3):
        w.up("p", i)
    links = [w.sender("p", i) for i in range(3)]
    c = w.client()
    for _ in range(5):
        w.send(c, "SEND", {"destination": "/queue/p", "curb-partition-key": "cust-42"}, b"k")
    counts = sorted(len(w.out(link)) for link in links)
    assert counts == [0, 0, 5]


def test_a_subscriber_of_a_partitioned_destination_gets_credit_where_the_messages_are():
    w = World("p=127.0.0.1:1,127.0.0.1:2")
    l1, l2 = w.up("p", 0), w.up("p", 1)
    w.out(l1), w.out(l2)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/p", "id": "s", "ack": "client-individual", "prefetch-count": "10"})
    assert [w.out(l1)[-1].headers["prefetch-count"], w.out(l2)[-1].headers["prefetch-count"]] == ["5", "5"]
    # Only the second instance reports queued messages: the first keeps 1, the rest moves.
    w.answer(l2, "MESSAGE", {"subscription": "count", "message-id": "count-1", "destination": "./count", "rdy": "50"})
    f1, f2 = w.out(l1), w.out(l2)
    assert [f.command for f in f1] == ["UNSUBSCRIBE", "SUBSCRIBE"] and f1[-1].headers["prefetch-count"] == "1"
    assert f2[-1].headers["prefetch-count"] == "9"


def test_a_full_client_is_offered_nothing_when_its_credit_moves_to_another_instance():
    """Seed 9302341 of the router simulator: a client that held its whole prefetch from
    two instances had its shares moved by their counts; the instance that got the larger
    share was offered credit the client did not have, handed the MESSAGEs back, its count
    rose, the shares moved again: a livelock. What a client holds in all bounds its credit."""
    w = World("p=127.0.0.1:1,127.0.0.1:2")
    l1, l2 = w.up("p", 0), w.up("p", 1)
    w.out(l1), w.out(l2)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/p", "id": "s", "ack": "client-individual", "prefetch-count": "4"})
    w.answer(l2, "MESSAGE", {"subscription": "count", "message-id": "count-1", "destination": "./count", "rdy": "50"})
    sub1, sub2 = w.out(l1)[-1].headers["id"], w.out(l2)[-1].headers["id"]
    assert [w.may_send(link) for link in (l1, l2)] == [1, 3]
    w.answer(l1, *message(sub1, 1))
    for msg_id in (2, 3, 4):
        w.answer(l2, *message(sub2, msg_id))
    assert len(w.out(c)) == 4  # the client holds its prefetch
    # The counts turn: the first instance has the messages now. The client is full, so no
    # instance may send it anything, whatever its share.
    w.answer(l1, "MESSAGE", {"subscription": "count", "message-id": "count-2", "destination": "./count", "rdy": "50"})
    w.answer(l2, "MESSAGE", {"subscription": "count", "message-id": "count-3", "destination": "./count", "rdy": "0"})
    assert [w.may_send(link) for link in (l1, l2)] == [0, 0]
    # An ACK of a message from the second instance makes room for one, which the first
    # instance (its larger share) is offered.
    w.send(c, "ACK", {"id": stable_id(w, l2, 2)})
    assert [w.may_send(link) for link in (l1, l2)] == [1, 0]


def test_transaction_frames_wait_for_commit_whose_receipt_waits_for_all_of_them():
    w = World("a=127.0.0.1:1", "b=127.0.0.1:2")
    w.up("a"), w.up("b")
    la, lb = w.sender("a"), w.sender("b")
    c = w.client()
    w.send(c, "BEGIN", {"transaction": "t1", "receipt": "begun"})
    w.send(c, "SEND", {"destination": "/queue/a", "transaction": "t1"}, b"1")
    w.send(c, "SEND", {"destination": "/queue/b", "transaction": "t1"}, b"2")
    assert w.out(la) == [] and w.out(lb) == []
    w.send(c, "COMMIT", {"transaction": "t1", "receipt": "done"})
    [sa], [sb] = w.out(la), w.out(lb)
    assert (sa.headers["curb-transaction"], sa.headers["curb-transaction-seq"]) == ("t1", "0")
    assert (sb.headers["curb-transaction"], sb.headers["curb-transaction-seq"]) == ("t1", "1")
    w.answer(la, "RECEIPT", {"receipt-id": sa.headers["receipt"]})
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["begun"]
    w.answer(lb, "RECEIPT", {"receipt-id": sb.headers["receipt"]})
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["done"]


def test_abort_drops_the_transaction():
    w = World("a=127.0.0.1:1")
    w.up("a")
    la = w.sender("a")
    c = w.client()
    w.send(c, "BEGIN", {"transaction": "t"})
    w.send(c, "SEND", {"destination": "/queue/a", "transaction": "t"}, b"1")
    w.send(c, "ABORT", {"transaction": "t", "receipt": "x"})
    assert w.out(la) == [] and [f.headers["receipt-id"] for f in w.out(c)] == ["x"]
    w.send(c, "COMMIT", {"transaction": "t"})
    [error] = w.out(c)
    assert error.headers["message"] == "no transaction 't' on this connection"


def test_an_instance_error_goes_to_its_frames_client_and_later_frames_are_sent_again():
    w = World("q=127.0.0.1:1")
    w.up("q")
    link = w.sender("q")
    bad, good = w.client(), w.client()
    w.send(bad, "SEND", {"destination": "/queue/q", "receipt": "b"}, b"too much")
    w.send(good, "SEND", {"destination": "/queue/q", "receipt": "g"}, b"fine")
    first, _ = w.out(link)
    w.answer(link, "ERROR", {"message": "queue full", "receipt-id": first.headers["receipt"]}, b"The queue is full.")
    [error] = w.out(bad)
    assert (error.headers["message"], error.headers["receipt-id"]) == ("queue full", "b")
    assert b"The queue is full. (instance 127.0.0.1:1 of destination 'q')" in error.body
    assert w.out(good) == []
    w.up("q")
    frames = w.out(link)
    assert [f.body for f in frames] == [b"fine"]
    w.answer(link, "RECEIPT", {"receipt-id": frames[0].headers["receipt"]})
    assert [f.headers["receipt-id"] for f in w.out(good)] == ["g"]


def test_a_send_waits_for_an_instance_and_is_refused_when_none_comes_in_time():
    w = World("q=127.0.0.1:1")
    c = w.client()
    w.send(c, "SEND", {"destination": "/queue/q", "receipt": "r"}, b"x")
    w.now = 4.0
    w.tick()
    assert w.out(c) == []
    w.now = 5.5
    w.tick()
    [error] = w.out(c)
    assert error.headers["message"] == "message not stored"
    assert b"no instance of destination 'q' came up (127.0.0.1:1: not connected yet)" in error.body


def test_heart_beats_are_negotiated_and_a_silent_client_is_dropped():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client(**{"heart-beat": "1000,1000"})
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual", "prefetch-count": "1"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    w.out(c)
    w.now = 30.0
    w.tick(c)
    assert c.close_wanted and c.gone
    assert ("NACK", "1") in [(f.command, f.headers.get("id")) for f in w.out(link)]


def test_the_link_state_is_up_after_connected():
    w = World("q=127.0.0.1:1")
    assert w.up("q").state is UP


def test_an_ack_without_a_receipt_asks_none_of_the_instance_and_holds_up_nothing():
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "a", "ack": "client-individual"})
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    [m] = w.out(c)
    w.send(c, "ACK", {"id": m.headers["ack"]})
    w.send(c, "UNSUBSCRIBE", {"id": "a", "receipt": "u"})
    [ack, _] = w.out(link)
    assert ack.headers == {"id": "1"}
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["u"]


def test_count_of_a_destination_sums_its_instances_and_follows_their_changes():
    w = World("p=127.0.0.1:1,127.0.0.1:2")
    l1, l2 = w.up("p", 0), w.up("p", 1)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "./p/count", "id": "n", "receipt": "r"})
    first, receipt = w.out(c)
    assert first.headers["destination"] == "./p/count" and receipt.headers["receipt-id"] == "r"
    zero = {"rdy": 0, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0}
    endpoints = {"endpoints": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert json.loads(first.body) == {**zero, "instances": 2, "up": 2, **endpoints}
    w.answer(
        l1,
        "MESSAGE",
        {"subscription": "count", "message-id": "count-1", "destination": "./count", "rdy": "3", "wip": "1"},
    )
    w.answer(
        l2,
        "MESSAGE",
        {"subscription": "count", "message-id": "count-1", "destination": "./count", "rdy": "4", "wip": "0"},
    )
    assert [(f.headers["rdy"], f.headers["wip"]) for f in w.out(c)] == [("3", "1"), ("7", "1")]
    w.lose(l2, "connection lost")
    [down] = w.out(c)
    assert json.loads(down.body) == {**zero, "rdy": 3, "wip": 1, "instances": 2, "up": 1, **endpoints}
    w.send(c, "ACK", {"id": down.headers["message-id"], "receipt": "k"})
    assert [f.headers["receipt-id"] for f in w.out(c)] == ["k"]


def test_count_lists_the_instances_in_route_order_even_when_down():
    """The Spark source reads a destination's instances from here, so every routed one is
    listed, up or not, as HOST:PORT (an IPv6 host in brackets, as `endpoints` reads it)."""
    w = World("p=127.0.0.1:9,[::1]:8,127.0.0.1:7")
    w.up("p", 1)
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/p/count", "id": "n"})
    [first] = w.out(c)
    assert json.loads(first.body)["endpoints"] == ["127.0.0.1:9", "[::1]:8", "127.0.0.1:7"]
    assert (json.loads(first.body)["instances"], json.loads(first.body)["up"]) == (3, 1)


def users_world(*route: str) -> World:
    """A world whose router checks logins against alice (send on orders only) and bob (everything)."""
    w = World(*route)
    table = {
        "alice": users.User("alice", "!", frozenset({"send@orders", "count@orders"})),
        "bob": users.User("bob", "!", frozenset(users.PERMISSIONS)),
    }
    w.core.users = table

    def check(session: Peer, login: str, passcode: str, answer: Callable[[Answer], None]) -> None:
        w.pending.append((answer, table.get(login) if passcode == "pw" else None))

    w.core.check_login = check  # type: ignore[method-assign,assignment]
    return w


def login(w: World, name: str, passcode: str = "pw") -> Session:
    client = w.open()
    w.send(client, "CONNECT", {"accept-version": "1.2", "login": name, "passcode": passcode})
    return client


def test_frames_after_connect_wait_for_the_login_check_and_then_run_in_order():
    w = users_world("orders=127.0.0.1:1")
    w.up("orders")
    c = login(w, "alice")
    w.send(c, "SEND", {"destination": "/queue/orders", "receipt": "r"}, b"x")
    assert w.out(c) == [] and w.out(w.sender("orders")) == []
    answer, user = w.pending.pop()
    answer(user)
    assert [f.command for f in w.out(c)] == ["CONNECTED"]
    assert [f.body for f in w.out(w.sender("orders"))] == [b"x"]


@pytest.mark.parametrize(("name", "passcode"), [("alice", "wrong"), ("mallory", "pw")])
def test_a_failed_login_is_refused(name, passcode):
    w = users_world("orders=127.0.0.1:1")
    c = login(w, name, passcode)
    answer, user = w.pending.pop()
    answer(user)
    assert w.out(c) == []  # refused a fixed delay after CONNECT, whatever failed
    w.now += 1.0
    w.tick(c)
    [error] = w.out(c)
    assert error.headers["message"] == "access refused" and c.close_wanted


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"destination": "/queue/mail"}, "send permission needed for 'mail'"),
        ({"destination": "/queue/orders"}, None),
    ],
)
def test_a_permission_may_name_a_destination(headers, refused):
    w = users_world("orders=127.0.0.1:1", "mail=127.0.0.1:2")
    w.up("orders"), w.up("mail")
    c = login(w, "alice")
    answer, user = w.pending.pop()
    answer(user)
    w.out(c)
    w.send(c, "SEND", {**headers, "receipt": "r"}, b"x")
    if refused is None:
        assert w.out(c) == [] and len(w.out(w.sender("orders"))) == 1
        return
    [error] = w.out(c)
    assert error.headers["message"] == refused
    assert b"curb passwd USERS-FILE alice --perm send" in error.body and b"--perm send@mail" in error.body


def test_consuming_needs_consume_and_counting_needs_count_for_the_destination():
    w = users_world("orders=127.0.0.1:1")
    w.up("orders")
    c = login(w, "alice")
    answer, user = w.pending.pop()
    answer(user)
    w.out(c)
    w.send(c, "SUBSCRIBE", {"destination": "./orders/count", "id": "n"})
    assert [f.headers["destination"] for f in w.out(c)] == ["./orders/count"]
    w.send(c, "SUBSCRIBE", {"destination": "/queue/orders", "id": "s"})
    [error] = w.out(c)
    assert error.headers["message"] == "consume permission needed for 'orders'"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"curb-ack-timeout": "-1"}, "bad curb-ack-timeout header"),
    ],
)
def test_an_own_ack_deadline_is_refused_and_subscribes_nothing_upstream(headers, message):
    """A curb-ack-timeout was dropped without a word: an ERROR now, and the instance sees
    no SUBSCRIBE."""
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)  # its ./count subscription
    c = w.client()
    w.send(c, "SUBSCRIBE", {"destination": "/queue/q", "id": "s", "receipt": "r", **headers})
    [error] = w.out(c)
    assert error.command == "ERROR" and error.headers["message"] == message
    assert error.body.strip()
    assert w.out(link) == []


@pytest.mark.parametrize(
    "bad",
    [{"curb-delay": "-1"}, {"curb-delay": "1", "AMQ_SCHEDULED_DELAY": "2"}, {"AMQ_SCHEDULED_PERIOD": "1000"}],
)
def test_a_send_an_instance_would_refuse_is_refused_before_it_is_forwarded_or_held(bad):
    """A COMMIT forwarded every SEND it held, and the instance stored those around one it
    refused: the router checks each SEND by the instances' own rule as it comes, so a
    transaction holds only SENDs an instance takes, and a bad one ends the connection
    (and its transaction) with nothing forwarded."""
    w = World("q=127.0.0.1:1")
    w.up("q")
    sender = w.sender("q")
    c = w.client()
    w.send(c, "BEGIN", {"transaction": "t"})
    w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t"}, b"first")
    w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t", "receipt": "bad", **bad}, b"second")
    w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t"}, b"third")
    w.send(c, "COMMIT", {"transaction": "t", "receipt": "done"})
    [error] = w.out(c)
    assert error.command == "ERROR" and error.headers["receipt-id"] == "bad"
    assert c.close_wanted
    assert w.out(sender) == []


def test_a_send_with_a_bad_delay_outside_a_transaction_is_refused_as_an_instance_would():
    w = World("q=127.0.0.1:1")
    w.up("q")
    c = w.client()
    w.send(c, "SEND", {"destination": "/queue/q", "curb-delay": "soon", "receipt": "r"}, b"x")
    [error] = w.out(c)
    assert error.command == "ERROR" and "curb-delay" in error.headers["message"]
    assert w.out(w.sender("q")) == []


def test_transactions_are_bounded_per_connection_and_the_bytes_come_back():
    """One client held 400 x 1 MiB SENDs in open transactions and took the router from 45
    to 455 MB: a connection's transactions now hold a bounded number of frames and bytes,
    past which the frame is an ERROR and nothing of the transaction is forwarded."""
    w = World("q=127.0.0.1:1")
    w.up("q")
    c = w.client()
    assert c.transactions is not None
    c.transactions.max_bytes = 10_000
    w.send(c, "BEGIN", {"transaction": "t"})
    for _ in range(9):
        w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t"}, b"x" * 1000)
    assert w.core.transactions.held > 9000
    w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t", "receipt": "big"}, b"x" * 1000)
    [error] = w.out(c)
    assert (error.headers["message"], error.headers["receipt-id"]) == ("transaction too large", "big")
    assert w.out(w.sender("q")) == []
    assert w.core.transactions.held == 0, "the refused connection's transactions gave their bytes back"


def test_transactions_of_all_connections_share_a_bound():
    w = World("q=127.0.0.1:1")
    w.up("q")
    w.core.transactions.limit = 5_000
    first, second = w.client(), w.client()
    for client in (first, second):
        w.send(client, "BEGIN", {"transaction": "t"})
    w.send(first, "SEND", {"destination": "/queue/q", "transaction": "t"}, b"x" * 3000)
    w.send(second, "SEND", {"destination": "/queue/q", "transaction": "t", "receipt": "r"}, b"x" * 3000)
    [error] = w.out(second)
    assert error.headers["message"] == "router busy: transactions hold too much"
    w.send(first, "COMMIT", {"transaction": "t"})
    assert [f.body for f in w.out(w.sender("q"))] == [b"x" * 3000]
    assert w.core.transactions.held == 0


@pytest.mark.parametrize("end", ["ABORT", "DISCONNECT", "gone"])
def test_whatever_ends_a_transaction_gives_its_bytes_back(end):
    w = World("q=127.0.0.1:1")
    w.up("q")
    c = w.client()
    w.send(c, "BEGIN", {"transaction": "t"})
    w.send(c, "SEND", {"destination": "/queue/q", "transaction": "t"}, b"x" * 500)
    assert w.core.transactions.held > 500
    if end == "gone":
        c.connection_lost()
    else:
        w.send(c, end, {"transaction": "t"} if end == "ABORT" else {})
    assert w.core.transactions.held == 0


def spawning_world() -> tuple[World, list[str]]:
    """A router with -spawn, and the names it asked its spawner for (each one spawned)."""
    w = World("q=127.0.0.1:1")
    asked: list[str] = []

    def spawn(wanted: str) -> bool:
        asked.append(wanted)
        return True

    w.core.placement.spawn = spawn
    return w, asked


@pytest.mark.parametrize("name", [".", "..", ".hidden", "-x", "_x", "a" * 65])
def test_spawn_starts_no_instance_for_a_name_it_does_not_take(name):
    """With -spawn, `.`, `..` and names a file system or a command line would take for
    something else created instances (DIR/NAME.log): refused now, with the rule."""
    w, asked = spawning_world()
    c = w.client()
    w.send(c, "SEND", {"destination": f"/queue/{name}", "receipt": "r"}, b"x")
    [error] = w.out(c)
    assert error.command == "ERROR" and error.headers["message"].startswith("unknown destination")
    assert b"-spawn starts an instance for a new NAME" in error.body
    assert asked == []


def test_spawn_starts_an_instance_for_a_plain_name():
    w, asked = spawning_world()
    c = w.client()
    w.send(c, "SEND", {"destination": "/queue/orders-2.eu", "receipt": "r"}, b"x")
    assert asked == ["orders-2.eu"]


def test_an_own_ack_deadline_is_kept_by_the_router_as_an_instance_keeps_it():
    """curb-ack-timeout was dropped without a word: the router keeps it now. Past it the
    message goes back to its instance (a plain NACK: the client had it), and the client's
    ACK is late; a NACK curb-touch moves it, on the instance too."""
    w = World("q=127.0.0.1:1")
    link = w.up("q")
    w.out(link)
    c = w.client()
    w.send(
        c, "SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual", "curb-ack-timeout": "5000"}
    )
    sub_id = w.out(link)[-1].headers["id"]
    w.answer(link, *message(sub_id, 1))
    w.answer(link, *message(sub_id, 2))
    m1, m2 = w.out(c)
    w.now = 4.0
    w.send(c, "NACK", {"id": m2.headers["ack"], "curb-touch": "10000"})
    assert [(f.command, f.headers) for f in w.out(link)] == [("NACK", {"id": "2", "curb-touch": "10000"})]
    w.now = 5.5
    w.tick()
    assert [(f.command, f.headers) for f in w.out(link)] == [("NACK", {"id": "1"})]
    w.send(c, "ACK", {"id": m1.headers["ack"], "receipt": "late"})
    w.send(c, "ACK", {"id": m2.headers["ack"], "receipt": "in-time"})
    acks = w.out(link)
    assert [(f.command, f.headers["id"]) for f in acks] == [("ACK", "2"), ("ACK", "count-0")]
    w.answer(link, "RECEIPT", {"receipt-id": acks[-1].headers["receipt"]})
    assert [f.headers for f in w.out(c)] == [
        {"receipt-id": "late", "curb-late": "true"},
        {"receipt-id": "in-time"},
    ]
