"""The frames a load process receives, parsed at a fraction of the full parser's cost per frame.

A pipelined load receives hundreds of frames of one plain shape per read (RECEIPTs to a
producer, MESSAGEs to a consumer), and Python spent more CPU parsing them one by one than
the broker did producing them. Here one regex walks the run of plain frames at the start
of each read; whatever does not fit it (an ERROR, escaped or CR-ended headers, a frame
cut by the read) goes through the strict `FrameParser`, so any broker's frames are right.
"""

from __future__ import annotations

import re

from benchmark.target import BrokerError
from curb.client import Client, StompError, error_reason
from curb.frame import FRAME_END, Frame, FrameParser, ProtocolError, encode

# RECEIPTs with only a receipt-id, as Curb, RabbitMQ and ActiveMQ send them.
_RECEIPTS = re.compile(rb"(?:\n*RECEIPT\nreceipt-id:[^\n\r\\:\0]*\n\n\0)+")
_RECEIPT_ID = re.compile(rb"receipt-id:([^\n]*)")
# A MESSAGE head without escapes or CRs, any headers in any order; ack, message-id and
# content-length captured (a header repeated would count its last, not its first, value).
_MESSAGE = re.compile(
    rb"\n*MESSAGE\n(?:(?:ack:([^\n\r\\]*)|message-id:([^\n\r\\]*)|content-length:([0-9]{1,9})"
    rb"|(?!ack:|message-id:|content-length:)[^\n\r\\:\0]+:[^\n\r\\\0]*)\n)*\n"
)
_PLAIN_ID = re.compile(rb"[^\n\r\\:]*")  # an ack id that needs no escaping
_LEADING_BEATS = re.compile(rb"\n*")
_CONTENT_LENGTH = re.compile(rb"\ncontent-length:([0-9]{1,9})\n")


class Incoming:
    """One connection's received bytes, read raw from its Client, and the bytes of a frame
    cut by the last read, which the next read completes."""

    def __init__(self, client: Client, max_frame_bytes: int):
        self.client = client
        self._max_frame_bytes = max_frame_bytes
        self._carry = b""
        self._needed = 0  # bytes the cut frame in _carry needs in all, when its head tells

    def read(self, timeout: float) -> bytes:
        """Received bytes, starting at a frame boundary; b"" if nothing came within `timeout`.
        A frame cut by the last read is completed first when its head gives its length, in
        one join: large frames then cost one copy, not one per read."""
        data = self.client.receive_bytes(timeout)
        if not data or not self._carry:
            return data
        parts, have = [self._carry, data], len(self._carry) + len(data)
        while have < self._needed and (more := self.client.receive_bytes(timeout)):
            parts.append(more)
            have += len(more)
        self._carry = b""
        return b"".join(parts)

    def parse(self, data: bytes, pos: int) -> list[Frame]:
        """The complete frames in data[pos:] by the full parser (an ERROR raises StompError);
        the start of a frame cut by the read is kept for the next read."""
        if pos == len(data):
            return []
        parser = FrameParser(self._max_frame_bytes)
        try:
            frames = parser.feed(data[pos:])
        except ProtocolError as err:
            raise BrokerError(f"bad frame from the broker: {err}") from None
        if parser.buffered:
            self._carry = data[len(data) - parser.buffered :]
            self._needed = _frame_length(self._carry)
        for frame in frames:
            if frame.command == "ERROR":
                raise StompError(error_reason(frame), frame)
        return frames

    def hand_back(self) -> None:
        """Give the kept bytes back to the Client, before it receives frames itself again."""
        self.client.unread(self._carry)
        self._carry = b""


def receipt_ids(incoming: Incoming, timeout: float) -> list[bytes]:
    """The receipt-ids of the RECEIPTs in the next read; BrokerError if nothing comes within
    `timeout` seconds or another frame comes."""
    client = incoming.client
    if client.holds_input:  # read while a large SEND waited for the socket
        held = []
        while client.holds_input:
            frame = client.receive(timeout)
            if frame is None:
                raise BrokerError(f"no frame from the broker for {timeout:g} s")
            held.append(frame)
        data, end, ids = b"", 0, []
    else:
        data = incoming.read(timeout)
        if not data:
            raise BrokerError(f"no frame from the broker for {timeout:g} s")
        run = _RECEIPTS.match(data)
        end = run.end() if run else 0
        ids = _RECEIPT_ID.findall(data, 0, end)
        held = []
    for frame in held + incoming.parse(data, end):
        if frame.command != "RECEIPT":
            raise BrokerError(f"expected a RECEIPT, got {frame.command}")
        ids.append(frame.headers.get("receipt-id", "").encode())
    return ids


def messages(incoming: Incoming, timeout: float) -> list[tuple[bytes, bytes]] | None:
    """(body, ack id) of each MESSAGE in the next read, None if nothing came within `timeout`
    seconds; BrokerError if another frame comes. The ack id is the `ack` header, else the
    `message-id` (STOMP 1.2)."""
    data = incoming.read(timeout)
    if not data:
        return None
    found, pos = _plain_messages(data)
    for frame in incoming.parse(data, pos):
        if frame.command != "MESSAGE":
            raise BrokerError(f"expected MESSAGE, got {frame.command}")
        headers = frame.headers
        found.append((frame.body, (headers.get("ack") or headers["message-id"]).encode()))
    return found


def _plain_messages(data: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
    """(body, ack id) of the plain MESSAGEs at the start of data, and where the rest starts."""
    found: list[tuple[bytes, bytes]] = []
    match = _MESSAGE.match
    pos = 0
    size = len(data)
    while (head := match(data, pos)) is not None:
        ack_id = head[1] or head[2]
        start = head.end()
        if head[3] is None:
            end = data.find(b"\0", start)
        else:
            end = start + int(head[3])
            if end >= size or data[end]:
                break  # cut by the read, or no NUL where it belongs: the full parser tells
        if ack_id is None or end < 0:
            break
        found.append((data[start:end], ack_id))
        pos = end + 1
    return found, pos


def _frame_length(start: bytes) -> int:
    """The length of the frame that `start` begins, NUL included, when its head is complete
    and has content-length; else 0 (unknown)."""
    lead = _LEADING_BEATS.match(start)
    first = lead.end() if lead else 0
    end = start.find(b"\n\n", first)
    length = _CONTENT_LENGTH.search(start, first, end + 1) if end >= 0 else None
    return end + 2 + int(length[1]) + 1 if length else 0


def ack_frame(ack_id: bytes, receipt: str | None = None) -> bytes:
    """The ACK of a message by its ack id: a byte template for a plain id without a receipt."""
    if receipt is None and _PLAIN_ID.fullmatch(ack_id):
        return b"ACK\nid:%s\n\n%s" % (ack_id, FRAME_END)
    headers = {"id": ack_id.decode()}
    if receipt is not None:
        headers["receipt"] = receipt
    return encode("ACK", headers)
