"""What each STOMP frame does: the table `RULES`, (state, command) -> handler, and the
handlers, which read the frame's headers and tell the broker.

- A frame the table does not name gets one ERROR naming the state and the command, and
  the connection closes after it (STOMP 1.2 ERROR).
- SEND goes through the broker's one SEND rule (Broker.accept); its RECEIPT waits for the
  fsync. ACK, NACK and DISCONNECT RECEIPTs wait until what the connection sent before is
  durable; the others' leave at once, all in frame order (curb.receipts).
- A browse (SUBSCRIBE with browser:true) sends the live messages of an id range and then
  one end marker (message-id BROWSE_END, browser:end); it changes no state.
- ACK with curb-upto:<n> acknowledges every message up to n on every connection; its
  RECEIPT waits until that is durable, like an ACK's.
- Ack deadlines: SUBSCRIBE (of the queue or of `./dead`) may set its own
  (`curb-ack-timeout`, ms, 0 for none), and a NACK with `curb-touch:<ms>` does not NACK
  but moves that delivery's deadline to ms from now (a NACK is the safe carrier: a
  broker that ignores the header redelivers, an ACK would lose the message). An ACK,
  NACK or touch that came after its message's deadline passed on this connection
  changes nothing and is not an error: its RECEIPT, if it asked for one, carries
  `curb-late:true`.
- Delays and dead letters (curb.timing, curb.dead): a NACK with `curb-delay:<ms>` asks
  for that delay; `SUBSCRIBE destination:./dead` (one per connection, beside the
  queue's) reads the dead letters, `browser:true` browses them; `SEND
  destination:./redrive` moves them back, its RECEIPT (with `curb-moved:<n>`) once that
  is durable. A SEND's due and expiry headers are the broker's (Broker.accept); a SEND
  to another `./` name or a misspelt `./redrive` is refused, as is a SUBSCRIBE to a `./`
  name Curb does not have (curb.destinations).
- A bad header is a QueueError (or an `error` call) whose advice says what to send instead.
"""

from __future__ import annotations

from collections.abc import Callable

from curb import heartbeat, message_limits, receipts
from curb.access import on_connect
from curb.backend import COUNT, DEAD, QUEUE, REDRIVE
from curb.conn import NEW, OPEN, Conn
from curb.destinations import ORDINARY
from curb.frame import Frame, decimal, escape
from curb.log.reasons import MaybeStored
from curb.outcomes import Refusal
from curb.queue import MAX_PREFETCH
from curb.queue_errors import Late, QueueError
from curb.refused import Refused
from curb.timing import TIME_HEADERS, nack_delay

# The command of a stand-in, among the frames held during a login check, for bytes that
# were no valid frame (its headers: the reason and the receipt); no parsed frame has it,
# since a NUL ends a frame.
UNPARSABLE = "\0unparsable"
PREFETCH_ADVICE = (
    f"Give prefetch-count (or activemq.prefetchSize) a whole number from 1 to {MAX_PREFETCH}, "
    "or leave it out for the broker's -prefetch."
)
MAX_MESSAGE_ID = (1 << 48) - 1  # a record holds its id in 12 hex digits
MAX_ID_HEADER = (1 << 64) - 1  # an id range's bound may lie beyond every id (Client.last_id)
MAX_DEADLINE_MS = heartbeat.MAX_MS  # curb-ack-timeout and curb-touch, at most a day
Handler = Callable[[Conn, Frame], None]


def on_send(session: Conn, frame: Frame) -> None:
    """The broker's one SEND rule (Broker.accept); the RECEIPT waits for the fsync. A
    SEND to ./redrive is no message: it moves dead letters back."""
    headers = frame.headers
    destination = headers.get("destination")
    if destination not in ORDINARY:
        kind, name = session.broker.send_kind(destination)
        if kind is REDRIVE:
            _redrive(session, frame, name)
            return
    receipt = headers.get("receipt")
    line = session.line
    entry = line.owe() if receipt is not None else None

    def stored(err: str | None) -> None:
        if err is None:
            if entry is not None and receipt is not None:
                line.settle(entry, receipts.receipt(receipt))
        elif isinstance(err, Refusal):
            session.error(err.message, str(err), receipt=receipt, entry=entry)
        elif isinstance(err, MaybeStored):
            session.error(
                "message may not be stored",
                f"{err}. The log failed after the message was written to it, so it may be on disk: "
                "then it will be delivered, after a restart if not before. Send it again once the "
                "broker can store it if a second copy does no harm, or with an id of your own "
                "that consumers deduplicate by.",
                receipt=receipt,
                entry=entry,
            )
        else:
            session.error(
                "message not stored",
                f"{err}. The message was not stored and will not be delivered: send it again "
                "once the broker can store it (its log says why not).",
                receipt=receipt,
                entry=entry,
            )

    try:
        session.broker.accept(headers, frame.body, stored, receipt is not None, session)
    except Refused:
        if entry is not None:
            line.remove(entry)
        raise


