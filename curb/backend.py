"""What a STOMP session asks of whatever serves it: the one seam between the session's
rules and a queue.

A `curb.session.Session` and its rule units (curb.commands, curb.access,
curb.deadlines, curb.render, curb.transaction_rules) reach their queue only through a
`Backend`. Two implement it: `curb.broker.Broker`, one queue on its own log, and
`curb.router.core.RouterCore`, the destinations of `curb router`, forwarded to Curb
instances. So a client meets the same rules, answers and errors on either: CONNECT and
logins, heart-beats, the receipt line, limits, flow control and every frame's checks are
written once, in the session.

The destination a frame names is the backend's to judge (`send_kind`,
`subscribe_kind`): an instance has one queue and its own `./` names; a router has a
queue per routed NAME and `./NAME/count`, `./NAME/dead`, `./NAME/redrive`. Calls that
concern one destination are given the name that judgement returned.

Invariants every backend keeps:
- `durability(session)` answers only once what the session sent before is durable
  (an instance: on its disk; a router: answered by every instance it was forwarded to),
  or with `Unconfirmed` when that can no longer be known (a link lost), which the
  receipt line turns into a RECEIPT with `curb-unconfirmed:true` that promises nothing
  (never `curb-late:true`, which says the frame changed nothing).
- A message it delivers through `Session.deliver` it holds for that session until
  ACK, NACK, `handed_off` (auto) or `gone`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from curb.frame import Frame
from curb.logins import Answer
from curb.users import User

if TYPE_CHECKING:
    from curb.log.browse import Step
    from curb.log.cursor import Record
    from curb.peer import Peer
    from curb.queue import Subscription
    from curb.transactions import Budget

Done = Callable[[str | None], None]

# What a destination is to a backend (send_kind, subscribe_kind).
QUEUE, REDRIVE, DEAD, COUNT = "queue", "redrive", "dead", "count"


class Browsing(Protocol):
    """A browse as the session steps it (curb.log.browse.Browse, curb.dead.DeadBrowse, a
    router's curb.router.browses.RoutedBrowse): `to_id` is the range's end, which its end
    marker names (`curb-last-id`) once `step` says it is done."""

    @property
    def to_id(self) -> int: ...
    def step(self, budget: int) -> Step: ...


class SessionConfig(Protocol):
    """The settings a session reads, fixed at start-up (curb.broker_config.BrokerConfig
    for an instance, curb.router.config.RouterConfig for a router)."""

    @property
    def prefetch(self) -> int: ...
    @property
    def max_frame(self) -> int: ...
    @property
    def heartbeat_ms(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def refuse_delay(self) -> float: ...


class Passes(Protocol):
    """A loop pass's batching (curb.loop_pass.LoopPass)."""

    def before_frames(self) -> None: ...
    def after_frames(self) -> None: ...
    def want_flush(self, session: Peer) -> None: ...


class Refusals(Protocol):
    """The refusals a session reports (curb.refusals.Refusals)."""

    def protocol_error(self, session: Peer, reason: str) -> None: ...
    def permission_refused(self) -> None: ...
    def access_refused(self, session: Peer, login: str | None) -> None: ...
    def connect_timed_out(self, session: Peer, timeout: float, now: float) -> None: ...
    def login_shed(self, session: Peer, queued: int) -> None: ...
    def tls_failed(self, peer: str, reason: str, why: str, now: float) -> None: ...
    def events(self, kind: str, text: str, **fields: Any) -> None: ...
    def web_connection_refused(self, limit: int) -> None: ...


class Logins(Protocol):
    def remembered(self, login: str, passcode: str) -> User | None: ...
    def forget(self, who: object) -> None: ...


class Backend(Protocol):
    """What a session asks of its queue (see the module docstring)."""

    @property
    def config(self) -> SessionConfig: ...
    @property
    def max_message(self) -> int: ...
    @property
    def passes(self) -> Passes: ...
    @property
    def refusals(self) -> Refusals: ...
    @property
    def logins(self) -> Logins: ...
    @property
    def users(self) -> Mapping[str, User] | None: ...
    @property
    def transactions(self) -> Budget | None:
        """Transactions' shared bound, or None where transactions are refused."""

    # ---------------------------------------------------------------- connections

    handshaking: int  # TLS connections admitted whose handshake is under way (curb.server)

    def admit(self, now: float, peer: str) -> bool: ...
    def join(self, session: Peer) -> None: ...
    def gone(self, session: Peer) -> None: ...
    def check_login(self, session: Peer, login: str, passcode: str, then: Callable[[Answer], None]) -> None: ...
    def durability(self, session: Peer) -> Callable[[Done], None]:
        """The session's `when_durable`: done(None) once what it sent so far is durable."""

    def wall_ms(self) -> int: ...

    # ---------------------------------------------------------------- destinations

    def send_kind(self, destination: str | None) -> tuple[str, str]:
        """(QUEUE or REDRIVE, name) for a SEND's destination; QueueError if refused."""

    def subscribe_kind(self, destination: str | None) -> tuple[str, str]:
        """(QUEUE, DEAD or COUNT, name) for a SUBSCRIBE's destination; QueueError if refused."""

    # ---------------------------------------------------------------- frames

    def check_send(self, headers: Mapping[str, str], body: bytes) -> None:
        """Raise Refused or QueueError for a SEND `accept` would refuse (a transaction
        holds only SENDs that pass)."""

    def accept(
        self,
        headers: Mapping[str, str],
        body: bytes,
        done: Done | None = None,
        urgent: bool = True,
        session: Peer | None = None,
    ) -> None:
        """Take a message (Broker.accept); `session`: the connection that sent it, whose
        later RECEIPTs wait for it too."""

    def redrive(self, name: str, count: int | None, moved: Callable[[int], None], failed: Done) -> None:
        """Move up to `count` (None: all) dead letters back: `moved(n)` once done, or
        `failed(why)` (a router's instance refused, or was lost before it answered)."""

    def subscribe(
        self,
        session: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int | None,
        ack_timeout: float | None,
        dead: bool,
        name: str = "",
    ) -> Subscription[Peer, Record]: ...
    def unsubscribe(self, session: Peer, sub_id: str, dead: bool = False) -> None: ...
    def ack(self, session: Peer, msg_id: int) -> None: ...
    def nack(self, session: Peer, msg_id: int, delay_ms: int | None = None) -> None: ...
    def bounce(self, session: Peer, msg_id: int) -> None: ...
    def touch(self, session: Peer, msg_id: int, seconds: float) -> None: ...
    def scope(self, session: Peer, frame: Frame) -> str | None:
        """The destination a frame's permission is scoped to (`send@NAME`), or None."""

    def ack_upto(self, upto: int, done: Done | None = None, destination: str | None = None) -> None: ...
    def browse(self, session: Peer, from_id: int, to_id: int | None, name: str = "") -> Browsing: ...
    def browse_dead(self, session: Peer, name: str = "") -> Browsing: ...
    def end_browse(self, browse: Browsing) -> None: ...

    # ---------------------------------------------------------------- counts and flow

    def counts_of(self, name: str) -> dict[str, int]: ...
    def count_tail(self, name: str, counts: dict[str, int]) -> tuple[bytes, bytes]:
        """The `./count` MESSAGE after its prefix, as curb.counts.CountMessages.tail."""

    def watch_counts(self, session: Peer, name: str, watching: bool) -> None: ...
    def handed_off(self, session: Peer, records: Sequence[Record]) -> None: ...
    def set_writable(self, session: Peer, writable: bool) -> None: ...
    def pump(self) -> None: ...
