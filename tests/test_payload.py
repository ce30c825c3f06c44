"""The stored payload codec: what a SEND leaves in the log comes back the same."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from curb import payload
from curb.frame import escape

CASES = {
    "no headers": ({}, b"body"),
    "empty body": ({"content-type": "text/plain"}, b""),
    "escapes": ({"x:colon": "a\nb\\c\rd"}, b"x"),
    "NUL and blank lines in body": ({"k": "v"}, b"\0\n\nend"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_encode_then_decode_round_trips(name):
    headers, body = CASES[name]
    assert payload.decode(payload.encode(headers, body)) == (headers, body)


def test_hop_headers_are_not_stored():
    stored = payload.encode(
        {"destination": "/q", "content-length": "1", "receipt": "r", "transaction": "t", "kept": "yes"}, b"b"
    )
    assert payload.decode(stored) == ({"kept": "yes"}, b"b")


def test_split_keeps_the_escaped_lines_for_the_wire():
    assert payload.split(payload.encode({"a:b": "c"}, b"body")) == (b"a\\cb:c\n", b"body")


def test_first_of_repeated_headers_wins_and_a_bad_escape_is_kept_as_is():
    assert payload.decode(b"a:1\na:2\nb:x\\ty\n\nz") == ({"a": "1", "b": "x\\ty"}, b"z")


def test_a_payload_without_its_empty_line_is_refused():
    with pytest.raises(payload.PayloadError):
        payload.split(b"a:1\nno end")


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=6))
def test_header_lines_escape_exactly_when_needed(headers):
    """The fast path (no escaping needed) and the escaping path write the same lines."""
    kept = [(k, v) for k, v in headers.items() if k not in payload.NOT_STORED]
    assert payload.header_lines(headers) == "".join(f"{escape(k)}:{escape(v)}\n" for k, v in kept).encode()
