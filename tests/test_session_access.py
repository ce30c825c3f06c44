"""Access rules of the sans-I/O session: logins against a users file, the permission each
frame needs, the delayed refusal and the CONNECT timeout, all on a fake clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from test_session_rules import World, commands

from curb import logins, users
from curb.access import permission_needed
from curb.frame import Frame, encode
from curb.single_queue import SingleQueue

# An instance's backend judges the destinations.
INSTANCE = SingleQueue()

CHEAP = {"n": 16, "r": 1, "p": 1}  # a valid scrypt hash that is quick to check in tests
USERS = {
    "all": users.User("all", users.hash_password("pw-all", **CHEAP), frozenset(users.PERMISSIONS)),
    "producer": users.User("producer", users.hash_password("pw-p", **CHEAP), frozenset({"send"})),
    "consumer": users.User("consumer", users.hash_password("pw-c", **CHEAP), frozenset({"consume"})),
    "watcher": users.User("watcher", users.hash_password("pw-w", **CHEAP), frozenset({"count"})),
    "certonly": users.User("certonly", users.NO_PASSWORD, frozenset({"send"})),
}


def world_with_users() -> World:
    world = World()
    world.broker.users = USERS
    return world


def connect(world: World, identity: str | None = None, now: float = 0.0, **headers: str):
    peer = world.session(now)
    peer.session.identity = identity
    peer.feed(encode("CONNECT", {"accept-version": "1.2", **headers}), now)
    return peer


@pytest.mark.parametrize(
    "headers, identity, user",
    [
        ({"login": "all", "passcode": "pw-all"}, None, "all"),
        ({"login": "producer", "passcode": "pw-p"}, None, "producer"),
        ({"login": "producer", "passcode": "pw-p"}, "consumer", "producer"),  # a login wins over the cert
        ({}, "consumer", "consumer"),  # the certificate's CN names the user
        ({}, "certonly", "certonly"),
    ],
)
def test_valid_credentials_connect(headers, identity, user):
    world = world_with_users()
    peer = connect(world, identity, **headers)
    assert commands(peer.frames()) == ["CONNECTED"]
    assert peer.session.user == user
    assert peer.session.login.permissions == USERS[user].permissions


@pytest.mark.parametrize(
    "headers, identity",
    [
        ({"login": "all", "passcode": "wrong"}, None),
        ({"login": "all"}, None),
        ({"login": "nobody", "passcode": "pw-all"}, None),
        ({"login": "certonly", "passcode": "!"}, None),  # no password logs in a cert-only user
        ({"login": "certonly", "passcode": ""}, None),
        ({}, None),
        ({}, "stranger"),  # a certificate the CA signed, but no such user
        ({"login": "all", "passcode": "wrong"}, "all"),
    ],
)
def test_bad_credentials_are_refused_after_the_same_delay(headers, identity):
    world = world_with_users()
    refused = []
    world.broker.refusals.events = lambda event, text, **fields: refused.append((event, text, fields))
    peer = connect(world, identity, now=5.0, **headers)
    session = peer.session
    assert peer.raw(5.0) == b"", "nothing is said before the delay"
    assert session.next_deadline == pytest.approx(5.0 + world.broker.config.refuse_delay)
    assert session.deadlines, "the refusal's deadline is sooner than any before: the transport must re-arm"
    peer.feed(b"SEND\ndestination:/q\n\nx\0", now=5.5)
    session.tick(5.9)
    assert peer.raw(5.9) == b""
    session.tick(6.0)
    [error] = peer.frames(6.0)
    assert (error.command, error.headers["message"]) == ("ERROR", "access refused")
    assert session.close_wanted == "close"
    assert world.log.unread == 0, "a refused connection stores nothing"
    login = headers.get("login")
    tried = (
        f"login {login!r}"
        if login is not None
        else f"no login, and certificate CN {identity!r} is not a user"
        if identity is not None
        else "no login and no client certificate"
    )
    assert refused == [
        (
            "access_refused",
            f"access refused to test ({tried})",
            {"count": 1, "peer": "test", "login": login, "cn": identity},
        ),
    ]
    assert world.broker.metrics.access_refused == 1


def test_without_a_users_file_everyone_may_do_everything():
    world = World()
    peer = world.session()
    peer.connect()
    assert peer.session.login.permissions is None and peer.session.user is None


SUB_QUEUE = ("SUBSCRIBE", {"id": "s", "destination": "/queue/curb"})
SUB_COUNT = ("SUBSCRIBE", {"id": "c", "destination": "./count"})
FRAMES = {
    "send": ("SEND", {"destination": "/queue/curb"}),
    "subscribe": SUB_QUEUE,
    "count": SUB_COUNT,
    "ack": ("ACK", {"id": "1"}),
    "nack": ("NACK", {"id": "1"}),
    "ack-count": ("ACK", {"id": "count-1"}),
    "unsubscribe": ("UNSUBSCRIBE", {"id": "nothing"}),
    "disconnect": ("DISCONNECT", {}),
}
# frame -> the permission it needs (None: any logged-in user may send it)
NEEDS = {
    "send": "send",
    "subscribe": "consume",
    "count": "count",
    "ack": "consume",
    "nack": "consume",
    "ack-count": "count",
    "unsubscribe": None,
    "disconnect": None,
}


@pytest.mark.parametrize("user", ["producer", "consumer", "watcher"])
@pytest.mark.parametrize("name", list(FRAMES))
def test_each_frame_needs_its_permission(user, name):
    command, headers = FRAMES[name]
    frame = Frame(command, dict(headers), b"")
    assert permission_needed(INSTANCE, frame) == NEEDS[name]
    world = world_with_users()
    peer = connect(world, login=user, passcode=f"pw-{user[0]}")
    assert commands(peer.frames()) == ["CONNECTED"]
    peer.send(command, receipt="r", **{k.replace("-", "_"): v for k, v in headers.items()})
    world.log.sync()
    got = peer.frames()
    needed = NEEDS[name]
    if needed is None or needed in USERS[user].permissions:
        assert all(f.headers.get("message", "").find("permission") < 0 for f in got), got
    else:
        [error] = got
        assert error.command == "ERROR"
        assert error.headers["message"] == f"{needed} permission needed"
        assert f"--perm {needed}" in error.body.decode()
        assert peer.session.close_wanted == "close"


def test_a_connection_that_never_connects_is_closed_at_the_connect_timeout():
    world = World()
    world.broker.config = dataclasses.replace(world.broker.config, connect_timeout=10.0)
    peer = world.session(now=100.0)
    session = peer.session
    assert session.next_deadline == pytest.approx(110.0)
    peer.feed(b"CONN", now=105.0)  # half a frame does not count
    assert session.next_deadline == pytest.approx(110.0)
    session.tick(109.9)
    assert peer.raw(109.9) == b"" and session.close_wanted is None
    session.tick(110.0)
    [error] = peer.frames(110.0)
    assert error.headers["message"] == "CONNECT timeout"
    assert session.close_wanted == "close"


def test_a_connected_session_has_no_connect_deadline():
    world = World()
    world.broker.config = dataclasses.replace(world.broker.config, connect_timeout=10.0)
    peer = world.session()
    peer.connect()
    assert peer.session.next_deadline is None
    peer.session.tick(20.0)
    assert peer.session.close_wanted is None


def test_a_zero_connect_timeout_means_no_limit():
    world = World()
    world.broker.config = dataclasses.replace(world.broker.config, connect_timeout=0)
    assert world.session().session.next_deadline is None


class Deferred:
    """An offload that runs the password checks only when the test says."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], users.User | None], Callable[[users.User | None], None]]] = []

    def __call__(self, work, then) -> None:
        self.waiting.append((work, then))

    def finish(self) -> None:
        waiting, self.waiting = self.waiting, []
        for work, then in waiting:
            then(work())


