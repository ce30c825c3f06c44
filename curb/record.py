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

A `pad` record marks the end of a lap of the ring: the next record is at RING_START. It
has id 0 and no payload, and a message has an id above 0, so a state that a torn write
left from an earlier lap (the state is outside the CRC) is caught by its id and length.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

MAGIC = b"curb log 1\n"
HEADER_TEXT = (
    MAGIC
    + b"# One durable STOMP queue. Records start at byte 512; each is a line\n"
    + b"# 'state deliveries id wseq time-ms length crc32' (hex), payload, newline.\n"
)
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
    if state not in (STATE_RDY, STATE_ACK, STATE_PAD):
        state = TORN_STATES.get(state, b"")
        if not state:
            raise FormatError(f"unknown record state {bytes(buf[pos : pos + 3])!r}")
    try:
        stamp = int(buf[pos + 35 : pos + 47], 16)
        header = RecordHeader(
            state,
            int(buf[pos + 4 : pos + 8], 16),
            int(buf[pos + 9 : pos + 21], 16),
            int(buf[pos + 22 : pos + 34], 16),
            stamp & ~COPY_FLAG,
            int(buf[pos + 48 : pos + 56], 16),
            int(buf[pos + 57 : pos + 65], 16),
            bool(stamp & COPY_FLAG),
        )
    except ValueError:
        raise FormatError("malformed record header") from None
    if (state == STATE_PAD) != (header.id == 0 and header.length == 0):
        # The state is outside the CRC: a write torn at a sector boundary can leave a
        # lap's old `pad` on a new message, or a message's old `rdy` on a new pad.
        raise FormatError("record state does not match its id and length")
    return header


def check_payload(buf, pos: int, header: RecordHeader) -> bool:
    """True if the record at buf[pos:] is complete and its CRC matches."""
    end = pos + header.size
    if len(buf) < end or buf[end - 1] != 10:
        return False
    crc = zlib.crc32(buf[pos + 9 : pos + 56])
    return zlib.crc32(buf[pos + RECORD_HEADER : end - 1], crc) == header.crc


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


def initial_header() -> bytes:
    """The first RING_START bytes of a new log: magic, a note for humans, one checkpoint."""
    first = Checkpoint(1, RING_START, RING_START, 1, 1)
    head = bytearray(b" " * RING_START)
    head[: len(HEADER_TEXT)] = HEADER_TEXT
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
