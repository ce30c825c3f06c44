"""Curb exposed on a network, end to end: TLS (plain and mutual) with certificates made by
trustme, certificate reload on SIGHUP, users and permissions, `curb passwd`, the CONNECT
timeout and the connection limit, against a real broker and stomp.py."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import stomp
import trustme
from conftest import free_port
from test_metrics import counter, scraped_until

from curb import users
from curb.frame import FrameParser

pytestmark = pytest.mark.slow


class Certs:
    """A CA, a server certificate for 127.0.0.1 it signed, and PEM files of both in `where`."""

    def __init__(self, where: Path, name: str):
        self.ca = trustme.CA()
        self.where = where
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert = where / f"{name}-server.pem"
        self.key = where / f"{name}-server.key"
        self.ca_file = where / f"{name}-ca.pem"
        server.private_key_pem.write_to_path(str(self.key))
        for n, pem in enumerate(server.cert_chain_pems):
            pem.write_to_path(str(self.cert), append=n > 0)
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def client(self, common_name: str) -> tuple[Path, Path]:
        """A client certificate with this subject CN, and its key."""
        issued = self.ca.issue_cert(f"{common_name}.example", common_name=common_name)
        cert, key = self.where / f"{common_name}-client.pem", self.where / f"{common_name}-client.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return cert, key


def tls_port(broker) -> int:
    """The TLS port from the broker's start-up line."""
    text = broker.stderr_text()
    marker = "TLS on 127.0.0.1:" if "TLS on " in text else "listening on 127.0.0.1:"
    return int(text.split(marker, 1)[1].split()[0].rstrip(",;()"))


def tls_broker(curb_broker, certs: Certs, *extra: str):
    return curb_broker(
        addr="off",
        extra_args=("-tls-addr", "127.0.0.1:0", "-tls-cert", str(certs.cert), "-tls-key", str(certs.key), *extra),
    )


def tls_conn(stomp_conn, port: int, ca: Path, client: tuple[Path, Path] | None = None, **connect):
    conn, inbox = stomp_conn(port, connect=False)
    cert, key = client if client else (None, None)
    conn.set_ssl(
        for_hosts=[("127.0.0.1", port)],
        ca_certs=str(ca),
        cert_file=str(cert) if cert else None,
        key_file=str(key) if key else None,
    )
    conn.connect(**connect)
    return conn, inbox


def test_tls_serves_stomp_py(curb_broker, stomp_conn, tmp_path):
    certs = Certs(tmp_path, "a")
    broker = tls_broker(curb_broker, certs)
    assert "TLS" in broker.stderr_text()
    conn, inbox = tls_conn(stomp_conn, broker.port, certs.ca_file)
    inbox.wait_connected()
    conn.send("/queue/curb", "over tls", receipt="r1")
    inbox.wait_receipt("r1")
    conn.subscribe("/queue/curb", id="s", ack="client-individual")
    [message] = inbox.wait_messages(1)
    assert message.body == "over tls"


def test_after_an_error_the_broker_closes_the_tls_connection(curb_broker, tmp_path):
    certs = Certs(tmp_path, "a")
    broker = tls_broker(curb_broker, certs)
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    with context.wrap_socket(socket.create_connection(("127.0.0.1", broker.port)), server_hostname="127.0.0.1") as tls:
        tls.settimeout(10)
        tls.sendall(b"CONNECT\naccept-version:1.2\n\n\0FROB\n\n\0")
        received = b""
        while chunk := tls.recv(4096):
            received += chunk
    frames = FrameParser().feed(received)
    assert [f.command for f in frames] == ["CONNECTED", "ERROR"], "then the end of the stream"


def test_a_plain_client_on_the_tls_port_gets_nothing(curb_broker, raw, tmp_path):
    broker = tls_broker(curb_broker, Certs(tmp_path, "a"))
    client = raw(broker.port)
    client.send(b"CONNECT\naccept-version:1.2\n\n\0")
    assert client.read_frame(timeout=3) is None


