"""The STOMP 1.2 frame codec: parsing (whole, split anywhere, byte by byte), limits, encoding."""

import pytest

from curb.frame import GATHER_FROM, HEARTBEAT, Frame, FrameParser, ProtocolError, encode, escape, unescape


def feed_in_chunks(wire: bytes, sizes, **limits) -> list[Frame]:
    """Feed `wire` in consecutive chunks of the given sizes (the last one takes the rest)."""
    parser = FrameParser(**limits)
    frames, pos = [], 0
    for size in sizes:
        frames += parser.feed(wire[pos : pos + size])
        pos += size
    return frames + parser.feed(wire[pos:])


def feed_bytewise(wire: bytes, **limits) -> list[Frame]:
    return feed_in_chunks(wire, [1] * len(wire), **limits)


PARSE_CASES = [
    ("lf", b"SEND\ndestination:/q\nfoo:bar\n\nhello\0", [Frame("SEND", {"destination": "/q", "foo": "bar"}, b"hello")]),
    (
        "crlf",
        b"SEND\r\ndestination:/q\r\nfoo:bar\r\n\r\nhello\0",
        [Frame("SEND", {"destination": "/q", "foo": "bar"}, b"hello")],
    ),
    ("mixed line ends", b"SEND\r\na:1\nb:2\r\n\nx\0", [Frame("SEND", {"a": "1", "b": "2"}, b"x")]),
    ("command only", b"DISCONNECT\n\n\0", [Frame("DISCONNECT", {}, b"")]),
    ("command only crlf", b"DISCONNECT\r\n\r\n\0", [Frame("DISCONNECT", {}, b"")]),
    ("heart-beats before and after", b"\n\r\n\n\nACK\nid:1\n\n\0\n\r\n\n", [Frame("ACK", {"id": "1"}, b"")]),
    ("heart-beats only", b"\n\n\r\n\n", []),
    ("raw colon kept in value", b"SEND\na:b:c\n\n\0", [Frame("SEND", {"a": "b:c"}, b"")]),
    ("nothing trimmed", b"SEND\n header : v \n\n\0", [Frame("SEND", {" header ": " v "}, b"")]),
    ("empty value", b"SEND\na:\n\n\0", [Frame("SEND", {"a": ""}, b"")]),
    (
        "first repeated header wins, wire order kept",
        b"SEND\nb:first\na:x\nb:second\nc:y\n\n\0",
        [Frame("SEND", {"b": "first", "a": "x", "c": "y"}, b"")],
    ),
    (
        "escapes decoded",
        b"SEND\nk\\cey\\\\:line\\nbreak\\r\\c\n\n\0",
        [Frame("SEND", {"k:ey\\": "line\nbreak\r:"}, b"")],
    ),
    ("escapes not nested", b"SEND\na:\\\\n\n\n\0", [Frame("SEND", {"a": "\\n"}, b"")]),
    ("repeated escaped header: first wins", b"SEND\na\\c:1\na\\c:2\n\n\0", [Frame("SEND", {"a:": "1"}, b"")]),
    ("CONNECT not unescaped", b"CONNECT\npasscode:a\\b\\c\n\n\0", [Frame("CONNECT", {"passcode": "a\\b\\c"}, b"")]),
    ("STOMP not unescaped", b"STOMP\nlogin:x\\y\n\n\0", [Frame("STOMP", {"login": "x\\y"}, b"")]),
    ("CONNECTED not unescaped", b"CONNECTED\nserver:a\\tb\n\n\0", [Frame("CONNECTED", {"server": "a\\tb"}, b"")]),
    ("utf-8 headers", "SEND\nnäme:wért ✓\n\n\0".encode(), [Frame("SEND", {"näme": "wért ✓"}, b"")]),
    (
        "content-length body with NULs and EOLs",
        b"SEND\ncontent-length:7\n\n\0a\n\n\0\r\n\0",
        [Frame("SEND", {"content-length": "7"}, b"\0a\n\n\0\r\n")],
    ),
    ("content-length zero", b"SEND\ncontent-length:0\n\n\0", [Frame("SEND", {"content-length": "0"}, b"")]),
    (
        "content-length leading zeros",
        b"SEND\ncontent-length:002\n\nab\0",
        [Frame("SEND", {"content-length": "002"}, b"ab")],
    ),
    (
        "no content-length: body ends at first NUL",
        b"SEND\n\nab\n\ncd\0SEND\n\n\0",
        [Frame("SEND", {}, b"ab\n\ncd"), Frame("SEND", {}, b"")],
    ),
    (
        "header names are case-sensitive",
        b"SEND\nContent-Length:1\n\nabc\0",
        [Frame("SEND", {"Content-Length": "1"}, b"abc")],
    ),
    ("body may hold what looks like a CRLF head end", b"SEND\n\nx\n\r\ny\0", [Frame("SEND", {}, b"x\n\r\ny")]),
    ("CR in the body is fine", b"SEND\na:1\n\nx\ry\0", [Frame("SEND", {"a": "1"}, b"x\ry")]),
    ("unknown command passes through", b"FROB\n\n\0", [Frame("FROB", {}, b"")]),
    (
        "many frames in one read",
        b"SEND\nn:1\n\none\0\nSEND\r\nn:2\r\n\r\ntwo\0SEND\nn:3\ncontent-length:5\n\nth\0ee\0\n\n",
        [
            Frame("SEND", {"n": "1"}, b"one"),
            Frame("SEND", {"n": "2"}, b"two"),
            Frame("SEND", {"n": "3", "content-length": "5"}, b"th\0ee"),
        ],
    ),
    (
        "CRLF CRLF head end before an LF that starts the body",
        b"SEND\r\ndestination:/q\r\nreceipt:a\r\n\r\n\nhello\0",
        [Frame("SEND", {"destination": "/q", "receipt": "a"}, b"\nhello")],
    ),
    ("LF CRLF head end before an LF", b"SEND\na:1\n\r\n\nx\0", [Frame("SEND", {"a": "1"}, b"\nx")]),
    (
        "frames end in NUL LF",
        encode("SEND", {"a": "1"}, b"x") * 2,
        [Frame("SEND", {"a": "1", "content-length": "1"}, b"x")] * 2,
    ),
]


