"""The STOMP session rules of a running broker, seen from outside: a real client (stomp.py)
for what well-behaved clients do, raw sockets for what they should not."""

from __future__ import annotations

import json
import time

import pytest

import curb
from curb.frame import encode

QUEUE = "/queue/curb"


def produce(stomp_conn, port: int, bodies, headers: dict[str, str] | None = None, **send_kwargs) -> None:
    """Send the bodies on a fresh connection and return once the last one's RECEIPT came."""
    conn, inbox = stomp_conn(port, **send_kwargs)
    for body in bodies[:-1]:
        conn.send(QUEUE, body, headers=dict(headers or {}))
    conn.send(QUEUE, bodies[-1], headers=dict(headers or {}), receipt="produced")
    inbox.wait_receipt("produced")


def consume(stomp_conn, port: int, ack: str = "client-individual", prefetch: int | None = None, **conn_kwargs):
    """A subscribed consumer: (connection, inbox)."""
    conn, inbox = stomp_conn(port, **conn_kwargs)
    headers = {} if prefetch is None else {"prefetch-count": str(prefetch)}
    conn.subscribe(QUEUE, id="sub", ack=ack, headers=headers)
    return conn, inbox


def bodies_of(messages) -> list:
    return [m.body for m in messages]


def hang_up(conn, inbox) -> None:
    """DISCONNECT and wait for its RECEIPT (stomp.py's disconnect(receipt=...) waits unbounded)."""
    conn.send_frame("DISCONNECT", {"receipt": "bye"})
    inbox.wait_receipt("bye")


def assert_serving(stomp_conn, conn, inbox) -> None:
    """A connection opened before some other client's trouble still sends and receives."""
    conn.send(QUEUE, "still here", receipt="still-here")
    inbox.wait_receipt("still-here")
    conn.subscribe(QUEUE, id="bystander", ack="auto")
    inbox.wait_for(lambda box: "still here" in bodies_of(box.messages), "the bystander's own message")
    assert not inbox.errors


# ---------------------------------------------------------------- stomp.py: the happy paths


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_connect_negotiates_stomp_1_2(curb_broker, stomp_conn, command):
    broker = curb_broker(extra_args=["-heartbeat", "400ms"])
    conn, inbox = stomp_conn(broker.port, connect=False)
    conn.connect(with_connect_command=command == "CONNECT")
    headers = inbox.wait_connected().headers
    assert headers["version"] == "1.2"
    assert headers["server"] == f"curb/{curb.__version__}"
    sx, sy = (int(x) for x in headers["heart-beat"].split(","))
    assert sx >= 0 and sy >= 0


