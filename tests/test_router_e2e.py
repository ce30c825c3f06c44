"""`curb router` for real: stomp.py and Curb's client through a router process to Curb
instances, each a real `curb` process on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from conftest import RouterProcess, wait_until

from curb.client import Client, StompError


def live_bodies(port: int) -> list[bytes]:
    """The bodies of the messages queued on an instance, read directly (a browse)."""
    with Client("127.0.0.1", port) as direct:
        return [frame.body for frame in direct.browse()]


def logged(router: RouterProcess, pattern: str, timeout: float = 10.0) -> re.Match[str]:
    """The router's first stderr line that matches `pattern`, once it has written it."""
    assert wait_until(lambda: re.search(pattern, router.stderr_text()), timeout), router.stderr_text()
    match = re.search(pattern, router.stderr_text())
    assert match is not None
    return match


def consume(client: Client, count: int, timeout: float = 10.0) -> list[bytes]:
    """Receive `count` MESSAGEs, ACKing each with a receipt; return their bodies."""
    bodies: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(bodies) < count:
        frame = client.receive(max(0.0, deadline - time.monotonic()))
        assert frame is not None, f"only {len(bodies)} of {count} messages came: {bodies}"
        if frame.command == "MESSAGE":
            bodies.append(frame.body)
            client.ack(frame.headers["ack"])
    return bodies