def test_mutual_tls_logs_in_by_certificate_cn_and_refuses_other_cas(curb_broker, stomp_conn, run_curb, tmp_path):
    certs = Certs(tmp_path, "a")
    stranger = Certs(tmp_path, "stranger")
    result = run_curb("passwd", "users", "alice", "--no-password", "--perm", "send")
    assert result.returncode == 0, result.stderr
    broker = tls_broker(curb_broker, certs, "-tls-ca", str(certs.ca_file), "-users", "users")
    assert "client certificates required" in broker.stderr_text()

    conn, inbox = tls_conn(stomp_conn, broker.port, certs.ca_file, certs.client("alice"))
    inbox.wait_connected()
    conn.send("/queue/curb", "from alice", receipt="r1")
    inbox.wait_receipt("r1")
    conn.subscribe("/queue/curb", id="s")
    assert inbox.wait_error().headers["message"] == "consume permission needed"
    conn.transport.disconnect_socket()  # stomp.py does not notice the broker's TLS close by itself

    # Signed by the right CA but no such user: access refused.
    _, mallory = tls_conn(stomp_conn, broker.port, certs.ca_file, certs.client("mallory"))
    assert mallory.wait_error().headers["message"] == "access refused"

    # Signed by another CA, or no certificate at all: the handshake fails, no STOMP at all.
    # (A raw socket: with TLS 1.3 the server's refusal comes after the client's handshake
    # is done, and stomp.py then does not always report the close.)
    for client in (stranger.client("alice"), None):
        assert refused_handshake(broker.port, certs.ca_file, client)


