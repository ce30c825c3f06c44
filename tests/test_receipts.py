"""curb.receipts as tables: answers leave in the order their places were taken, whatever
order the log answers in, and a lost frame's ERROR takes its place."""

from __future__ import annotations

from curb.frame import FrameParser
from curb.outcomes import Unconfirmed
from curb.receipts import ReceiptLine


class Line:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.waiting: list = []
        self.errors: list[tuple] = []
        self.line = ReceiptLine(self.out.append, self.waiting.append, self.error)

    def error(self, message: str, detail: str, receipt=None, entry=None) -> None:
        self.errors.append((message, receipt))
        self.line.settle(entry, b"ERROR:" + message.encode())

    def receipts(self) -> list[str]:
        return [f.headers.get("receipt-id", "") for f in FrameParser().feed(b"".join(self.out))]


def test_a_receipt_due_at_once_waits_for_the_durable_one_before_it():
    t = Line()
    t.line.after_sync("send-1", "SEND")
    t.line.at_once("sub-2")
    assert t.out == [], "the SUBSCRIBE's RECEIPT overtook the SEND's"
    t.waiting.pop(0)(None)
    assert t.receipts() == ["send-1", "sub-2"]


def test_a_late_receipt_says_so_and_a_lost_frame_gets_its_error_in_its_place():
    t = Line()
    t.line.after_sync("nack-1", "NACK", late=True)
    t.line.after_sync("ack-2", "ACK")
    t.line.at_once("sub-3")
    first, second = t.waiting
    second("disk failed (EIO)")
    assert t.out == [] and t.errors == [("ACK not stored", "ack-2")]
    first(None)
    assert t.out[0].startswith(b"RECEIPT\nreceipt-id:nack-1\ncurb-late:true\n")
    assert t.out[1] == b"ERROR:ACK not stored"


def test_an_unconfirmed_answer_is_never_read_as_late():
    """curb-late:true says the frame changed nothing; what a lost link leaves unknown
    says curb-unconfirmed:true instead, beside curb-late:true only for a late frame."""
    t = Line()
    t.line.after_sync("ack-1", "ACK")
    t.line.after_sync("ack-2", "ACK", late=True)
    t.line.after_sync("ack-3", "ACK")
    for answer in t.waiting:
        answer(Unconfirmed("instance lost"))
    answers = [(f.headers, f.body) for f in FrameParser().feed(b"".join(t.out))]
    assert answers == [
        ({"receipt-id": "ack-1", "curb-unconfirmed": "true"}, b""),
        ({"receipt-id": "ack-2", "curb-late": "true", "curb-unconfirmed": "true"}, b""),
        ({"receipt-id": "ack-3", "curb-unconfirmed": "true"}, b""),
    ]


def test_what_ends_the_line_is_written_last_and_runs_its_then():
    t = Line()
    closed: list[bool] = []
    t.line.after_sync("r1", "ACK")
    t.line.settle(t.line.end(), b"", lambda: closed.append(True))
    assert closed == []
    t.waiting[0](None)
    assert t.receipts() == ["r1"] and closed == [True] and t.line.last is not None