def test_stomp_py_sends_through_the_router_to_each_named_instance(curb_broker, curb_router, stomp_conn, tmp_path):
    orders = curb_broker(file="orders.log")
    mail = curb_broker(file="mail.log")
    router = curb_router([f"orders=127.0.0.1:{orders.port}", f"mail=127.0.0.1:{mail.port}"])
    conn, inbox = stomp_conn(router.port)
    conn.send("/queue/orders", "o1", headers={"kind": "order"}, receipt="r1")
    conn.send("./mail", "m1", receipt="r2")
    inbox.wait_receipt("r2")
    assert "r1" in inbox.receipts
    assert live_bodies(orders.port) == [b"o1"] and live_bodies(mail.port) == [b"m1"]
    conn.subscribe("/queue/orders", id="s", ack="client-individual", headers={"prefetch-count": "5"})
    [message] = inbox.wait_messages(1)
    assert (message.body, message.headers["kind"], message.headers["destination"]) == ("o1", "order", "/queue/orders")
    conn.ack(message.headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    assert live_bodies(orders.port) == []


def test_an_unknown_destination_gets_a_clear_error(curb_broker, curb_router, stomp_conn):
    instance = curb_broker()
    router = curb_router([f"orders=127.0.0.1:{instance.port}"])
    conn, inbox = stomp_conn(router.port)
    conn.send("/queue/nope", "x", receipt="r")
    error = inbox.wait_error()
    assert error.headers["message"] == "unknown destination '/queue/nope'"
    assert "this router routes: /queue/orders" in error.body
    inbox.wait_disconnected()


def test_a_client_that_disconnects_has_its_messages_redelivered_to_another(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as producer:
        for n in range(3):
            producer.send(b"%d" % n, receipt=f"r{n}", destination="/queue/q")
        producer.wait_receipt("r2")
    first = Client("127.0.0.1", router.port)
    first.connect()
    first.subscribe("a", destination="/queue/q", prefetch=3)
    got = [first.receive(10) for _ in range(3)]
    assert [f.body for f in got if f is not None] == [b"0", b"1", b"2"]
    first.close()  # no ACK, no DISCONNECT
    with Client("127.0.0.1", router.port) as second:
        second.subscribe("b", destination="/queue/q", prefetch=10)
        assert sorted(consume(second, 3)) == [b"0", b"1", b"2"]


def test_many_consumers_share_one_destination_within_their_prefetch(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as producer:
        for n in range(40):
            producer.send(b"%d" % n, receipt=f"r{n}", destination="/queue/q")
        producer.wait_receipt("r39")
    consumers = [Client("127.0.0.1", router.port) for _ in range(2)]
    for n, consumer in enumerate(consumers):
        consumer.connect()
        consumer.subscribe(f"s{n}", destination="/queue/q", prefetch=2)
    # Neither ACKs: each holds its prefetch and nothing more.
    held = [[consumer.receive(5) for _ in range(2)] for consumer in consumers]
    assert all(frame is not None and frame.command == "MESSAGE" for frames in held for frame in frames)
    assert all(consumer.receive(0.3) is None for consumer in consumers)
    for consumer in consumers:
        consumer.close()
    with Client("127.0.0.1", router.port) as last:
        last.subscribe("z", destination="/queue/q", prefetch=50)
        assert sorted(int(b) for b in consume(last, 40)) == list(range(40))
    assert live_bodies(instance.port) == []


def test_a_partitioned_destination_spreads_sends_and_drains_all_instances(curb_broker, curb_router):
    instances = [curb_broker(file=f"p{n}.log") for n in range(3)]
    router = curb_router(["p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)])
    with Client("127.0.0.1", router.port) as producer:
        for n in range(30):
            producer.send(b"%d" % n, receipt=f"r{n}", destination="/queue/p")
        producer.wait_receipt("r29")
    assert [len(live_bodies(i.port)) for i in instances] == [10, 10, 10]
    with Client("127.0.0.1", router.port) as consumer:
        consumer.subscribe("s", destination="/queue/p", prefetch=6)
        assert sorted(int(b) for b in consume(consumer, 30)) == list(range(30))


def test_an_instance_down_its_messages_wait_while_sends_and_consumers_use_the_others(curb_broker, curb_router):
    instances = [curb_broker(file=f"p{n}.log") for n in range(3)]
    router = curb_router(["p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)])
    with Client("127.0.0.1", router.port) as producer:
        for n in range(9):
            producer.send(b"a%d" % n, receipt=f"r{n}", destination="/queue/p")
        producer.wait_receipt("r8")
    waiting = sorted(live_bodies(instances[1].port))
    instances[1].kill()
    with Client("127.0.0.1", router.port) as producer:
        time.sleep(0.3)  # the router notices the lost link (connection reset) at once; give it a pass
        for n in range(6):
            producer.send(b"b%d" % n, receipt=f"s{n}", destination="/queue/p")
        producer.wait_receipt("s5")
    stored = sorted(live_bodies(instances[0].port) + live_bodies(instances[2].port))
    assert [b for b in stored if b.startswith(b"b")] == [b"b%d" % n for n in range(6)]
    with Client("127.0.0.1", router.port) as consumer:
        consumer.subscribe("s", destination="/queue/p", prefetch=4)
        assert sorted(consume(consumer, len(stored))) == stored
        assert consumer.receive(0.3) is None
        instances[1].start()
        assert sorted(consume(consumer, 3, timeout=15)) == waiting


def test_transactions_forward_at_commit_and_abort_drops(curb_broker, curb_router, stomp_conn):
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    conn, inbox = stomp_conn(router.port)
    conn.begin("t1")
    conn.send("/queue/q", "one", transaction="t1")
    conn.send("/queue/q", "two", transaction="t1")
    conn.send("/queue/q", "mark", receipt="seen")
    inbox.wait_receipt("seen")
    assert live_bodies(instance.port) == [b"mark"]
    conn.commit("t1", receipt="committed")
    inbox.wait_receipt("committed")
    assert live_bodies(instance.port) == [b"mark", b"one", b"two"]
    conn.begin("t2")
    conn.send("/queue/q", "three", transaction="t2")
    conn.abort("t2", receipt="aborted")
    inbox.wait_receipt("aborted")
    with Client("127.0.0.1", instance.port) as direct:
        direct.subscribe("d", prefetch=10)
        frames = [direct.receive(5) for _ in range(3)]
        assert [f.headers.get("curb-transaction-seq") for f in frames if f is not None] == [None, "0", "1"]
        assert direct.receive(0.3) is None


def test_acks_in_a_transaction_take_effect_at_commit(curb_broker, curb_router):
    instance = curb_broker()
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as client:
        client.send(b"job", receipt="r", destination="/queue/q")
        client.wait_receipt("r")
        client.subscribe("s", destination="/queue/q", prefetch=1)
        message = client.receive(5)
        assert message is not None
        client.write(b"BEGIN\ntransaction:t\n\n\0")
        client.write(b"ACK\nid:%s\ntransaction:t\n\n\0" % message.headers["ack"].encode())
        client.write(b"SEND\ndestination:/queue/q\nreceipt:x\n\n\0")
        client.wait_receipt("x")
        assert live_bodies(instance.port) == [b"job", b""]
        client.write(b"COMMIT\ntransaction:t\nreceipt:c\n\n\0")
        client.wait_receipt("c")
    assert live_bodies(instance.port) == [b""]


def test_routes_file_is_reread_on_sighup(curb_broker, curb_router, tmp_path):
    first, second = curb_broker(file="a.log"), curb_broker(file="b.log")
    routes = tmp_path / "routes"
    routes.write_text(f"# routes\na=127.0.0.1:{first.port}\n")
    router = curb_router([], extra_args=["-routes", str(routes)])
    # A router on 127.0.0.1 says so, rather than telling the operator to listen there.
    assert "no -users: any local client may send to, consume from and count" in router.stderr_text()
    # A comment after a route is a comment (it once made the reload fail).
    routes.write_text(f"a=127.0.0.1:{first.port}  # the first\nb=127.0.0.1:{second.port} # added\n")
    router.child.process.send_signal(signal.SIGHUP)
    logged(router, "reloaded routes")
    with Client("127.0.0.1", router.port) as client:
        time.sleep(0.3)
        client.send(b"x", receipt="r", destination="/queue/b")
        client.wait_receipt("r")
    assert live_bodies(second.port) == [b"x"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["router"], "no routes: give -route NAME=HOST:PORT"),
        (["router", "-route", "a=127.0.0.1:1", "-route", "a=127.0.0.1:2"], "destination 'a' is routed twice"),
        (["router", "-route", "a b=127.0.0.1:1"], "bad destination name 'a b'"),
        (["router", "-routes", "/nonexistent/routes"], "No such file or directory"),
    ],
)
def test_bad_routes_are_a_usage_error_with_the_fix(run_curb, args, line):
    result = run_curb(*args)
    assert result.returncode == 2, result.stderr
    assert line in result.stderr and result.stderr.startswith("curb: ")
    assert "Traceback" not in result.stderr


def test_a_refused_send_ends_only_its_own_client(curb_broker, curb_router):
    instance = curb_broker(cap="64KiB")
    router = curb_router([f"q=127.0.0.1:{instance.port}"])
    with Client("127.0.0.1", router.port) as steady:
        steady.send(b"small", receipt="s0", destination="/queue/q")
        steady.wait_receipt("s0")
        hog = Client("127.0.0.1", router.port)
        hog.connect()
        with pytest.raises(StompError) as refused:
            for n in range(200):
                hog.send(b"x" * 4000, receipt=f"h{n}", destination="/queue/q")
            hog.wait_receipt("h199")
        assert refused.value.frame is not None
        time.sleep(0.3)
        steady.send(b"after", receipt="s1", destination="/queue/q")
        steady.wait_receipt("s1")
    assert live_bodies(instance.port)[-1] == b"after"


def test_spawn_runs_an_instance_per_new_destination_and_restarts_it(curb_router, tmp_path):
    spawned = tmp_path / "spawned"
    spawned.mkdir()
    router = curb_router([], extra_args=["-spawn", str(spawned), "-spawn-cap", "1MiB", "-spawn-max", "2"])
    with Client("127.0.0.1", router.port) as client:
        client.send(b"hello", receipt="r", destination="/queue/fresh")
        client.wait_receipt("r")
        assert (spawned / "fresh.log").exists()
        match = logged(router, r"spawned an instance for 'fresh' \(pid (\d+)\) on 127\.0\.0\.1:(\d+)")
        assert live_bodies(int(match.group(2))) == [b"hello"]
        os.kill(int(match.group(1)), signal.SIGKILL)
        logged(router, "restarted an instance for 'fresh'", timeout=15)
        client.subscribe("s", destination="./fresh", prefetch=5)
        assert consume(client, 1, timeout=15) == [b"hello"]
        client.send(b"x", receipt="second", destination="/queue/second")
        client.wait_receipt("second")
        client.send(b"x", receipt="third", destination="/queue/third")
        with pytest.raises(StompError) as refused:
            client.wait_receipt("third")
        assert "unknown destination '/queue/third'" in str(refused.value)


def test_two_routers_side_by_side_serve_the_same_instances(curb_broker, curb_router):
    instances = [curb_broker(file=f"p{n}.log") for n in range(2)]
    route = "p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)
    first, second = curb_router([route]), curb_router([route])
    with Client("127.0.0.1", first.port) as producer:
        for n in range(20):
            producer.send(b"%d" % n, receipt=f"r{n}", destination="/queue/p")
        producer.wait_receipt("r19")
    with Client("127.0.0.1", second.port) as consumer:
        consumer.subscribe("s", destination="/queue/p", prefetch=8)
        assert sorted(int(b) for b in consume(consumer, 20)) == list(range(20))
    first.kill()  # a router holds nothing but connections: the other goes on alone
    with Client("127.0.0.1", second.port) as client:
        client.send(b"after", receipt="a", destination="/queue/p")
        client.wait_receipt("a")


def test_a_restarted_spawning_router_knows_the_destinations_of_its_logs_at_once(curb_router, tmp_path):
    """For a second or two after a -spawn router restarted, `./b/count` for an existing
    b.log was an unknown destination: the logs already in DIR are destinations from the
    start, their counts zero until their instance is up."""
    spawned = tmp_path / "spawned"
    spawned.mkdir()
    first = curb_router([], extra_args=["-spawn", str(spawned), "-spawn-cap", "1MiB"])
    with Client("127.0.0.1", first.port) as client:
        client.send(b"kept", receipt="r", destination="/queue/b")
        client.wait_receipt("r")
    assert first.stop() == 0
    second = curb_router([], extra_args=["-spawn", str(spawned), "-spawn-cap", "1MiB"])
    with Client("127.0.0.1", second.port) as client:
        client.subscribe("c", destination="./b/count")
        counts = client.receive(timeout=10)
        assert counts is not None and counts.command == "MESSAGE", counts
        deadline = time.monotonic() + 15
        while json.loads(counts.body)["rdy"] != 1:
            assert time.monotonic() < deadline, counts.body
            update = client.receive(timeout=1)
            counts = update if update is not None else counts
