"""`curb passwd FILE NAME`: add a user to a users file, or change one's password or permissions.

The password is read from the terminal (asked twice) or, when stdin is not a terminal,
as stdin's first line, so scripts can pipe it in. The file is replaced atomically (a
temporary file in the same directory, fsynced, then renamed) with mode 0600 and the old
file's owner: a reader, such as a broker reloading on SIGHUP, sees the old file or the new
one, never half.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import sys

import click

from curb import users


@click.command("passwd")
@click.argument("path", metavar="FILE")
@click.argument("name")
@click.option(
    "-perm",
    "--perm",
    "perms",
    multiple=True,
    metavar="PERM[,PERM...]",
    callback=lambda ctx, param, values: _permissions(values),
    help="Permissions to give: send, consume, count, purge, or one of them @DESTINATION (curb router only, "
    "e.g. send@orders); repeat the flag or list them with commas. "
    "Default for an existing user: keep its permissions.",
)
@click.option(
    "-no-password",
    "--no-password",
    is_flag=True,
    help="No password logs this user in: it connects only with a client certificate whose CN is NAME.",
)
def passwd_command(path: str, name: str, perms: frozenset[str], no_password: bool) -> None:
    """Add user NAME to the users file FILE (created if missing), or change its password
    and, with --perm, its permissions. send: SEND; consume: SUBSCRIBE to the queue, ACK,
    NACK; count: SUBSCRIBE to ./count."""
    try:
        users.check_name(name)
        table = _read(path)
    except users.UsersError as err:
        raise click.UsageError(f"{path}: {err}") from None
    old = table.get(name)
    if old is None and not perms:
        raise click.UsageError(f"{name} is a new user: give its permissions with --perm (send, consume, count, purge)")
    permissions = perms or (old.permissions if old else frozenset())
    stored = users.NO_PASSWORD if no_password else users.hash_password(_password(name))
    table[name] = users.User(name, stored, permissions)
    try:
        _write(path, users.format_users(table.values()))
    except OSError as err:
        raise click.ClickException(f"cannot write {path}: {err.strerror or err}") from None
    verb = "changed" if old else "added"
    click.echo(f"curb: {verb} {name} ({', '.join(sorted(permissions)) or 'no permissions'}) in {path}", err=True)


def _permissions(values: tuple[str, ...]) -> frozenset[str]:
    """`--perm send --perm consume` and `--perm send,consume` alike: the file itself
    stores the comma list."""
    names = [name.strip() for value in values for name in value.split(",")]
    if "" in names:
        raise click.BadParameter(f"empty permission in {','.join(values)!r}: use {', '.join(users.PERMISSIONS)}")
    try:
        return users.check_permissions(names)
    except users.UsersError as err:
        raise click.BadParameter(str(err)) from None


def _read(path: str) -> dict[str, users.User]:
    try:
        with open(path, encoding="utf-8") as f:
            return users.parse(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise users.UsersError(f"cannot read it: {getattr(err, 'strerror', None) or err}") from None


def _password(name: str) -> str:
    if sys.stdin.isatty():
        first = getpass.getpass(f"Password for {name}: ")
        if getpass.getpass("Again: ") != first:
            raise click.UsageError("the passwords differ; nothing changed")
    else:
        first = sys.stdin.readline().rstrip("\r\n")
    if not first:
        raise click.UsageError("empty password; nothing changed (use --no-password for certificate-only users)")
    return first


def _write(path: str, text: str) -> None:
    """Replace `path` with `text` atomically, mode 0600."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _keep_owner(path, fd)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)  # the rename itself is durable only once its directory is
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _keep_owner(path: str, fd: int) -> None:
    """A file the broker's user owns stays its own when root changes it."""
    try:
        old = os.stat(path)
    except FileNotFoundError:
        return
    if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
        # Not root: the file becomes ours, as any edit of it would.
        with contextlib.suppress(PermissionError):
            os.fchown(fd, old.st_uid, old.st_gid)
