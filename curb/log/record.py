"""The on-disk format of the log file: file header, checkpoint slots and records.

Pure functions over bytes, shared by the broker's log and by the offline readers.

A record is one text line of fixed-width fields, the payload, and a newline, padded with
spaces before that newline to a multiple of ALIGN (32) bytes:

    rdy 00000000 000000000000 00004f 00000000002a 00000000004f 019a3c2b1d40 000000000000 00000065 5e1f03aa
    content-type:text/plain
    <blank line>
    body bytes...<spaces>

Fields (hex): state, delivery count, due time, tag (the *mutable block*: the first 32
bytes), then message id, write sequence, send time (ms since the epoch; its top bit,
COPY_FLAG, marks a copy that compaction made of a message already in the log), expiry
time, payload length and CRC-32. The CRC covers the id to the length and the payload;
the mutable block is rewritten in place (`mutable_block`), so it is outside the CRC.
Times are ms since the epoch; a due time of 0 (or one passed) means rdy now, an expiry
time of 0 never. The payload is the SEND's own headers, escaped as on the wire, one per
line, a blank line, then the body byte for byte.

States: `rdy` (queued; parked while its due time is ahead), `ack` (done), `max` and `exp`
(dead letters, reason max-deliveries or expired: never delivered to a subscriber of the
queue), and `pad`, which ends a lap of the ring: the next record is at RING_START. A pad
has id 0 and no payload, and a message has an id above 0.

Invariants of the mutable block:
- Every record starts at a multiple of ALIGN (RING_START and the ring's end are
  multiples of it, and every record's size is), so its mutable block lies within one
  512-byte sector. Storage writes a sector whole, so a rewrite of the block (an ACK, a
  requeue with its delay and count, a burial, a redrive) is on disk entirely or not at
  all, never torn: recovery sees the block before the rewrite or after it.
- The tag is the low 24 bits of the record's write sequence, which the CRC covers. A
  record write torn at a sector boundary can leave the mutable block of an older record
  at the same offset (aligned records often share offsets across laps) in front of new
  bytes that pass the CRC; the tag then disagrees with the write sequence and the record
  counts as damage (never synced, so nothing promised it), not as the new message in
  the old one's state.

The file header (the first RING_START bytes) holds the magic line, a note for humans,
the cap line and the two checkpoint slots. The cap line records the ring's end (-cap
rounded down to 4 KiB) the broker last opened the file with, so that an offline reader
can tell how full the file is; nothing in recovery reads it, and a file written before it
existed has spaces there (`recorded_cap` is then None).

The CRC is CRC-32 (zlib's). zlib computes it at about 4 GB/s here, a quarter to two
fifths of a 1 MiB message's CPU; zlib-ng computes the same function with carry-less
multiplication at about 55 GB/s. So `payload_crc` gives payloads of FAST_CRC_FROM bytes
and more to zlib-ng (a dependency of the package, imported at the first such payload, so
an idle broker does not load it); where it is missing, as in a Spark executor's
environment, zlib computes the same values.

Files of the first format (magic `curb log 1`: 66-byte headers `state deliveries id wseq
time length crc`, 4-digit counts, no alignment) are read with `V1` only to upgrade them
(curb.upgrade); their states were patched in place unaligned, so a torn patch could leave
part `rdy`, part `ack`, read as `rdy` (TORN_STATES_V1).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, overload

try:  # the compiled build's C steps (record_c.c); the pure-Python build has none
    from curb.log import record_c as _c

    NATIVE = True
except ImportError:
    NATIVE = False

# What the readers parse: bytes read from a file, or a buffer they were read into.
Bytes = bytes | bytearray

MAGIC = b"curb log 2\n"
MAGIC_V1 = b"curb log 1\n"
HEADER_TEXT = (
    MAGIC
    + b"# One durable STOMP queue. Records start at byte 512, each at a multiple of 32: a line\n"
    + b"# 'state deliveries due tag id wseq time expires length crc32' (hex), payload, newline.\n"
)
CAP_OFFSET = 191  # the cap line's newline; the line itself starts at 192
SLOT_OFFSETS = (256, 384)
RING_START = 512

ALIGN: Final = 32
RECORD_HEADER: Final = 103
MUTABLE = 32  # the mutable block: state, deliveries, due time and tag
CRC_FROM, CRC_TO = 33, 93  # the header bytes the CRC covers: id to length
SMALL_CRC: Final = 4096  # payloads up to this size are copied out for their CRC, not viewed
FAST_CRC_FROM: Final = 16 * 1024  # payloads from this size have their CRC from zlib-ng
STATE_RDY = b"rdy"
STATE_ACK = b"ack"
STATE_PAD: Final = b"pad"
STATE_MAX = b"max"  # dead letter: delivered -max-deliveries times and back once more
STATE_EXP = b"exp"  # dead letter: expired before it was delivered
DEAD_REASONS = {STATE_MAX: "max-deliveries", STATE_EXP: "expired"}
DEAD_STATES = {reason: state for state, reason in DEAD_REASONS.items()}
STATES: Final = (STATE_RDY, STATE_ACK, STATE_PAD, STATE_MAX, STATE_EXP)
MAX_DELIVERIES = 0xFFFFFFFF
MAX_TIME_MS = (1 << 47) - 1  # due and expiry times; the send time's top bit is COPY_FLAG
TAG_MASK: Final = 0xFFFFFF
COPY_FLAG: Final = 1 << 47
# The header's hex fields after the state as bytes: deliveries (4), due (6, as 2 + 4), tag
# (3, as 1 + 2), id, write sequence, time and expiry (6 each), length and CRC (4 each).
_FIELDS = struct.Struct(">IHIBHHIHIHIHIII")
_SPACES: Final = (3, 12, 25, 32, 45, 58, 71, 84, 93)
_MID: Final = struct.Struct(">HIHIHIHII")  # the 48-bit fields as 16 + 32 bits, then the length
_LOW32: Final = 0xFFFFFFFF
# The bytes after a payload: spaces to the record's alignment, then the newline.
TAILS = tuple(b" " * n + b"\n" for n in range(ALIGN))


def payload_crc(data: Bytes | memoryview, value: int) -> int:
    """zlib.crc32(data, value), from zlib-ng where the payload is large (see the module)."""
    if len(data) < FAST_CRC_FROM:
        return zlib.crc32(data, value)
    if not _FAST_CRC:
        _FAST_CRC.append(_fast_crc32())
    return _FAST_CRC[0](data, value)


# zlib-ng's crc32 once looked up (a list: a compiled module's global is then never rebound).
_FAST_CRC: list[Callable[[Bytes | memoryview, int], int]] = []


def _fast_crc32() -> Callable[[Bytes | memoryview, int], int]:
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return zlib.crc32
    # Typed here: mypyc's build environment lacks zlib-ng, so there its crc32 is Any.
    fast: Callable[[Bytes | memoryview, int], int] = zlib_ng.crc32
    return fast


def record_size(length: int) -> int:
    """The bytes a record with a payload of `length` bytes takes in the ring."""
    return (RECORD_HEADER + length + ALIGN) & -ALIGN


PAD_SIZE = record_size(0)


class FormatError(Exception):
    """Bytes that are not a valid part of a curb log."""


class RecordHeader:
    """The fixed-width line in front of each record's payload, and where its payload is.
    A plain class, not a dataclass: the compiled build makes one for every record read,
    and a dataclass's generated __init__ would run as Python code."""

    __slots__ = (
        "body_at",
        "copy",
        "crc",
        "deliveries",
        "due_ms",
        "expires_ms",
        "id",
        "length",
        "size",
        "state",
        "timestamp_ms",
        "wseq",
    )

    def __init__(
        self,
        state: bytes,
        deliveries: int,
        msg_id: int,
        wseq: int,
        timestamp_ms: int,
        length: int,
        crc: int,
        copy: bool = False,
        due_ms: int = 0,
        expires_ms: int = 0,
        size: int = 0,
        body_at: int = RECORD_HEADER,
    ):
        self.state = state
        self.deliveries = deliveries
        self.id = msg_id
        self.wseq = wseq
        self.timestamp_ms = timestamp_ms
        self.length = length
        self.crc = crc
        self.copy = copy
        self.due_ms = due_ms
        self.expires_ms = expires_ms
        self.size = size  # the record's bytes in the ring
        self.body_at = body_at  # where the payload starts, from the record's start

    @overload
    def payload(self, buf: bytes, off: int) -> bytes: ...
    @overload
    def payload(self, buf: bytearray, off: int) -> bytearray: ...
    def payload(self, buf: bytes | bytearray, off: int) -> bytes | bytearray:
        """The payload of this record, which starts at buf[off]: a slice of buf. (Overloads
        rather than a constrained type variable: mypyc checks the body once, for the union.)"""
        return buf[off + self.body_at : off + self.body_at + self.length]


