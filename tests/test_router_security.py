"""The router over TLS on both sides, logging in to instances that require users: clients
reach it with TLS (-tls-addr), it reaches a TLS-only instance (-instance-tls-ca) as a user
of that instance's users file (-instance-credentials)."""

from __future__ import annotations

import socket
import ssl

import pytest
from test_security import Certs, tls_port

from curb import users
from curb.client import Client, StompError
from curb.frame import Frame, FrameParser, encode

pytestmark = pytest.mark.slow


def test_tls_in_front_and_behind_with_the_instance_users_file(curb_broker, curb_router, tmp_path):
    certs = Certs(tmp_path, "i")
    table = [users.User("router", users.hash_password("s3cret"), frozenset({"send", "consume", "count"}))]
    (tmp_path / "users").write_text(users.format_users(table))
    serve_tls = ("-tls-addr", "127.0.0.1:0", "-tls-cert", str(certs.cert), "-tls-key", str(certs.key))
    instance = curb_broker(addr="off", extra_args=(*serve_tls, "-users", str(tmp_path / "users")))
    (tmp_path / "creds").write_text("router:s3cret\n")
    router = curb_router(
        [f"q=127.0.0.1:{tls_port(instance)}"],
        ["-instance-tls-ca", str(certs.ca_file), "-instance-credentials", str(tmp_path / "creds"), *serve_tls],
    )
    assert "is up" in router.stderr_text() and "access refused" not in instance.stderr_text()
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    port = tls_port(router)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            parser = FrameParser()
            conn.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "x"}))
            conn.sendall(encode("SEND", {"destination": "/queue/q", "receipt": "r"}, b"secret mail"))
            frames: list[Frame] = []
            while len(frames) < 2:
                frames += parser.feed(conn.recv(65536))
    assert [f.command for f in frames] == ["CONNECTED", "RECEIPT"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-tls-addr", "127.0.0.1:0"], "-tls-addr, -tls-cert and -tls-key go together"),
        (["-instance-tls-ca", "/nonexistent/ca.pem"], "cannot read /nonexistent/ca.pem"),
        (["-instance-tls-cert", "x.pem"], "need -instance-tls-ca"),
    ],
)
def test_bad_tls_flags_are_usage_errors(run_curb, args, says):
    result = run_curb("router", "-route", "q=127.0.0.1:1", *args)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_credentials_file_is_a_usage_error(run_curb, tmp_path):
    (tmp_path / "creds").write_text("no colon here\n")
    result = run_curb("router", "-route", "q=127.0.0.1:1", "-instance-credentials", str(tmp_path / "creds"))
    assert result.returncode == 2 and "write LOGIN:PASSCODE on its first line" in result.stderr


def test_router_users_with_permissions_per_destination(curb_broker, curb_router, run_curb, tmp_path):
    orders, mail = curb_broker(file="orders.log"), curb_broker(file="mail.log")
    table = [
        users.User("alice", users.hash_password("pw"), frozenset({"send@orders"})),
        users.User("bob", users.hash_password("pw"), frozenset(users.PERMISSIONS)),
    ]
    (tmp_path / "users").write_text(users.format_users(table))
    router = curb_router(
        [f"orders=127.0.0.1:{orders.port}", f"mail=127.0.0.1:{mail.port}"], ["-users", str(tmp_path / "users")]
    )
    assert "2 users from" in router.stderr_text()
    with Client("127.0.0.1", router.port, login="alice", passcode="pw") as alice:
        alice.send(b"o", receipt="r", destination="/queue/orders")
        alice.wait_receipt("r")
        alice.send(b"m", receipt="m", destination="/queue/mail")
        with pytest.raises(StompError) as refused:
            alice.wait_receipt("m")
    assert "send permission needed for 'mail'" in str(refused.value)
    with pytest.raises(StompError) as wrong:
        Client("127.0.0.1", router.port, login="alice", passcode="nope").connect()
    assert "access refused" in str(wrong.value)
    with Client("127.0.0.1", router.port, login="bob", passcode="pw") as bob:
        bob.subscribe("s", destination="/queue/orders", prefetch=1)
        message = bob.receive(10)
        assert message is not None and message.body == b"o"
