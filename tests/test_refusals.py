"""Every refusal the broker makes is counted and logged, at most one line per kind per
LIMIT_LOG_SECONDS, naming the peer and, once known, the user: in memory, on a fake clock."""

from __future__ import annotations

import random

import pytest
from memworld import MemWorld
from simdisk import SimDisk
from test_session_access import connect, world_with_users
from test_session_rules import World

from curb.frame import encode
from curb.metrics import TLS_FAILURES
from curb.refusals import LIMIT_LOG_SECONDS


class Said:
    """The broker's events, as (event, text, fields), on a clock the test moves."""

    def __init__(self, world: World | MemWorld) -> None:
        self.lines: list[tuple[str, str, dict]] = []
        self.now = 0.0
        world.broker.refusals.events = lambda event, text, **fields: self.lines.append((event, text, fields))
        world.broker.refusals.clock = lambda: self.now

    def of(self, event: str) -> list[tuple[str, dict]]:
        return [(text, fields) for name, text, fields in self.lines if name == event]


def refuse_logins(world: World, said: Said, times: list[float]) -> None:
    for n, now in enumerate(times):
        said.now = now
        peer = connect(world, None, now=now, login="producer", passcode=f"wrong{n}")
        peer.session.tick(now + world.broker.config.refuse_delay)
        assert peer.frames(now + world.broker.config.refuse_delay)[0].headers["message"] == "access refused"


def test_failed_logins_are_counted_and_logged_once_per_interval_with_the_count():
    """A flood of bad logins was one line each, without bound."""
    world = world_with_users()
    said = Said(world)
    refuse_logins(world, said, [0.0, 1.0, 2.0, 3.0, LIMIT_LOG_SECONDS + 0.5])
    assert world.broker.metrics.access_refused == 5
    lines = said.of("access_refused")
    assert [fields["count"] for _, fields in lines] == [1, 4]
    assert lines[0][0] == "access refused to test (login 'producer')"
    assert lines[1][0].startswith("access refused to test (login 'producer') (4 such since the last line")


@pytest.mark.parametrize(
    "headers, identity, says",
    [
        ({}, None, "(no login and no client certificate)"),
        ({}, "stranger", "(no login, and certificate CN 'stranger' is not a user)"),
        ({"login": "all", "passcode": "wrong"}, "all", "(login 'all')"),
    ],
)
def test_a_refused_login_says_what_was_tried_never_none(headers, identity, says):
    """A CONNECT without a login was logged as `(login None)`."""
    world = world_with_users()
    said = Said(world)
    connect(world, identity, **headers).session.tick(world.broker.config.refuse_delay)
    [(text, _)] = said.of("access_refused")
    assert text == f"access refused to test {says}"


def test_a_missing_permission_is_counted_and_its_line_names_the_user():
    """The line said only `client error from PEER: consume permission needed`."""
    world = world_with_users()
    said = Said(world)
    peer = connect(world, None, login="producer", passcode="pw-p")
    assert peer.frames()[0].command == "CONNECTED"
    peer.feed(encode("SUBSCRIBE", {"id": "s", "destination": "/queue/curb"}))
    assert peer.frames()[0].headers["message"] == "consume permission needed"
    assert world.broker.metrics.permissions_refused == 1
    [(text, fields)] = said.of("client_error")
    assert text == "client error from test (user 'producer'): consume permission needed"
    assert fields == {"count": 1, "peer": "test", "user": "producer", "reason": "consume permission needed"}


def test_client_errors_are_logged_once_per_interval():
    world = World()
    said = Said(world)
    for now in (0.0, 1.0, 2.0, LIMIT_LOG_SECONDS + 1.0):
        said.now = now
        peer = world.session(now)
        peer.feed(b"HELLO\n\n\0", now)
        assert peer.frames(now)[0].command == "ERROR"
    assert world.broker.metrics.protocol_errors == 4
    assert [fields["count"] for _, fields in said.of("client_error")] == [1, 3]


def test_tls_failures_are_counted_by_reason_and_each_reason_has_its_own_lines():
    """A peer that closes mid-handshake (a port check) is counted, never logged."""
    world = World()
    said = Said(world)
    broker = world.broker
    for now, reason in [(0.0, "no_certificate"), (1.0, "no_certificate"), (2.0, "old_version"), (3.0, "closed")]:
        broker.refusals.tls_failed("10.0.0.9:4000", reason, f"because {reason}", now)
    broker.refusals.tls_failed("10.0.0.9:4001", "no_certificate", "because no_certificate", LIMIT_LOG_SECONDS)
    assert broker.metrics.tls_failures == {
        **dict.fromkeys(TLS_FAILURES, 0),
        "no_certificate": 3,
        "old_version": 1,
        "closed": 1,
    }
    lines = said.of("tls_failed")
    assert [(fields["reason"], fields["count"]) for _, fields in lines] == [
        ("no_certificate", 1),
        ("old_version", 1),
        ("no_certificate", 2),
    ]
    assert lines[0][0] == "TLS handshake with 10.0.0.9:4000 failed: because no_certificate"
    assert lines[2][1]["peer"] == "10.0.0.9:4001"


def test_a_full_disk_is_a_line_and_a_counted_refusal_per_send():
    """SENDs the full disk refused were logged only as `client error ...: message not
    stored` and counted nowhere."""
    disk = SimDisk(random.Random(3), free_bytes=64 * 1024)
    world = MemWorld(cap=1 << 20, disk=disk)
    said = Said(world)
    producers = [world.peer() for _ in range(3)]
    for n, producer in enumerate(producers):
        producer.send("SEND", b"x" * 40_000, destination="/queue/curb", receipt=f"r{n}")
    world.settle()
    answers = [producer.frames() for producer in producers]
    refused = [frames[0] for frames in answers if frames and frames[0].command == "ERROR"]
    assert refused, f"a 64 KiB disk took three 40 KB messages: {answers}"
    assert all("disk full" in frame.body.decode() for frame in refused)
    assert world.broker.metrics.refused_disk_full == len(refused)
    assert world.broker.metrics.refused_full == 0
    [(text, fields)] = said.of("disk_full")
    assert text.startswith("disk full: cannot grow log: No space left on device")
    assert "until space is freed" in text and fields["count"] == 1
