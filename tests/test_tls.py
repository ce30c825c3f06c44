"""curb.tls in process: which name a client certificate logs in as, and the files' errors."""

from __future__ import annotations

import ssl

import pytest
import trustme

from curb import tls


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
