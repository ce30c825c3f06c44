"""What docs/router.md promises when the router or an instance is killed (kill -9) in the middle
of a COMMIT: no RECEIPT for it unless every frame took effect; the client sends the
transaction again under the same name; every SEND is stored at least once, and the pairs
(curb-transaction, curb-transaction-seq) let a consumer drop the copies."""

from __future__ import annotations

import time
import uuid

import pytest

from curb.client import Client, StompError
from curb.frame import encode

SENDS = 1000


def commit(port: int, tx: str, receipt: str = "commit", wait: bool = True) -> Client:
    """Open a connection and send a whole transaction (BEGIN, SENDS SENDs, COMMIT); with
    `wait`, wait for COMMIT's RECEIPT (StompError if an ERROR comes instead)."""
    client = Client("127.0.0.1", port, timeout=15)
    client.connect()
    client.write(encode("BEGIN", {"transaction": tx}))
    for seq in range(SENDS):
        client.send(b"%s:%d:" % (tx.encode(), seq) + bytes(300), {"transaction": tx}, destination="/queue/p")
    client.write(encode("COMMIT", {"transaction": tx, "receipt": receipt}))
    client.flush()
    if wait:
        client.wait_receipt(receipt)
    return client


def stored(ports: list[int]) -> list[tuple[str, str]]:
    """Every message on the instances as its (curb-transaction, curb-transaction-seq)."""
    pairs = []
    for port in ports:
        with Client("127.0.0.1", port) as direct:
            for frame in direct.browse():
                pairs.append((frame.headers["curb-transaction"], frame.headers["curb-transaction-seq"]))
    return pairs


def check_once_after_dedupe(pairs: list[tuple[str, str]], txs: list[str]) -> int:
    """Each SEND of each transaction is there, none of another; returns the copies."""
    assert set(pairs) == {(tx, str(seq)) for tx in txs for seq in range(SENDS)}
    return len(pairs) - len(set(pairs))


def until_stored(port: int, least: int) -> int:
    """Wait until an instance has at least `least` messages on disk (or 15 s pass)."""
    deadline = time.monotonic() + 15
    with Client("127.0.0.1", port) as direct:
        while (last := direct.last_id()) < least and time.monotonic() < deadline:
            pass
    return last


@pytest.mark.parametrize("least", [1, SENDS // 4])
def test_router_killed_mid_commit_the_resent_transaction_is_whole_after_dedupe(curb_broker, curb_router, least):
    instances = [curb_broker(file=f"p{n}.log") for n in range(2)]
    route = "p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)
    router = curb_router([route])
    tx = str(uuid.uuid4())
    client = commit(router.port, tx, wait=False)
    until_stored(instances[0].port, least)
    router.kill()
    partial = len(stored([i.port for i in instances]))
    try:  # a RECEIPT that left before the kill means the whole transaction is stored
        client.wait_receipt("commit", timeout=2)
        committed = True
    except StompError:
        committed = False
    client.close()
    router.start()
    if committed:
        assert check_once_after_dedupe(stored([i.port for i in instances]), [tx]) == 0
        return
    commit(router.port, tx).disconnect()
    copies = check_once_after_dedupe(stored([i.port for i in instances]), [tx])
    assert copies == partial  # what the killed COMMIT stored came again, and was dropped as a copy


def test_an_instance_killed_mid_commit_loses_no_send_of_the_transaction(curb_broker, curb_router):
    instances = [curb_broker(file=f"p{n}.log") for n in range(2)]
    route = "p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)
    router = curb_router([route])
    tx = str(uuid.uuid4())
    client = commit(router.port, tx, wait=False)
    until_stored(instances[1].port, SENDS // 8)
    instances[1].kill()
    try:
        client.wait_receipt("commit", timeout=15)
        committed = True
    except StompError:
        committed = False
    client.close()
    instances[1].start()
    if not committed:
        commit(router.port, tx).disconnect()
    check_once_after_dedupe(stored([i.port for i in instances]), [tx])
