"""The record format as tables in memory: encoding and parsing of every field, the
mutable block's rewrites (patches) and what a torn or stale one reads as, alignment; and
the upgrade of a file of the first format, made by the code before the format changed
(tests/data/log-format-1.log: 27 live messages among acked ones, held messages copied
by compaction, an ACK patch, delivery counts written by requeues, a watermark of 2)."""

from __future__ import annotations

import shutil
import sys
import zlib

import pytest

from curb.log import Log, LogCore, LogError, LogReader
from curb.log import record as fmt

DATA = "tests/data/log-format-1.log"
# (id, deliveries, its x-n header) of the live messages in the first-format file, in
# queue order, as the reader of that format listed them.
V1_LIVE = [(3, 1), (5, 1), (6, 1), (7, 3), (8, 1), (9, 1), (10, 1), (11, 1), (12, 1)] + [
    (i, 0) for i in range(382, 400)
]


def record(state=b"rdy", deliveries=0, mid=42, wseq=79, stamp=1_700_000_000_000, payload=b"\nbody", **kw) -> bytes:
    header = fmt.encode_record(state, deliveries, mid, wseq, stamp, payload, **kw)
    return b"".join(fmt.record_bytes(header, payload))


@pytest.mark.parametrize(
    "state, deliveries, due, expires, copy",
    [
        (b"rdy", 0, 0, 0, False),
        (b"rdy", 1, 1_700_000_123_456, 0, False),  # a delayed message
        (b"rdy", 65_536, 0, 1_800_000_000_000, True),  # past the first format's 4 digits
        (b"max", 20, 0, 0, False),  # a dead letter: max-deliveries
        (b"exp", 0, 1_700_000_000_001, 1_700_000_000_000, False),  # a dead letter: expired
        (b"ack", fmt.MAX_DELIVERIES, fmt.MAX_TIME_MS, fmt.MAX_TIME_MS, True),
    ],
)
def test_every_field_survives_encode_and_parse(state, deliveries, due, expires, copy):
    raw = record(state, deliveries, copy=copy, due_ms=due, expires_ms=expires)
    hdr = fmt.parse_header(raw, 0)
    assert (hdr.state, hdr.deliveries, hdr.id, hdr.wseq, hdr.due_ms, hdr.expires_ms, hdr.copy) == (
        state,
        deliveries,
        42,
        79,
        due,
        expires,
        copy,
    )
    assert hdr.timestamp_ms == 1_700_000_000_000 and bytes(hdr.payload(raw, 0)) == b"\nbody"
    assert fmt.check_payload(raw, 0, hdr)
    assert len(raw) == hdr.size == fmt.record_size(5) and hdr.size % fmt.ALIGN == 0


@pytest.mark.parametrize(
    "deliveries, mid, wseq, stamp, due, expires, copy",
    [
        (0, 1, 1, 0, 0, 0, False),
        (7, 0x123456789ABC, 0xFEDCBA987654, 1_700_000_000_000, 1_700_000_000_123, 1_800_000_000_000, True),
        (fmt.MAX_DELIVERIES + 5, (1 << 48) - 1, (1 << 48) - 1, fmt.MAX_TIME_MS, fmt.MAX_TIME_MS, fmt.MAX_TIME_MS, True),
    ],
)
def test_a_header_is_laid_out_field_by_field_as_the_format_says(deliveries, mid, wseq, stamp, due, expires, copy):
    """The header line, byte for byte: fixed-width lowercase hex fields, one space apart,
    the mutable block as mutable_block writes it, the CRC over the rest and the payload."""
    payload = b"\nsome body"
    header = fmt.encode_record(b"rdy", deliveries, mid, wseq, stamp, payload, copy=copy, due_ms=due, expires_ms=expires)
    rest = b"%012x %012x %012x %012x %08x" % (mid, wseq, stamp | (fmt.COPY_FLAG if copy else 0), expires, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(rest))
    assert header == b"%s %s %08x\n" % (fmt.mutable_block(b"rdy", deliveries, due, wseq), rest, crc)
    assert len(header) == fmt.RECORD_HEADER


