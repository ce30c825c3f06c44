"""Logins at once against a real broker: a reconnect storm of valid users is served, a
login the broker sheds hears "server busy", a flood of bad logins from one address
keeps neither connected clients nor another address's users waiting long, and TLS
clients that send nothing cannot keep a real one from its handshake."""

from __future__ import annotations

import asyncio
import collections
import re
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import trustme

from curb import users
from curb.frame import encode

pytestmark = pytest.mark.slow

CHEAP = {"n": 1024, "r": 8, "p": 1}  # a real scrypt check, a few milliseconds
PERMS = frozenset(users.PERMISSIONS)


def write_users(path: Path, names: list[str], **cost: int) -> None:
    table = [users.User(name, users.hash_password(f"{name}-pw", **cost), PERMS) for name in names]
    path.write_text(users.format_users(table))


def tls_files(where: Path) -> tuple[ssl.SSLContext, tuple[str, ...]]:
    """A certificate and key for 127.0.0.1 in `where` (the broker's directory): a client
    context that trusts them, and the broker's flags for a TLS listener with them."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    issued.private_key_pem.write_to_path(str(where / "tls.key"))
    issued.cert_chain_pems[0].write_to_path(str(where / "tls.pem"))
    tls = ssl.create_default_context()
    ca.configure_trust(tls)
    return tls, ("-tls-addr", "127.0.0.1:0", "-tls-cert", "tls.pem", "-tls-key", "tls.key")


async def _log_in(port: int, login: str, passcode: str, source: str, tls: ssl.SSLContext | None) -> str:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source, 0), ssl=tls, server_hostname="127.0.0.1" if tls else None
    )
    writer.write(encode("CONNECT", {"accept-version": "1.2", "login": login, "passcode": passcode}))
    try:
        data = await asyncio.wait_for(reader.readuntil(b"\0"), 30)
    except asyncio.IncompleteReadError:
        return "closed"
    finally:
        writer.close()
    head = data.decode().split("\n\n", 1)[0].split("\n")
    message = [line[8:] for line in head if line.startswith("message:")]
    return " ".join([head[0], *message])


def log_in_at_once(
    port: int, logins: list[tuple[str, str]], source: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> list[str]:
    """Open a connection and send CONNECT for each (login, passcode) at once; what each got."""

    async def all_of_them() -> list[str]:
        return await asyncio.gather(*(_log_in(port, login, passcode, source, tls) for login, passcode in logins))

    return asyncio.run(all_of_them())


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_a_storm_of_valid_logins_is_served_and_a_wrong_one_among_them_refused(
    curb_broker, tmp_path, wait_until, over_tls
):
    names = [f"user{n}" for n in range(10)]
    write_users(tmp_path / "users", names, **CHEAP)
    tls = None
    if over_tls:
        tls, flags = tls_files(tmp_path)
        broker = curb_broker(addr="off", extra_args=("-users", "users", *flags))
    else:
        broker = curb_broker(extra_args=("-users", "users"))
    logins = [(names[n % 10], f"{names[n % 10]}-pw") for n in range(200)]
    logins.insert(100, ("user3", "wrong"))
    started = time.monotonic()
    answers = log_in_at_once(broker.port, logins, tls=tls)
    assert answers.pop(100) == "ERROR access refused"
    assert time.monotonic() - started >= 0.9, "a wrong passcode is refused after the usual delay"
    assert collections.Counter(answers) == {"CONNECTED": 200}
    assert wait_until(lambda: "(login 'user3')" in broker.stderr_text())
    assert broker.stderr_text().count("access refused to") == 1


def test_a_login_the_broker_sheds_hears_server_busy_and_is_not_logged_as_refused(curb_broker, tmp_path, wait_until):
    write_users(tmp_path / "users", ["victim"])  # the full scrypt cost: the checks pile up
    broker = curb_broker(extra_args=("-users", "users", "-http", "127.0.0.1:0"))
    answers = log_in_at_once(broker.port, [("victim", f"guess {n}") for n in range(60)])
    got = collections.Counter(answers)
    assert set(got) == {"ERROR access refused", "ERROR server busy"}, got
    assert got["ERROR server busy"] >= 60 - 33, "one check runs and 32 wait; the rest are shed"
    # Refusal lines are rate-limited (one a kind per 10 s): the shed ones never count as refused.
    assert wait_until(lambda: re.search(r"server busy: shed a login from \S+ unchecked", broker.stderr_text()))
    log = broker.stderr_text()
    assert log.count("access refused to") == 1
    port = int(re.findall(r"metrics on http://127\.0\.0\.1:(\d+)", log)[0])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        metrics = b"".join(iter(lambda: sock.recv(1 << 16), b"")).decode()
    assert f"curb_logins_shed_total {got['ERROR server busy']}" in metrics
    assert f"curb_access_refused_total {got['ERROR access refused']}" in metrics


def _round_trip(sock: socket.socket) -> float:
    started = time.monotonic()
    sock.sendall(encode("SUBSCRIBE", {"id": "b", "destination": "/queue/curb"}))
    sock.sendall(encode("UNSUBSCRIBE", {"id": "b", "receipt": "r"}))
    data = b""
    while b"RECEIPT" not in data:
        data += sock.recv(4096)
    return time.monotonic() - started


def test_a_flood_of_bad_logins_from_one_address_keeps_no_other_address_out(curb_broker, tmp_path):
    names = ["victim", "bystander", *(f"fresh{n}" for n in range(5))]
    write_users(tmp_path / "users", names)  # the full scrypt cost, as an attacker would meet it
    broker = curb_broker(extra_args=("-users", "users"))
    bystander = socket.create_connection(("127.0.0.1", broker.port))
    bystander.sendall(encode("CONNECT", {"accept-version": "1.2", "login": "bystander", "passcode": "bystander-pw"}))
    assert bystander.recv(4096).startswith(b"CONNECTED")

    stop = threading.Event()
    flooded: list[str] = []

    def flood() -> None:
        while not stop.is_set():
            answers = log_in_at_once(broker.port, [("victim", f"{len(flooded)} {n}") for n in range(40)], "127.0.0.2")
            flooded.extend(answers)

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        time.sleep(0.5)  # the flood's checks fill its share of the queue
        flood_checks = []
        for name in names[2:]:
            before = broker.stderr_text().count("access refused to 127.0.0.2")
            assert log_in_at_once(broker.port, [(name, f"{name}-pw")]) == ["CONNECTED"]
            flood_checks.append(broker.stderr_text().count("access refused to 127.0.0.2") - before)
        trips = [_round_trip(bystander) for _ in range(20)]
    finally:
        stop.set()
        flooder.join()
    assert "ERROR server busy" in flooded, "the flood was more than the queue takes from one address"
    # Each first login waits for the check under way and one of the flood's, not for the
    # flood's queue (32 checks): count the flood's checks answered meanwhile, with a margin
    # for log lines read late.
    assert max(flood_checks) <= 8, flood_checks
    assert max(trips) < 1.0, trips


def test_tls_clients_that_send_nothing_cannot_keep_a_real_one_waiting(curb_broker, tmp_path):
    """More silent TLS connections than handshakes run at once (curb.arrivals), then a real
    client: it is served within a second, not after the silent ones' handshake timeout."""
    tls, flags = tls_files(tmp_path)
    broker = curb_broker(addr="off", extra_args=flags)
    silent = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(40)]
    try:
        time.sleep(0.2)  # all 40 accepted: 32 hold the places, 8 wait
        started = time.monotonic()
        assert log_in_at_once(broker.port, [("", "")], tls=tls) == ["CONNECTED"]
        assert time.monotonic() - started < 2.0
    finally:
        for sock in silent:
            sock.close()