def _redrive(session: Conn, frame: Frame, name: str) -> None:
    """SEND to ./redrive: dead letters back to the queue; the RECEIPT, saying how many
    moved (`curb-moved`), once that is durable. A redrive is done at once and carries
    nothing, so a due time or a body, which it could not honour, is refused."""
    timed = [name for name in TIME_HEADERS if name in frame.headers]
    if timed:
        raise QueueError(
            f"{frame.headers['destination']} takes no {timed[0]} header",
            "A redrive moves dead letters at once and cannot wait: send it without "
            f"{', '.join(timed)}, when the dead letters should move.",
        )
    if frame.body:
        raise QueueError(
            f"{frame.headers['destination']} takes no body",
            f"A redrive moves dead letters and stores nothing: send {frame.headers['destination']} with an empty body "
            "(curb-count:<n> moves at most n); to send a job, use another destination, such as /queue/work.",
        )
    raw = frame.headers.get("curb-count")
    try:
        count = None if raw is None else decimal(raw, "curb-count", MAX_MESSAGE_ID)
    except ValueError as err:
        raise QueueError(
            "bad curb-count header",
            f"{err}: give the number of dead letters to move back, oldest first, or leave curb-count out "
            "to move them all.",
        ) from None
    receipt_id = frame.headers.get("receipt")
    line = session.line
    entry = line.owe() if receipt_id is not None else None

    def moved(n: int) -> None:
        if entry is not None and receipt_id is not None:
            line.after_sync_at(entry, receipt_id, "SEND", extra=b"curb-moved:%d\n" % n)

    def failed(err: str | None) -> None:
        if isinstance(err, Refusal):
            session.error(err.message, str(err), receipt=receipt_id, entry=entry)
        else:
            session.error(
                "redrive not confirmed",
                f"{err}. Whether the dead letters moved is unknown: browse the dead letters to see.",
                receipt=receipt_id,
                entry=entry,
            )

    session.broker.redrive(name, count, moved, failed)


def on_subscribe(session: Conn, frame: Frame) -> None:
    headers = frame.headers
    sub_id = headers.get("id")
    if sub_id is None:
        raise QueueError(
            "SUBSCRIBE needs an id header",
            "Give SUBSCRIBE an id header (any name); MESSAGEs carry it as subscription and UNSUBSCRIBE names it.",
        )
    kind, name = session.broker.subscribe_kind(headers.get("destination"))
    lines = [
        b"subscription:" + escape(sub_id).encode(),
        b"destination:" + escape(headers.get("destination", "/queue/curb")).encode(),
    ]
    for line in lines:
        problem = message_limits.line_problem(line, message_limits.MAX_SUBSCRIPTION_LINE)
        if problem is not None:
            raise QueueError(f"SUBSCRIBE {problem}", "Use a shorter subscription id and destination.")
    prefix = b"MESSAGE\n%s\n%s\n" % tuple(lines)
    broker, messages = session.broker, session.messages
    if headers.get("browser") == "true":
        if sub_id in messages.browses:
            raise QueueError(
                f"browse {sub_id!r} is still running; UNSUBSCRIBE it or wait for its end",
                "Wait for the browse's end marker (message-id browse-end), UNSUBSCRIBE it, or "
                "give the new browse another id.",
            )
        first = _message_id(headers, "curb-from-id")
        last = _message_id(headers, "curb-to-id")
        if kind is DEAD:
            messages.browses[sub_id] = (broker.browse_dead(session, name), prefix)
        elif kind is QUEUE:
            messages.browses[sub_id] = (broker.browse(session, 1 if first is None else first, last, name), prefix)
        else:
            raise QueueError(
                f"{headers.get('destination')} cannot be browsed",
                "Browse the queue or its dead letters; the counts come with a plain SUBSCRIBE.",
            )
    elif kind is COUNT:
        messages.watch_counts(sub_id, prefix, name)
        session.send_counts(broker.counts_of(name))
    else:
        raw_timeout = headers.get("curb-ack-timeout")
        try:
            timeout = None if raw_timeout is None else _milliseconds(raw_timeout, "curb-ack-timeout", 0)
        except ValueError as err:
            session.error(
                "bad curb-ack-timeout header",
                f"{err}: give the milliseconds a delivered message may wait for its ACK or NACK before it "
                f"goes back to the queue, from 0 (no deadline) to {MAX_DEADLINE_MS} (a day).",
                frame,
            )
            return
        dead = kind is DEAD
        sub = broker.subscribe(
            session, sub_id, headers.get("ack", "auto"), prefetch_header(headers), timeout, dead, name
        )
        messages.prefixes[sub] = prefix
        if dead:
            messages.dead_sub = sub_id
    session.line.at_once(headers.get("receipt"))


