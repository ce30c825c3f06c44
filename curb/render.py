"""MESSAGE frames, made one way for every kind the broker sends: a delivery, a browse's
message and its end marker, and a `./count` update.

Every MESSAGE is its subscription's prefix (MESSAGE, subscription and destination lines,
made once at SUBSCRIBE), a message-id line and the broker's own lines for this kind (a
delivery's ack and redelivery lines, a browse end marker's, a count's version), then a
stored payload as the log keeps it (curb.payload: the SEND's kept header lines, already
escaped for the wire, an empty line, the body). A count update's JSON and an end marker's empty body are
payloads of the same shape, so `write_message` is the only place a MESSAGE is laid out.

`Messages` holds what one connection's MESSAGEs need: each subscription's prefix, its
browses and its `./count` subscription, and makes its deliveries, browse steps and
count updates through `write_message`.

A body of VIEW_BODY bytes or more goes out as a view of the payload read from the log,
never copied into its frame; shorter ones are cheaper to copy than to send apart.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

from curb import payload
from curb.conn import CLOSING, Conn
from curb.dead import dead_headers
from curb.frame import FRAME_END, encode
from curb.output import Output, Piece

if TYPE_CHECKING:
    from curb.backend import Backend, Browsing
    from curb.log.cursor import Record
    from curb.peer import Peer
    from curb.queue import Subscription

VIEW_BODY = 64 * 1024
BROWSE_END = "browse-end"  # the message-id of a browse's end marker
NO_PAYLOAD = b"\n"  # no kept headers, an empty body
ENDED_KEPT = 16  # ended browses whose ids an UNSUBSCRIBE may still name
FIRST_DELIVERY = b"curb-deliveries:1\n"  # the count a first delivery's MESSAGE carries
Write = Callable[[Piece, bool], None]  # (data, whether a frame ends with it)


def write_message(write: Write, head: bytes, stored: Piece) -> None:
    """One MESSAGE: `head` (prefix, message-id and the broker's lines), then the stored
    payload's header lines, content-length and body."""
    # A small payload in bytes is split as bytes, and a small body formatted as bytes: the
    # compiled build then joins the frame natively, where a view is a generic % call. A
    # large one is viewed: its body goes out where it lies, never copied.
    body: bytes | memoryview
    if isinstance(stored, bytes) and len(stored) < VIEW_BODY:
        lines, body = payload.split(stored)
    else:
        lines, body = payload.split(memoryview(stored))
    if len(body) < VIEW_BODY:
        small = body if isinstance(body, bytes) else bytes(body)
        write(b"%s%scontent-length:%d\n\n%s%s" % (head, lines, len(small), small, FRAME_END), True)
    else:
        write(b"%s%scontent-length:%d\n\n" % (head, lines, len(body)), False)
        write(body, False)
        write(FRAME_END, True)


def browse_end_head(prefix: bytes, last_id: int) -> bytes:
    """A browse's end marker: nothing after it belongs to the browse; `curb-last-id` is
    the range's end, where the next browse of a reader that plans by ids starts."""
    return b"%smessage-id:%s\nbrowser:end\ncurb-last-id:%d\n" % (prefix, BROWSE_END.encode(), last_id)


class Messages:
    """One connection's subscriptions as the MESSAGEs they make, written through `write`;
    an auto subscription's message is done once `output` has handed its frame over."""

    def __init__(self, broker: Backend, peer: Conn, write: Write, output: Output[Record]):
        self._broker, self._peer, self._write, self._output = broker, peer, write, output
        self.prefixes: dict[Subscription[Peer, Record], bytes] = {}
        self.browses: dict[str, tuple[Browsing, bytes]] = {}  # sub id -> browse, MESSAGE prefix
        # The ids of the last browses that ended by their end marker: an UNSUBSCRIBE of one
        # crossed the marker on the wire (the client could not know), and is no error.
        self.ended: collections.deque[str] = collections.deque(maxlen=ENDED_KEPT)
        self.count_sub: str | None = None
        self.count_name = ""  # the destination whose counts it watches (a router's NAME)
        self.dead_sub: str | None = None  # the id of its ./dead subscription
        self._count_prefix = b""
        self._last_counts: dict[str, int] | None = None
        self.counts_owed = False  # counts changed while the peer could take no output

    def deliver(self, sub: Subscription[Peer, Record], rec: Record, data: Piece) -> None:
        """One MESSAGE of the stored payload `data` for the subscription, with the
        message's delivery count (and a dead letter's reason, curb.dead)."""
        msg_id, deliveries, auto = rec.id, rec.deliveries, sub.ack_mode == "auto"
        if rec.dead:  # from ./dead: its reason and count
            extra = dead_headers(rec)
        elif deliveries > 1:
            extra = b"redelivered:true\ncurb-deliveries:%d\n" % deliveries
        else:
            extra = FIRST_DELIVERY
        if auto:
            head = b"%smessage-id:%d\n%s" % (self.prefixes[sub], msg_id, extra)
        else:
            head = b"%smessage-id:%d\nack:%d\n%s" % (self.prefixes[sub], msg_id, msg_id, extra)
        write_message(self._write, head, data)
        if auto:
            self._output.after_last(rec)

    def browse_more(self, budget: int) -> bool:
        """One step of each browse: its messages, and its end marker once it is over.
        Returns whether some browse could go on at once. A closing connection ends them:
        nothing may follow an ERROR or a DISCONNECT's RECEIPT."""
        if self._peer.state is CLOSING:
            self.end_browses()
            return False
        more = False
        for sub_id, (browse, prefix) in list(self.browses.items()):
            step = browse.step(budget)
            due, now_ms = step.due, self._broker.wall_ms() if step.due else 0
            for msg_id, data in step.messages:
                head = b"%smessage-id:%d\n" % (prefix, msg_id)
                if due.get(msg_id, 0) > now_ms:  # delayed: when it is due, ms since the epoch
                    head += b"curb-due:%d\n" % due[msg_id]
                write_message(self._write, head, data)
            if step.done:
                write_message(self._write, browse_end_head(prefix, browse.to_id), NO_PAYLOAD)
                del self.browses[sub_id]
                self.ended.append(sub_id)
                self._broker.end_browse(browse)
            elif not step.waiting:
                more = True
        return more

    def end_browses(self) -> None:
        for browse, _ in self.browses.values():
            self._broker.end_browse(browse)
        self.browses.clear()

    def watch_counts(self, sub_id: str | None, prefix: bytes = b"", name: str = "") -> None:
        """Subscribe to `./count` (a router's `./NAME/count`) as `sub_id` (None: unsubscribe)."""
        if self.count_sub is not None:
            self._broker.watch_counts(self._peer, self.count_name, False)
        self.count_sub, self._count_prefix, self._last_counts, self.count_name = sub_id, prefix, None, name
        if sub_id is not None:
            self._broker.watch_counts(self._peer, name, True)

    def resend_counts(self) -> None:
        """The latest counts, owed while the peer could take no output."""
        self.send_counts(self._broker.counts_of(self.count_name))

    def send_counts(self, counts: dict[str, int]) -> None:
        """One `./count` MESSAGE if the counts changed since the last (curb.counts); while
        the peer can take no output, only the latest counts are sent, once it can."""
        if self.count_sub is None or counts == self._last_counts:
            return
        if not self._peer.writable:
            self.counts_owed = True
            return
        self.counts_owed = False
        self._last_counts = counts
        id_line, stored = self._broker.count_tail(self.count_name, counts)
        write_message(self._write, self._count_prefix + id_line, stored)


def error_frame(message: str, detail: str, receipt: str | None = None, version: str | None = None) -> bytes:
    """An ERROR: `message` in its header, `detail` (what happened and what to do) its body."""
    headers = {"message": message, "content-type": "text/plain"}
    if version is not None:
        headers["version"] = version
    if receipt is not None:
        headers["receipt-id"] = receipt
    return encode("ERROR", headers, (detail + "\n").encode())
