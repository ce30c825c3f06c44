"""The router over TLS on both sides, logging in to instances that require users: clients
reach it with TLS (-tls-addr), it reaches a TLS-only instance (-instance-tls-ca) as a user
of that instance's users file (-instance-credentials)."""

from __future__ import annotations

import socket
import ssl

import pytest
from test_security import Certs, tls_port

from curb import users
from curb.frame import Frame, FrameParser, encode

pytestmark = pytest.mark.slow


def test_tls_in_front_and_behind_with_the_instance_users_file(curb_broker, curb_router, tmp_path):
    certs = Certs(tmp_path, "i")
    table = [users.User("router", users.hash_password("s3cret"), frozenset({"send", "consume", "count"}))]
    (tmp_path / "users").write_text(users.format_users(table))
    instance = curb_broker(
        addr="off",
        extra_args=(
            "-tls-addr",
            "127.0.0.1:0",
            "-tls-cert",
            str(certs.cert),
            "-tls-key",
            str(certs.key),
            "-users",
            str(tmp_path / "users"),
        ),
    )
    (tmp_path / "creds").write_text("router:s3cret\n")
    router = curb_router(
        [f"q=127.0.0.1:{tls_port(instance)}"],
        [
            "-instance-tls-ca",
            str(certs.ca_file),
            "-instance-credentials",
            str(tmp_path / "creds"),
            "-tls-addr",
            "127.0.0.1:0",
            "-tls-cert",
            str(certs.cert),
            "-tls-key",
            str(certs.key),
        ],
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
