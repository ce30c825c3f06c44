"""The users file: who may connect, with which password hash and which permissions.

One user per line, `name:hash:permissions`, `#` starts a comment line:

    alice:scrypt$16384$8$1$<salt, base64>$<hash, base64>:send,consume,count
    spark:!:consume

The hash is scrypt (hashlib) with a random 16-byte salt; its cost parameters (n, r, p) are
kept on each line, so a later default applies to new passwords without breaking old ones.
`!` in place of a hash means no password logs in: the user connects only with a client
certificate whose subject CN is the name (mutual TLS).

Invariants:
- Names hold no `:`, white space or control characters; each appears once in a file.
- Permissions are a subset of PERMISSIONS, or one of them scoped to a destination of
  `curb router` (`send@orders`), which only the router reads: an instance grants only
  unscoped ones (it serves one queue), the router either (`allows`).
- `authenticate` costs one scrypt whether the name exists or not (a dummy hash stands in),
  and compares hashes in constant time, so its time does not tell which names exist.
- `LoginCache` holds no passcode: only an HMAC of (name, passcode) under a key made at
  start-up that never leaves memory, compared in constant time, and only while the user's
  line still has the hash it was verified against.
This module is pure: it reads and writes text, never files. Its hashing imports hashlib
and hmac when first used: a broker without users never does, and they cost an idle
broker more memory (0.7 MiB) than the rest of this module.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A destination's name, as a permission (`send:orders`) or a route of `curb router` names it.
DESTINATION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


PERMISSIONS = ("send", "consume", "count", "purge")  # purge: DELETE a queue over HTTP
NO_PASSWORD = "!"
# scrypt's cost: 2**14 blocks of 128*r bytes is 16 MiB and about 50 ms a check.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
SALT_BYTES = 16
HASH_BYTES = 32
MAX_SCRYPT_MEMORY = 256 << 20


class UsersError(ValueError):
    """The users file (or a name, permission or hash) is not valid; says which line and why."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    hash: str
    permissions: frozenset[str]


