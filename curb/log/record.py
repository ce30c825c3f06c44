"""The on-disk format of the log file: file header, checkpoint slots and records.

Pure functions over bytes, shared by the broker's log and by the offline readers.

A record is one text line of fixed-width fields, the payload, and a newline:

    rdy 0000 00000000002a 00000000004f 019a3c2b1d40 00000065 5e1f03aa
    content-type:text/plain
    <blank line>
    body bytes...

Fields: state (`rdy`, `ack` or `pad`), delivery count, message id, write sequence,
send time (ms since the epoch; its top bit, COPY_FLAG, marks a copy that compaction made
of a message already in the log), payload length, CRC-32 (all hex). State and delivery
count are patched in place, so the CRC covers everything else: id, write sequence,
time, length and payload. The payload is the SEND's own headers, escaped as on the
wire, one per line, a blank line, then the body byte for byte.

The file header (the first RING_START bytes) holds the magic line, a note for humans,
the cap line and the two checkpoint slots. The cap line records the ring's end (-cap
rounded down to 4 KiB) the broker last opened the file with, so that an offline reader
can tell how full the file is; nothing in recovery reads it, and a file written before it
existed has spaces there (`recorded_cap` is then None).

A `pad` record marks the end of a lap of the ring: the next record is at RING_START. It
has id 0 and no payload, and a message has an id above 0, so a state that a torn write
left from an earlier lap (the state is outside the CRC) is caught by its id and length.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = b"curb log 1\n"
HEADER_TEXT = (
    MAGIC
    + b"# One durable STOMP queue. Records start at byte 512; each is a line\n"
    + b"# 'state deliveries id wseq time-ms length crc32' (hex), payload, newline.\n"
)
CAP_OFFSET = 191  # the cap line's newline; the line itself starts at 192
SLOT_OFFSETS = (256, 384)
RING_START = 512

RECORD_HEADER = 66
PAD_SIZE = RECORD_HEADER + 1
STATE_RDY = b"rdy"
STATE_ACK = b"ack"
STATE_PAD = b"pad"
MAX_DELIVERIES = 0xFFFF
# An ACK's or requeue's patch of the state that a power loss tore at a sector boundary:
# part `rdy`, part `ack`. Such a patch was never synced, so no RECEIPT promised it:
# the record counts as `rdy` (delivered again, never lost).
TORN_STATES = {STATE_RDY[:k] + STATE_ACK[k:]: STATE_RDY for k in (1, 2)} | {
    STATE_ACK[:k] + STATE_RDY[k:]: STATE_RDY for k in (1, 2)
}
COPY_FLAG = 1 << 47
# The header's hex fields after the state as bytes: deliveries (2), id, write sequence and
# time (6 each, as 2 + 4), length and CRC (4 each).
_FIELDS = struct.Struct(">HHIHIHIII")


class FormatError(Exception):
    """Bytes that are not a valid part of a curb log."""


@dataclass(slots=True)
class RecordHeader:
    """The fixed-width line in front of each record's payload."""

    state: bytes
    deliveries: int
    id: int
    wseq: int
    timestamp_ms: int
    length: int
    crc: int
    copy: bool = False

    @property
    def size(self) -> int:
        return RECORD_HEADER + self.length + 1


def encode_record(
    state: bytes, deliveries: int, msg_id: int, wseq: int, timestamp_ms: int, payload: bytes, copy: bool = False
) -> bytes:
    """The header line of a record; the payload and a newline follow it in the file."""
    stamp = timestamp_ms | COPY_FLAG if copy else timestamp_ms
    mid = b"%012x %012x %012x %08x" % (msg_id, wseq, stamp, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(mid))
    if not deliveries and state == STATE_RDY:  # every new message
        return b"rdy 0000 %s %08x\n" % (mid, crc)
    return b"%s %04x %s %08x\n" % (state, min(deliveries, MAX_DELIVERIES), mid, crc)


def state_patch(state: bytes, deliveries: int) -> bytes:
    """The first 8 bytes of a record header, rewritten in place on ACK or requeue."""
    return b"%s %04x" % (state, min(deliveries, MAX_DELIVERIES))