def refused_handshake(port: int, ca: Path, client: tuple[Path, Path] | None) -> str:
    """Why the broker ended a TLS connection that sent a CONNECT: the TLS error, or the end
    of the stream; fails if a STOMP answer came instead."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"CONNECT\naccept-version:1.2\nhost:curb\n\n\0")
            answer = tls.recv(4096)
    except (ssl.SSLError, ConnectionError) as err:
        return f"TLS refused: {err}"
    assert answer == b"", f"a refused client got an answer: {answer!r}"
    return "closed"


def test_sighup_reloads_the_certificate_for_new_connections_and_keeps_old_ones(
    curb_broker, stomp_conn, tmp_path, wait_until
):
    first = Certs(tmp_path, "first")
    broker = tls_broker(curb_broker, first)
    old, old_inbox = tls_conn(stomp_conn, broker.port, first.ca_file)
    old_inbox.wait_connected()

    second = Certs(tmp_path, "second")
    os.replace(second.cert, first.cert)
    os.replace(second.key, first.key)
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "reloaded the TLS certificate" in broker.stderr_text())

    new, new_inbox = tls_conn(stomp_conn, broker.port, second.ca_file)
    new_inbox.wait_connected()
    with pytest.raises(stomp.exception.ConnectFailedException):
        tls_conn(stomp_conn, broker.port, first.ca_file)  # the old CA no longer names the server

    old.send("/queue/curb", "still here", receipt="old")
    old_inbox.wait_receipt("old")
    new.send("/queue/curb", "new", receipt="new")
    new_inbox.wait_receipt("new")

    first.cert.write_text("not a certificate\n")
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "cannot reload TLS" in broker.stderr_text())
    _, kept_inbox = tls_conn(stomp_conn, broker.port, second.ca_file)
    kept_inbox.wait_connected()  # a bad file on reload leaves the last good certificate in force


@pytest.mark.parametrize(
    "flags, says",
    [
        (["-tls-addr", "127.0.0.1:0"], "-tls-addr needs -tls-cert FILE and -tls-key FILE"),
        (["-tls-cert", "x.pem", "-tls-key", "x.key"], "need -tls-addr"),
        (["-tls-addr", "127.0.0.1:0", "-tls-cert", "missing.pem", "-tls-key", "missing.key"], "missing.pem"),
        (["-tls-addr", "127.0.0.1:0", "-tls-cert", "junk.pem", "-tls-key", "junk.pem"], "not a PEM certificate"),
        (["-addr", "off"], "-addr off needs -tls-addr"),
        (["-users", "missing-users"], "cannot use users file missing-users"),
        (["-users", "junk.pem"], "cannot use users file junk.pem: line 1"),
    ],
)
def test_bad_tls_and_users_flags_are_one_line_usage_errors(run_curb, tmp_path, flags, says):
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    result = run_curb("-addr", "127.0.0.1:0", "-file", str(tmp_path / "curb.log"), *flags)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and says in lines[0], result.stderr


def test_a_bad_ca_file_is_a_usage_error(run_curb, tmp_path):
    certs = Certs(tmp_path, "a")
    (tmp_path / "junk.pem").write_text("nothing\n")
    result = run_curb(
        *("-addr", "off", "-tls-addr", "127.0.0.1:0", "-tls-cert", str(certs.cert), "-tls-key", str(certs.key)),
        *("-tls-ca", "junk.pem", "-file", "curb.log"),
    )
    assert result.returncode == 2 and "junk.pem" in result.stderr, result.stderr


# ---------------------------------------------------------------- users over plain TCP


def add_user(cwd: Path, name: str, password: str, *perms: str) -> subprocess.CompletedProcess[str]:
    args = [x for p in perms for x in ("--perm", p)]
    return subprocess.run(
        [sys.executable, "-m", "curb", "passwd", "users", name, *args],
        input=password + "\n",
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_passwd_writes_a_private_file_and_changes_users(tmp_path):
    assert add_user(tmp_path, "alice", "pw1", "send", "count").returncode == 0
    path = tmp_path / "users"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    table = users.parse(path.read_text())
    assert table["alice"].permissions == {"send", "count"}
    assert users.verify(table["alice"].hash, "pw1")

    assert add_user(tmp_path, "alice", "pw2").returncode == 0, "an existing user keeps its permissions"
    table = users.parse(path.read_text())
    assert table["alice"].permissions == {"send", "count"} and users.verify(table["alice"].hash, "pw2")

    new = add_user(tmp_path, "bob", "pw")
    assert new.returncode == 2 and "--perm" in new.stderr
    empty = add_user(tmp_path, "bob", "", "send")
    assert empty.returncode == 2 and "empty password" in empty.stderr
    assert set(users.parse(path.read_text())) == {"alice"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left"


def test_users_log_in_and_need_their_permissions(curb_broker, stomp_conn, tmp_path):
    assert add_user(tmp_path, "producer", "pp", "send").returncode == 0
    assert add_user(tmp_path, "consumer", "cc", "consume", "count").returncode == 0
    broker = curb_broker(extra_args=("-users", "users"))
    assert "2 users from users" in broker.stderr_text()

    producer, p_inbox = stomp_conn(broker.port, connect=False)
    producer.connect("producer", "pp")
    p_inbox.wait_connected()
    producer.send("/queue/curb", "job", receipt="r")
    p_inbox.wait_receipt("r")

    consumer, c_inbox = stomp_conn(broker.port, connect=False)
    consumer.connect("consumer", "cc")
    c_inbox.wait_connected()
    consumer.subscribe("/queue/curb", id="s", ack="client-individual")
    [message] = c_inbox.wait_messages(1)
    consumer.ack(message.headers["message-id"], "s", receipt="a")
    c_inbox.wait_receipt("a")

    producer.subscribe("./count", id="c")
    error = p_inbox.wait_error()
    assert error.headers["message"] == "count permission needed"
    assert "--perm count" in error.body


@pytest.mark.parametrize("login, passcode", [("producer", "wrong"), ("nobody", "pp"), (None, None)])
def test_bad_credentials_get_access_refused_and_are_logged(curb_broker, stomp_conn, tmp_path, login, passcode):
    assert add_user(tmp_path, "producer", "pp", "send").returncode == 0
    broker = curb_broker(extra_args=("-users", "users"))
    conn, inbox = stomp_conn(broker.port, connect=False)
    conn.connect(login, passcode)
    assert inbox.wait_error().headers["message"] == "access refused"
    inbox.wait_disconnected()
    assert inbox.connected is None
    assert "access refused to 127.0.0.1:" in broker.stderr_text()
    tried = f"(login {login!r})" if login is not None else "(no login and no client certificate)"
    assert tried in broker.stderr_text()


def test_sighup_rereads_the_users_file_and_keeps_it_if_broken(curb_broker, stomp_conn, tmp_path, wait_until):
    assert add_user(tmp_path, "alice", "a1", "send").returncode == 0
    broker = curb_broker(extra_args=("-users", "users"))
    assert add_user(tmp_path, "bob", "b1", "send").returncode == 0
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "reloaded 2 users from users" in broker.stderr_text())
    conn, inbox = stomp_conn(broker.port, connect=False)
    conn.connect("bob", "b1")
    inbox.wait_connected()

    (tmp_path / "users").write_text("broken line\n")
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "kept the 2 users read before" in broker.stderr_text())
    (tmp_path / "users").write_text("# everyone left\n")
    broker.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "has no users, so every CONNECT would be refused" in broker.stderr_text())
    assert broker.stderr_text().count("kept the 2 users read before") == 2
    again, again_inbox = stomp_conn(broker.port, connect=False)
    again.connect("alice", "a1")
    again_inbox.wait_connected()


def test_without_users_the_start_up_line_says_anyone_may_connect(curb_broker):
    local = curb_broker()
    assert "no -users: any local client may" in local.stderr_text()
    exposed = curb_broker(addr=":0", file="other.log")
    assert "WARNING: no -users" in exposed.stderr_text()


def test_a_web_front_the_network_reaches_without_users_is_refused_unless_meant(run_curb, curb_broker, tmp_path):
    """-http on every interface with no -users would let anyone who reaches it publish,
    consume and purge: refused at start-up, naming the fixes; -http-open says it is meant,
    and the warning then names the HTTP listener too."""
    refused = run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", "-http", ":0", "-file", str(tmp_path / "a.log"))
    line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "-http" in line and "-users" in line and "-http-open" in line, refused.stderr
    meant = curb_broker(extra_args=("-http", ":0", "-http-open"), file="b.log")
    warning = next(line for line in meant.stderr_text().splitlines() if "WARNING: no -users" in line)
    assert "(HTTP, -http-open)" in warning and "purge" in warning and "(STOMP)" not in warning


# ---------------------------------------------------------------- limits


def test_a_silent_connection_is_closed_at_the_connect_timeout(curb_broker, raw):
    broker = curb_broker(extra_args=("-connect-timeout", "0.5"))
    silent = raw(broker.port)
    half = raw(broker.port)
    half.send(b"CONNECT\naccept-vers")
    for client in (silent, half):
        error = client.read_frame(timeout=5)
        assert error is not None and error.headers["message"] == "CONNECT timeout"
        assert client.closed(timeout=5)


def test_a_connection_stalled_mid_frame_is_dropped_at_the_heart_beat_deadline(curb_broker, raw, wait_until):
    broker = curb_broker(extra_args=("-heartbeat", "200ms"))
    client = raw(broker.port)
    client.connect(heart_beat="200,0")
    client.send(b"SEND\ndestination:/queue/curb\ncontent-length:100\n\nhalf a bo")
    assert client.closed(timeout=5), "a peer that promised beats and went silent is dropped"
    assert wait_until(lambda: "no heart-beat from 127.0.0.1:" in broker.stderr_text())


def test_connections_past_the_limit_are_closed_at_once_and_the_others_served(curb_broker, raw, wait_until):
    broker = curb_broker(extra_args=("-max-connections", "2"))
    first, second = raw(broker.port), raw(broker.port)
    first.connect()
    second.connect()
    for _ in range(3):
        extra = raw(broker.port)
        assert extra.closed(timeout=5), "the connection past the limit is closed"
    first.send_frame("SEND", {"destination": "/queue/curb", "receipt": "r"}, b"x")
    receipt = first.read_frame()
    assert receipt is not None and receipt.command == "RECEIPT"
    # stderr is read by a thread of the test: wait for the line before counting.
    assert wait_until(lambda: "2 connections are open (-max-connections)" in broker.stderr_text())
    assert broker.stderr_text().count("2 connections are open (-max-connections)") == 1, "rate-limited"
    first.close()

    def served() -> bool:
        client = raw(broker.port)
        client.send_frame("CONNECT", {"accept-version": "1.2"})
        frame = client.read_frame(timeout=2)
        return frame is not None and frame.command == "CONNECTED"

    assert wait_until(served, timeout=10, interval=0.1)


def test_every_refused_connection_is_a_line_naming_the_peer_and_a_counter_in_metrics(
    curb_broker, stomp_conn, raw, tmp_path, wait_until
):
    """A failed TLS handshake and a CONNECT timeout left no line of their own or no
    counter, and a missing permission's line did not name the user."""
    certs = Certs(tmp_path, "a")
    assert add_user(tmp_path, "producer", "pp", "send").returncode == 0
    http_port = free_port()
    tls_flags = ("-tls-addr", "127.0.0.1:0", "-tls-cert", str(certs.cert), "-tls-key", str(certs.key))
    broker = curb_broker(
        extra_args=(
            *tls_flags,
            *("-tls-ca", str(certs.ca_file), "-users", "users"),
            *("-connect-timeout", "1", "-http", f"127.0.0.1:{http_port}"),
        )
    )
    assert refused_handshake(tls_port(broker), certs.ca_file, None)

    silent = raw(broker.port)
    host, port = silent.sock.getsockname()[:2]
    silent_peer = f"{host}:{port}"
    assert silent.read_frame(timeout=5).headers["message"] == "CONNECT timeout"

    stranger, s_inbox = stomp_conn(broker.port, connect=False)
    stranger.connect("producer", "wrong")
    assert s_inbox.wait_error().headers["message"] == "access refused"

    producer, p_inbox = stomp_conn(broker.port, connect=False)
    producer.connect("producer", "pp")
    p_inbox.wait_connected()
    producer.subscribe("/queue/curb", id="s")
    assert p_inbox.wait_error().headers["message"] == "consume permission needed"

    scraped_until(
        http_port,
        dict(
            [
                (
                    (
                        "curb_tls_handshake_failures",
                        "curb_tls_handshake_failures_total",
                        (("reason", "no_certificate"),),
                    ),
                    1,
                ),
                counter("curb_connect_timeouts", 1),
                counter("curb_access_refused", 1),
                counter("curb_permissions_refused", 1),
            ]
        ),
    )
    assert wait_until(lambda: "consume permission needed" in broker.stderr_text())
    text = broker.stderr_text()
    assert "TLS handshake with 127.0.0.1:" in text and "failed: the client sent no certificate" in text, text
    assert f"closed {silent_peer}: no CONNECT within 1 s (-connect-timeout)" in text, text
    assert "access refused to 127.0.0.1:" in text and "(login 'producer')" in text, text
    assert "(user 'producer'): consume permission needed" in text, text


