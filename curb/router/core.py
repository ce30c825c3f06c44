"""The router as its clients' backend, sans I/O: each client is a `curb.session.Session`
with this core as its `curb.backend.Backend`, so a client of `curb router` meets the
rules, answers and errors of an instance, written once in the session; the core turns
what a session asks into frames for instances and hands their MESSAGEs to sessions.

Its units: where frames go (curb.router.placement), the links to instances
(curb.router.links), clients' credit and the instances' subscriptions
(curb.router.credit), what each client holds (curb.router.deliveries), a destination's
counts (curb.router.counts) and the RECEIPTs that wait on instances
(curb.router.waits). The glue (curb.router.glue) serves the clients with curb.server,
connects the links, writes their output (`flush_links`, once per loop pass,
curb.loop_pass) and ticks the core. No socket, no clock, no event loop of its own:
`clock`, `schedule` and `wall_ms` are given.

Rules kept here:
- Destinations: a routed NAME is a queue; `./NAME/count` (or `/queue/NAME/count`) its
  counts, `./NAME/dead` its dead letters, `./NAME/redrive` its redrive.
- A SEND is checked as an instance checks it (curb.send_rule) before it is forwarded
  or held in a transaction, and forwarded with a receipt of the router's own; its
  session's RECEIPT waits for the instance's. A RECEIPT that waits for what the session
  sent before (`durability`) sends a marker with a receipt (`ACK id:count-0`, which an
  instance answers once what came before on that connection is durable) on each link
  its ACKs and NACKs used since. So a client's RECEIPT means its frame and every
  earlier one are durable, on whichever instance; where that cannot be known (a link
  lost first) it carries `curb-unconfirmed:true` (curb.router.waits).
- An instance's ERROR for a frame is that frame's client's ERROR, with the instance's
  message and body; the frames after it, which the instance dropped unread, are placed
  again (SENDs) or unconfirmed (the markers that wait for ACKs and NACKs).
- Browses read the instances themselves (curb.router.browses); ACK `curb-upto` and
  `./NAME/redrive` act on them (curb.router.bulk); `./NAME/dead` subscriptions take their
  dead letters as the queue's subscriptions take messages (curb.router.credit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from curb import message_limits, payload, send_rule
from curb.backend import COUNT, DEAD, QUEUE, REDRIVE, Browsing, Done
from curb.browse_steps import BrowseSteps
from curb.frame import Frame
from curb.log.cursor import Record
from curb.logins import Answer, LoginChecks, Offload, UsersFile, run_now
from curb.loop_pass import LoopPass, Schedule
from curb.metrics import Metrics
from curb.outcomes import Refusal
from curb.peer import Peer
from curb.queue import MAX_PREFETCH, settings
from curb.queue_errors import QueueError
from curb.refusals import Refusals
from curb.refused import Refused
from curb.router.browses import Browses, RoutedBrowse
from curb.router.bulk import Bulk
from curb.router.config import RouterConfig
from curb.router.counts import DestinationCounts
from curb.router.credit import ClientSub, Credit
from curb.router.deliveries import Deliveries
from curb.router.links import BROWSES, CONSUMES, SENDS, UP, Forwarded, Link, Links
from curb.router.placement import Placement
from curb.router.routes import Address, Routes, own_name
from curb.router.waits import Waits
from curb.transactions import Budget


class RouterCore(UsersFile):
    """Every client session and link of one router; see the module docstring."""

    def __init__(
        self,
        routes: Routes,
        config: RouterConfig | None = None,
        *,
        events: Callable[..., None] = lambda *args, **fields: None,
        schedule: Schedule,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        clock: Callable[[], float] = time.monotonic,
        offload: Offload | None = None,
    ):
        self.config = config = config or RouterConfig()
        self.max_message = config.max_frame
        self.wall_ms = wall_ms
        self.transactions = Budget()
        self.refusals = Refusals(Metrics(), events, clock)
        self.logins = LoginChecks(offload or run_now, lambda callback: schedule(0, callback))
        self.handshaking = 0
        self.hold_flush = False
        self.flush_links: Callable[[], None] = lambda: None  # the glue's: write the links' output
        self.passes = LoopPass(self, self.pump, schedule)
        self.sessions: dict[Peer, None] = {}
        self.waits: dict[Peer, Waits] = {}
        self.links = Links(self, config.link_heartbeat_ms, config.login, config.passcode, events)
        self.placement = Placement(self.links, clock, config.link_wait, self.sessions.__contains__)
        self.credit = Credit(self.links, self.placement.consumers)
        self.counts = DestinationCounts(self.credit, self.placement.consumers)
        self.deliveries = Deliveries(self.links, self.credit, clock)
        self.ack = self.deliveries.ack  # the commonest call of a session: no hop
        self.new_links: Callable[[list[Link]], None] = lambda links: None  # the glue's: connect them
        self.browse_steps = BrowseSteps(schedule)
        self.bulk = Bulk(self.links, self.placement)
        self.browses = Browses(self.links, lambda link: self.new_links([link]), self.browse_steps.want)
        self.set_routes(routes)

    def flush(self) -> None:
        """The loop pass's log write (curb.loop_pass): the links' output goes out."""
        self.flush_links()

    # ---------------------------------------------------------------- routes

    def set_routes(self, routes: Routes) -> list[Link]:
        """A new routes table: the new links (for the glue to connect); see Placement."""
        return self._routed(self.placement.set_routes(routes))

    def spawned_instance(self, name: str, address: Address) -> list[Link]:
        return self._routed(self.placement.spawned_instance(name, address))

    def _routed(self, new: list[Link]) -> list[Link]:
        for link in self.placement.removed:
            self.credit.forget(link)
        self.placement.removed.clear()
        for name in self.placement.dests:
            self.credit.reshare(name)
        return new

    # ---------------------------------------------------------------- connections

    def admit(self, now: float, peer: str) -> bool:
        return True

    def join(self, session: Peer) -> None:
        self.sessions[session] = None
        self.refusals.metrics.connections_total += 1

    def check_login(self, session: Peer, login: str, passcode: str, then: Callable[[Answer], None]) -> None:
        def shed(_: Answer) -> None:
            self.refusals.login_shed(session, self.logins.queued)

        self.logins.check_peer(session.peer, session, login, passcode, then, shed)

    def durability(self, session: Peer) -> Callable[[Done], None]:
        waits = self.waits.setdefault(session, Waits())

        def when_durable(done: Done) -> None:
            for link, epoch in self.deliveries.unsynced.pop(session, {}).items():
                number = waits.forwarded()
                if link.state is UP and link.epoch == epoch:
                    marker = Forwarded(session, waits, "ACK", {"id": "count-0"}, b"", link.dest, number=number)
                    self.links.forward(link, marker)
                else:
                    waits.answered(number, f"instance {link.name} was lost before it answered")
            waits.wait(done)

        return when_durable

    def gone(self, session: Peer) -> None:
        """The connection is gone: what it held goes back to its instances."""
        self.sessions.pop(session, None)
        self.logins.forget(session)
        for dest in [dest for dest, watchers in self.counts.watchers.items() if session in watchers]:
            self.counts.watch(session, dest, False)
        self.deliveries.gone(session)
        self.waits.pop(session, None)

    # ---------------------------------------------------------------- destinations

    def send_kind(self, destination: str | None) -> tuple[str, str]:
        redrive = own_name(destination, "/redrive")
        if redrive is not None:
            return REDRIVE, redrive
        return QUEUE, self.placement.route(destination, "SEND")

    def subscribe_kind(self, destination: str | None) -> tuple[str, str]:
        for kind, suffix in ((COUNT, "/count"), (DEAD, "/dead")):
            name = own_name(destination, suffix)
            if name is not None:
                return kind, self.placement.route(f"./{name}", "SUBSCRIBE", destination)
        return QUEUE, self.placement.route(destination, "SUBSCRIBE")

    def scope(self, session: Peer, frame: Frame) -> str | None:
        if frame.command in ("SEND", "SUBSCRIBE"):
            try:
                kinds = self.send_kind if frame.command == "SEND" else self.subscribe_kind
                return kinds(frame.headers.get("destination"))[1]
            except QueueError:
                return None
        raw = frame.headers.get("id", "")
        delivery = self.deliveries.holding.get(session, {}).get(int(raw)) if raw.isdigit() else None
        return None if delivery is None else delivery.link.dest

    # ---------------------------------------------------------------- SEND

    def check_send(self, headers: Mapping[str, str], body: bytes) -> None:
        """What an instance would refuse is refused here, before it is forwarded or held
        in a transaction: a COMMIT forwards only SENDs that pass."""
        self.placement.route(headers.get("destination"), "SEND")
        self._checked_lines(headers, body)

    def _checked_lines(self, headers: Mapping[str, str], body: bytes) -> bytes:
        """The SEND's kept header lines (curb.payload), once it passes an instance's checks."""
        lines = payload.header_lines(headers)
        size = len(lines) + 1 + len(body)
        if lines or size - 1 + message_limits.RESERVE > self.config.max_frame:  # else nothing to check
            try:
                send_rule.check(headers, lines, size, self.config.max_frame, self.wall_ms)
            except send_rule.BadSend as err:
                raise Refused(str(err), err.advice) from None
        return lines

    def accept(
        self,
        headers: Mapping[str, str],
        body: bytes,
        done: Done | None = None,
        urgent: bool = True,
        session: Peer | None = None,
    ) -> None:
        """Forward a SEND: its kept headers (the one-hop ones, curb.payload.NOT_STORED,
        dropped, as an instance drops them) behind its routed destination."""
        assert session is not None  # every SEND through the router comes from a session
        dest = self.placement.route(headers.get("destination"), "SEND")
        lines = self._checked_lines(headers, body)
        waits = self.waits.get(session) or self.waits.setdefault(session, Waits())
        self.placement.send(session, waits, headers, body, dest, lines, done)

    # ---------------------------------------------------------------- subscriptions

    def subscribe(
        self,
        session: Peer,
        sub_id: str,
        ack_mode: str,
        prefetch: int | None,
        ack_timeout: float | None,
        dead: bool,
        name: str = "",
    ) -> ClientSub:
        default_ms = round(self.config.ack_timeout * 1000)
        prefetch, timeout_ms = settings(ack_mode, prefetch, ack_timeout, self.config.prefetch, MAX_PREFETCH, default_ms)
        sub = ClientSub(session, sub_id, ack_mode, prefetch, timeout_ms, dest=name, dead=dead)
        self.deliveries.subscribe(sub)
        self.counts.changed(name)
        return sub

    def unsubscribe(self, session: Peer, sub_id: str, dead: bool = False) -> None:
        self.counts.changed(self.deliveries.unsubscribe(session, sub_id).dest)

    def browse(self, session: Peer, from_id: int, to_id: int | None, name: str = "") -> Browsing:
        return self._browse(session, name, f"/queue/{name}", from_id, to_id)

    def browse_dead(self, session: Peer, name: str = "") -> Browsing:
        return self._browse(session, name, "./dead", 0, None)

    def _browse(self, session: Peer, name: str, source: str, first: int, last: int | None) -> RoutedBrowse:
        indexes = self.placement.indexes
        instances = [(link.address, indexes[(name, link.address)]) for link in self.placement.consumers(name)]
        self.browse_steps.add(session)
        return self.browses.start(RoutedBrowse(session, name, source, first, last, instances))

    def end_browse(self, browse: Browsing) -> None:
        if isinstance(browse, RoutedBrowse):
            self.browses.end(browse)

    def ack_upto(self, upto: int, done: Done | None = None, destination: str | None = None) -> None:
        self.bulk.ack_upto(upto, done or _nothing, destination)

    def redrive(self, name: str, count: int | None, moved: Callable[[int], None], failed: Done) -> None:
        self.bulk.redrive(name, count, moved, failed)

    # ---------------------------------------------------------------- ACK and NACK

    def nack(self, session: Peer, msg_id: int, delay_ms: int | None = None) -> None:
        extra = {} if delay_ms is None else {"curb-delay": str(delay_ms)}
        self.deliveries.answer(session, self.deliveries.held(session, msg_id), "NACK", extra)

    def bounce(self, session: Peer, msg_id: int) -> None:
        extra = {"curb-undelivered": "true"}
        self.deliveries.answer(session, self.deliveries.held(session, msg_id), "NACK", extra)

    def touch(self, session: Peer, msg_id: int, seconds: float) -> None:
        self.deliveries.touch(session, msg_id, seconds)

    def handed_off(self, session: Peer, records: Sequence[Record]) -> None:
        self.deliveries.handed_off(session, records)

    # ---------------------------------------------------------------- links (LinkEvents)

    def instance_message(self, link: Link, frame: Frame) -> None:
        if link.role is BROWSES:
            self.browses.message(link, frame)
            return
        if frame.headers.get("subscription") == "count":
            if self.counts.instance_counts(link, frame) and len(self.placement.consumers(link.dest)) > 1:
                self.credit.reshare(link.dest)
            return
        self.deliveries.message(link, frame, self.placement.indexes.get((link.dest, link.address)))

    def link_up(self, link: Link) -> None:
        if link.role is BROWSES:
            self.browses.link_up(link)
            return
        if link.role is SENDS:
            self.placement.unpark(link.dest)
            return
        self.credit.link_up(link)
        self.counts.changed(link.dest)

    def link_down(self, link: Link, why: str, pending: list[Forwarded]) -> None:
        if link.role is CONSUMES:
            self.deliveries.link_down(link)
            self.counts.changed(link.dest)
        for item in pending:
            self._lost(item, f"instance {link.name} of {link.dest!r} was lost before it answered ({why})")

    def _lost(self, item: Forwarded, why: str) -> None:
        if item.session is not None and item.session not in self.sessions:
            return
        if item.command == "SEND" and item.session is not None:
            self.placement.place_send(item)  # at least once: the instance may have stored it
        else:
            item.lost(why)

    def instance_refused(self, link: Link, item: Forwarded, frame: Frame, after: list[Forwarded]) -> None:
        reason = frame.headers.get("message", "ERROR")
        detail = frame.body.decode(errors="replace").strip() or reason
        item.failed(Refusal(reason, f"{detail} (instance {link.name} of destination {link.dest!r})"))
        for each in after:
            self._lost(each, f"instance {link.name} refused an earlier frame")

    # ---------------------------------------------------------------- flow, counts, time

    def set_writable(self, session: Peer, writable: bool) -> None:
        for sub in self.deliveries.subs.get(session, {}).values():
            self.credit.share(sub)
            self.credit.rebalance_dest(sub.dest)

    def pump(self) -> None:
        """A session can take output again (or a loop pass ended): instances push their
        MESSAGEs, so only the browses need a step, which waited for it."""
        if self.browse_steps.sessions:
            self.browse_steps.want()

    def counts_of(self, name: str) -> dict[str, int]:
        return self.counts.of(name)

    def count_tail(self, name: str, counts: dict[str, int]) -> tuple[bytes, bytes]:
        return self.counts.tail(name, counts)

    def watch_counts(self, session: Peer, name: str, watching: bool) -> None:
        self.counts.watch(session, name, watching)

    def tick(self, now: float) -> None:
        """Link heart-beats; SENDs parked past link_wait are refused; ack deadlines."""
        self.links.tick(now)
        self.placement.refuse_parked(now)
        passed = self.deliveries.expire(now)
        if passed:
            last = passed[-1]
            self.refusals.timed_out(len(passed), last.sub.conn, last.rec.id, now, f"{last.sub.dest!r}'s instances")


def _nothing(err: str | None) -> None:
    """What waits for an ACK curb-upto that nothing waits for."""
