"""curb.tls in process: which name a client certificate logs in as, the files' errors, and
how every failed handshake of real TLS clients is counted and logged (curb.server.Handshake)."""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl

import pytest
import trustme

from curb import tls
from curb.broker import Broker, BrokerEvents
from curb.instance import Config, Instance
from curb.log import Log
from curb.metrics import TLS_FAILURES
from curb.server import Handshake


@pytest.mark.parametrize(
    "peercert, name",
    [
        (None, None),
        ({}, None),
        ({"subject": ((("organizationName", "Example"),),)}, None),
        ({"subject": ((("organizationName", "Example"),), (("commonName", "alice"),))}, "alice"),
        ({"subject": ((("commonName", "first"),), (("commonName", "last"),))}, "last"),
        ({"subject": ((("commonName", "alice"), ("emailAddress", "a@example.com")),)}, "alice"),
    ],
)
def test_a_certificate_logs_in_as_its_subject_cn(peercert, name):
    assert tls.peer_name(peercert) == name


def test_the_context_is_tls_1_2_or_later_and_mutual_only_with_a_ca(tmp_path):
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "both.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    plain = tls.load(tls.TlsFiles(str(tmp_path / "both.pem"), str(tmp_path / "both.pem")))
    assert plain.minimum_version == ssl.TLSVersion.TLSv1_2
    assert plain.verify_mode == ssl.CERT_NONE
    mutual = tls.load(tls.TlsFiles(str(tmp_path / "both.pem"), str(tmp_path / "both.pem"), str(tmp_path / "ca.pem")))
    assert mutual.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    "cert, key, ca, says",
    [
        ("missing.pem", "both.pem", None, "cannot read"),
        ("both.pem", "missing.pem", None, "cannot read"),
        ("junk.pem", "junk.pem", None, "not a PEM certificate and its key"),
        ("both.pem", "both.pem", "junk.pem", "holds no PEM CA certificate"),
        ("both.pem", "both.pem", "missing.pem", "cannot read"),
    ],
)
def test_a_bad_file_is_named(tmp_path, cert, key, ca, says):
    trustme.CA().issue_cert("x").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "both.pem"))
    (tmp_path / "junk.pem").write_text("junk\n")
    files = tls.TlsFiles(str(tmp_path / cert), str(tmp_path / key), str(tmp_path / ca) if ca else None)
    with pytest.raises(tls.TlsError) as raised:
        tls.load(files)
    assert says in str(raised.value)
    bad = next(name for name in (cert, key, ca) if name in ("missing.pem", "junk.pem"))
    assert bad in str(raised.value)


class Pki:
    """A CA with a server certificate for 127.0.0.1, another CA, and client contexts."""

    def __init__(self) -> None:
        self.ca, self.other = trustme.CA(), trustme.CA()
        self.server = self.ca.issue_cert("127.0.0.1")

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.server.configure_cert(context)
        self.ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def files(self, where) -> tls.TlsFiles:
        """The server's certificate chain, key and CA as the -tls flags' PEM files."""
        self.server.private_key_and_cert_chain_pem.write_to_path(str(where / "server.pem"))
        self.ca.cert_pem.write_to_path(str(where / "ca.pem"))
        return tls.TlsFiles(str(where / "server.pem"), str(where / "server.pem"), str(where / "ca.pem"))

    def client(self, kind: str) -> ssl.SSLContext:
        context = ssl.create_default_context()
        (self.other if kind == "distrusts the server" else self.ca).configure_trust(context)
        if kind in ("good", "distrusts the server"):
            self.ca.issue_cert("alice.example", common_name="alice").configure_cert(context)
        elif kind == "other CA":
            self.other.issue_cert("alice.example", common_name="alice").configure_cert(context)
        elif kind == "TLS 1.1":
            context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
            context.set_ciphers("DEFAULT:@SECLEVEL=0")
        return context


