"""The -http listener end to end: https with -http-tls, and its flag errors."""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest
from conftest import free_port
from test_security import Certs

pytestmark = pytest.mark.slow


def test_http_tls_serves_the_web_front_over_https(curb_broker, tmp_path):
    certs = Certs(tmp_path, "web")
    port = free_port()
    broker = curb_broker(
        extra_args=("-http", f"127.0.0.1:{port}", "-http-tls", "-tls-cert", str(certs.cert), "-tls-key", str(certs.key))
    )
    assert f"metrics on https://127.0.0.1:{port}/metrics" in broker.stderr_text()
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/stats", context=context, timeout=10) as answer:
        assert json.loads(answer.read())["rdy"] == 0
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain http on the https port: no answer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["-http", "127.0.0.1:0", "-http-tls"], "-http-tls needs -tls-cert FILE and -tls-key FILE"),
        (["-http-tls", "-tls-cert", "a.pem", "-tls-key", "a.key"], "-http-tls needs -http [HOST]:PORT"),
    ],
)
def test_http_tls_flag_errors_are_one_line(run_curb, flags, says):
    result = run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", *flags)
    assert result.returncode == 2
    assert says in result.stderr.strip().splitlines()[-1]