@pytest.mark.parametrize("at", [4, 11, 13, 26, 33, 46, 59, 72, 85, 94, 101])
@pytest.mark.parametrize("char", [b" ", b"_", b"+", b"g", b"\xff"])
def test_a_header_digit_that_is_not_lowercase_hex_is_malformed(at, char):
    """Every field is lowercase hex digits and nothing else: a space, an underscore or a
    sign that a looser number parser would let through is damage."""
    raw = bytearray(record())
    raw[at : at + 1] = char
    with pytest.raises(fmt.FormatError):
        fmt.parse_header(raw, 0)


@pytest.mark.parametrize(
    "length", [0, 100, fmt.SMALL_CRC, fmt.SMALL_CRC + 1, fmt.FAST_CRC_FROM - 1, fmt.FAST_CRC_FROM, 70_000]
)
@pytest.mark.parametrize("kind", [bytes, bytearray])
@pytest.mark.parametrize("flip", [None, 40, 96, "payload"])
def test_the_crc_check_reads_small_and_large_payloads_alike(length, kind, flip):
    """Payloads up to SMALL_CRC in bytes are copied out for the CRC, the rest viewed in
    place, and from FAST_CRC_FROM on zlib-ng computes it: all judge a record the same,
    intact or with one bit flipped."""
    raw = bytearray(record(payload=b"y" * length))
    at = fmt.RECORD_HEADER + length - 1 if flip == "payload" else flip
    if at is not None and at >= fmt.RECORD_HEADER - 1 and length == 0:
        at = None
    if at is not None:
        raw[at] ^= 0x01
    buf = kind(raw)
    hdr = fmt.parse_header(buf, 0)
    assert fmt.check_payload(buf, 0, hdr) == fmt.crc_holds(buf, 0, len(raw)) == (at is None)


