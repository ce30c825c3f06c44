"""`[HOST]:PORT` addresses, parsed one way for the broker's -addr and -http, the Spark
connector's endpoints and the benchmark, so an address that works in one works in all."""

from __future__ import annotations


def parse_addr(text: str) -> tuple[str | None, int]:
    """(host or None for every interface, port) from '[HOST]:PORT', ':PORT' or '[::1]:PORT'."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"bad address {text!r}: use [HOST]:PORT, e.g. :61613 or 127.0.0.1:61613")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"bad address {text!r}: put an IPv6 host in brackets, e.g. [::1]:61613")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}: use a number from 0 to 65535, e.g. :61613")
    return (host or None), int(port)