def parse_header(buf, pos: int) -> RecordHeader:
    """Parse the record header at buf[pos:]; FormatError if it is not well formed.
    The payload's CRC is not checked here (see check_payload)."""
    if len(buf) < pos + RECORD_HEADER or buf[pos + RECORD_HEADER - 1] != 10:
        raise FormatError("incomplete or malformed record header")
    state = bytes(buf[pos : pos + 3])
    if state != STATE_RDY and state != STATE_ACK and state != STATE_PAD:
        state = TORN_STATES.get(state, b"")
        if not state:
            raise FormatError(f"unknown record state {bytes(buf[pos : pos + 3])!r}")
    # Fixed-width fields: one space before each, then an even number of hex digits, so
    # with the spaces in place the digits decode as 28 big-endian bytes in one call.
    if (
        buf[pos + 3] != 32
        or buf[pos + 8] != 32
        or buf[pos + 21] != 32
        or buf[pos + 34] != 32
        or buf[pos + 47] != 32
        or buf[pos + 56] != 32
    ):
        raise FormatError("malformed record header")
    try:
        deliveries, id_hi, id_lo, wseq_hi, wseq_lo, stamp_hi, stamp_lo, length, crc = _FIELDS.unpack(
            bytes.fromhex(buf[pos + 4 : pos + 65].decode("ascii"))
        )
    except (ValueError, struct.error):  # not ASCII, not hex digits, or too few of them
        raise FormatError("malformed record header") from None
    msg_id = id_hi << 32 | id_lo
    if (state == STATE_PAD) != (msg_id == 0 and length == 0):
        # The state is outside the CRC: a write torn at a sector boundary can leave a
        # lap's old `pad` on a new message, or a message's old `rdy` on a new pad.
        raise FormatError("record state does not match its id and length")
    stamp = stamp_hi << 32 | stamp_lo
    return RecordHeader(
        state, deliveries, msg_id, wseq_hi << 32 | wseq_lo, stamp & ~COPY_FLAG, length, crc, bool(stamp & COPY_FLAG)
    )


def check_payload(buf, pos: int, header: RecordHeader) -> bool:
    """True if the record at buf[pos:] is complete and its CRC matches."""
    end = pos + RECORD_HEADER + header.length + 1
    if len(buf) < end or buf[end - 1] != 10:
        return False
    view = memoryview(buf)  # the CRC reads the bytes where they are: no copy of the payload
    crc = zlib.crc32(view[pos + 9 : pos + 56])
    return zlib.crc32(view[pos + RECORD_HEADER : end - 1], crc) == header.crc


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where the live region of the ring was when this slot was written.

    Everything the checkpoint names was on disk before the slot was written, so after a
    crash recovery can trust it and then look past `head` for newer records.

    `acked_upto` is the ack-up-to watermark: every message with an id up to it is
    acknowledged for good, whatever its record's state says. It names no bytes, so any
    checkpoint may carry the newest one. Slots written before it existed have six
    fields; they decode with a watermark of 0 (nothing acknowledged that way)."""

    gen: int
    tail: int
    head: int
    next_id: int
    next_wseq: int
    acked_upto: int = 0

    def encode(self) -> bytes:
        body = b"ckpt %016x %016x %016x %016x %016x %016x" % (
            self.gen,
            self.tail,
            self.head,
            self.next_id,
            self.next_wseq,
            self.acked_upto,
        )
        return body + b" %08x\n" % zlib.crc32(body)

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint | None:
        """The checkpoint in a slot (either layout), or None if the slot is empty or torn."""
        line = raw.split(b"\n", 1)[0]
        parts = line.split(b" ")
        if len(parts) not in (7, 8) or parts[0] != b"ckpt":
            return None
        try:
            values = [int(p, 16) for p in parts[1:]]
        except ValueError:
            return None
        if zlib.crc32(line[:-9]) != values[-1]:
            return None
        return cls(*values[:-1])


def cap_line(end: int) -> bytes:
    """The cap line, on a line of its own, recording the ring's end with a CRC (a torn
    line reads as none)."""
    body = b"# cap %016x" % end
    return b"\n" + body + b" %08x\n" % zlib.crc32(body)


def recorded_cap(header: bytes) -> int | None:
    """The ring's end the file header records, or None if it records none (or a torn one)."""
    line = header[CAP_OFFSET : CAP_OFFSET + len(cap_line(0))]
    try:
        end = int(line[7:23], 16)  # after "\n# cap "
    except ValueError:
        return None
    return end if line == cap_line(end) else None


def initial_header(end: int) -> bytes:
    """The first RING_START bytes of a new log: magic, a note for humans, the ring's end
    and one checkpoint."""
    first = Checkpoint(1, RING_START, RING_START, 1, 1)
    head = bytearray(b" " * RING_START)
    head[: len(HEADER_TEXT)] = HEADER_TEXT
    line = cap_line(end)
    head[CAP_OFFSET : CAP_OFFSET + len(line)] = line
    for off in SLOT_OFFSETS:
        head[off - 1 : off] = b"\n"
    slot = first.encode()
    head[SLOT_OFFSETS[1] : SLOT_OFFSETS[1] + len(slot)] = slot
    head[-1:] = b"\n"
    return bytes(head)


def latest_checkpoint(header: bytes) -> Checkpoint:
    """The newest intact checkpoint in a file header; FormatError if it is not a curb log."""
    if not header.startswith(MAGIC):
        raise FormatError("not a curb log (no 'curb log 1' header)")
    decoded = [Checkpoint.decode(header[o : o + 128]) for o in SLOT_OFFSETS]
    found = [c for c in decoded if c is not None]
    if not found:
        raise FormatError("the log's header is damaged (no intact checkpoint)")
    return max(found, key=lambda c: c.gen)