def client_run(port: int, pki: Pki, kind: str) -> bytes:
    """One client of this kind: what it read after sending a CONNECT (b"" if refused)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        if kind == "plain STOMP":
            raw.sendall(b"CONNECT\naccept-version:1.2\n\n\0")
            return raw.recv(4096)
        if kind == "silent":
            return raw.recv(4096)
        if kind == "closes at once":
            return b""
        try:
            with pki.client(kind).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"CONNECT\naccept-version:1.2\n\n\0")
                return tls.recv(4096)
        except (ssl.SSLError, ConnectionError):
            return b""


REASONS = {
    "no certificate": ("no_certificate", "sent no certificate"),
    "other CA": ("untrusted_certificate", "unable to get local issuer certificate"),
    "TLS 1.1": ("old_version", "older than 1.2"),
    "distrusts the server": ("certificate_rejected", "rejected the broker's certificate"),
    "plain STOMP": ("not_tls", "does not speak TLS"),
    "silent": ("timeout", "no handshake within 0.5 s"),
    "closes at once": ("closed", None),
}


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_every_failed_handshake_is_counted_by_reason_and_logged_with_the_peer(tmp_path):
    """asyncio reports a failed server handshake to no one: a client without a
    certificate, with another CA's or speaking TLS 1.1 left no line and no count."""
    pki = Pki()
    said: list[tuple[str, str, dict]] = []

    async def run() -> tuple[Broker, dict[str, bytes]]:
        loop = asyncio.get_running_loop()
        log_events = BrokerEvents()
        log = Log(tmp_path / "q.log", 64 * 1024, events=log_events)
        log.start(loop)
        broker = log_events.broker = Broker(
            log.core, events=lambda event, text, **fields: said.append((event, text, fields))
        )
        context = pki.server_context()
        # A short time limit only for the silent client: the others must not time out on a busy machine.
        listeners = [
            await loop.create_server(functools.partial(Handshake, broker, context, limit), "127.0.0.1", 0)
            for limit in (0.5, 30.0)
        ]
        short, long = (listener.sockets[0].getsockname()[1] for listener in listeners)
        answers = {
            kind: await asyncio.to_thread(client_run, short if kind == "silent" else long, pki, kind)
            for kind in [*REASONS, "good"]
        }
        await asyncio.sleep(0.1)
        for listener in listeners:
            listener.close()
        broker.close_sessions()
        await log.close()
        return broker, answers

    broker, answers = asyncio.run(run())
    assert answers["good"].startswith(b"CONNECTED\n"), "a CONNECT sent with the handshake's end is answered"
    assert broker.metrics.tls_failures == {**dict.fromkeys(TLS_FAILURES, 0), **{r: 1 for r, _ in REASONS.values()}}
    lines = {fields["reason"]: (text, fields) for event, text, fields in said if event == "tls_failed"}
    assert set(lines) == {reason for reason, says in REASONS.values() if says}
    for reason, says in REASONS.values():
        if says:
            text, fields = lines[reason]
            assert text.startswith("TLS handshake with 127.0.0.1:") and says in text, text
            assert fields["peer"].startswith("127.0.0.1:")
    assert all(answer == b"" for kind, answer in answers.items() if kind not in ("good", "plain STOMP"))


def test_a_tls_connection_past_the_limit_is_closed_before_its_handshake(tmp_path):
    pki = Pki()
    config = Config(
        path=str(tmp_path / "q.log"),
        cap=1 << 20,
        addr=None,
        tls_addr=("127.0.0.1", 0),
        tls_files=pki.files(tmp_path),
        max_connections=1,
    )

    async def run() -> tuple[Broker, bytes, int]:
        async with Instance(config) as curb:
            broker = curb.broker
            port = curb.tls_addresses[0][1]
            with socket.create_connection(("127.0.0.1", port)):  # a handshake under way takes the one place
                await asyncio.sleep(0.1)
                assert broker.handshaking == 1
                answer = await asyncio.to_thread(client_run, port, pki, "good")
                failed = sum(broker.metrics.tls_failures.values())
        return broker, answer, failed

    broker, answer, failed = asyncio.run(run())
    assert answer == b""
    assert broker.metrics.connections_refused == 1
    assert failed == 0, "refused before any TLS"


def ssl_error(reason: str, words: str) -> ssl.SSLError:
    err = ssl.SSLError(1, f"[SSL: {reason}] {words} (_ssl.c:1006)")
    err.reason = reason
    return err


@pytest.mark.parametrize(
    "err, reason, says",
    [
        (ConnectionAbortedError("SSL handshake is taking longer than 2.5 seconds"), "timeout", "within 2.5 s"),
        (None, "closed", "closed the connection"),
        (ConnectionResetError(), "closed", "closed the connection"),
        (
            ssl_error("PEER_DID_NOT_RETURN_A_CERTIFICATE", "peer did not return a certificate"),
            "no_certificate",
            "-tls-ca",
        ),
        (ssl_error("UNSUPPORTED_PROTOCOL", "unsupported protocol"), "old_version", "(unsupported protocol)"),
        (ssl_error("WRONG_VERSION_NUMBER", "wrong version number"), "not_tls", "plain STOMP goes to -addr"),
        (ssl_error("SSLV3_ALERT_BAD_CERTIFICATE", "sslv3 alert bad certificate"), "certificate_rejected", "-tls-cert"),
        (
            ssl_error("TLSV1_ALERT_UNKNOWN_CA", "tlsv1 alert unknown ca"),
            "certificate_rejected",
            "(tlsv1 alert unknown ca)",
        ),
        (ssl_error("NO_SHARED_CIPHER", "no shared cipher"), "other", "no shared cipher"),
    ],
)
def test_a_failed_handshake_is_sorted_into_a_reason_with_a_sentence(err, reason, says):
    sorted_as, sentence = tls.handshake_failure(err, 2.5)
    assert sorted_as == reason and sorted_as in TLS_FAILURES
    assert says in sentence and "_ssl.c" not in sentence, sentence