def producer_logging_in(after: bytes):
    """(world, its deferred password checks, a peer) after one read of a producer's
    CONNECT, a receipted SEND and `after`: the check is under way."""
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    peer = world.session()
    peer.feed(
        encode("CONNECT", {"accept-version": "1.2", "login": "producer", "passcode": "pw-p"})
        + encode("SEND", {"destination": "/queue/curb", "receipt": "s"}, b"x")
        + after
    )
    return world, checks, peer


def test_frames_after_connect_wait_for_the_password_check_and_then_run_in_order():
    world, checks, peer = producer_logging_in(encode("DISCONNECT", {"receipt": "bye"}))
    assert peer.raw() == b"" and not peer.session.reading, "nothing read or answered during the check"
    assert world.log.unread == 0
    checks.finish()
    world.log.sync()
    assert commands(peer.frames()) == ["CONNECTED", "RECEIPT", "RECEIPT"]
    assert world.log.unread == 1


def test_a_slow_check_still_refuses_at_the_deadline_counted_from_connect():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    peer = connect(world, now=3.0, login="producer", passcode="wrong")
    assert peer.session.next_deadline == pytest.approx(3.0 + world.broker.config.connect_timeout)
    checks.finish()
    assert peer.session.next_deadline == pytest.approx(3.0 + world.broker.config.refuse_delay)


def from_address(world: World, address: str, now: float = 0.0, **headers: str):
    peer = world.session(now)
    peer.session.peer = f"{address}:40000"
    peer.feed(encode("CONNECT", {"accept-version": "1.2", **headers}), now)
    return peer