def encode_record(
    state: bytes,
    deliveries: int,
    msg_id: int,
    wseq: int,
    timestamp_ms: int,
    payload: bytes,
    copy: bool = False,
    due_ms: int = 0,
    expires_ms: int = 0,
) -> bytes:
    """The header line of a record; the payload and `TAILS[...]` follow it in the file
    (`record_bytes` gives all three)."""
    stamp = timestamp_ms | COPY_FLAG if copy else timestamp_ms
    if NATIVE:
        line = _c.encode(state, deliveries, msg_id, wseq, stamp, payload, due_ms, expires_ms)
        if line is not None:
            return line
    # The id, write sequence, stamp, expiry and length as "%012x %012x %012x %012x %08x":
    # packed big-endian and written out as hex in groups of 6 bytes from the left (the
    # last group 4): about 3,000 instructions a record fewer than formatting each number.
    mid = (
        _MID.pack(
            msg_id >> 32,
            msg_id & _LOW32,
            wseq >> 32,
            wseq & _LOW32,
            stamp >> 32,
            stamp & _LOW32,
            expires_ms >> 32,
            expires_ms & _LOW32,
            len(payload),
        )
        .hex(" ", -6)
        .encode()
    )
    crc = payload_crc(payload, zlib.crc32(mid))
    if deliveries == 0 and due_ms == 0 and state == STATE_RDY:
        # Most records are new messages, never delivered and due at once: their mutable
        # block is a constant but for its tag, and one format call does the rest.
        return b"%s%06x %s %08x\n" % (_NEW_UNTAGGED, wseq & TAG_MASK, mid, crc)
    return b"%s %s %08x\n" % (mutable_block(state, deliveries, due_ms, wseq), mid, crc)


