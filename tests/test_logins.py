"""Password checks queued fairly, shared and cached (curb.logins), as tables over a
worker the test runs by hand."""

from __future__ import annotations

import pytest

from curb import logins, users

CHEAP = {"n": 16, "r": 1, "p": 1}
TABLE = {name: users.User(name, users.hash_password(f"{name}-pw", **CHEAP), frozenset({"send"})) for name in "abc"}


class Worker:
    """An offload that runs one check when the test says, and counts them."""

    def __init__(self) -> None:
        self.waiting: list = []
        self.ran = 0

    def __call__(self, work, then) -> None:
        self.waiting.append((work, then))

    def step(self) -> None:
        [(work, then)] = self.waiting  # never more than one at a time
        self.waiting.clear()
        self.ran += 1
        then(work())


def run(logins_in: str, steps: int = 100) -> tuple[list[str], int]:
    """Each word of `logins_in` is `who@source:login/passcode`; returns who got which
    answer, in the order the answers came, and how many checks ran."""
    worker = Worker()
    checks = logins.LoginChecks(worker)
    checks.users = TABLE
    answers = []
    for word in logins_in.split():
        who, rest = word.split("@")
        source, login_pass = rest.split(":")
        login, passcode = login_pass.split("/")

        def then(answer, who=who):
            name = "shed" if answer is logins.SHED else "refused" if answer is None else answer.name
            answers.append(f"{who}={name}")

        checks.check(who, source, login, passcode, then)
    while worker.waiting and steps:
        worker.step()
        steps -= 1
    return answers, worker.ran


@pytest.mark.parametrize(
    "logins_in, answers, ran",
    [
        ("1@x:a/a-pw", "1=a", 1),
        ("1@x:a/no", "1=refused", 1),
        ("1@x:z/z-pw", "1=refused", 1),  # no such user: still one check
        # The same login waiting shares one check, whatever the source.
        ("1@x:a/a-pw 2@x:a/a-pw 3@y:a/a-pw", "1=a 2=a 3=a", 1),
        ("1@x:a/no 2@y:a/no", "1=refused 2=refused", 1),
        # Checks are served in turn across sources: y's one check is second, not fourth.
        ("1@x:a/1 2@x:a/2 3@x:a/3 4@y:b/b-pw", "1=refused 2=refused 4=b 3=refused", 4),
        ("1@x:a/1 2@x:a/2 3@y:b/1 4@y:b/2 5@z:c/c-pw", "1=refused 2=refused 3=refused 5=c 4=refused", 5),
    ],
)
def test_answers_in_order(logins_in, answers, ran):
    assert run(logins_in) == (answers.split(), ran)


def test_a_login_verified_once_is_remembered_and_a_wrong_one_is_not():
    worker = Worker()
    checks = logins.LoginChecks(worker)
    checks.users = TABLE
    got: list[logins.Answer] = []
    checks.check("1", "x", "a", "a-pw", got.append)
    checks.check("2", "x", "b", "no", got.append)
    worker.step()
    worker.step()
    assert got == [TABLE["a"], None]
    assert checks.remembered("a", "a-pw") == TABLE["a"]
    assert checks.remembered("b", "no") is None
    assert checks.remembered("a", "no") is None


def test_past_a_sources_bound_logins_are_shed_and_other_sources_still_queue():
    worker = Worker()
    checks = logins.LoginChecks(worker)
    checks.users = TABLE
    got: dict[str, logins.Answer] = {}

    def keep(who: str) -> logins.Waiter:
        return lambda answer: got.__setitem__(who, answer)

    per_source = logins.MAX_QUEUED_PER_SOURCE
    for n in range(per_source + 3):  # one runs, per_source wait, two are shed
        checks.check(f"x{n}", "x", "a", f"guess {n}", keep(f"x{n}"))
    assert got == {f"x{per_source + 1}": logins.SHED, f"x{per_source + 2}": logins.SHED}
    got.clear()
    assert checks.queued == per_source
    for source in range(logins.MAX_QUEUED // per_source - 1):  # fill the queue from other sources
        for n in range(per_source):
            checks.check(f"{source}.{n}", f"s{source}", "a", f"{source}.{n}", keep(f"{source}.{n}"))
    assert checks.queued == logins.MAX_QUEUED
    checks.check("late", "new", "b", "b-pw", keep("late"))
    assert got == {f"x{per_source}": logins.SHED}, "a full queue sheds the newest of the source holding the most"
    assert checks.queued == logins.MAX_QUEUED
    while worker.waiting:
        worker.step()
    assert got["late"] == TABLE["b"]
    assert checks.queued == 0


def test_a_check_no_one_waits_for_leaves_the_queue_but_one_running_finishes():
    worker = Worker()
    checks = logins.LoginChecks(worker)
    checks.users = TABLE
    got: list[logins.Answer] = []
    checks.check("1", "x", "a", "a-pw", got.append)  # runs
    checks.check("2", "x", "b", "b-pw", got.append)  # waits
    checks.check("3", "y", "b", "b-pw", got.append)  # shares 2's check
    checks.forget("1")
    checks.forget("2")
    assert checks.queued == 1, "3 still waits for it"
    checks.forget("3")
    assert checks.queued == 0
    worker.step()
    assert got == [] and not worker.waiting
    assert checks.remembered("a", "a-pw") == TABLE["a"], "the finished check still counts"


def test_a_check_many_wait_for_answers_them_a_pass_at_a_time():
    worker = Worker()
    passes: list = []
    checks = logins.LoginChecks(worker, passes.append)
    checks.users = TABLE
    got: list[logins.Answer] = []
    waiters = 2 * logins.ANSWERS_PER_PASS + 1
    for n in range(waiters):
        checks.check(n, "x", "a", "a-pw", got.append)
    worker.step()
    given = [len(got)]
    while passes:
        passes.pop(0)()
        given.append(len(got))
    per_pass = logins.ANSWERS_PER_PASS
    assert given == [per_pass, 2 * per_pass, waiters]
    assert got == [TABLE["a"]] * waiters
