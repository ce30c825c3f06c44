"""TLS for the STOMP listener: the server's context, reloadable, and a client's certificate name.

A listening socket keeps the SSLContext it was created with, so reloading certificates
(SIGHUP) cannot replace it. Instead the listener's context hands every new connection,
while its ClientHello is read, to the newest context (`sni_callback`, which OpenSSL calls
whether or not the client sent a server name). Open connections keep the keys they were
set up with; new ones get the new certificate and CA.

Invariants: TLS 1.2 is the oldest version offered; the ciphers are those of
`ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`; with a CA file, a client without a
certificate that CA signed fails the handshake.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any


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
