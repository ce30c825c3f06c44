"""`curb passwd`'s command line: the forms of --perm it takes and the ones it refuses."""

import pytest
from click.testing import CliRunner

from curb import users
from curb.passwd import passwd_command


def passwd(path, name, *args):
    return CliRunner().invoke(passwd_command, [str(path), name, *args], input="pw\n")


@pytest.mark.parametrize(
    "args",
    [
        ["--perm", "send", "--perm", "consume"],
        ["--perm", "send,consume"],
        ["-perm", "consume, send"],
        ["--perm", "send,consume", "--perm", "send"],
    ],
)
def test_permissions_repeated_or_as_a_comma_list_are_the_same(tmp_path, args):
    result = passwd(tmp_path / "users", "alice", *args)
    assert result.exit_code == 0, result.output
    assert users.parse((tmp_path / "users").read_text())["alice"].permissions == {"send", "consume"}


@pytest.mark.parametrize(
    "perm, says",
    [
        ("send,bogus", "unknown permission 'bogus': use send, consume, count, purge"),
        ("send,", "empty permission in 'send,'"),
    ],
)
def test_a_bad_permission_in_a_list_is_refused_with_the_choices(tmp_path, perm, says):
    result = passwd(tmp_path / "users", "alice", "--perm", perm)
    assert result.exit_code == 2 and says in result.output
    assert not (tmp_path / "users").exists(), "nothing written"