def on_unsubscribe(session: Conn, frame: Frame) -> None:
    sub_id = frame.headers.get("id")
    if sub_id is None:
        raise QueueError("UNSUBSCRIBE needs an id header", "Give UNSUBSCRIBE the id header its SUBSCRIBE had.")
    messages = session.messages
    browse = messages.browses.pop(sub_id, None)
    if browse is not None:
        session.broker.end_browse(browse[0])
    elif messages.count_sub is not None and messages.count_sub == sub_id:
        messages.watch_counts(None)
    elif messages.dead_sub is not None and messages.dead_sub == sub_id:
        messages.dead_sub = None
        session.broker.unsubscribe(session, sub_id, dead=True)
    else:
        try:
            session.broker.unsubscribe(session, sub_id)
        except QueueError:
            if sub_id not in messages.ended:
                raise
            messages.ended.remove(sub_id)  # it crossed the browse's end marker: already over
    session.line.at_once(frame.headers.get("receipt"))


def on_ack(session: Conn, frame: Frame) -> None:
    raw_upto = frame.headers.get("curb-upto")
    if raw_upto is not None:
        _ack_upto(session, frame, _id_value(raw_upto, "curb-upto"), frame.headers.get("destination"))
        return
    _settle(session, frame, ack_id(session, frame), session.broker.ack)


def _ack_upto(session: Conn, frame: Frame, upto: int, destination: str | None) -> None:
    """ACK curb-upto: its RECEIPT waits until the acknowledgement is durable."""
    receipt = frame.headers.get("receipt")
    line = session.line
    entry = line.owe() if receipt is not None else None
    # Even without a receipt the log is given a waiter: it then writes the new watermark
    # soon, instead of with some later checkpoint. Refused (by a router's instance), its
    # ERROR is sent all the same.
    done = _refused_only(session) if entry is None or receipt is None else line.answer(entry, receipt, "ACK")
    try:
        session.broker.ack_upto(upto, done, destination)
    except QueueError:
        if entry is not None:
            line.remove(entry)
        raise


def _refused_only(session: Conn) -> receipts.Done:
    """What waits for an ACK curb-upto without a receipt: only a refusal is sent."""

    def done(err: str | None) -> None:
        if isinstance(err, Refusal):
            session.error(err.message, str(err))

    return done


def on_nack(session: Conn, frame: Frame) -> None:
    msg_id = ack_id(session, frame)
    raw_touch = frame.headers.get("curb-touch")
    if raw_touch is None:
        if frame.headers.get("curb-undelivered") == "true":
            # A router handing back what it could give no client: rdy at once, uncounted.
            _settle(session, frame, msg_id, session.broker.bounce)
            return
        delay = nack_delay(frame.headers)
        _settle(session, frame, msg_id, lambda peer, msg: session.broker.nack(peer, msg, delay))
        return
    # curb-touch: the delivery stays, due that many ms from now; nothing to sync.
    try:
        seconds = _milliseconds(raw_touch, "curb-touch", 1)
    except ValueError as err:
        session.error(
            "bad curb-touch header",
            f"{err}: give the milliseconds from now by which the message must be ACKed or NACKed, "
            f"from 1 to {MAX_DEADLINE_MS} (a day).",
            frame,
        )
        return
    _settle(session, frame, msg_id, lambda peer, msg: session.broker.touch(peer, msg, seconds))


def _settle(session: Conn, frame: Frame, msg_id: int | None, step: Callable[[Conn, int], None]) -> None:
    """An ACK's, NACK's or touch's `step` on its message (none for a ./count update), then
    its RECEIPT once what the connection sent before is durable; `curb-late:true` when
    the message's ack deadline had passed, and the step changed nothing."""
    late = False
    if msg_id is not None:
        try:
            step(session, msg_id)
        except Late:
            late = True
    receipt = frame.headers.get("receipt")
    if receipt is not None:
        session.line.after_sync(receipt, frame.command, late=late)


def on_disconnect(session: Conn, frame: Frame) -> None:
    """The line's last place: its RECEIPT once what came before is durable, then the close."""
    receipt = frame.headers.get("receipt")
    if receipt is None:
        session.end_with(b"")
    else:
        session.line.when_durable(session.line.answer(session.finish(), receipt, "DISCONNECT", session.hang_up))