def test_send_receipt_then_subscribe_and_ack(broker, stomp_conn):
    produce(stomp_conn, broker.port, ["hello"])
    conn, inbox = consume(stomp_conn, broker.port)
    [message] = inbox.wait_messages(1)
    headers = message.headers
    assert message.body == "hello"
    assert headers["subscription"] == "sub"
    assert headers["ack"] == headers["message-id"]
    assert int(headers["message-id"]) >= 0
    assert headers["destination"]
    assert headers["content-length"] == "5"
    assert "redelivered" not in headers
    conn.ack(headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    hang_up(conn, inbox)
    _, later = consume(stomp_conn, broker.port)
    assert later.quiet() == [], "an ACKed message was delivered again"


def test_nack_redelivers_ahead_of_newer_messages(curb_broker, stomp_conn):
    broker = curb_broker(extra_args=["-redelivery-delay", "0"])  # back at once: the order is the subject
    produce(stomp_conn, broker.port, ["first", "second", "third"])
    conn, inbox = consume(stomp_conn, broker.port, prefetch=2)
    first, second = inbox.wait_messages(2)
    assert bodies_of([first, second]) == ["first", "second"]
    conn.nack(first.headers["ack"], receipt="nacked")
    inbox.wait_receipt("nacked")
    again = inbox.wait_messages(3)[2]
    assert again.body == "first", "a NACKed message must come back before never-delivered ones"
    assert again.headers["redelivered"] == "true"
    assert again.headers["curb-deliveries"] == "2"
    assert again.headers["message-id"] == first.headers["message-id"]
    conn.ack(again.headers["ack"])
    conn.ack(second.headers["ack"])
    assert inbox.wait_messages(4)[3].body == "third"


def test_content_type_and_user_headers_come_back(broker, stomp_conn):
    produce(
        stomp_conn,
        broker.port,
        ['{"n": 1}'],
        headers={"content-type": "application/json", "x-trace": "t-42", "x-odd": "a:b\\c\nd"},
    )
    _, inbox = consume(stomp_conn, broker.port)
    [message] = inbox.wait_messages(1)
    assert message.headers["content-type"] == "application/json"
    assert message.headers["x-trace"] == "t-42"
    assert message.headers["x-odd"] == "a:b\\c\nd"
    assert message.body == '{"n": 1}'


def test_body_with_nul_bytes_round_trips(broker, stomp_conn):
    body = bytes(range(256)) * 3 + b"\0\0end\0"
    produce(stomp_conn, broker.port, [body], auto_decode=False)
    _, inbox = consume(stomp_conn, broker.port, auto_decode=False)
    [message] = inbox.wait_messages(1)
    assert message.body == body
    assert message.headers["content-length"] == str(len(body))


def test_messages_come_in_fifo_order(broker, stomp_conn):
    sent = [f"m{i}" for i in range(25)]
    produce(stomp_conn, broker.port, sent)
    _, inbox = consume(stomp_conn, broker.port, prefetch=100)
    received = inbox.wait_messages(len(sent))
    assert bodies_of(received) == sent
    ids = [int(m.headers["message-id"]) for m in received]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_unsubscribe_pauses_delivery_but_ack_still_works(broker, stomp_conn):
    produce(stomp_conn, broker.port, ["a", "b", "c", "d"])
    conn, inbox = consume(stomp_conn, broker.port, prefetch=2)
    held = inbox.wait_messages(2)
    conn.unsubscribe("sub", receipt="unsubscribed")
    inbox.wait_receipt("unsubscribed")
    for message in held:
        conn.ack(message.headers["ack"], receipt=f"ack-{message.body}")
        inbox.wait_receipt(f"ack-{message.body}")
    assert len(inbox.quiet()) == 2, "UNSUBSCRIBE must stop deliveries"
    assert not inbox.errors
    _, other = consume(stomp_conn, broker.port)
    assert bodies_of(other.wait_messages(2)) == ["c", "d"]
    assert len(other.quiet()) == 2


def test_disconnect_gets_receipt_and_wip_goes_to_another_consumer(curb_broker, stomp_conn, raw):
    broker = curb_broker(extra_args=["-redelivery-delay", "0"])  # back at once: the order is the subject
    produce(stomp_conn, broker.port, ["one", "two", "three"])
    client = raw(broker.port)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "client-individual", "prefetch-count": "2"})
    assert [client.read_frame().body for _ in range(2)] == [b"one", b"two"]
    client.send_frame("DISCONNECT", {"receipt": "bye"})
    receipt = client.read_frame()
    assert receipt is not None and receipt.command == "RECEIPT"
    assert receipt.headers["receipt-id"] == "bye"
    assert client.closed()
    _, inbox = consume(stomp_conn, broker.port)
    messages = inbox.wait_messages(3)
    assert bodies_of(messages) == ["one", "two", "three"]
    assert [m.headers.get("redelivered") for m in messages] == ["true", "true", None]


def test_consumer_gone_without_ack_hands_its_messages_to_another(broker, stomp_conn, raw):
    produce(stomp_conn, broker.port, ["x", "y"])
    client = raw(broker.port)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "client-individual"})
    assert [client.read_frame().body for _ in range(2)] == [b"x", b"y"]
    _, inbox = consume(stomp_conn, broker.port)
    assert inbox.quiet() == [], "messages held by a live consumer went to another"
    client.close()
    messages = inbox.wait_messages(2)
    assert bodies_of(messages) == ["x", "y"]
    assert all(m.headers["redelivered"] == "true" for m in messages)


def test_competing_consumers_get_distinct_messages_exactly_once(broker, stomp_conn, wait_until):
    consumers = [consume(stomp_conn, broker.port, prefetch=1000) for _ in range(3)]
    sent = [f"job-{i}" for i in range(30)]
    produce(stomp_conn, broker.port, sent)
    for _, inbox in consumers:
        inbox.wait_for(lambda box: len(box.messages) > 0, "a share of the work")
    assert wait_until(lambda: sum(len(inbox.messages) for _, inbox in consumers) >= len(sent))
    consumers[0][1].quiet()
    got = [m.body for _, inbox in consumers for m in inbox.messages]
    assert sorted(got) == sorted(sent), "each message exactly once across the consumers"


