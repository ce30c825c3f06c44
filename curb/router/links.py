"""The router's connections to its instances (links), sans I/O: their STOMP side, frames
forwarded with the router's receipts, heart-beats and what a lost link leaves behind.

Two links per instance: SENDS carries SENDs (and redrives, ACKs up to an id), CONSUMES
the subscription, its ACKs and NACKs and the instance's `./count`. Two, because an
instance ends a connection after an ERROR (a SEND refused as queue full, say), and that
must not return the messages consumers hold. A browse has a BROWSES link of its own while
it runs (curb.router.browses).

The glue (curb.router.glue) tells `Links` that a link connected, sent bytes or was lost;
`Links` writes into each link's `out` and marks it in `dirty`, and tells the core
(`LinkEvents`) what the instance said.

Rules:
- A frame forwarded with our receipt (`r<N>`) waits in `Link.forwarded` until the
  instance's RECEIPT or ERROR names it. An ERROR answers its frame; the frames after it
  were dropped unread by the instance, and are the core's to place again (`lost`).
- An epoch counts a link's connections: what was delivered on an earlier one was
  requeued by the instance when it ended.
- Frames are handled in the order read. A CONSUMES link's, at most `handle_each`
  (HANDLE_EACH) in one call (`data`, then `handle` until none are left), so the glue can read other
  connections between: a window of MESSAGEs read at once flows on in parts, the
  clients' ACKs read in between, instead of each process holding the whole window in
  turn. Of what a connection read before it was lost, its RECEIPTs are handled before
  the loss (each confirms what it answers); its MESSAGEs are dropped unhandled, since
  the instance took them back when the connection ended, and no client may get them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Protocol

from curb import heartbeat
from curb.deadlines import BEAT_EARLY
from curb.frame import Frame, FrameParser, ProtocolError, encode
from curb.outcomes import Unconfirmed
from curb.peer import Peer
from curb.receipts import Done
from curb.router.routes import Address
from curb.router.tally import Tally
from curb.router.waits import Waits

DOWN, CONNECTING, UP = "down", "connecting", "up"
SENDS, CONSUMES, BROWSES = "sends", "consumes", "browses"
LINK_MAX_FRAME = 64 * 1024 * 1024
HANDLE_EACH = 32  # frames of a CONSUMES link's read handled in one call


class Forwarded:
    """A frame a client's session asked the router to forward, until an instance answers.
    A plain class, not a dataclass: one is made for every SEND, and a dataclass's
    generated __init__ would run as Python code in the compiled build."""

    __slots__ = ("answer", "body", "command", "dest", "done", "headers", "number", "sent", "session", "waits", "wire")

    def __init__(
        self,
        session: Peer | None,
        waits: Waits,
        command: str,
        headers: Mapping[str, str],
        body: bytes,
        dest: str,
        done: Done | None = None,
        number: int = 0,
    ):
        self.session = session  # None: a frame no session's later RECEIPTs wait for
        self.waits = waits
        self.command = command
        self.headers = headers  # as the client gave them (a SEND's `wire` is made from them)
        self.body = body
        self.dest = dest
        self.done = done  # told the instance's answer: None, or why it failed
        self.number = number  # its place in its session's Waits
        self.wire: bytes | None = None  # the frame as the instance gets it, but for our receipt
        self.answer: Frame | None = None  # the instance's RECEIPT, once it came
        self.sent = False  # it was forwarded at least once (an instance may have taken it)

    def answered(self, frame: Frame) -> None:
        """The instance's RECEIPT: `done` once every earlier frame of the session is
        answered too (a RECEIPT for a SEND promises the SENDs before it)."""
        self.answer = frame
        self.waits.answered(self.number)
        if self.done is not None:
            self.waits.wait_upto(self.number, self.done, minds_lost=self.command != "SEND")

    def failed(self, why: str) -> None:
        if self.done is not None:
            self.done(why)
        self.waits.answered(self.number, failed=why)

    def lost(self, why: str) -> None:
        """Lost with its link before its answer: whether it took effect is unknown."""
        if self.done is not None:
            self.done(Unconfirmed(why))
        self.waits.answered(self.number, why)


class Link:
    """One connection to one instance, and what it carries."""

    def __init__(self, number: int, dest: str, address: Address, role: str):
        self.number = number
        self.dest = dest
        self.address = address
        self.role = role
        self.state = DOWN
        self.epoch = 0
        self.out: list[bytes] = []
        self.close_wanted = False
        self.last_recv = self.last_send = 0.0
        self.send_every = self.expect_every = 0.0
        self.parser = FrameParser(max_frame_bytes=LINK_MAX_FRAME)
        self.forwarded: collections.OrderedDict[str, Forwarded] = collections.OrderedDict()
        self.next_receipt = 0
        self.why_down = "not connected yet"
        self.tried = False  # a connection was tried (the glue's start-up waits for it)
        self.hold = False  # read nothing more from it for now (a browse holds enough)
        self.position = 0  # a BROWSES link: its instance's place in the route
        self.unhandled: collections.deque[Frame] = collections.deque()  # read, not yet handled
        self.tally = Tally()

    @property
    def name(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


class LinkEvents(Protocol):
    """What the core is told of its links."""

    def link_up(self, link: Link) -> None: ...
    def link_down(self, link: Link, why: str, pending: list[Forwarded]) -> None: ...
    def instance_message(self, link: Link, frame: Frame) -> None: ...
    def instance_refused(self, link: Link, item: Forwarded, frame: Frame, after: list[Forwarded]) -> None: ...


class Links:
    """Every link of one router, their output and their heart-beats."""

    def __init__(
        self,
        core: LinkEvents,
        heartbeat_ms: int,
        login: str | None,
        passcode: str | None,
        events: Callable[..., None],
    ):
        self.core = core
        self.heartbeat_ms = heartbeat_ms
        self.login, self.passcode = login, passcode
        self.events = events
        self.handle_each = HANDLE_EACH
        self.by_number: dict[int, Link] = {}
        self.dirty: dict[Link, None] = {}
        self.now = 0.0
        self._numbers = 0

    def new_number(self) -> int:
        """A number no link of this router had."""
        self._numbers += 1
        return self._numbers

    def write(self, link: Link, data: bytes) -> None:
        if not link.close_wanted:
            link.out.append(data)
            self.dirty[link] = None

    def send(self, link: Link, command: str, headers: dict[str, str]) -> None:
        """A frame without our receipt (nothing waits for its answer)."""
        if link.state is not DOWN:
            self.write(link, encode(command, headers))
            if command == "ACK":
                link.tally.acked += 1
            elif command == "NACK" and "curb-touch" not in headers:
                if "curb-undelivered" in headers:
                    link.tally.bounced += 1
                else:
                    link.tally.nacked += 1

    def answer(self, link: Link, command: bytes, upstream: str) -> None:
        """An ACK or NACK of the instance's ack id `upstream` (digits: curb.router.
        deliveries takes no other), and nothing else: the commonest frame to an
        instance, made without the general encoder."""
        if link.state is not DOWN and not link.close_wanted:
            link.out.append(b"%s\nid:%s\n\n\x00" % (command, upstream.encode()))
            self.dirty[link] = None
            if command == b"ACK":
                link.tally.acked += 1
            else:
                link.tally.nacked += 1

    def forward(self, link: Link, item: Forwarded) -> None:
        """A frame with our receipt: its answer settles `item`."""
        link.next_receipt += 1
        receipt = f"r{link.next_receipt}"
        link.forwarded[receipt] = item
        item.sent = True
        if item.command == "SEND":
            link.tally.forwarded += 1
        if item.wire is None:  # encoded once, without our receipt, which goes in per link
            item.wire = encode(item.command, dict(item.headers), item.body)
        cut = len(item.command) + 1
        self.write(link, b"%sreceipt:%s\n%s" % (item.wire[:cut], receipt.encode(), item.wire[cut:]))

    def take_dirty(self, now: float) -> list[Link]:
        """The links with output or a close to apply; their `out` is the glue's to write."""
        dirty = list(self.dirty)
        self.dirty.clear()
        for link in dirty:
            if link.out:
                link.last_send = now
        return dirty

    # ---------------------------------------------------------------- the glue's calls

    def connected(self, link: Link, now: float) -> None:
        """A TCP (or TLS) connection to the instance is open: log in."""
        link.state = CONNECTING
        link.parser = FrameParser(max_frame_bytes=LINK_MAX_FRAME)
        link.unhandled.clear()
        link.out.clear()
        link.close_wanted = False
        link.last_recv = link.last_send = now
        beat = self.heartbeat_ms
        headers = {"accept-version": "1.2", "host": link.address[0], "heart-beat": f"{beat},{beat}"}
        if self.login is not None:
            headers["login"] = self.login
            headers["passcode"] = self.passcode or ""
        self.write(link, encode("CONNECT", headers))

    def data(self, link: Link, data: bytes, now: float) -> bool:
        """Bytes read from the link: its first frames handled; True when some wait for
        `handle`."""
        link.last_recv = self.now = now
        try:
            link.unhandled.extend(link.parser.feed(data))
        except ProtocolError as err:
            link.unhandled.extend(err.frames)
            self.handle(link, len(link.unhandled))
            if link.state is not DOWN:
                self.drop(link, f"bad frame from the instance: {err}")
            return False
        return self.handle(link, None if link.role is CONSUMES else len(link.unhandled))

    def handle(self, link: Link, most: int | None = None) -> bool:
        """Handle up to `most` (`handle_each`) of the frames read; True when some are left."""
        unhandled = link.unhandled
        if most is None:
            most = self.handle_each
        for _ in range(min(most, len(unhandled))):
            if link.state is DOWN:
                break
            self._frame(link, unhandled.popleft())
        if link.state is DOWN:
            unhandled.clear()
        return bool(unhandled)

    def lost(self, link: Link, why: str) -> None:
        """The connection is gone (or never came): the RECEIPTs it read are handled first
        (see the rules); what it forwarded and nobody answered is the core's again."""
        unhandled = link.unhandled
        while unhandled:
            frame = unhandled.popleft()
            if frame.command == "RECEIPT":
                self._frame(link, frame)
        unhandled.clear()
        was_up = link.state is UP
        link.state = DOWN
        link.why_down = why
        if was_up:
            self.events(
                "link_down",
                f"instance {link.name} of {link.dest!r} is down ({link.role}): {why}",
                instance=link.name,
                dest=link.dest,
                reason=why,
            )
        pending = list(link.forwarded.values())
        link.forwarded.clear()
        self.core.link_down(link, why, pending)

    def drop(self, link: Link, why: str) -> None:
        link.unhandled.clear()
        link.close_wanted = True
        self.dirty[link] = None
        self.lost(link, why)

    # ---------------------------------------------------------------- frames from instances

    def _frame(self, link: Link, frame: Frame) -> None:
        command = frame.command
        if command == "MESSAGE":
            self.core.instance_message(link, frame)
        elif command == "RECEIPT":
            item = link.forwarded.pop(frame.headers.get("receipt-id", ""), None)
            if item is not None:
                item.answered(frame)
        elif command == "CONNECTED":
            self._up(link, frame)
        elif command == "ERROR":
            self._refused(link, frame)
        else:
            self.drop(link, f"unexpected {command[:40]} frame from the instance")

    def _up(self, link: Link, frame: Frame) -> None:
        try:
            theirs = heartbeat.parse(frame.headers.get("heart-beat", "0,0"))
        except ValueError:
            self.drop(link, "bad heart-beat header from the instance")
            return
        beat = self.heartbeat_ms
        link.send_every, link.expect_every = heartbeat.negotiate((beat, beat), theirs)
        link.state = UP
        link.epoch += 1
        link.why_down = ""
        self.events(
            "link_up",
            f"instance {link.name} of {link.dest!r} is up ({link.role})",
            instance=link.name,
            dest=link.dest,
            role=link.role,
        )
        self.core.link_up(link)

    def _refused(self, link: Link, frame: Frame) -> None:
        """An instance's ERROR names the frame by our receipt; it ends the connection."""
        receipt = frame.headers.get("receipt-id")
        item = link.forwarded.pop(receipt, None) if receipt is not None else None
        reason = frame.headers.get("message", "ERROR")
        if item is None:
            self.drop(link, f"the instance sent ERROR {reason[:80]!r}")
            return
        link.tally.refused += 1
        after = list(link.forwarded.values())
        link.forwarded.clear()
        self.drop(link, f"the instance refused a {item.command}: {reason[:80]}")
        self.core.instance_refused(link, item, frame, after)

    # ---------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Drop the links to instances silent for too long; beat on those owed one."""
        self.now = now
        for link in list(self.by_number.values()):
            if link.state is DOWN:
                continue
            if link.expect_every and now - link.last_recv > heartbeat.tolerance(link.expect_every):
                self.drop(link, "the instance fell silent (no heart-beat)")
            elif link.send_every and now - link.last_send >= link.send_every * BEAT_EARLY:
                self.write(link, b"\n")
