"""Properties of the frame codec, found by hypothesis: the way bytes are split never
changes the frames or the error, ProtocolError is the only exception, the buffer stays
within the limits, and encode() parses back to the frame it was given.

The default run is quick (a few dozen examples per property); set
CURB_HYPOTHESIS_PROFILE=thorough for thousands.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from curb.frame import ALWAYS_SIZED_COMMANDS, UNESCAPED_COMMANDS, Frame, FrameParser, ProtocolError, encode

settings.register_profile("quick", max_examples=60, deadline=None)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("CURB_HYPOTHESIS_PROFILE", "quick"))

LIMITS = {"max_frame_bytes": 64, "max_headers": 3, "max_header_line": 20, "max_body_bytes": 40}
# Pieces that make the parser's branches likely: line ends, colons, escapes, NULs, lengths.
PIECES = [
    b"SEND",
    b"ACK",
    b"CONNECT",
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b"\n\r\n",
    b":",
    b"\0",
    b"\\",
    b"\\c",
    b"\\n",
    b"content-length:",
    b"content-length:5",
    b"content-length:000000000000000000003",
    b"content-length:99999999999999999999999",
    b"destination:/q",
    b"a",
    b"x" * 30,
    "é".encode(),
    b"\xff",
]
stompish = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=8)), max_size=40).map(b"".join)
wire_bytes = st.one_of(stompish, st.binary(max_size=200))


def run(chunks: list[bytes], **limits: int) -> tuple[list[Frame], str | None]:
    """Every frame the parser gives for these feeds, and the error it stopped at (or None);
    checks after each feed that it buffers no more than the limits allow."""
    parser = FrameParser(**limits)
    bound = parser.max_frame_bytes + 1
    frames: list[Frame] = []
    for chunk in chunks:
        try:
            frames += parser.feed(chunk)
        except ProtocolError as err:
            return frames + err.frames, str(err)
        assert parser.buffered <= bound
    return frames, None


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(wire_bytes, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_same_frames_or_error(data, cuts):
    assert run(split(data, cuts)) == run([data])


@given(wire_bytes, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_same_frames_or_error_under_small_limits(data, cuts):
    assert run(split(data, cuts), **LIMITS) == run([data], **LIMITS)


@given(wire_bytes, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_same_frames_or_error_when_gathering(data, cuts):
    """gather_from=1: every sized body left incomplete by a feed is gathered, not buffered."""
    assert run(split(data, cuts), gather_from=1, **LIMITS) == run([data], **LIMITS)


@given(wire_bytes)
def test_byte_by_byte_gives_the_same_frames_or_error(data):
    assert run([data[i : i + 1] for i in range(len(data))], **LIMITS) == run([data], **LIMITS)


@given(st.binary(min_size=1, max_size=600), st.integers(min_value=1, max_value=50))
def test_input_beyond_the_limits_is_never_buffered_beyond_them(data, step):
    """run() checks the bound after every feed; any exception but ProtocolError fails."""
    run([data[i : i + step] for i in range(0, len(data), step)], **LIMITS)


text = st.text(st.characters(codec="utf-8"), max_size=20)
names = text.filter(lambda name: name not in ("", "content-length"))
escaped_commands = ["SEND", "SUBSCRIBE", "ACK", "MESSAGE", "RECEIPT", "ERROR", "DISCONNECT"]


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    command = draw(st.sampled_from(escaped_commands + sorted(UNESCAPED_COMMANDS)))
    if command in UNESCAPED_COMMANDS:  # never escaped: no CR or LF anywhere, no colon in a name
        plain = st.characters(codec="utf-8", exclude_characters="\r\n")
        values = st.text(plain, max_size=20)
        keys = st.text(st.characters(codec="utf-8", exclude_characters="\r\n:"), min_size=1, max_size=20)
    else:
        values, keys = text, names
    headers = draw(st.dictionaries(keys.filter(lambda k: k != "content-length"), values, max_size=6))
    body = draw(st.binary(max_size=50))
    return Frame(command, headers, body)


@given(frames())
def test_encode_parses_back_to_the_frame(frame):
    expected = dict(frame.headers)
    if frame.body or frame.command in ALWAYS_SIZED_COMMANDS:
        expected["content-length"] = str(len(frame.body))
    assert FrameParser().feed(encode(frame.command, frame.headers, frame.body)) == [
        Frame(frame.command, expected, frame.body)
    ]