def test_a_consumer_that_stops_reading_gets_no_more_and_others_are_served(curb_broker, stomp_conn, raw):
    """Back-pressure: with a huge prefetch, a consumer that never reads its socket is sent
    only what its buffers hold; the rest goes to a consumer that reads, while the first is
    still connected. Once it goes, what it held is redelivered."""
    broker = curb_broker(cap="64MiB")
    stalled = raw(broker.port)
    stalled.connect()
    stalled.send_frame(
        "SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "client-individual", "prefetch-count": "10000"}
    )
    count = 300
    produce(stomp_conn, broker.port, [f"{i:04d}-" + "x" * 65536 for i in range(count)])
    _, inbox = consume(stomp_conn, broker.port, prefetch=10000, auto_decode=False)
    inbox.wait_for(lambda box: len(box.messages) >= count // 3, "the messages the stalled consumer cannot take")
    served_while_stalled = len(inbox.quiet())
    assert count // 3 <= served_while_stalled < count
    stalled.close()
    messages = inbox.wait_messages(count)
    assert sorted(m.body[:4] for m in messages) == [b"%04d" % i for i in range(count)]


@pytest.mark.parametrize("header", ["prefetch-count", "activemq.prefetchSize"])
def test_prefetch_header_bounds_unacked_messages(broker, stomp_conn, header):
    produce(stomp_conn, broker.port, [f"p{i}" for i in range(6)])
    conn, inbox = stomp_conn(broker.port)
    conn.subscribe(QUEUE, id="sub", ack="client-individual", headers={header: "2"})
    first = inbox.wait_messages(2)
    assert len(inbox.quiet()) == 2, f"{header}:2 must hold the subscription at 2 unacked messages"
    conn.ack(first[0].headers["ack"])
    inbox.wait_messages(3)
    assert len(inbox.quiet()) == 3, "one ACK frees room for one more message"


def test_server_default_prefetch_is_the_flag(curb_broker, stomp_conn):
    broker = curb_broker(extra_args=["-prefetch", "3"])
    produce(stomp_conn, broker.port, [f"d{i}" for i in range(6)])
    _, inbox = consume(stomp_conn, broker.port)
    inbox.wait_messages(3)
    assert len(inbox.quiet()) == 3


def test_server_default_prefetch_is_100(broker, stomp_conn):
    produce(stomp_conn, broker.port, [f"q{i}" for i in range(110)])
    _, inbox = consume(stomp_conn, broker.port)
    inbox.wait_messages(100)
    assert len(inbox.quiet()) == 100, "a subscription without prefetch-count must not take the whole queue"


def test_auto_ack_mode_needs_no_ack(broker, stomp_conn):
    produce(stomp_conn, broker.port, ["auto1", "auto2"])
    conn, inbox = consume(stomp_conn, broker.port, ack="auto")
    assert bodies_of(inbox.wait_messages(2)) == ["auto1", "auto2"]
    hang_up(conn, inbox)
    _, later = consume(stomp_conn, broker.port)
    assert later.quiet() == [], "messages delivered in auto mode are done"


def test_client_ack_mode_is_cumulative(broker, stomp_conn):
    produce(stomp_conn, broker.port, ["c1", "c2", "c3"])
    conn, inbox = consume(stomp_conn, broker.port, ack="client")
    messages = inbox.wait_messages(3)
    conn.ack(messages[1].headers["ack"], receipt="upto-c2")
    inbox.wait_receipt("upto-c2")
    hang_up(conn, inbox)
    _, later = consume(stomp_conn, broker.port)
    assert bodies_of(later.wait_messages(1)) == ["c3"]
    assert len(later.quiet()) == 1, "ACK in client mode covers every earlier message"


def test_receipts_on_subscribe_unsubscribe_ack_nack(broker, stomp_conn):
    produce(stomp_conn, broker.port, ["r1", "r2"])
    conn, inbox = stomp_conn(broker.port)
    conn.subscribe(QUEUE, id="sub", ack="client-individual", receipt="subscribed")
    inbox.wait_receipt("subscribed")
    first, second = inbox.wait_messages(2)
    conn.ack(first.headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    conn.nack(second.headers["ack"], receipt="nacked")
    inbox.wait_receipt("nacked")
    conn.unsubscribe("sub", receipt="unsubscribed")
    inbox.wait_receipt("unsubscribed")
    assert not inbox.errors


def test_count_subscription_reports_counts_at_once_and_on_change(broker, stomp_conn):
    watcher, counts = stomp_conn(broker.port)
    watcher.subscribe("./count", id="count", ack="auto")

    def latest(box) -> dict:
        return json.loads(box.messages[-1].body) if box.messages else {}

    [first] = counts.wait_messages(1)
    assert json.loads(first.body) == {"rdy": 0, "wip": 0, "delayed": 0, "dead": 0, "subscriptions": 0}
    assert (first.headers["rdy"], first.headers["wip"]) == ("0", "0")
    produce(stomp_conn, broker.port, ["n1", "n2"])
    counts.wait_for(lambda box: latest(box).get("rdy") == 2, "a count with rdy 2")
    conn, inbox = consume(stomp_conn, broker.port)
    held = inbox.wait_messages(2)
    counts.wait_for(
        lambda box: latest(box) == {"rdy": 0, "wip": 2, "delayed": 0, "dead": 0, "subscriptions": 1},
        "a count with 2 wip on 1 subscription",
    )
    assert (counts.messages[-1].headers["rdy"], counts.messages[-1].headers["wip"]) == ("0", "2")
    for message in held:
        conn.ack(message.headers["ack"])
    counts.wait_for(lambda box: latest(box).get("wip") == 0, "a count with 0 wip after the ACKs")


def test_messages_and_headers_survive_a_clean_restart(broker, stomp_conn):
    produce(
        stomp_conn,
        broker.port,
        ["keep-1", "keep-2", "keep-3"],
        headers={"content-type": "text/plain", "x-origin": "restart-test"},
    )
    conn, inbox = consume(stomp_conn, broker.port, prefetch=1)
    [done] = inbox.wait_messages(1)
    conn.ack(done.headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    assert broker.stop() == 0
    broker.start()
    _, after = consume(stomp_conn, broker.port)
    messages = after.wait_messages(2)
    assert bodies_of(messages) == ["keep-2", "keep-3"]
    assert all(m.headers["content-type"] == "text/plain" for m in messages)
    assert all(m.headers["x-origin"] == "restart-test" for m in messages)
    assert len(after.quiet()) == 2, "an ACKed message came back after a restart"


# ---------------------------------------------------------------- raw sockets: errors


def error_then_close(client):
    """The frames the broker sent until it closed: must be exactly one ERROR."""
    assert client.closed(), "the broker kept the connection open after the bad frame"
    frames = list(client.frames)
    assert [f.command for f in frames] == ["ERROR"], f"expected one ERROR then close, got {frames}"
    error = frames[0]
    assert error.headers.get("message"), "ERROR without a message header"
    return error


BAD_INPUT = {
    "frame before CONNECT": (False, b"SEND\ndestination:/queue/curb\nreceipt:r-early\n\nhi\0", "r-early"),
    "header line without colon": (True, b"SEND\ndestination:/queue/curb\nno-colon-here\n\nhi\0", None),
    "undefined escape": (True, b"SEND\ndestination:/queue/curb\nx-note:tab\\there\n\nhi\0", None),
    "content-length not a number": (True, b"SEND\ncontent-length:ten\n\nhi\0", None),
    "content-length negative": (True, b"SEND\ncontent-length:-1\n\nhi\0", None),
    "content-length shorter than body": (True, b"SEND\ncontent-length:1\n\nhello\0", None),
    "frame over -max-frame": (True, b"SEND\ncontent-length:8192\n\n" + b"x" * 8192 + b"\0", None),
    "frame over -max-frame, no content-length": (True, b"SEND\n\n" + b"x" * 8192 + b"\0", None),
    "unknown command": (True, b"FROB\nreceipt:r-frob\n\n\0", "r-frob"),
    "BEGIN": (True, b"BEGIN\ntransaction:t1\nreceipt:r-begin\n\n\0", "r-begin"),
    "COMMIT": (True, b"COMMIT\ntransaction:t1\nreceipt:r-commit\n\n\0", "r-commit"),
    "ABORT": (True, b"ABORT\ntransaction:t1\nreceipt:r-abort\n\n\0", "r-abort"),
    "second SUBSCRIBE": (
        True,
        b"SUBSCRIBE\nid:a\ndestination:/queue/curb\n\n\0SUBSCRIBE\nid:b\ndestination:/queue/curb\nreceipt:r-sub2\n\n\0",
        "r-sub2",
    ),
    "SUBSCRIBE without id": (True, b"SUBSCRIBE\ndestination:/queue/curb\nreceipt:r-noid\n\n\0", "r-noid"),
    "ACK of an unknown id": (True, b"ACK\nid:424242\nreceipt:r-ack\n\n\0", "r-ack"),
    "NACK of an unknown id": (True, b"NACK\nid:424242\nreceipt:r-nack\n\n\0", "r-nack"),
    "ACK without id": (True, b"ACK\nreceipt:r-ackid\n\n\0", "r-ackid"),
}


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_gets_one_error_and_a_close_others_unaffected(curb_broker, stomp_conn, raw, name):
    connect_first, data, receipt = BAD_INPUT[name]
    broker = curb_broker(extra_args=["-max-frame", "4KiB"])
    bystander = stomp_conn(broker.port)
    client = raw(broker.port)
    if connect_first:
        client.connect()
    client.send(data)
    error = error_then_close(client)
    if receipt is not None:
        assert error.headers.get("receipt-id") == receipt
    assert_serving(stomp_conn, *bystander)


@pytest.mark.parametrize("accept", [None, "1.0", "1.0,1.1"])
def test_connect_without_1_2_is_refused_with_the_version_we_speak(broker, raw, accept):
    client = raw(broker.port)
    headers = {"host": "localhost"} if accept is None else {"host": "localhost", "accept-version": accept}
    client.send_frame("CONNECT", headers)
    error = error_then_close(client)
    assert "1.2" in error.headers.get("version", "").split(",")


def test_ack_of_a_message_delivered_to_another_connection_is_an_error(broker, stomp_conn, raw):
    produce(stomp_conn, broker.port, ["mine"])
    owner, inbox = consume(stomp_conn, broker.port)
    [message] = inbox.wait_messages(1)
    thief = raw(broker.port)
    thief.connect()
    thief.send_frame("SUBSCRIBE", {"id": "t", "destination": QUEUE, "ack": "client-individual"})
    thief.send_frame("ACK", {"id": message.headers["ack"], "receipt": "r-steal"})
    assert error_then_close(thief).headers.get("receipt-id") == "r-steal"
    owner.ack(message.headers["ack"], receipt="mine-acked")
    inbox.wait_receipt("mine-acked")
    assert not inbox.errors


def test_message_too_large_for_the_cap_is_refused_and_not_stored(curb_broker, stomp_conn, raw):
    broker = curb_broker(cap="64KiB")
    bystander = stomp_conn(broker.port)
    client = raw(broker.port)
    client.connect()
    client.send_frame("SEND", {"destination": QUEUE, "receipt": "r-big"}, b"b" * 100 * 1024)
    error = error_then_close(client)
    assert error.headers.get("receipt-id") == "r-big"
    assert "large" in error.headers["message"]
    checker, inbox = consume(stomp_conn, broker.port)
    assert inbox.quiet() == [], "a refused message was stored"
    hang_up(checker, inbox)
    assert_serving(stomp_conn, *bystander)


def test_send_to_a_full_queue_is_refused_and_not_stored(curb_broker, stomp_conn, raw):
    broker = curb_broker(cap="64KiB")
    client = raw(broker.port)
    client.connect()
    stored = []
    for i in range(1000):
        body = b"%04d" % i + b"f" * 1020
        client.send_frame("SEND", {"destination": QUEUE, "receipt": f"r{i}"}, body)
        answer = client.read_frame()
        assert answer is not None, f"no answer to SEND {i}"
        if answer.command == "ERROR":
            break
        assert answer.headers["receipt-id"] == f"r{i}"
        stored.append(body)
    else:
        pytest.fail("1000 KiB went into a 64 KiB queue without a queue-full ERROR")
    assert "full" in answer.headers["message"]
    assert answer.headers.get("receipt-id") == f"r{i}"
    assert client.closed()
    assert stored, "not even one message fit"
    _, inbox = consume(stomp_conn, broker.port, ack="auto", prefetch=1000, auto_decode=False)
    inbox.wait_messages(len(stored))
    assert bodies_of(inbox.quiet()) == stored, "the refused message was stored, or a stored one lost"


# ---------------------------------------------------------------- raw sockets: heart-beats and framing


def test_server_sends_the_heart_beats_a_client_asks_for(curb_broker, raw):
    broker = curb_broker(extra_args=["-heartbeat", "200ms"])
    client = raw(broker.port)
    connected = client.connect(heart_beat="0,500")
    sx = int(connected.headers["heart-beat"].split(",")[0])
    assert sx > 0, "the broker offers no heart-beats although it was started with -heartbeat 200ms"
    every = max(sx, 500) / 1000
    deadline = time.monotonic() + 4 * every + 2
    beats = 0
    while beats < 3 and time.monotonic() < deadline:
        beats += client.read_bytes(deadline - time.monotonic()).count(b"\n")
    assert beats >= 3, f"expected a heart-beat about every {every}s"
    assert not client.frames


def connect_silent_consumer(port: int, raw):
    """A consumer that promised heart-beats every 300 ms and holds one message."""
    client = raw(port)
    connected = client.connect(heart_beat="300,0")
    assert int(connected.headers["heart-beat"].split(",")[1]) > 0, "the broker wants no heart-beats"
    client.send_frame("SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "client-individual"})
    message = client.read_frame()
    assert message is not None and message.body == b"held"
    return client


def test_silent_client_is_dropped_and_its_wip_redelivered(curb_broker, stomp_conn, raw):
    broker = curb_broker(extra_args=["-heartbeat", "200ms"])
    produce(stomp_conn, broker.port, ["held"])
    client = connect_silent_consumer(broker.port, raw)
    _, inbox = consume(stomp_conn, broker.port)
    assert client.closed(), "a client that stopped its heart-beats was not dropped"
    [message] = inbox.wait_messages(1)
    assert message.body == "held" and message.headers["redelivered"] == "true"


def test_client_that_keeps_beating_stays(curb_broker, stomp_conn, raw):
    broker = curb_broker(extra_args=["-heartbeat", "200ms"])
    produce(stomp_conn, broker.port, ["held"])
    client = connect_silent_consumer(broker.port, raw)
    _, inbox = consume(stomp_conn, broker.port)
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        client.send(b"\n")
        assert not client.closed(timeout=0.25), "dropped although it kept beating"
    assert inbox.messages == []


def test_frames_trickling_in_byte_by_byte_work(broker, stomp_conn, raw):
    client = raw(broker.port)
    data = (
        b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
        b"SEND\ndestination:/queue/curb\nreceipt:slow\ncontent-length:6\n\ntrick\0\0"
    )
    for byte in data:
        client.send(bytes([byte]))
        time.sleep(0.001)
    assert client.read_frame().command == "CONNECTED"
    receipt = client.read_frame()
    assert receipt.command == "RECEIPT" and receipt.headers["receipt-id"] == "slow"
    _, inbox = consume(stomp_conn, broker.port)
    assert inbox.wait_messages(1)[0].body == "trick\0"


def test_many_frames_in_one_write_work(broker, raw):
    client = raw(broker.port)
    count = 30
    data = b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
    data += b"".join(b"SEND\ndestination:/queue/curb\nreceipt:s%d\n\nbulk-%d\0" % (i, i) for i in range(count))
    data += b"SUBSCRIBE\nid:s\ndestination:/queue/curb\nack:client-individual\n\n\0"
    client.send(data)
    frames = [client.read_frame() for _ in range(1 + 2 * count)]
    assert None not in frames, f"missing frames: {frames}"
    assert frames[0].command == "CONNECTED"
    receipts = [f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"]
    messages = [f.body for f in frames if f.command == "MESSAGE"]
    assert receipts == [f"s{i}" for i in range(count)]
    assert messages == [b"bulk-%d" % i for i in range(count)]


def test_pipelined_receipts_come_in_frame_order(broker, raw):
    client = raw(broker.port)
    client.connect()
    client.send(
        b"SEND\ndestination:/queue/curb\nreceipt:send-1\n\none\0"
        b"SUBSCRIBE\nid:s\ndestination:/queue/curb\nack:client-individual\nreceipt:subscribe\n\n\0"
        b"SEND\ndestination:/queue/curb\nreceipt:send-2\n\ntwo\0"
        b"DISCONNECT\nreceipt:disconnect\n\n\0"
    )
    assert client.closed()
    receipts = [f.headers["receipt-id"] for f in client.frames if f.command == "RECEIPT"]
    assert receipts == ["send-1", "subscribe", "send-2", "disconnect"]


# ---------------------------------------------------------------- an ERROR waits for the receipts before it

# Bad frames that follow receipted SENDs, ACKs and a NACK in the same write (a broker
# with -max-frame 4KiB): each draws an ERROR only after the receipts owed before it.
BAD_AFTER_RECEIPTS = {
    "header line without colon": b"SEND\ndestination:/queue/curb\nno-colon-here\n\nhi\0",
    "unknown command": b"FROB\nreceipt:r-bad\n\n\0",
    "BEGIN": b"BEGIN\ntransaction:t1\nreceipt:r-bad\n\n\0",
    "ACK of an unknown id": b"ACK\nid:424242\nreceipt:r-bad\n\n\0",
    "second SUBSCRIBE": b"SUBSCRIBE\nid:b\ndestination:/queue/curb\nreceipt:r-bad\n\n\0",
    "content-length not a number": b"SEND\ncontent-length:ten\n\nhi\0",
    "frame over -max-frame": b"SEND\ncontent-length:8192\n\n" + b"x" * 8192 + b"\0",
    "CONNECT again": b"CONNECT\naccept-version:1.2\nreceipt:r-bad\n\n\0",
}


@pytest.mark.parametrize("name", list(BAD_AFTER_RECEIPTS))
def test_an_error_comes_after_the_receipts_of_the_frames_before_it(curb_broker, stomp_conn, raw, name):
    broker = curb_broker(extra_args=["-max-frame", "4KiB"])
    produce(stomp_conn, broker.port, ["held 1", "held 2", "held 3"])
    client = raw(broker.port)
    client.connect()
    client.send_frame("SUBSCRIBE", {"id": "s", "destination": QUEUE, "ack": "client-individual"})
    ids = [client.read_frame().headers["ack"] for _ in range(3)]
    client.send(
        b"SEND\ndestination:/queue/curb\nreceipt:s1\n\nnew 1\0"
        b"ACK\nid:%s\nreceipt:a1\n\n\0"
        b"SEND\ndestination:/queue/curb\nreceipt:s2\n\nnew 2\0"
        b"NACK\nid:%s\nreceipt:n2\n\n\0"
        b"ACK\nid:%s\nreceipt:a3\n\n\0" % tuple(i.encode() for i in ids) + BAD_AFTER_RECEIPTS[name]
    )
    assert client.closed()
    answers = [f for f in client.frames if f.command != "MESSAGE"]
    assert [f.headers.get("receipt-id") for f in answers[:-1]] == ["s1", "a1", "s2", "n2", "a3"], answers
    assert answers[-1].command == "ERROR" and answers[-1].body.strip(), answers
    _, inbox = consume(stomp_conn, broker.port, ack="auto")
    inbox.wait_messages(3)
    assert sorted(bodies_of(inbox.quiet())) == ["held 2", "new 1", "new 2"], "the receipted frames took effect"


def test_a_pipelined_producer_at_a_full_queue_gets_a_receipt_for_every_stored_message(curb_broker, stomp_conn, raw):
    broker = curb_broker(cap="64KiB")
    client = raw(broker.port)
    client.connect()
    receipted: list[bytes] = []
    error = None
    for batch in range(100):
        bodies = [b"%03d-%02d " % (batch, n) + b"f" * 1000 for n in range(16)]
        client.send(
            b"".join(encode("SEND", {"destination": QUEUE, "receipt": body[:6].decode()}, body) for body in bodies)
        )
        for body in bodies:
            answer = client.read_frame()
            assert answer is not None, f"no answer to SEND {body[:6]!r}"
            if answer.command == "ERROR":
                error = answer
                break
            assert answer.headers["receipt-id"] == body[:6].decode(), "receipts in frame order"
            receipted.append(body)
        if error is not None:
            break
    assert error is not None, "1.6 MB went into a 64 KiB queue without an ERROR"
    assert "full" in error.headers["message"] or error.headers["message"] == "message not stored"
    assert client.closed() and not client.frames, "nothing after the ERROR"
    _, inbox = consume(stomp_conn, broker.port, ack="auto", prefetch=1000, auto_decode=False)
    inbox.wait_messages(len(receipted))
    stored = bodies_of(inbox.quiet())
    assert stored == receipted, (
        f"{len(stored)} messages stored, {len(receipted)} receipted: "
        f"{len(set(stored) - set(receipted))} stored without a RECEIPT"
    )
