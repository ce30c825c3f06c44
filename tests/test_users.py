"""The users file format and password hashing (curb.users), table-driven."""

from __future__ import annotations

import pytest

from curb import users

CHEAP = {"n": 16, "r": 1, "p": 1}


def test_a_hash_verifies_its_password_only():
    stored = users.hash_password("secret", **CHEAP)
    assert stored.startswith("scrypt$16$1$1$")
    assert users.verify(stored, "secret")
    assert not users.verify(stored, "Secret")
    assert not users.verify(stored, "")


def test_each_hash_has_its_own_salt():
    assert users.hash_password("same", **CHEAP) != users.hash_password("same", **CHEAP)


def test_the_default_parameters_are_stored_on_the_line():
    stored = users.hash_password("x")
    n, r, p = stored.split("$")[1:4]
    assert (int(n), int(r), int(p)) == (users.SCRYPT_N, users.SCRYPT_R, users.SCRYPT_P)
    assert users.verify(stored, "x")


@pytest.mark.parametrize(
    "stored", ["!", "", "plain", "scrypt$16$1$1$salt", "scrypt$15$1$1$AA==$AA==", "md5$1$1$1$AA==$AA=="]
)
def test_no_password_matches_a_missing_or_bad_hash(stored):
    assert not users.verify(stored, "")
    assert not users.verify(stored, "!")


def test_a_file_round_trips_through_format_and_parse():
    alice = users.User("alice", users.hash_password("a", **CHEAP), frozenset({"send", "count"}))
    spark = users.User("spark", users.NO_PASSWORD, frozenset())
    text = users.format_users([alice, spark])
    assert text.startswith("#")
    assert f"alice:{alice.hash}:send,count\n" in text
    assert "spark:!:\n" in text
    assert users.parse(text) == {"alice": alice, "spark": spark}


GOOD_HASH = users.hash_password("x", **CHEAP)


@pytest.mark.parametrize(
    "text, error",
    [
        ("alice\n", "line 1: expected name:hash:permissions"),
        (f"# users\n\nalice:{GOOD_HASH}:send,admin\n", "line 3: unknown permission 'admin'"),
        (f"alice:{GOOD_HASH}:send\nalice:!:send\n", "line 2: user 'alice' appears twice"),
        ("alice:secret:send\n", "line 1: bad hash"),
        ("alice:scrypt$16$1$1$!!$AA==:send\n", "line 1: bad hash"),
        ("alice:scrypt$1048576$64$1$AA==$AA==:send\n", "line 1: bad hash: scrypt parameters"),
        ("al ice:!:send\n", "line 1: bad user name"),
        (":!:send\n", "line 1: bad user name"),
    ],
)
def test_a_bad_file_names_its_first_bad_line(text, error):
    with pytest.raises(users.UsersError) as raised:
        users.parse(text)
    assert str(raised.value).startswith(error)


def test_authenticate():
    table = {
        "alice": users.User("alice", users.hash_password("pw", **CHEAP), frozenset({"send"})),
        "cert": users.User("cert", users.NO_PASSWORD, frozenset({"send"})),
    }
    assert users.authenticate(table, "alice", "pw") == table["alice"]
    assert users.authenticate(table, "alice", "nope") is None
    assert users.authenticate(table, "bob", "pw") is None
    assert users.authenticate(table, "cert", "!") is None
    assert users.authenticate(table, "cert", "") is None


ALICE = users.User("alice", users.hash_password("pw", **CHEAP), frozenset({"send"}))
BOB = users.User("bob", users.hash_password("bw", **CHEAP), frozenset({"send"}))
NEW_ALICE = users.User("alice", users.hash_password("pw2", **CHEAP), frozenset({"send"}))
MORE_ALICE = users.User("alice", ALICE.hash, frozenset({"send", "count"}))


@pytest.mark.parametrize(
    "table, login, passcode, found",
    [
        ({"alice": ALICE, "bob": BOB}, "alice", "pw", ALICE),
        ({"alice": ALICE, "bob": BOB}, "alice", "pw ", None),
        ({"alice": ALICE, "bob": BOB}, "alice", "", None),
        ({"alice": ALICE, "bob": BOB}, "bob", "bw", None),  # never verified
        ({"alice": ALICE, "bob": BOB}, "bob", "pw", None),  # another user's passcode
        ({"alice": MORE_ALICE}, "alice", "pw", MORE_ALICE),  # same hash: today's permissions
        ({"alice": NEW_ALICE}, "alice", "pw", None),  # a new password
        ({"alice": NEW_ALICE}, "alice", "pw2", None),  # verified only once checked
        ({"bob": BOB}, "alice", "pw", None),  # gone from the file
    ],
)
def test_the_login_cache_knows_only_verified_logins_under_the_current_hash(table, login, passcode, found):
    cache = users.LoginCache()
    cache.remember(ALICE, "pw")
    assert cache.get(table, login, passcode) == found


@pytest.mark.parametrize(
    "a, b, same",
    [
        (("alice", "pw"), ("alice", "pw"), True),
        (("alice", "pw"), ("alice", "pw "), False),
        (("alice", "pw"), ("alic", "epw"), False),  # the split between login and passcode counts
        (("alice:", "pw"), ("alice", ":pw"), False),
        (("", ""), ("", ""), True),
    ],
)
def test_the_digest_tells_logins_apart(a, b, same):
    cache = users.LoginCache()
    assert (cache.digest(*a) == cache.digest(*b)) is same


def test_each_cache_has_its_own_key_and_keeps_no_passcode():
    one, two = users.LoginCache(), users.LoginCache()
    assert one.digest("alice", "pw") != two.digest("alice", "pw")
    one.remember(ALICE, "secret passcode")
    assert "secret passcode" not in repr(vars(one))


@pytest.mark.parametrize(
    "reloaded, kept",
    [
        ({"alice": ALICE, "bob": BOB}, 1),
        ({"alice": MORE_ALICE}, 1),
        ({"alice": NEW_ALICE}, 0),
        ({"bob": BOB}, 0),
        ({}, 0),
    ],
)
def test_a_reload_forgets_the_logins_it_changed(reloaded, kept):
    cache = users.LoginCache()
    cache.remember(ALICE, "pw")
    cache.retain(reloaded)
    assert len(cache) == kept