def test_a_producer_flooding_without_receipts_gets_queue_full_and_others_are_served(curb_broker, raw):
    broker = curb_broker(cap="64KiB")
    greedy = raw(broker.port)
    greedy.connect()
    frame = b"SEND\ndestination:/queue/curb\ncontent-length:1000\n\n" + b"f" * 1000 + b"\0"
    for _ in range(1000):
        try:
            greedy.send(frame)
        except OSError:
            break  # the broker closed after its ERROR; the ERROR is still readable
        if greedy.frames or greedy.read_bytes(timeout=0.001):
            break
    error = greedy.read_frame()
    assert error is not None and (error.command, error.headers["message"]) == ("ERROR", "queue full")

    consumer = raw(broker.port)
    consumer.connect()
    consumer.send_frame("SUBSCRIBE", {"id": "s", "destination": "/queue/curb", "ack": "client-individual"})
    for n in range(20):
        message = consumer.read_frame()
        assert message is not None and message.command == "MESSAGE"
        consumer.send_frame("ACK", {"id": message.headers["ack"], **({"receipt": "acked"} if n == 19 else {})})
    while (answer := consumer.read_frame()) is not None and answer.command != "RECEIPT":
        pass
    assert answer is not None, "the consumer is served: its ACKs get their receipt"
    producer = raw(broker.port)
    producer.connect()
    producer.send_frame("SEND", {"destination": "/queue/curb", "receipt": "r"}, b"after")
    answer = producer.read_frame()
    assert answer is not None and answer.command == "RECEIPT", answer
