"""The stored payload: what the log keeps of a SEND, and how it comes back out.

A payload is the SEND's kept headers as escaped `name:value` lines, each ending in LF,
then an empty line, then the body byte for byte. The lines stay escaped on disk so that a
MESSAGE can copy them to the wire as they are, without parsing or escaping again; only
offline readers (inspect, the Spark reader) decode them. The headers that belong to one
hop (destination, content-length, receipt, transaction) are not kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import overload

from curb.frame import ProtocolError, escape, unescape

# The end of the header lines: escaped lines hold no empty line, so the first one found
# is it, and a search stops there, before the body.
_BLANK_LINE = re.compile(b"\n\n")
NOT_STORED = frozenset(("destination", "content-length", "receipt", "transaction"))


class PayloadError(ValueError):
    """Bytes that are not a stored payload (no empty line after the header lines)."""


def header_lines(headers: Mapping[str, str]) -> bytes:
    """The kept header lines of a SEND with these headers, escaped, each ending in LF."""
    if headers.keys() <= NOT_STORED:  # the common case: nothing but one-hop headers
        return b""
    kept = [(k, v) for k, v in headers.items() if k not in NOT_STORED]
    lines = "".join([f"{k}:{v}\n" for k, v in kept])
    # Usually nothing needs escaping: one colon and one LF a line, no CR or backslash.
    if lines.count(":") != len(kept) or lines.count("\n") != len(kept) or "\\" in lines or "\r" in lines:
        lines = "".join([f"{escape(k)}:{escape(v)}\n" for k, v in kept])
    return lines.encode()


def encode(headers: dict[str, str], body: bytes) -> bytes:
    """The payload the log stores for a SEND with these headers and body."""
    return header_lines(headers) + b"\n" + body


@overload
def split(payload: bytes) -> tuple[bytes, bytes]: ...
@overload
def split(payload: memoryview) -> tuple[bytes, memoryview]: ...
def split(payload: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """(escaped header lines, each ending in LF, ready for the wire; body). The body is a
    slice of the payload's own type: of a memoryview, a view of the same bytes. (Overloads
    rather than a constrained type variable: mypyc checks the body once, for the union.)"""
    if payload[:1] == b"\n":
        return b"", payload[1:]
    blank = _BLANK_LINE.search(payload)
    if blank is None:
        raise PayloadError("payload without the empty line that ends its headers")
    end = blank.start()
    return bytes(payload[: end + 1]), payload[end + 2 :]


def decode_headers(lines: bytes) -> dict[str, str]:
    """The kept headers of split()'s first part, unescaped; the first of repeated names
    wins. A line that does not unescape is kept as it is: readers show what is there."""
    headers: dict[str, str] = {}
    for line in lines.decode("utf-8", "replace").splitlines():
        name, _, value = line.partition(":")
        try:
            headers.setdefault(unescape(name), unescape(value))
        except ProtocolError:
            headers.setdefault(name, value)
    return headers


def decode(payload: bytes) -> tuple[dict[str, str], bytes]:
    """(kept headers, body) of a stored payload."""
    lines, body = split(payload)
    return decode_headers(lines), body