def on_transaction(session: Conn, frame: Frame) -> None:
    session.error(
        "transactions are not supported",
        "Curb does not buffer transactions; send frames without 'transaction'.",
        frame,
    )


def unparsable(session: Conn, reason: str, receipt: str | None) -> None:
    """The ERROR for bytes that are no valid frame."""
    session.error(
        reason,
        "The frame is not valid STOMP 1.2 or breaks one of the broker's limits "
        "(see Limits in Curb's docs/guide.md): fix the frame and reconnect.",
        receipt=receipt,
    )


def unexpected(session: Conn, frame: Frame) -> None:
    """The ERROR for any frame the table does not allow in the session's state (or for
    bytes held as UNPARSABLE behind a login check)."""
    command = frame.command
    if command == UNPARSABLE:
        unparsable(session, frame.headers["message"], frame.headers.get("receipt"))
    elif command in KNOWN_COMMANDS:
        session.error(
            f"{command} not allowed {session.state}",
            "Send CONNECT (or STOMP) once, first; then any other frame."
            if session.state is NEW
            else "CONNECT may only be sent once per connection: open a new connection to connect again.",
            frame,
        )
    else:
        session.error(
            f"unknown command {command[:40]!r} {session.state}",
            "Curb speaks STOMP 1.2: send CONNECT (or STOMP), SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK or DISCONNECT.",
            frame,
        )


RULES: dict[tuple[str, str], Handler] = {
    (NEW, "CONNECT"): on_connect,
    (NEW, "STOMP"): on_connect,
    (OPEN, "SEND"): on_send,
    (OPEN, "SUBSCRIBE"): on_subscribe,
    (OPEN, "UNSUBSCRIBE"): on_unsubscribe,
    (OPEN, "ACK"): on_ack,
    (OPEN, "NACK"): on_nack,
    (OPEN, "DISCONNECT"): on_disconnect,
    (OPEN, "BEGIN"): on_transaction,
    (OPEN, "COMMIT"): on_transaction,
    (OPEN, "ABORT"): on_transaction,
}
KNOWN_COMMANDS = frozenset(command for _, command in RULES)


def ack_id(session: Conn, frame: Frame) -> int | None:
    """The message an ACK or NACK names; None for a ./count update, which needs none."""
    raw = frame.headers.get("id")
    if raw is None:
        raise QueueError(
            f"{frame.command} needs an id header",
            f"Give {frame.command} the id header: the ack header of the MESSAGE it answers.",
        )
    if raw.startswith("count-") and session.messages.count_sub is not None:
        return None
    try:
        return decimal(raw, "ack id", MAX_MESSAGE_ID)
    except ValueError:
        raise QueueError(
            f"unknown ack id {raw[:40]!r}",
            f"Give {frame.command} the ack header of a MESSAGE this connection received (a "
            "message id, a decimal number); to ACK up to an id, send ACK with a curb-upto header.",
        ) from None


def _milliseconds(raw: str, name: str, least: int) -> float:
    """Seconds in a header of milliseconds from `least` to MAX_DEADLINE_MS; ValueError
    naming the header and those bounds otherwise (one rule, whatever was wrong)."""
    try:
        value = decimal(raw, name, MAX_DEADLINE_MS)
    except ValueError:
        value = -1
    if value < least:
        raise ValueError(f"{name} must be a whole number from {least} to {MAX_DEADLINE_MS}, not {raw[:40]!r}")
    return value / 1000


def _message_id(headers: dict[str, str], name: str) -> int | None:
    """A header holding a message id (a non-negative integer), or None when absent."""
    raw = headers.get(name)
    return None if raw is None else _id_value(raw, name)


def _id_value(raw: str, name: str) -> int:
    """A message id header's value (a non-negative integer)."""
    try:
        return decimal(raw, name, MAX_ID_HEADER)
    except ValueError:
        raise QueueError(
            f"bad {name} {raw[:40]!r}: use a message id, a non-negative integer",
            f"Give {name} a message id: a decimal integer from 0 to {MAX_ID_HEADER}, such as a MESSAGE's message-id.",
        ) from None


def prefetch_header(headers: dict[str, str]) -> int | None:
    """SUBSCRIBE's prefetch-count (or activemq.prefetchSize); None when it names none."""
    raw = headers.get("prefetch-count", headers.get("activemq.prefetchSize"))
    if raw is None:
        return None
    try:
        value = decimal(raw, "prefetch", MAX_PREFETCH)
    except ValueError:
        value = 0
    if value < 1:
        raise QueueError(f"bad prefetch {raw[:40]!r}: use a whole number from 1 to {MAX_PREFETCH}", PREFETCH_ADVICE)
    return value
