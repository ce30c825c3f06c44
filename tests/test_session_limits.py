"""Hostile input at the session, in memory: every bad frame gets one ERROR that names the
limit or header, frames before it in the same read are answered first, and a SEND is
taken only if the MESSAGE it becomes fits every reader's limits."""

from __future__ import annotations

import pytest
from test_session_rules import World, commands

from curb.frame import FRAME_END, MAX_FRAME, MAX_HEADER_LINE, MAX_HEADERS, FrameParser, encode
from curb.message_limits import ADDED_HEADERS, MAX_SUBSCRIPTION_LINE, RESERVE


def error_of(frames) -> str:
    [error] = [f for f in frames if f.command == "ERROR"]
    return error.headers["message"] + " | " + error.body.decode()


# name -> (CONNECT's heart-beat header, words in the ERROR)
BAD_HEARTBEATS = {
    "400 nines": ("1," + "9" * 400, "heart-beat 9999"),
    "one past a day": ("0,86400001", "exceeds the limit of 86400000"),
    "negative": ("-1,0", "from 0 to 86400000"),
    "three numbers": ("1,2,3", "two comma-separated integers"),
    "empty part": ("1,", "from 0 to 86400000"),
}


@pytest.mark.parametrize("value, words", BAD_HEARTBEATS.values(), ids=BAD_HEARTBEATS)
def test_a_bad_heart_beat_is_an_error_naming_the_header(value, words):
    peer = World().session()
    peer.feed(encode("CONNECT", {"accept-version": "1.2", "heart-beat": value}))
    frames = peer.frames()
    assert commands(frames) == ["ERROR"]
    assert "bad heart-beat header" in error_of(frames)
    assert words in error_of(frames)


def test_heart_beat_with_leading_zeros_and_at_the_bound_is_taken():
    peer = World(heartbeat_ms=1000).session()
    assert peer.connect(heart_beat="0000000000000000000000001000,86400000").command == "CONNECTED"


def test_frames_before_a_bad_frame_in_one_read_are_answered_first():
    peer = World().session()
    peer.connect()
    good = encode("SUBSCRIBE", {"id": "1", "destination": "/q", "receipt": "r1"})
    good += encode("UNSUBSCRIBE", {"id": "1", "receipt": "r2"})
    peer.feed(good + b"SEND\nno colon here\n\n\0")
    frames = peer.frames()
    assert commands(frames) == ["RECEIPT", "RECEIPT", "ERROR"]
    assert "header line without a colon" in error_of(frames)


def test_a_crlf_head_end_followed_by_lf_in_one_read_is_a_send():
    world = World()
    peer = world.session()
    peer.connect()
    peer.feed(b"SEND\r\ndestination:/q\r\nreceipt:a\r\n\r\n\nhello\0")
    world.log.sync()
    assert commands(peer.frames()) == ["RECEIPT"]
    assert world.log.ready[0].payload == b"\n\nhello"


def send_headers(n: int) -> dict[str, str]:
    return {f"h{i}": "v" for i in range(n)}


