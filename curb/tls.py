"""TLS for the STOMP listener: the server's context, reloadable, and a client's certificate name.

A listening socket keeps the SSLContext it was created with, so reloading certificates
(SIGHUP) cannot replace it. Instead the listener's context hands every new connection,
while its ClientHello is read, to the newest context (`sni_callback`, which OpenSSL calls
whether or not the client sent a server name). Open connections keep the keys they were
set up with; new ones get the new certificate and CA.

Invariants: TLS 1.2 is the oldest version offered; the ciphers are those of
`ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`; with a CA file, a client without a
certificate that CA signed fails the handshake. Every failed handshake is sorted into one
of curb.metrics.TLS_FAILURES by `handshake_failure`, with a sentence for the operator.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any

# OpenSSL's reasons (SSLError.reason) that say the client sent no TLS at all, or only
# versions older than TLS 1.2.
NOT_TLS = frozenset({"HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL"})
OLD_VERSION = frozenset({"UNSUPPORTED_PROTOCOL", "TLSV1_ALERT_PROTOCOL_VERSION", "VERSION_TOO_LOW"})


class TlsError(ValueError):
    """A certificate, key or CA file that cannot be used; the text says which and why."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str
    ca: str | None = None  # set: client certificates are required (mutual TLS)


def load(files: TlsFiles) -> ssl.SSLContext:
    """A server context from the PEM files; TlsError names the file that failed."""
    for path in (files.cert, files.key, files.ca):
        if path is not None:
            _check_readable(path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as err:
        raise TlsError(f"{files.cert} and {files.key} are not a PEM certificate and its key ({_why(err)})") from None
    if files.ca is not None:
        try:
            context.load_verify_locations(cafile=files.ca)
        except (ssl.SSLError, OSError) as err:
            raise TlsError(f"{files.ca} holds no PEM CA certificate ({_why(err)})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A context for connecting to Curb over TLS (the router's links): servers verified
    against `ca` and their host name; with `cert` and `key`, a client certificate too.
    TlsError names the file that failed."""
    for path in (ca, cert, key):
        if path is not None:
            _check_readable(path)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as err:
        raise TlsError(f"{ca} holds no PEM CA certificate ({_why(err)})") from None
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as err:
            raise TlsError(f"{cert} and {key} are not a PEM certificate and its key ({_why(err)})") from None
    return context


def _check_readable(path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise TlsError(f"cannot read {path}: {err.strerror or err}") from None


def _why(err: Exception) -> str:
    return getattr(err, "reason", None) or getattr(err, "strerror", None) or str(err)


class Listener:
    """The context a TLS listener is created with; `reload` swaps in new files' context
    for the connections that come after."""

    def __init__(self, files: TlsFiles):
        self.files = files
        self.current = load(files)
        self.context = load(files)
        self.context.sni_callback = self._pick

    def reload(self) -> None:
        """Read the files again; TlsError (and the old context kept) if they are bad."""
        self.current = load(self.files)

    def _pick(self, sslobj: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        sslobj.context = self.current


def peer_name(peercert: dict[str, Any] | None) -> str | None:
    """The commonName of a verified client certificate's subject (the last one, if several)."""
    if not peercert:
        return None
    names = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[-1] if names else None


def handshake_failure(err: BaseException | None, timeout: float) -> tuple[str, str]:
    """Why a server-side TLS handshake failed: (a reason of curb.metrics.TLS_FAILURES, a
    sentence for the operator). `err` is what the handshake raised (None: the connection
    ended without an error), `timeout` the handshake's time limit in seconds."""
    if isinstance(err, ConnectionAbortedError):  # asyncio's handshake timeout
        return "timeout", f"no handshake within {timeout:g} s (-connect-timeout)"
    if err is None or isinstance(err, (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError)):
        return "closed", "the client closed the connection during the handshake"
    if isinstance(err, ssl.SSLCertVerificationError):
        why = err.verify_message or _ssl_text(err)
        return (
            "untrusted_certificate",
            f"its certificate was not accepted ({why}); -tls-ca must hold the CA that signed it",
        )
    reason = getattr(err, "reason", None) or ""
    text = _ssl_text(err)
    if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "no_certificate", "the client sent no certificate, and -tls-ca requires one signed by its CA"
    if reason in OLD_VERSION:
        return (
            "old_version",
            f"the client offers only TLS versions older than 1.2 ({text}); Curb needs TLS 1.2 or later",
        )
    if reason in NOT_TLS:
        return "not_tls", f"the client does not speak TLS ({text}); plain STOMP goes to -addr"
    if "ALERT" in reason and ("CERTIFICATE" in reason or reason.endswith("_CA")):
        return (
            "certificate_rejected",
            f"the client rejected the broker's certificate ({text}); clients must trust the CA that "
            "signed -tls-cert, and the certificate must name the host they connect to",
        )
    return "other", text


def _ssl_text(err: BaseException) -> str:
    """OpenSSL's words without their source position: '[SSL: X] words (_ssl.c:1006)' -> 'words'."""
    text = str(err)
    found = re.fullmatch(r"\[[^]]*\] (.*?)(?: \(_ssl\.c:\d+\))?", text)
    return (found.group(1) if found else text) or type(err).__name__