def record_bytes(header: bytes, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """A record's buffers as written: header line, payload, padding and newline."""
    return header, payload, TAILS[-(RECORD_HEADER + len(payload) + 1) % ALIGN]


def mutable_block(state: bytes, deliveries: int, due_ms: int, wseq: int) -> bytes:
    """The first MUTABLE bytes of a record: what an ACK, requeue, burial or redrive
    rewrites in place (one sector, so never torn)."""
    return b"%s %08x %012x %06x" % (state, min(deliveries, MAX_DELIVERIES), due_ms, wseq & TAG_MASK)


# A new message's mutable block up to its tag (rdy, never delivered, due at once), as
# mutable_block lays it out; encode_record writes the six digits of its tag after it.
_NEW_UNTAGGED: Final = mutable_block(STATE_RDY, 0, 0, 0)[:-6]


def parse_header(buf: Bytes, pos: int) -> RecordHeader:
    """Parse the record header at buf[pos:]; FormatError if it is not well formed.
    The payload's CRC is not checked here (see check_payload)."""
    if NATIVE:
        parsed = _c.parse(buf, pos)
        if parsed is not None:
            state, count, msg_id, wseq, stamp, length, crc, copy, due_ms, expires_ms, size = parsed
            return RecordHeader(state, count, msg_id, wseq, stamp, length, crc, copy, due_ms, expires_ms, size)
    line = bytes(buf[pos : pos + RECORD_HEADER])  # one copy, then native indexing
    if len(line) < RECORD_HEADER or line[RECORD_HEADER - 1] != 10:
        raise FormatError("incomplete or malformed record header")
    state = line[:3]
    if state not in STATES:
        raise FormatError(f"unknown record state {state!r}")
    # Fixed-width fields: one space before each, then an even number of hex digits, so
    # with the spaces in place the digits decode as 45 big-endian bytes in one call.
    for at in _SPACES:
        if line[at] != 32:
            raise FormatError("malformed record header")
    try:
        fields: tuple[int, ...] = _FIELDS.unpack(bytes.fromhex(line[4 : RECORD_HEADER - 1].decode("ascii")))
    except (ValueError, struct.error):  # not ASCII, not hex digits, or too few of them
        raise FormatError("malformed record header") from None
    msg_id = fields[5] << 32 | fields[6]
    wseq = fields[7] << 32 | fields[8]
    length = fields[13]
    if (fields[3] << 16 | fields[4]) != wseq & TAG_MASK:
        # The mutable block is another write's: an older record's, before bytes of a
        # newer one that a crash tore (see the module's invariants).
        raise FormatError("record's state belongs to another write")
    if (state == STATE_PAD) != (msg_id == 0 and length == 0):
        raise FormatError("record state does not match its id and length")
    stamp = fields[9] << 32 | fields[10]
    return RecordHeader(
        state,
        fields[0],
        msg_id,
        wseq,
        stamp & ~COPY_FLAG,
        length,
        fields[14],
        bool(stamp & COPY_FLAG),
        fields[1] << 32 | fields[2],
        fields[11] << 32 | fields[12],
        record_size(length),
    )


def check_payload(buf: Bytes, pos: int, header: RecordHeader) -> bool:
    """True if the record at buf[pos:] is complete and its CRC matches."""
    return _crc_matches(buf, pos, header.size, header.length, header.crc)


def crc_holds(buf: Bytes, pos: int, size: int) -> bool:
    """`check_payload` for a record of `size` bytes whose header was found well formed
    by a reader of its fields in place (recovery's skim), without parsing it again."""
    try:
        length, crc = int(buf[pos + 85 : pos + 93], 16), int(buf[pos + 94 : pos + 102], 16)
    except ValueError:
        return False
    return _crc_matches(buf, pos, size, length, crc)


def _crc_matches(buf: Bytes, pos: int, size: int, length: int, crc: int) -> bool:
    """Whether the record of `size` bytes at buf[pos:] is complete and the CRC of its
    header's id-to-length fields and its payload of `length` bytes is `crc`. The bytes
    are read where they are (a memoryview) unless they are few: copying a small payload
    out of bytes costs less than making the views."""
    if NATIVE:
        matches = _c.crc_matches(buf, pos, size, length, crc)
        if matches is not None:
            return matches
    end = pos + size
    if len(buf) < end or buf[end - 1] != 10:
        return False
    body = pos + RECORD_HEADER
    if length <= SMALL_CRC and isinstance(buf, bytes):
        return zlib.crc32(buf[body : body + length], zlib.crc32(buf[pos + CRC_FROM : pos + CRC_TO])) == crc
    view = memoryview(buf)
    return payload_crc(view[body : body + length], zlib.crc32(view[pos + CRC_FROM : pos + CRC_TO])) == crc


class Layout:
    """How a format's records are read: the header's size, its parser, the CRC check and
    the pattern a header's start matches (for finding records after damage). This one is
    the current format's; LayoutV1 the first's. Methods, not functions held in fields:
    a reader calls them for every record, and a method of a compiled class is a direct
    call where a function in a field is a generic one."""

    def __init__(self, magic: bytes, header: int, candidate: re.Pattern[bytes]):
        self.magic = magic
        self.header = header
        self.candidate = candidate

    def parse(self, buf: Bytes, pos: int) -> RecordHeader:
        return parse_header(buf, pos)

    def check(self, buf: Bytes, pos: int, header: RecordHeader) -> bool:
        return check_payload(buf, pos, header)


class LayoutV1(Layout):
    """The first format's records."""

    def parse(self, buf: Bytes, pos: int) -> RecordHeader:
        return parse_header_v1(buf, pos)

    def check(self, buf: Bytes, pos: int, header: RecordHeader) -> bool:
        return check_payload_v1(buf, pos, header)


# ---------------------------------------------------------------- the first format

RECORD_HEADER_V1 = 66
# An ACK's or requeue's patch of a v1 record's state that a power loss tore at a sector
# boundary: part `rdy`, part `ack`. Such a patch was never synced, so no RECEIPT promised
# it: the record counts as `rdy` (delivered again, never lost).
TORN_STATES_V1 = {STATE_RDY[:k] + STATE_ACK[k:]: STATE_RDY for k in (1, 2)} | {
    STATE_ACK[:k] + STATE_RDY[k:]: STATE_RDY for k in (1, 2)
}
_FIELDS_V1 = struct.Struct(">HHIHIHIII")


def parse_header_v1(buf: Bytes, pos: int) -> RecordHeader:
    """Parse a first-format record header at buf[pos:]; FormatError if not well formed."""
    if len(buf) < pos + RECORD_HEADER_V1 or buf[pos + RECORD_HEADER_V1 - 1] != 10:
        raise FormatError("incomplete or malformed record header")
    state = bytes(buf[pos : pos + 3])
    if state != STATE_RDY and state != STATE_ACK and state != STATE_PAD:
        state = TORN_STATES_V1.get(state, b"")
        if not state:
            raise FormatError(f"unknown record state {bytes(buf[pos : pos + 3])!r}")
    for at in (3, 8, 21, 34, 47, 56):
        if buf[pos + at] != 32:
            raise FormatError("malformed record header")
    try:
        deliveries, id_hi, id_lo, wseq_hi, wseq_lo, stamp_hi, stamp_lo, length, crc = _FIELDS_V1.unpack(
            bytes.fromhex(buf[pos + 4 : pos + 65].decode("ascii"))
        )
    except (ValueError, struct.error):
        raise FormatError("malformed record header") from None
    msg_id = id_hi << 32 | id_lo
    if (state == STATE_PAD) != (msg_id == 0 and length == 0):
        raise FormatError("record state does not match its id and length")
    stamp = stamp_hi << 32 | stamp_lo
    return RecordHeader(
        state,
        deliveries,
        msg_id,
        wseq_hi << 32 | wseq_lo,
        stamp & ~COPY_FLAG,
        length,
        crc,
        bool(stamp & COPY_FLAG),
        size=RECORD_HEADER_V1 + length + 1,
        body_at=RECORD_HEADER_V1,
    )


def check_payload_v1(buf: Bytes, pos: int, header: RecordHeader) -> bool:
    """True if the first-format record at buf[pos:] is complete and its CRC matches."""
    end = pos + header.size
    if len(buf) < end or buf[end - 1] != 10:
        return False
    view = memoryview(buf)
    crc = zlib.crc32(view[pos + 9 : pos + 56])
    return payload_crc(view[pos + RECORD_HEADER_V1 : end - 1], crc) == header.crc


def _candidate(states: tuple[bytes, ...], digits: int) -> re.Pattern[bytes]:
    return re.compile(b"(?:" + b"|".join(states) + rb") [0-9a-f]{%d} [0-9a-f]{12} " % digits)


V2 = Layout(MAGIC, RECORD_HEADER, _candidate(STATES, 8))
V1 = LayoutV1(MAGIC_V1, RECORD_HEADER_V1, _candidate((STATE_RDY, STATE_ACK, STATE_PAD, *TORN_STATES_V1), 4))


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


def layout_of(header: bytes) -> Layout | None:
    """The record layout of a log whose file header this is; None if it is not a curb log."""
    for layout in (V2, V1):
        if header.startswith(layout.magic):
            return layout
    return None


def latest_checkpoint(header: bytes) -> Checkpoint:
    """The newest intact checkpoint in a file header (of either format); FormatError if
    it is not a curb log."""
    if layout_of(header) is None:
        raise FormatError("not a curb log (no 'curb log 2' or 'curb log 1' header)")
    decoded = [Checkpoint.decode(header[o : o + 128]) for o in SLOT_OFFSETS]
    found = [c for c in decoded if c is not None]
    if not found:
        raise FormatError("the log's header is damaged (no intact checkpoint)")
    return max(found, key=lambda c: c.gen)