# name -> (SEND headers beyond destination, body, words in the ERROR)
UNDELIVERABLE = {
    "one header too many": (
        send_headers(MAX_HEADERS - ADDED_HEADERS + 1),
        b"",
        "too many headers | The SEND keeps 122",
    ),
    "raw colons double when escaped": (
        {"h": "a:" + ":" * (MAX_HEADER_LINE // 2)},
        b"",
        f"header too long | A SEND header line of {MAX_HEADER_LINE + 5} bytes after escaping exceeds the limit of "
        f"{MAX_HEADER_LINE} bytes",
    ),
}


@pytest.mark.parametrize("headers, body, words", UNDELIVERABLE.values(), ids=UNDELIVERABLE)
def test_a_send_whose_message_would_break_a_limit_is_refused(headers, body, words):
    world = World()
    peer = world.session()
    peer.connect()
    wire = b"SEND\ndestination:/q\nreceipt:r\n" + b"".join(f"{k}:{v}\n".encode() for k, v in headers.items())
    peer.feed(wire + b"\n" + body + b"\0")
    frames = peer.frames()
    assert commands(frames) == ["ERROR"]
    assert words in error_of(frames)
    assert frames[0].headers["receipt-id"] == "r"
    assert not world.log.ready


def test_a_send_whose_message_would_exceed_the_frame_limit_is_refused_with_the_numbers():
    world = World()
    world.broker.max_message = MAX_FRAME  # the fake log takes anything; the frame limit decides
    peer = world.session()
    peer.connect()
    body = b"x" * (MAX_FRAME - RESERVE)  # the largest body taken at the head
    peer.send("SEND", body=body, destination="/q", receipt="r", h="v")
    frames = peer.frames()
    assert commands(frames) == ["ERROR"]
    assert f"message too large | Its MESSAGE could take {MAX_FRAME + 4} bytes, over the frame limit of {MAX_FRAME}" in (
        error_of(frames)
    )


def test_the_largest_deliverable_send_comes_out_as_a_message_a_client_parses():
    world = World()
    world.broker.max_message = MAX_FRAME
    peer = world.session()
    peer.connect()
    peer.send(
        "SUBSCRIBE",
        id="s" * (MAX_SUBSCRIPTION_LINE - len("subscription:")),
        destination="d" * (MAX_SUBSCRIPTION_LINE - len("destination:")),
        ack="client",
    )
    # Names "h000:" of 5 bytes; values of raw colons, escaped to fill the line exactly.
    value = ":" * ((MAX_HEADER_LINE - 5) // 2) + "x" * ((MAX_HEADER_LINE - 5) % 2)
    headers = {f"h{i:03d}": value for i in range(MAX_HEADERS - ADDED_HEADERS)}
    kept = len(headers) * (MAX_HEADER_LINE + 1)
    body = b"b" * (MAX_FRAME - RESERVE - kept)
    peer.feed(encode("SEND", {"destination": "/q", **headers}, body))
    wire = peer.raw()
    assert wire.endswith(FRAME_END)
    [message] = FrameParser().feed(wire)
    assert message.command == "MESSAGE", message
    assert message.headers["h000"] == value
    assert message.body == body
    peer.send("NACK", id=message.headers["ack"])  # the redelivery carries the most headers
    [again] = FrameParser().feed(peer.raw())
    assert again.headers["redelivered"] == "true"
    assert len(again.headers) == MAX_HEADERS


# name -> (SUBSCRIBE headers, words in the ERROR)
BAD_SUBSCRIBES = {
    "prefetch of 400 digits": ({"prefetch-count": "9" * 400}, "bad prefetch '9999"),
    "prefetch over the bound": (
        {"prefetch-count": "1000001"},
        "bad prefetch '1000001': use a whole number from 1 to 1000000",
    ),
    "prefetch zero": ({"prefetch-count": "0"}, "bad prefetch '0': use a whole number from 1 to 1000000"),
    "prefetch not a number": ({"prefetch-count": "ten"}, "from 1 to 1000000"),
    "subscription line too long": ({"id": "i" * MAX_SUBSCRIPTION_LINE}, "exceeds the limit of 1024 bytes"),
}


@pytest.mark.parametrize("headers, words", BAD_SUBSCRIBES.values(), ids=BAD_SUBSCRIBES)
def test_a_subscribe_beyond_a_bound_is_an_error_naming_it(headers, words):
    peer = World().session()
    peer.connect()
    peer.feed(encode("SUBSCRIBE", {"id": "1", "destination": "/q", **headers}))
    frames = peer.frames()
    assert commands(frames) == ["ERROR"]
    assert words in error_of(frames)


@pytest.mark.parametrize("header", ["prefetch-count", "activemq.prefetchSize"])
def test_a_prefetch_up_to_the_bound_is_honoured_as_asked(header):
    peer = World().session()
    peer.connect()
    peer.feed(encode("SUBSCRIBE", {"id": "1", "destination": "/q", "ack": "client", header: "1000000"}))
    assert commands(peer.frames()) == []
    [sub] = peer.session.messages.prefixes
    assert sub.prefetch == 1_000_000


def test_every_frame_the_broker_writes_ends_in_nul_lf():
    world = World()
    peer = world.session()
    peer.feed(encode("CONNECT", {"accept-version": "1.2"}))
    peer.send("SUBSCRIBE", id="1", destination="/q", ack="client", receipt="r")
    peer.send("SEND", body=b"hi", destination="/q")
    peer.send("FROB")
    wire = peer.raw()
    assert wire.count(b"\0") == 4  # CONNECTED, RECEIPT, MESSAGE, ERROR
    assert wire.count(b"\0") == wire.count(FRAME_END)
    assert wire.endswith(FRAME_END)