@pytest.mark.parametrize("wire, expected", [case[1:] for case in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_parses_whole(wire, expected):
    assert FrameParser().feed(wire) == expected


@pytest.mark.parametrize("wire, expected", [case[1:] for case in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_every_split_point_gives_the_same_frames(wire, expected):
    for split in range(len(wire) + 1):
        assert feed_in_chunks(wire, [split]) == expected, f"split at {split}"


@pytest.mark.parametrize("wire, expected", [case[1:] for case in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_byte_by_byte_gives_the_same_frames(wire, expected):
    frames = feed_bytewise(wire)
    assert frames == expected
    assert all(type(frame.body) is bytes for frame in frames)


@pytest.mark.parametrize("wire, expected", [case[1:] for case in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_gathered_bodies_give_the_same_frames(wire, expected):
    """gather_from=1: every sized body a read leaves incomplete is gathered piece by piece."""
    for split in range(len(wire) + 1):
        assert feed_in_chunks(wire, [split], gather_from=1) == expected, f"split at {split}"
    frames = feed_bytewise(wire, gather_from=1)
    assert frames == expected
    assert all(type(frame.body) is bytes for frame in frames)


BIG = b"x" * GATHER_FROM + b"\0y"
BIG_WIRE = b"SEND\ncontent-length:%d\n\n%s\0\nSEND\n\nz\0" % (len(BIG), BIG)


@pytest.mark.parametrize(
    "reads",
    [
        [len(BIG_WIRE)],  # whole: nothing gathered
        [30, len(BIG_WIRE)],  # the head, then the rest
        [10, 100, 1000, 40000],  # head cut, then body pieces
        [len(BIG_WIRE) - 6, 1, 5],  # the NUL alone, then the next frame
        [len(BIG_WIRE) - 5, 5],  # the NUL last in a read
        [4096] * 9,
    ],
)
def test_large_body_in_many_reads(reads):
    parser = FrameParser()
    frames, pos = [], 0
    for size in reads:
        frames += parser.feed(BIG_WIRE[pos : pos + size])
        pos += size
        if not frames:  # every byte of the incomplete frame is counted as held
            assert parser.buffered == pos
    assert frames == [Frame("SEND", {"content-length": str(len(BIG))}, BIG), Frame("SEND", {}, b"z")]
    assert type(frames[0].body) is bytes and parser.buffered == 0


def test_large_body_without_its_nul_is_refused():
    wire = b"SEND\nreceipt:r\ncontent-length:%d\n\n" % GATHER_FROM
    parser = FrameParser()
    assert parser.feed(wire + b"a" * 1000) == []
    with pytest.raises(ProtocolError, match="not followed by NUL") as err:
        parser.feed(b"a" * GATHER_FROM)
    assert err.value.receipt == "r"


def test_frames_come_out_as_soon_as_complete():
    parser = FrameParser()
    assert parser.feed(b"SEND\ncontent-length:2\n\nab") == []
    assert parser.feed(b"\0SEND\n\nc") == [Frame("SEND", {"content-length": "2"}, b"ab")]
    assert parser.feed(b"d\0") == [Frame("SEND", {}, b"cd")]


def test_straddling_frame_body_is_bytes():
    parser = FrameParser()
    parser.feed(b"SEND\n\nab")
    [frame, _] = parser.feed(b"cd\0SEND\n\n\0")
    assert type(frame.body) is bytes and frame.body == b"abcd"


ERROR_CASES = [
    ("lone CR between frames", b"\rSEND\n\n\0", "CR"),
    ("CR inside command", b"SE\rND\n\n\0", "CR"),
    ("two CRs ending the command", b"SEND\r\r\n\n\0", "CR"),
    ("CR inside header name", b"SEND\nhe\rad:v\n\n\0", "CR"),
    ("CR inside header value", b"SEND\nhead:v\ral\n\n\0", "CR"),
    ("CR line before the blank line", b"SEND\na:b\n\r\r\n\n\0", "CR"),
    ("header line without colon", b"SEND\na:1\nnocolon\nb:2\n\n\0", "colon"),
    ("empty header name", b"SEND\n:v\n\n\0", "empty name"),
    ("undefined escape", b"SEND\na:\\t\n\n\0", "\\t"),
    ("undefined escape in name", b"SEND\n\\x:1\n\n\0", "\\x"),
    ("trailing backslash", b"SEND\na:b\\\n\n\0", "backslash"),
    ("undefined escape in a repeated header", b"SEND\na:1\na:\\t\n\n\0", "\\t"),
    ("content-length not a number", b"SEND\ncontent-length:abc\n\n\0", "content-length"),
    ("content-length negative", b"SEND\ncontent-length:-1\n\n\0", "content-length"),
    ("content-length with sign", b"SEND\ncontent-length:+1\n\nx\0", "content-length"),
    ("content-length with space", b"SEND\ncontent-length: 1\n\nx\0", "content-length"),
    ("content-length empty", b"SEND\ncontent-length:\n\n\0", "content-length"),
    ("content-length non-ascii digit", "SEND\ncontent-length:٣\n\nabc\0".encode(), "content-length"),
    ("body longer than content-length", b"SEND\ncontent-length:2\n\nabc\0", "NUL"),
    ("invalid utf-8 in header", b"SEND\na:\xff\xfe\n\n\0", "UTF-8"),
    ("invalid utf-8 in command", b"SE\xc3ND\n\n\0", "UTF-8"),
]


@pytest.mark.parametrize("wire, reason", [case[1:] for case in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_bad_input_raises(wire, reason):
    with pytest.raises(ProtocolError) as whole:
        FrameParser().feed(wire)
    with pytest.raises(ProtocolError) as bytewise:
        feed_bytewise(wire)
    assert reason in str(whole.value)
    assert str(bytewise.value) == str(whole.value)
    assert "\n" not in str(whole.value)


LIMITS = {"max_frame_bytes": 64, "max_headers": 3, "max_header_line": 20}

# Frames exactly at each limit: accepted.
AT_LIMIT_CASES = [
    ("frame of max_frame_bytes, no content-length", b"SEND\n\n" + b"x" * 58 + b"\0"),
    ("frame of max_frame_bytes, content-length", b"SEND\ncontent-length:40\n\n" + b"x" * 40 + b"\0"),
    ("max_headers headers", b"SEND\na:1\nb:2\nc:3\n\n\0"),
    ("header line of max_header_line bytes", b"SEND\n" + b"h" * 18 + b":v\n\n\0"),
    ("header line of max_header_line bytes, crlf", b"SEND\r\n" + b"h" * 18 + b":v\r\n\r\n\0"),
    ("command line of max_header_line bytes", b"C" * 20 + b"\n\n\0"),
]


@pytest.mark.parametrize("wire", [case[1] for case in AT_LIMIT_CASES], ids=[c[0] for c in AT_LIMIT_CASES])
def test_frames_at_the_limits_pass(wire):
    assert len(FrameParser(**LIMITS).feed(wire)) == 1
    assert len(feed_bytewise(wire, **LIMITS)) == 1


# Limits exceeded; the prefix alone (no end of frame in sight) must already raise.
OVER_LIMIT_CASES = [
    ("body without NUL beyond max_frame_bytes", b"SEND\n\n" + b"x" * 59, "frame exceeds 64 bytes"),
    ("content-length announcing too much", b"SEND\ncontent-length:41\n\n", "frame exceeds 64 bytes"),
    ("huge content-length", b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n", "header line exceeds"),
    ("too many headers", b"SEND\na:1\nb:2\nc:3\nd:4\n", "more than 3 headers"),
    ("header line too long", b"SEND\n" + b"h" * 21, "header line exceeds 20 bytes"),
    ("header line too long, completed", b"SEND\n" + b"h" * 19 + b":v\nx", "header line exceeds 20 bytes"),
    ("command line too long", b"C" * 21, "header line exceeds 20 bytes"),
    ("CR not followed by LF", b"SEND\na:b\rc", "CR"),
    ("head beyond max_frame_bytes", b"SEND\n" + b"a:123456789012\n" * 3 + b"b:12345678901234", "frame exceeds"),
]


@pytest.mark.parametrize(
    "prefix, reason", [case[1:] for case in OVER_LIMIT_CASES], ids=[c[0] for c in OVER_LIMIT_CASES]
)
def test_limits_trigger_before_the_frame_ends(prefix, reason):
    with pytest.raises(ProtocolError, match=reason):
        FrameParser(**LIMITS).feed(prefix)
    with pytest.raises(ProtocolError, match=reason):
        feed_bytewise(prefix, **LIMITS)


def test_huge_content_length_is_rejected_as_too_large_naming_the_limit():
    with pytest.raises(
        ProtocolError, match=r"body too large: content-length 9999.* exceeds the limit of 16777216 bytes"
    ):
        FrameParser().feed(b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n")


@pytest.mark.parametrize("zeros", [1, 19, 30, 5000])
def test_content_length_with_leading_zeros_is_its_value(zeros):
    wire = b"SEND\ncontent-length:" + b"0" * zeros + b"5\n\nhello\0"
    assert [f.body for f in FrameParser().feed(wire)] == [b"hello"]


def test_content_length_over_the_body_limit_is_refused_at_the_head():
    with pytest.raises(ProtocolError, match="body too large: content-length 101 exceeds the limit of 100 bytes"):
        FrameParser(max_body_bytes=100).feed(b"SEND\ncontent-length:101\n\n")


def test_unsized_body_over_the_body_limit_is_refused_before_its_nul():
    with pytest.raises(ProtocolError, match="body exceeds 100 bytes"):
        feed_bytewise(b"SEND\n\n" + b"x" * 101, max_body_bytes=100)


def test_frames_before_a_bad_one_come_with_the_error():
    wire = b"SEND\na:1\n\nx\0\nACK\nid:2\n\n\0BAD\nnocolon\n\n\0"
    with pytest.raises(ProtocolError, match="without a colon") as caught:
        FrameParser().feed(wire)
    assert caught.value.frames == [Frame("SEND", {"a": "1"}, b"x"), Frame("ACK", {"id": "2"}, b"")]


def test_frame_over_limit_completing_in_one_read_is_rejected():
    with pytest.raises(ProtocolError, match="frame exceeds 64 bytes"):
        FrameParser(**LIMITS).feed(b"SEND\n\n" + b"x" * 59 + b"\0")


def test_limits_apply_per_frame():
    frame = b"SEND\n\n" + b"x" * 50 + b"\0"
    assert len(FrameParser(**LIMITS).feed(frame * 10)) == 10


ESCAPES = [
    ("plain", "plain"),
    ("a:b", "a\\cb"),
    ("line\nfeed", "line\\nfeed"),
    ("carriage\rreturn", "carriage\\rreturn"),
    ("back\\slash", "back\\\\slash"),
    ("\\n", "\\\\n"),
    (":\\\r\n", "\\c\\\\\\r\\n"),
]


@pytest.mark.parametrize("text, escaped", ESCAPES)
def test_escape_and_unescape(text, escaped):
    assert escape(text) == escaped
    assert unescape(escaped) == text


@pytest.mark.parametrize("bad", ["\\t", "a\\", "\\", "\\C", "\\\\\\"])
def test_unescape_rejects_undefined_escapes(bad):
    with pytest.raises(ProtocolError):
        unescape(bad)


def test_encode_exact_bytes():
    assert encode("SEND", {"destination": "/queue/curb"}, b"hi") == (
        b"SEND\ndestination:/queue/curb\ncontent-length:2\n\nhi\0\n"
    )
    assert encode("SUBSCRIBE", [("id", "0"), ("ack", "client")]) == b"SUBSCRIBE\nid:0\nack:client\n\n\0\n"


@pytest.mark.parametrize("command", ["SEND", "MESSAGE", "ERROR"])
def test_encode_always_sizes_send_message_error(command):
    assert encode(command, {}) == command.encode() + b"\ncontent-length:0\n\n\0\n"


def test_encode_sizes_any_non_empty_body():
    assert encode("RECEIPT", {}, b"x") == b"RECEIPT\ncontent-length:1\n\nx\0\n"


def test_encode_replaces_caller_content_length():
    wire = encode("SEND", {"content-length": "99", "a": "1"}, b"abc")
    assert wire.count(b"content-length") == 1
    assert FrameParser().feed(wire) == [Frame("SEND", {"a": "1", "content-length": "3"}, b"abc")]
    assert encode("ACK", {"content-length": "5", "id": "1"}) == b"ACK\nid:1\n\n\0\n"


def test_encode_escapes_headers():
    assert encode("MESSAGE", {"a:b": "c\nd\\"}) == b"MESSAGE\na\\cb:c\\nd\\\\\ncontent-length:0\n\n\0\n"


@pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
def test_encode_does_not_escape_connect_frames(command):
    assert encode(command, {"passcode": "a\\b:c"}) == command.encode() + b"\npasscode:a\\b:c\n\n\0\n"


@pytest.mark.parametrize("headers", [{"login": "a\nb"}, {"lo:gin": "x"}, {"login": "a\rb"}])
def test_encode_refuses_unescapable_connect_headers(headers):
    with pytest.raises(ValueError):
        encode("CONNECT", headers)


ROUND_TRIPS = [
    Frame("SEND", {"destination": "/queue/curb", "content-length": "5"}, b"hello"),
    Frame("MESSAGE", {"weird:name\\": "line\nbreak\r\n:", "content-length": "3"}, b"\0\0\0"),
    Frame("SEND", {"ünï": "cödé ✓", "content-length": "8"}, b"\n\n\0\r\n\0x\0"),
    Frame("ERROR", {"message": "bad: thing", "content-length": "0"}, b""),
    Frame("CONNECTED", {"version": "1.2", "server": "curb/0.1\\x"}, b""),
    Frame("RECEIPT", {"receipt-id": "r:1"}, b""),
]


@pytest.mark.parametrize("frame", ROUND_TRIPS, ids=[f.command for f in ROUND_TRIPS])
def test_encode_parse_round_trip(frame):
    wire = encode(frame.command, frame.headers, frame.body)
    assert FrameParser().feed(wire) == [frame]
    assert feed_bytewise(wire) == [frame]


def test_heartbeat_is_a_bare_eol():
    parser = FrameParser()
    assert parser.feed(HEARTBEAT * 3) == []
    assert parser.feed(b"ACK\nid:1\n\n\0") == [Frame("ACK", {"id": "1"}, b"")]


RECEIPTED_ERRORS = {
    "content-length over the body limit": b"SEND\nreceipt:r\ncontent-length:101\n\n",
    "content-length not a number": b"SEND\nreceipt:r\ncontent-length:x\n\n",
    "unsized body over the body limit": b"SEND\nreceipt:r\n\n" + b"x" * 101,
    "no NUL at content-length": b"SEND\nreceipt:r\ncontent-length:1\n\nxy",
}


@pytest.mark.parametrize("wire", RECEIPTED_ERRORS.values(), ids=RECEIPTED_ERRORS)
def test_an_error_after_the_head_carries_the_frames_receipt(wire):
    with pytest.raises(ProtocolError) as caught:
        feed_bytewise(wire, max_body_bytes=100)
    assert caught.value.receipt == "r"


def test_an_error_in_the_head_has_no_receipt():
    with pytest.raises(ProtocolError) as caught:
        FrameParser().feed(b"SEND\nreceipt:r\nno colon\n\n\0")
    assert caught.value.receipt is None
