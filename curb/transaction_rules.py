"""BEGIN, COMMIT and ABORT, for a backend that takes transactions (`curb router`; an
instance refuses them, curb.commands.on_transaction).

Rules:
- A SEND, ACK or NACK with a `transaction` header is held in the session (bounded,
  curb.transactions) until its COMMIT. A SEND is checked when it comes
  (`Backend.send_kind`, `Backend.check_send`), an ACK's or NACK's id too, and every held
  SEND again at COMMIT before any frame is handed on: so a COMMIT hands on all of its
  frames or, refused, none. Holding is a held frame's whole effect: its RECEIPT leaves
  at once.
- COMMIT hands its frames on in order, through the same rules as frames sent without a
  transaction (curb.commands), each SEND stamped with `curb-transaction` (the name) and
  `curb-transaction-seq` (its place among the transaction's SENDs, from 0), and its
  RECEIPT waits until all of them are durable.
- ABORT drops them, and so do a DISCONNECT, an ERROR and a connection gone
  (`Transactions.clear`, called by the session when it stops).
"""

from __future__ import annotations

from curb import commands, receipts
from curb.backend import REDRIVE
from curb.conn import OPEN, Conn
from curb.frame import Frame
from curb.queue_errors import QueueError
from curb.transactions import Transactions

TX_HEADER = "curb-transaction"
TX_SEQ_HEADER = "curb-transaction-seq"
_NOT_HANDED_ON = frozenset(("transaction", "receipt"))


def _transactions(session: Conn) -> Transactions:
    txs = session.transactions
    assert txs is not None  # these rules serve only sessions that hold transactions
    return txs


def _name(frame: Frame) -> str:
    tx = frame.headers.get("transaction")
    if not tx:
        raise QueueError(
            f"{frame.command} needs a transaction header",
            f"Give {frame.command} the transaction header: the name its BEGIN gave.",
        )
    return tx


def _check_send(session: Conn, frame: Frame) -> None:
    kind, _ = session.broker.send_kind(frame.headers.get("destination"))
    if kind is REDRIVE:
        raise QueueError(
            "a redrive cannot be part of a transaction",
            "Send the redrive without a transaction header: it moves dead letters at once.",
        )
    session.broker.check_send(frame.headers, frame.body)


def _held_or(handler: commands.Handler) -> commands.Handler:
    """A SEND's, ACK's or NACK's rule: held for its transaction, or `handler` at once
    without one."""

    def rule(session: Conn, frame: Frame) -> None:
        if "transaction" in frame.headers:
            _hold(session, frame, frame.headers["transaction"])
        else:
            handler(session, frame)

    return rule


def _hold(session: Conn, frame: Frame, tx: str) -> None:
    txs = _transactions(session)
    if tx not in txs:
        raise QueueError(
            f"no transaction {tx[:40]!r} on this connection",
            f"BEGIN the transaction before a {frame.command} names it.",
        )
    if frame.command == "SEND":
        _check_send(session, frame)
    else:
        commands.ack_id(session, frame)
    txs.hold(tx, frame)
    session.line.at_once(frame.headers.get("receipt"))


def on_begin(session: Conn, frame: Frame) -> None:
    tx = _name(frame)
    txs = _transactions(session)
    if tx in txs:
        raise QueueError(
            f"transaction {tx!r} has begun already",
            "COMMIT or ABORT it first, or give the new transaction another name.",
        )
    txs.begin(tx)
    session.line.at_once(frame.headers.get("receipt"))


def _taken(session: Conn, frame: Frame) -> list[Frame]:
    frames = _transactions(session).take(_name(frame))
    if frames is None:
        raise QueueError(
            f"no transaction {_name(frame)[:40]!r} on this connection",
            f"BEGIN the transaction before {frame.command}, and COMMIT or ABORT it once.",
        )
    return frames


def on_commit(session: Conn, frame: Frame) -> None:
    tx = _name(frame)
    frames = _taken(session, frame)
    for held in frames:
        if held.command == "SEND":
            _check_send(session, held)
    seq = 0
    for held in frames:
        headers = {name: value for name, value in held.headers.items() if name not in _NOT_HANDED_ON}
        if held.command == "SEND":
            headers[TX_HEADER], headers[TX_SEQ_HEADER] = tx, str(seq)
            seq += 1
        commands.RULES[(OPEN, held.command)](session, Frame(held.command, headers, held.body))
        if session.state is not OPEN:
            return
    _answer_commit(session, frame.headers.get("receipt"))


def _answer_commit(session: Conn, receipt: str | None) -> None:
    """COMMIT's RECEIPT once all of its frames are durable, or an ERROR in its place when
    whether they all took effect cannot be known: a transaction promises all or nothing."""
    line = session.line
    entry = line.owe()

    def done(err: str | None) -> None:
        if err is None:
            line.settle(entry, b"" if receipt is None else receipts.receipt(receipt))
        else:
            session.error(
                "COMMIT not confirmed",
                f"{err}. Whether every frame of this transaction took effect is unknown: its SENDs may be "
                "stored (send them again with ids of your own that consumers deduplicate by), its ACKed "
                "messages may come again.",
                receipt=receipt,
                entry=entry,
            )

    line.when_durable(done)


def on_abort(session: Conn, frame: Frame) -> None:
    _taken(session, frame)
    session.line.at_once(frame.headers.get("receipt"))


TRANSACTION_RULES: dict[tuple[str, str], commands.Handler] = {
    **commands.RULES,
    (OPEN, "SEND"): _held_or(commands.on_send),
    (OPEN, "ACK"): _held_or(commands.on_ack),
    (OPEN, "NACK"): _held_or(commands.on_nack),
    (OPEN, "BEGIN"): on_begin,
    (OPEN, "COMMIT"): on_commit,
    (OPEN, "ABORT"): on_abort,
}
