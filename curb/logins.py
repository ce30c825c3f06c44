"""Password checks for CONNECT: few, off the event loop, and fair across source addresses.

A check is one scrypt (about 50 ms of a core). When a broker restarts, every client logs
in again at once; a storm of valid logins must be served, and a flood of bad ones from one
address must neither stall connected clients nor keep other addresses' users out. So:

- A login verified before is answered at once from a cache (users.LoginCache).
- Logins waiting with the same name and passcode share one check.
- Other checks wait in a FairQueue by source address: at most MAX_QUEUED_PER_SOURCE of
  one address and MAX_QUEUED in all, served in turn across addresses; one runs at a time,
  handed to `offload` (a worker thread in curb.cli). A login past those bounds is shed:
  answered SHED at once, unchecked, which the client hears as "server busy", never as a
  wrong password.

Invariants:
- Every waiter gets exactly one answer (a User, None for wrong credentials, or SHED),
  unless `forget` took it back first (its connection is gone); a check no one waits for
  any more leaves the queue unrun.
- At most one check is handed to `offload` at a time.
- At most ANSWERS_PER_PASS waiters are answered in one loop pass (the rest through
  `later`): a check that a thousand connections of one user wait for must not stall the
  connected clients for the time it takes to connect them all.
- A check runs against the users table current when it runs; a changed table (a reload)
  forgets the cached logins it changed.
This module keeps no clock and does no I/O of its own.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from curb.fairqueue import FairQueue
from curb.users import LoginCache, User, authenticate

# Checks waiting, at most: from one source address, and in all. At 50 ms a check, a full
# queue is about 6 s of checks; a login that finds no room is shed ("server busy").
MAX_QUEUED_PER_SOURCE = 32
MAX_QUEUED = 128
# Answers given in one loop pass, at most: each CONNECTED costs the loop about 0.1 ms.
ANSWERS_PER_PASS = 16


class Shed:
    """The answer to a login that was not checked: too many checks wait."""

    def __repr__(self) -> str:
        return "SHED"


SHED: Final = Shed()
Answer = User | Shed | None
Waiter = Callable[[Answer], None]
# Runs a slow function (a password check) and hands its result to a callback on the
# broker's thread; curb.cli passes a worker thread's, tests run it at once or later.
Offload = Callable[[Callable[[], "User | None"], Callable[["User | None"], None]], None]


@dataclass(eq=False, slots=True)
class _Check:
    key: bytes
    source: str
    login: str
    passcode: str
    waiters: dict[object, Waiter] = field(default_factory=dict)  # by whoever waits (a session)


def run_now(work: Callable[[], User | None], then: Callable[[User | None], None]) -> None:
    then(work())


def call_now(callback: Callable[[], None]) -> None:
    callback()


class LoginChecks:
    def __init__(
        self,
        offload: Offload = run_now,
        later: Callable[[Callable[[], None]], object] = call_now,
        cache: LoginCache | None = None,
    ):
        self.offload = offload
        self.later = later  # runs a callback in a later loop pass
        self.cache = cache if cache is not None else LoginCache()
        self._users: Mapping[str, User] = {}
        self._queue: FairQueue[_Check] = FairQueue(MAX_QUEUED_PER_SOURCE, MAX_QUEUED)
        self._checks: dict[bytes, _Check] = {}  # queued or running, by key
        self._waiting: dict[object, _Check] = {}  # by waiter
        self._running: _Check | None = None
        self._answers: collections.deque[tuple[Waiter, Answer]] = collections.deque()

    @property
    def users(self) -> Mapping[str, User]:
        return self._users

    @users.setter
    def users(self, table: Mapping[str, User]) -> None:
        self._users = table
        self.cache.retain(table)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def remembered(self, login: str, passcode: str) -> User | None:
        """The user if this login verified before (no check needed), else None."""
        return self.cache.get(self._users, login, passcode)

    def check_peer(self, peer: str, who: object, login: str, passcode: str, then: Waiter, shed: Waiter) -> None:
        """`check` for a connection from `peer` (HOST:PORT), queued fairly by its host;
        `shed(SHED)` too when it was shed unchecked."""
        source = peer.rpartition(":")[0] or peer

        def answer(result: Answer) -> None:
            if result is SHED:
                shed(result)
            then(result)

        self.check(who, source, login, passcode, answer)

    def check(self, who: object, source: str, login: str, passcode: str, then: Waiter) -> None:
        """Check a login for `who` (one waiter at a time each); `then(answer)` once known,
        possibly at once."""
        key = self.cache.digest(login, passcode)
        check = self._checks.get(key)
        if check is None:
            check = _Check(key, source, login, passcode)
            shed = self._queue.put(source, check)
            if shed is check:
                then(SHED)
                return
            self._checks[key] = check
            if shed is not None:
                self._answer(shed, SHED)
        check.waiters[who] = then
        self._waiting[who] = check
        self._next()

    def forget(self, who: object) -> None:
        """`who` no longer waits (its connection is gone): no answer comes."""
        check = self._waiting.pop(who, None)
        if check is None:
            return
        del check.waiters[who]
        if not check.waiters and self._queue.remove(check.source, check):
            del self._checks[check.key]

    def _next(self) -> None:
        if self._running is not None:
            return
        check = self._queue.take()
        if check is None:
            return
        self._running = check
        table, login, passcode = self._users, check.login, check.passcode
        self.offload(lambda: authenticate(table, login, passcode), lambda user: self._checked(check, user))

    def _checked(self, check: _Check, user: User | None) -> None:
        self._running = None
        if user is not None:
            self.cache.remember(user, check.passcode)
        self._answer(check, user)
        self._next()

    def _answer(self, check: _Check, answer: Answer) -> None:
        del self._checks[check.key]
        for who in check.waiters:
            del self._waiting[who]
        answers = self._answers
        idle = not answers
        answers.extend((then, answer) for then in check.waiters.values())
        if idle:
            self._give_answers()

    def _give_answers(self) -> None:
        answers = self._answers
        try:
            for _ in range(ANSWERS_PER_PASS):
                if not answers:
                    return
                then, answer = answers.popleft()
                then(answer)
        finally:
            if answers:
                self.later(self._give_answers)


class UsersFile:
    """A backend's users file (None: there is none, and every client may do everything),
    kept beside the login checks that read it: a new table (a reload) forgets the logins
    cached under a changed line (curb.users.LoginCache)."""

    logins: LoginChecks
    _users: Mapping[str, User] | None = None

    @property
    def users(self) -> Mapping[str, User] | None:
        return self._users

    @users.setter
    def users(self, table: Mapping[str, User] | None) -> None:
        self._users = table
        self.logins.users = table or {}
