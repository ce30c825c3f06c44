"""Who may do what on a STOMP connection: CONNECT (version, heart-beats, login) and each
frame's permission; the session's states (NEW until CONNECTED, OPEN, CLOSING).

With a users file (Broker.users), CONNECT must name a user and its password, or come
over a connection whose client certificate's CN names a user (`Conn.identity`). A
login verified before is known at once (Broker.remembered_login); another password check
(scrypt) runs off the event loop (Broker.check_login); until it answers the session reads
nothing and holds the frames that came after CONNECT (`Login.held`), then handles them
in order. A failed CONNECT is answered "access refused" only at a deadline a fixed delay
after it came (`Login.refusing_at`), the same for every failure, so a wrong password
cannot be told from an unknown user by its timing; a login the broker shed unchecked
gets "server busy" at once, never "access refused".

Each frame needs at most one permission, named by `PERMISSION` (and `./count` frames
need `count`); without a users file everything is allowed.
"""

from __future__ import annotations

from typing import Protocol

from curb import __version__, heartbeat, users
from curb.backend import COUNT, REDRIVE
from curb.conn import CLOSING, OPEN, Conn
from curb.frame import Frame, encode
from curb.logins import Answer, Shed
from curb.queue_errors import QueueError

SERVER = f"curb/{__version__}"

# The permission each command needs when Curb has a users file; `./count` frames need
# `count` instead (permission_needed).
PERMISSION = {"SEND": "send", "SUBSCRIBE": "consume", "ACK": "consume", "NACK": "consume"}


class Destinations(Protocol):
    """How a backend judges a destination (curb.backend.Backend.send_kind, subscribe_kind)."""

    def send_kind(self, destination: str | None) -> tuple[str, str]: ...
    def subscribe_kind(self, destination: str | None) -> tuple[str, str]: ...


def permission_needed(backend: Destinations, frame: Frame) -> str | None:
    """The permission a frame needs, or None for a frame anyone logged in may send. A
    redrive changes dead letters as consuming them does: it needs `consume`; reading
    counts needs `count`. Which destination is which is the backend's to say."""
    command, headers = frame.command, frame.headers
    try:
        if command == "SEND" and backend.send_kind(headers.get("destination"))[0] is REDRIVE:
            return "consume"
        if command == "SUBSCRIBE" and backend.subscribe_kind(headers.get("destination"))[0] is COUNT:
            return "count"
    except QueueError:
        pass  # a destination refused: the frame's own rule says so
    if command in ("ACK", "NACK") and headers.get("id", "").startswith("count-"):
        return "count"
    return PERMISSION.get(command)


def refused(session: Conn, frame: Frame) -> bool:
    """Whether the session's user lacks the frame's permission; if so, its ERROR is sent.
    Only for a session with permissions (a users file)."""
    permissions = session.login.permissions or frozenset()
    needed = permission_needed(session.broker, frame)
    if needed is None or needed in permissions:
        return False
    scope = session.broker.scope(session, frame)
    if scope is not None and users.allows(permissions, needed, scope):
        return False
    session.broker.refusals.permission_refused()
    session.error(
        f"{needed} permission needed" + (f" for {scope!r}" if scope is not None else ""),
        f"User {session.user!r} may not {frame.command} here without the {needed!r} permission; "
        f"the operator grants it with `curb passwd USERS-FILE {session.user} --perm {needed} ...`"
        + (f" (or --perm {needed}@{scope} for this destination only)." if scope is not None else "."),
        frame,
    )
    return True


def log_in(session: Conn, headers: dict[str, str], theirs: tuple[int, int]) -> None:
    """Check CONNECT's credentials against the users file: a certificate's CN or a login
    verified before at once, another password off the loop, holding the frames that
    follow until it is known."""
    broker = session.broker
    users_by_name = broker.users
    assert users_by_name is not None
    login = headers.get("login")
    came = session.beats.last_recv
    if login is None:
        user = users_by_name.get(session.identity) if session.identity is not None else None
        _logged_in(session, user, None, came, theirs)
        return
    passcode = headers.get("passcode", "")
    known = broker.logins.remembered(login, passcode)
    if known is not None:
        _logged_in(session, known, login, came, theirs)
        return
    session.login.held, session.reading = [], False  # read nothing, hold the frames that come
    session.wake()
    broker.check_login(session, login, passcode, lambda answer: _checked(session, answer, login, came, theirs))


def _checked(session: Conn, answer: Answer, login: str, came: float, theirs: tuple[int, int]) -> None:
    """The password check's answer: handle the held frames once connected."""
    held, session.login.held = session.login.held or [], None
    if session.gone:
        return
    if isinstance(answer, Shed):
        _shed(session)
        return
    _logged_in(session, answer, login, came, theirs)
    if answer is None:
        return
    session.reading = session.writable and not session.stopped
    for frame in held:
        if session.state is CLOSING:
            break
        session.handle(frame)
    session.broker.passes.after_frames()


def _logged_in(session: Conn, user: users.User | None, login: str | None, came: float, theirs: tuple[int, int]) -> None:
    """Connect as `user`, or refuse at the deadline a fixed delay after CONNECT came."""
    if user is None:
        session.broker.refusals.access_refused(session, login)
        session.state = CLOSING
        session.login.refusing_at = came + session.broker.config.refuse_delay  # curb.deadlines answers then
        session.deadlines += 1
        session.wake()  # the driver re-arms its timer for the refusal
        return
    session.user, session.login.permissions = user.name, user.permissions
    connected(session, theirs)


def on_connect(session: Conn, frame: Frame) -> None:
    """CONNECT (or STOMP): version and heart-beats, then the login when there are users."""
    versions = frame.headers.get("accept-version", "1.0").split(",")
    if "1.2" not in versions:
        session.error(
            "unsupported protocol version", "Curb speaks STOMP 1.2 only; send accept-version:1.2.", frame, version="1.2"
        )
        return
    try:
        theirs = heartbeat.parse(frame.headers.get("heart-beat", "0,0"))
    except ValueError as err:
        session.error("bad heart-beat header", f"{err}.", frame)
        return
    if session.broker.users is not None:
        log_in(session, frame.headers, theirs)
    else:
        connected(session, theirs)


def connected(session: Conn, theirs: tuple[int, int]) -> None:
    ours = session.broker.config.heartbeat_ms
    session.beats.send_every, session.beats.expect_every = heartbeat.negotiate((ours, ours), theirs)
    session.deadlines += 1
    session.state = OPEN
    session.write(
        encode(
            "CONNECTED",
            {"version": "1.2", "server": SERVER, "heart-beat": f"{ours},{ours}", "session": str(id(session))},
        )
    )


def _shed(session: Conn) -> None:
    """The login was not checked (too many wait): say so at once, not as a wrong password."""
    session.say_and_close(
        encode(
            "ERROR",
            {"version": "1.2", "content-type": "text/plain", "message": "server busy"},
            b"Too many logins are waiting for a password check, so this one was not checked. "
            b"Connect again in a few seconds.\n",
        )
    )


ACCESS_REFUSED = encode(
    "ERROR",
    {"version": "1.2", "content-type": "text/plain", "message": "access refused"},
    b"Send the login and passcode of a user in the broker's users file.\n",
)