@pytest.mark.parametrize("length", [0, 1, fmt.FAST_CRC_FROM - 1, fmt.FAST_CRC_FROM, 1 << 20])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_the_payload_crc_is_zlibs_crc32_at_every_size(length, kind):
    """zlib-ng's CRC (large payloads) is zlib's function: the format does not change."""
    data = bytes(range(256)) * (length // 256) + b"z" * (length % 256)
    assert fmt.payload_crc(kind(data), 0x1234ABCD) == zlib.crc32(data, 0x1234ABCD)


def test_without_zlib_ng_the_large_payloads_crc_is_zlibs(monkeypatch):
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # `import zlib_ng` then raises ImportError
    assert fmt._fast_crc32() is zlib.crc32


@pytest.mark.parametrize("flip", [None, 40, 90, 98, fmt.RECORD_HEADER + 2, -1])
def test_the_skims_crc_check_agrees_with_the_parsed_one(flip):
    """crc_holds (recovery's skim: fields read in place) judges a record as check_payload does."""
    raw = bytearray(record(payload=b"x" * 40))
    if flip is not None:
        raw[flip] ^= 0x01
    try:
        parsed = fmt.check_payload(raw, 0, fmt.parse_header(raw, 0))
    except fmt.FormatError:
        parsed = False
    assert fmt.crc_holds(raw, 0, len(raw)) == parsed == (flip is None)


@pytest.mark.parametrize("length", [0, 1, 31, 32, 33, 100, 4096])
def test_every_record_is_a_whole_number_of_aligned_blocks(length):
    raw = record(payload=b"x" * length)
    assert len(raw) % fmt.ALIGN == 0 and raw.endswith(b"\n") and len(raw) == fmt.record_size(length)
    assert fmt.RING_START % fmt.ALIGN == 0 and fmt.PAD_SIZE % fmt.ALIGN == 0


@pytest.mark.parametrize(
    "state, deliveries, due",
    [(b"ack", 3, 0), (b"rdy", 4, 1_700_000_999_000), (b"max", 21, 0), (b"exp", 1, 0), (b"rdy", 0, 0)],
)
def test_a_patch_of_the_mutable_block_changes_only_state_count_and_due_time(state, deliveries, due):
    raw = bytearray(record(due_ms=5, expires_ms=9))
    patch = fmt.mutable_block(state, deliveries, due, 79)
    assert len(patch) == fmt.MUTABLE
    raw[: len(patch)] = patch
    hdr = fmt.parse_header(raw, 0)
    assert (hdr.state, hdr.deliveries, hdr.due_ms, hdr.expires_ms) == (state, deliveries, due, 9)
    assert fmt.check_payload(raw, 0, hdr), "the CRC does not cover the mutable block"


def test_a_mutable_block_left_by_an_older_record_is_damage_not_a_state():
    """A record write torn at a sector boundary: the first sector (mutable block and the
    id's first digits) is an older record's at the same aligned offset, the rest new.
    The CRC holds (it skips the block, and the ids' first digits agree), but the tag
    names the older write sequence: the record is damage, not the new one acked."""
    new = record(mid=0x2A, wseq=0x1004F)
    old = record(b"ack", 2, mid=0x2B, wseq=0x4F + 7)
    torn = old[: fmt.MUTABLE] + new[fmt.MUTABLE :]
    with pytest.raises(fmt.FormatError, match="another write"):
        fmt.parse_header(torn, 0)


def test_a_block_never_straddles_a_sector():
    """Aligned records put their 32-byte block inside one 512-byte sector, wherever they are."""
    for offset in range(fmt.RING_START, 64 * 1024, fmt.ALIGN):
        assert offset // 512 == (offset + fmt.MUTABLE - 1) // 512


def test_the_first_format_is_still_read():
    v1 = b"rdy 0003 00000000002a 00000000004f 019a3c2b1d40 00000005 00000000\n"
    hdr = fmt.parse_header_v1(v1 + b"\nbody\n", 0)
    assert (hdr.state, hdr.deliveries, hdr.id, hdr.size, hdr.body_at) == (b"rdy", 3, 42, 72, 66)
    assert fmt.layout_of(b"curb log 1\n...") is fmt.V1 and fmt.layout_of(fmt.MAGIC) is fmt.V2
    assert fmt.layout_of(b"not a log") is None


# ---------------------------------------------------------------- upgrading a first-format file


def drain(log: LogCore) -> list[tuple[int, int, str, bytes]]:
    out = []
    while (rec := log.next_ready()) is not None:
        payload = bytes(log.payload(rec))
        out.append((rec.id, rec.deliveries, payload.split(b"x-n:")[1].split(b"\n")[0].decode(), payload))
    return out


def test_a_first_format_file_is_upgraded_at_start_up_keeping_ids_counts_and_order(tmp_path):
    path = tmp_path / "curb.log"
    shutil.copy(DATA, path)
    old_size = path.stat().st_size
    log = Log(path, 64 * 1024).core
    try:
        found = drain(log)
        assert [(mid, deliveries) for mid, deliveries, _, _ in found] == V1_LIVE
        assert all(tag == str(mid) for mid, _, tag, _ in found), "each payload is its own message's"
        assert all(payload.endswith(b"m%03d-" % (mid % 1000)) for mid, _, _, payload in found)
        assert log.last_id >= 399 and log.acked_upto == 2
        new = log.append(b"x-n:after\n\nafter")
        assert new.id > 399, "ids are never reused"
    finally:
        log.final_checkpoint()
        log.disk.close()
    assert path.read_bytes().startswith(b"curb log 2\n") and path.stat().st_size <= max(old_size, 64 * 1024)
    assert not (tmp_path / "curb.log.upgrade").exists()
    with LogReader(str(path)) as reader:
        summary = reader.summary()
        assert summary.messages == len(V1_LIVE) + 1 and summary.delayed == summary.dead == 0
    again = Log(path, 64 * 1024).core
    try:
        assert [(mid, d) for mid, d, _, _ in drain(again)] == [*V1_LIVE, (new.id, 0)]
    finally:
        again.disk.close()


def test_an_upgrade_that_does_not_fit_the_cap_changes_nothing_and_says_which_cap(tmp_path):
    path = tmp_path / "curb.log"
    shutil.copy(DATA, path)
    before = path.read_bytes()
    with pytest.raises(LogError, match=r"older format .* start with -cap \d+MiB or larger"):
        Log(path, 16 * 1024)
    assert path.read_bytes() == before
    assert not (tmp_path / "curb.log.upgrade").exists()


def test_a_crashed_upgrade_leaves_the_old_file_and_starts_again(tmp_path):
    """A half-written new file from an upgrade cut short: the next start makes it afresh."""
    path = tmp_path / "curb.log"
    shutil.copy(DATA, path)
    (tmp_path / "curb.log.upgrade").write_bytes(b"curb log 2\n" + b"rdy " * 5000)
    log = Log(path, 64 * 1024).core
    try:
        assert [(mid, d) for mid, d, _, _ in drain(log)] == V1_LIVE
    finally:
        log.disk.close()