def hash_password(password: str, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A salted scrypt hash of `password`, with its parameters: `scrypt$n$r$p$salt$hash`."""
    salt = os.urandom(SALT_BYTES)
    digest = _scrypt(password, salt, n, r, p)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def verify(stored: str, password: str) -> bool:
    """True if `password` matches the stored hash; False for `!` or a malformed hash."""
    try:
        n, r, p, salt, expected = _split_hash(stored)
    except UsersError:
        return False
    import hmac

    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(expected)), expected)


def authenticate(users: Mapping[str, User], login: str, passcode: str) -> User | None:
    """The user if `login` and `passcode` match a line of the users file, else None."""
    user = users.get(login)
    if user is None or user.hash == NO_PASSWORD:
        verify(_DUMMY_HASH, passcode)
        return None
    return user if verify(user.hash, passcode) else None


class LoginCache:
    """Logins verified since start-up, so that a user's next login costs an HMAC instead
    of an scrypt: after a restart every client logs in again at once, and only the first
    login of each user should pay for its check.

    One entry per user name (the last passcode that verified), so it holds at most one
    entry per line of the users file."""

    def __init__(self, secret: bytes | None = None):
        self._secret = secret if secret is not None else os.urandom(32)
        self._verified: dict[str, tuple[str, bytes]] = {}  # name -> (hash verified against, digest)

    def digest(self, login: str, passcode: str) -> bytes:
        """The keyed digest of a login: equal for equal (login, passcode) pairs only."""
        import hashlib
        import hmac

        name = login.encode()
        data = b"%d:%s%s" % (len(name), name, passcode.encode())
        return hmac.new(self._secret, data, hashlib.sha256).digest()

    def get(self, users: Mapping[str, User], login: str, passcode: str) -> User | None:
        """The user if this login verified before against the user's current hash, else None
        (not known: check it)."""
        entry = self._verified.get(login)
        user = users.get(login)
        if entry is None or user is None or user.hash != entry[0]:
            return None
        import hmac

        return user if hmac.compare_digest(entry[1], self.digest(login, passcode)) else None

    def remember(self, user: User, passcode: str) -> None:
        """`passcode` just verified against `user`'s hash."""
        self._verified[user.name] = (user.hash, self.digest(user.name, passcode))

    def retain(self, users: Mapping[str, User]) -> None:
        """Forget the logins of users gone from `users` or whose hash changed (a reload)."""
        for name, (stored, _) in list(self._verified.items()):
            user = users.get(name)
            if user is None or user.hash != stored:
                del self._verified[name]

    def __len__(self) -> int:
        return len(self._verified)


def parse(text: str) -> dict[str, User]:
    """The users of a users file's text; UsersError names the first bad line."""
    users: dict[str, User] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            user = _parse_line(line)
        except UsersError as err:
            raise UsersError(f"line {number}: {err}") from None
        if user.name in users:
            raise UsersError(f"line {number}: user {user.name!r} appears twice")
        users[user.name] = user
    return users


def format_users(users: Iterable[User]) -> str:
    """The text of a users file holding `users`, one line each, in the order given."""
    lines = ["# Curb users: name:hash:permissions (see `curb passwd --help`)"]
    lines += [f"{u.name}:{u.hash}:{','.join(_ordered(u.permissions))}" for u in users]
    return "\n".join(lines) + "\n"


def _ordered(permissions: frozenset[str]) -> list[str]:
    """Plain permissions in PERMISSIONS' order, then scoped ones sorted."""
    return [p for p in PERMISSIONS if p in permissions] + sorted(p for p in permissions if p not in PERMISSIONS)


def check_name(name: str) -> str:
    if not name or any(c == ":" or c.isspace() or not c.isprintable() for c in name):
        raise UsersError(f"bad user name {name!r}: use printable characters other than ':' and spaces")
    return name


def check_permissions(names: Iterable[str]) -> frozenset[str]:
    perms = frozenset(names)
    unknown = sorted(p for p in perms if p not in PERMISSIONS and not _scoped(p))
    if unknown:
        raise UsersError(
            f"unknown permission {unknown[0]!r}: use {', '.join(PERMISSIONS)}, or one of them "
            "@DESTINATION for curb router (e.g. send@orders)"
        )
    return perms


def allows(permissions: frozenset[str], permission: str, destination: str) -> bool:
    """Whether a user with `permissions` may do `permission` on a router's destination."""
    return permission in permissions or f"{permission}@{destination}" in permissions


def _scoped(permission: str) -> bool:
    """`PERMISSION@DESTINATION`, the destination named as `curb router` names them."""
    kind, sep, destination = permission.partition("@")
    return bool(sep) and kind in PERMISSIONS and DESTINATION_NAME.fullmatch(destination) is not None


def _parse_line(line: str) -> User:
    parts = line.split(":")
    if len(parts) != 3:
        raise UsersError("expected name:hash:permissions")
    name, stored, perms = parts
    if stored != NO_PASSWORD:
        _split_hash(stored)
    return User(check_name(name), stored, check_permissions(p.strip() for p in perms.split(",") if p.strip()))


def _split_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise UsersError("bad hash: expected scrypt$n$r$p$salt$hash or !")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = base64.b64decode(parts[4], validate=True), base64.b64decode(parts[5], validate=True)
    except ValueError:
        raise UsersError("bad hash: n, r, p must be numbers and salt, hash base64") from None
    if (
        n < 2
        or n & (n - 1)
        or r < 1
        or p < 1
        or 128 * r * n * p > MAX_SCRYPT_MEMORY
        or len(digest) > 64
        or not salt
        or not digest
    ):
        raise UsersError(f"bad hash: scrypt parameters n={n} r={r} p={p} out of range")
    return n, r, p, salt, digest


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, size: int = HASH_BYTES) -> bytes:
    import hashlib

    memory = 128 * r * n * p + (1 << 20)
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=memory * 2, dklen=size)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Verified against when a login names no user, so an unknown name costs what a known one does.
_DUMMY_HASH = f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(bytes(SALT_BYTES))}${_b64(bytes(HASH_BYTES))}"