def test_a_login_verified_before_connects_at_once_without_a_check():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    first = connect(world, login="producer", passcode="pw-p")
    assert len(checks.waiting) == 1
    checks.finish()
    assert commands(first.frames()) == ["CONNECTED"]
    again = world.session()
    again.feed(
        encode("CONNECT", {"accept-version": "1.2", "login": "producer", "passcode": "pw-p"})
        + encode("SEND", {"destination": "/queue/curb", "receipt": "s"}, b"x")
    )
    world.log.sync()
    assert not checks.waiting, "no second check"
    assert commands(again.frames()) == ["CONNECTED", "RECEIPT"]
    wrong = connect(world, now=2.0, login="producer", passcode="pw-p ")
    assert len(checks.waiting) == 1, "another passcode is checked"
    checks.finish()
    assert wrong.session.next_deadline == pytest.approx(2.0 + world.broker.config.refuse_delay)


def test_a_storm_of_the_same_login_costs_one_check():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    peers = [connect(world, login="producer", passcode="pw-p") for _ in range(500)]
    assert len(checks.waiting) == 1
    checks.finish()
    assert all(commands(p.frames()) == ["CONNECTED"] for p in peers)
    assert world.broker.metrics.logins_shed == 0


def test_logins_past_the_queue_bounds_get_server_busy_at_once_and_no_access_refused_line():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    lines = []
    world.broker.refusals.events = lambda event, text, **fields: lines.append(event)
    bound = logins.MAX_QUEUED_PER_SOURCE + 1  # one runs, the bound wait
    peers = [from_address(world, "10.0.0.1", login="producer", passcode=f"guess {n}") for n in range(bound + 2)]
    for peer in peers[-2:]:
        [error] = peer.frames()
        assert error.headers["message"] == "server busy"
        assert "again" in error.body.decode()
        assert peer.session.close_wanted == "close"
    assert world.broker.metrics.logins_shed == 2
    assert world.broker.metrics.access_refused == 0
    assert lines == ["logins_shed"], "one line for both, and no access refused"
    other = from_address(world, "10.0.0.2", login="producer", passcode="pw-p")
    assert other.raw() == b"", "another address still gets a place in the queue"
    checks.finish()  # the running check
    checks.finish()  # the first address's turn
    checks.finish()  # the second's: its only check, before the first address's other 31
    assert commands(other.frames()) == ["CONNECTED"]
    assert world.broker.logins.queued == logins.MAX_QUEUED_PER_SOURCE - 2  # two ran, one runs


def test_a_wrong_passcode_is_refused_at_the_usual_deadline_even_during_a_storm():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    good = [connect(world, login="producer", passcode="pw-p") for _ in range(50)]
    bad = connect(world, now=0.5, login="producer", passcode="wrong")
    while checks.waiting:
        checks.finish()
    assert all(commands(p.frames()) == ["CONNECTED"] for p in good)
    assert bad.session.next_deadline == pytest.approx(0.5 + world.broker.config.refuse_delay)
    bad.session.tick(0.5 + world.broker.config.refuse_delay)
    [error] = bad.frames()
    assert error.headers["message"] == "access refused"


def test_a_connection_gone_while_its_check_waits_takes_the_check_out_of_the_queue():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    running = connect(world, login="producer", passcode="one")
    queued = connect(world, login="producer", passcode="two")
    assert world.broker.logins.queued == 1
    queued.session.connection_lost()
    assert world.broker.logins.queued == 0
    running.session.connection_lost()
    checks.finish()
    assert not checks.waiting, "the forgotten check never runs"
    assert running.raw() == b"" and queued.raw() == b""


def test_a_reload_that_changes_a_password_forgets_its_cached_login():
    world = world_with_users()
    checks = Deferred()
    world.broker.logins.offload = checks
    connect(world, login="producer", passcode="pw-p")
    checks.finish()
    assert world.broker.logins.remembered("producer", "pw-p") is not None
    world.broker.users = {**USERS, "consumer": users.User("consumer", users.hash_password("new", **CHEAP), frozenset())}
    assert world.broker.logins.remembered("producer", "pw-p") is not None, "an unchanged line keeps its login"
    changed = users.User("producer", users.hash_password("new", **CHEAP), frozenset({"send"}))
    world.broker.users = {**USERS, "producer": changed}
    assert world.broker.logins.remembered("producer", "pw-p") is None
    old = connect(world, login="producer", passcode="pw-p")
    assert len(checks.waiting) == 1, "the old password is checked again"
    checks.finish()
    assert old.session.state == "closing" and world.broker.metrics.access_refused == 1


def test_a_bad_frame_after_connect_waits_for_the_password_check_and_the_frames_before_it():
    world, checks, peer = producer_logging_in(b"SEND\nno colon\n\n\0")
    assert peer.raw() == b"" and peer.session.close_wanted is None, "nothing answered during the check"
    checks.finish()
    world.log.sync()
    frames = peer.frames()
    assert commands(frames) == ["CONNECTED", "RECEIPT", "ERROR"]
    assert frames[2].headers["message"] == "header line without a colon"
    assert world.log.unread == 1
    assert peer.session.close_wanted == "close"
