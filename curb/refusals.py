"""Refusals: each counted in the metrics and logged, at most one line a kind per
LIMIT_LOG_SECONDS however many there are.

A TLS handshake that failed, the connection limit, a connection without CONNECT in time, a
failed or shed login, a client error such as a missing permission, a SEND the full disk
refused, and the deliveries past their ack deadline with the ACKs, NACKs and touches that
came after it: a line names the peer and, once it logged in, the user; a line that stands
for several says how many since the last.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from curb.metrics import Metrics
from curb.peer import Peer, who
from curb.ratelimit import LineLimit

# At most one line of each kind of refusal per this many seconds, however many there are.
LIMIT_LOG_SECONDS = 10.0


class Refusals:
    """The metrics' refusal counters and the rate-limited lines of `events`; `clock` times
    the lines of steps that are not given the time."""

    def __init__(self, metrics: Metrics, events: Callable[..., None], clock: Callable[[], float]):
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self._lines: collections.defaultdict[str, LineLimit] = collections.defaultdict(
            lambda: LineLimit(LIMIT_LOG_SECONDS)
        )

    def line(
        self, event: str, text: str, now: float | None = None, kind: str = "", times: int = 1, **fields: object
    ) -> None:
        """The line for `times` refusals of this event (and kind), unless one was logged
        less than LIMIT_LOG_SECONDS ago; a line for several says how many since the last."""
        count = self._lines[f"{event}:{kind}"].hit(self.clock() if now is None else now, times)
        if not count:
            return
        if count > 1:
            text += f" ({count} such since the last line; at most one line per {LIMIT_LOG_SECONDS:g} s)"
        self.events(event, text, count=count, **fields)

    def connection_limit(self, peer: str, limit: int, now: float) -> None:
        """A STOMP connection closed at once: the limit was reached."""
        self.metrics.connections_refused += 1
        self.line(
            "connection_limit",
            f"connection from {peer} closed at once: {limit} connections are open (-max-connections)",
            now,
            peer=peer,
            limit=limit,
        )

    def web_connection_refused(self, limit: int) -> None:
        """A web connection was closed at the limit (curb.web.front): counted and logged as
        a STOMP connection's is."""
        self.metrics.connections_refused += 1
        self.line(
            "connection_limit",
            f"a web connection was closed at once: {limit} web connections are open (-max-connections)",
            kind="web",
            limit=limit,
        )

    def late(self, session: Peer, msg_id: int, what: str, now: float) -> None:
        """A settlement came after its message's ack deadline."""
        self.metrics.late_acks += 1
        self.line(
            "late_ack",
            f"late {what} from {who(session)}: message {msg_id} passed its ack deadline and went back to the "
            "queue before it; the frame changed nothing",
            now,
            peer=session.peer,
            user=session.user,
            message_id=msg_id,
        )

    def timed_out(self, count: int, session: Peer, msg_id: int, now: float, where: str) -> None:
        """`count` deliveries whose ack deadline passed; the last, `msg_id`, held by `session`."""
        self.metrics.ack_timeouts += count
        self.line(
            "ack_timeout",
            f"ack deadline passed: {count} delivered messages went back to {where} (the last: "
            f"message {msg_id}, held by {who(session)})",
            now,
            kind=where,
            times=count,
            peer=session.peer,
            user=session.user,
            message_id=msg_id,
        )

    def protocol_error(self, session: Peer, reason: str) -> None:
        """A client's frame was answered with ERROR, and its connection closes."""
        self.metrics.protocol_errors += 1
        self.line(
            "client_error",
            f"client error from {who(session)}: {reason}",
            peer=session.peer,
            user=session.user,
            reason=reason,
        )

    def permission_refused(self) -> None:
        """A frame needed a permission its user lacks; its ERROR, a client error whose line
        names the user, follows."""
        self.metrics.permissions_refused += 1

    def login_shed(self, session: Peer, queued: int) -> None:
        self.metrics.logins_shed += 1
        self.line(
            "logins_shed",
            f"server busy: shed a login from {session.peer} unchecked, {queued} password checks waiting",
            peer=session.peer,
        )

    def connect_timed_out(self, session: Peer, timeout: float, now: float) -> None:
        """A connection sent no CONNECT within `timeout` seconds."""
        self.metrics.connect_timeouts += 1
        self.line(
            "connect_timeout",
            f"closed {session.peer}: no CONNECT within {timeout:g} s (-connect-timeout)",
            now,
            peer=session.peer,
        )

    def access_refused(self, session: Peer, login: str | None) -> None:
        """A CONNECT did not log in: `login` is its login header (None: it had none, and
        the client certificate's CN, if any, named no user)."""
        self.metrics.access_refused += 1
        cn = session.identity
        if login is not None:
            tried = f"login {login!r}"
        elif cn is not None:
            tried = f"no login, and certificate CN {cn!r} is not a user"
        else:
            tried = "no login and no client certificate"
        self.line(
            "access_refused", f"access refused to {session.peer} ({tried})", peer=session.peer, login=login, cn=cn
        )

    def tls_failed(self, peer: str, reason: str, why: str, now: float) -> None:
        """A TLS handshake failed; `reason` is one of curb.metrics.TLS_FAILURES. A client
        that closed the connection itself is counted but not logged: load balancers'
        port checks do that all day, and nothing was refused."""
        self.metrics.tls_failures[reason] += 1
        if reason != "closed":
            self.line(
                "tls_failed", f"TLS handshake with {peer} failed: {why}", now, kind=reason, peer=peer, reason=reason
            )

    def disk_full(self, refused: int, why: str) -> None:
        """The log could not grow, so it refused the SENDs waiting to be written."""
        self.metrics.refused_disk_full += refused
        self.line(
            "disk_full",
            f"disk full: {why}; SENDs are refused (not stored) until space is freed on that file system",
            reason=why,
        )
