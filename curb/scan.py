"""Walking a log file's records from a checkpoint: start-up recovery and offline reads.

The checkpoint names a region [tail, head) whose records were all on disk before it was
written, so a damaged record there is corruption: it is skipped by finding the next
intact record. Past `head`, records written after the checkpoint are accepted only while
their write sequence continues the checkpoint's and their CRC holds; the first that does
not ends the log, and if it looks like a record cut short it is reported as a torn tail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from curb import record as fmt
from curb.frame import ProtocolError, unescape
from curb.record import RECORD_HEADER, RING_START, STATE_ACK, STATE_PAD, STATE_RDY, FormatError

CHUNK = 1 << 20
STARTS = (b"rdy ", b"ack ", b"pad ")
STATES = (STATE_RDY, STATE_ACK, STATE_PAD)
VERIFY_NEAR_HEAD = 4 << 20


class LogError(Exception):
    """The log file cannot be used; str() says what to fix."""


class Scan:
    """One pass over a log's records, counting what recovery needs to know."""

    def __init__(self, fd: int, ckpt: fmt.Checkpoint):
        self.fd = fd
        self.ckpt = ckpt
        self.file_size = os.fstat(fd).st_size
        self.head = ckpt.head
        self.next_wseq = ckpt.next_wseq
        self.max_id = 0
        self.copies: list[int] = []
        self.messages = 0
        self.acked = 0
        self.live_bytes = 0
        self.dead_bytes = 0
        self._oldest_pos: int | None = None
        self.damaged: list[str] = []
        self.torn: str | None = None
        self._buf = b""
        self._base = 0

    def run(self) -> None:
        """Count the records, checking every CRC near the head and past it, where a crash
        can tear a write; older records were synced before the checkpoint named them, and
        their CRC is checked when they are read for delivery."""
        for _ in self._walk(VERIFY_NEAR_HEAD):
            pass
        self._note_damage()

    def records(self) -> Iterator[tuple[int, fmt.RecordHeader, bytes, int]]:
        """Yield (offset, header, buffer, index of the record in buffer) for every
        message record in queue order, each checked against its CRC."""
        yield from self._walk(None)
        self._note_damage()

    def _note_damage(self) -> None:
        if self.damaged:
            note = "; ".join(self.damaged)
            self.torn = note if self.torn is None else f"{note}; {self.torn}"

    def _count(self, state: bytes, msg_id: int, size: int, pos: int) -> None:
        if msg_id < self.max_id:
            self.copies.append(msg_id)
        else:
            self.max_id = msg_id
        if state == STATE_RDY:
            self.messages += 1
            self.live_bytes += size
            if self._oldest_pos is None:
                self._oldest_pos = pos
        else:
            self.acked += 1
            self.dead_bytes += size

    @property
    def oldest_ms(self) -> int | None:
        """Send time of the first waiting message (queue order is send order)."""
        if self._oldest_pos is None:
            return None
        buf, off = self._window(self._oldest_pos, RECORD_HEADER)
        return fmt.parse_header(buf, off).timestamp_ms

    def _walk(self, trust_until: int | None):
        """Phase 1: the checkpoint's region; phase 2: records written after it.
        With `trust_until`, records more than that many bytes before the checkpoint's
        head are skimmed for state, length and id only."""
        pos, stop = self.ckpt.tail, self.ckpt.head
        budget = self.file_size * 2 + CHUNK
        while pos != stop and budget > 0:
            if trust_until is not None and (pos > stop or stop - pos > trust_until):
                start = pos
                pos = self._skim(pos, stop, trust_until)
                budget -= abs(pos - start)
                if pos != start:
                    continue
            hdr, buf, off = self._intact(pos)
            if hdr is None:
                nxt = self._resync(pos, stop)
                if nxt is None:
                    self.damaged.append(f"torn tail: bytes {pos}..{stop} dropped")
                    self.head = pos
                    return
                self.damaged.append(f"damaged bytes {pos}..{nxt} skipped")
                pos = nxt
                continue
            if pos < stop < pos + hdr.size:
                self.damaged.append(f"record at byte {pos} overruns the checkpoint; dropped from there")
                self.head = pos
                return
            budget -= hdr.size
            if hdr.state != STATE_PAD:
                self._count(hdr.state, hdr.id, hdr.size, pos)
                yield pos, hdr, buf, off
            pos = RING_START if hdr.state == STATE_PAD else pos + hdr.size
        pos, expect = self.head, self.next_wseq
        while True:
            hdr, buf, off = self._intact(pos)
            if hdr is None or hdr.wseq != expect:
                if hdr is None and self._looks_torn(pos, expect):
                    self.torn = f"torn tail: record at byte {pos} dropped"
                break
            if hdr.state != STATE_PAD:
                self._count(hdr.state, hdr.id, hdr.size, pos)
                yield pos, hdr, buf, off
            expect += 1
            pos = RING_START if hdr.state == STATE_PAD else pos + hdr.size
            self.head = pos
        self.next_wseq = expect

    def _skim(self, pos: int, stop: int, trust_until: int) -> int:
        """Count well-formed records from pos by their headers alone, while they are more
        than `trust_until` bytes before the checkpoint's head; return where it stopped
        (there the checked path takes over). The recovery of a large log spends its time
        here, so it is one flat loop."""
        buf, base, count = self._buf, self._base, self._count
        rdy, ack, pad = STATE_RDY, STATE_ACK, STATE_PAD
        while pos != stop and (pos > stop or stop - pos > trust_until):
            off = pos - base
            if off < 0 or off + RECORD_HEADER > len(buf):
                buf, off = self._window(pos, RECORD_HEADER)
                base = self._base
            if buf[off + RECORD_HEADER - 1] != 10:
                break
            state = buf[off:off + 3]
            if state == pad:
                pos = RING_START
                continue
            if state != rdy and state != ack:
                break
            try:
                msg_id = int(buf[off + 9:off + 21], 16)
                size = RECORD_HEADER + 1 + int(buf[off + 48:off + 56], 16)
            except ValueError:
                break
            count(state, msg_id, size, pos)
            pos += size
        return pos

    def _window(self, pos: int, n: int) -> tuple[bytes, int]:
        off = pos - self._base
        if off < 0 or off + n > len(self._buf):
            self._buf = os.pread(self.fd, max(n, CHUNK), pos)
            self._base, off = pos, 0
        return self._buf, off

    def _intact(self, pos: int):
        """(header, buffer, index) of an intact record at pos, else (None, ...)."""
        buf, off = self._window(pos, RECORD_HEADER)
        try:
            hdr = fmt.parse_header(buf, off)
        except FormatError:
            return None, buf, off
        buf, off = self._window(pos, hdr.size)
        if not fmt.check_payload(buf, off, hdr):
            return None, buf, off
        return hdr, buf, off

    def _looks_torn(self, pos: int, expect: int) -> bool:
        """Whether the bytes at pos are the start of the record due next, cut short."""
        buf, off = self._window(pos, RECORD_HEADER)
        start = buf[off:off + 4]
        if not start or not any(s.startswith(start) for s in STARTS):
            return False
        try:
            return fmt.parse_header(buf, off).wseq == expect
        except FormatError:
            return len(buf) - off < RECORD_HEADER

    def _resync(self, pos: int, stop: int) -> int | None:
        """The offset of the next intact record after damage at pos, within the
        checkpoint's region; RING_START when the rest of a lap is lost; None if none."""
        limit = stop if pos < stop else self.file_size
        at = pos + 1
        while at < limit:
            buf = os.pread(self.fd, min(CHUNK, limit - at) + RECORD_HEADER, at)
            i = buf.find(b"\n")
            while 0 <= i < len(buf) - 4:
                cand = at + i + 1
                if cand >= limit:
                    break
                if buf[i + 1:i + 5] in STARTS and self._intact(cand)[0] is not None:
                    return cand
                i = buf.find(b"\n", i + 1)
            at += CHUNK
        return RING_START if pos > stop else None


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of a log file, as an offline reader sees it."""

    id: int
    state: str
    deliveries: int
    timestamp_ms: int
    offset: int
    size: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Summary:
    """What a log file holds. `cap` is the extent of the ring so far (at most -cap)."""

    path: str
    file_bytes: int
    cap: int
    messages: int
    acked: int
    live_bytes: int
    dead_bytes: int
    oldest_timestamp_ms: int | None
    torn: str | None


class LogReader:
    """A read-only view of a log file: it takes no lock, so it works on the file of a
    stopped broker and of a running one (whose newest records may show as torn)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise LogError(f"cannot read {self.path}: {err.strerror}") from None
        self.fd = fd
        try:
            self.ckpt = fmt.latest_checkpoint(os.pread(fd, RING_START, 0))
        except FormatError as err:
            os.close(fd)
            raise LogError(f"{self.path}: {err}") from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def entries(self) -> Iterator[Entry]:
        """Every record still in the live region, in queue order; acked ones included."""
        for pos, hdr, buf, off in Scan(self.fd, self.ckpt).records():
            payload = bytes(buf[off + RECORD_HEADER:off + hdr.size - 1])
            head, body = fmt.split_payload(payload)
            yield Entry(hdr.id, hdr.state.decode(), hdr.deliveries, hdr.timestamp_ms, pos,
                        hdr.size, _stored_headers(head), body)

    def summary(self) -> Summary:
        scan = Scan(self.fd, self.ckpt)
        scan.run()
        return Summary(self.path, scan.file_size, max(scan.file_size, scan.head), scan.messages,
                       scan.acked, scan.live_bytes, scan.dead_bytes, scan.oldest_ms, scan.torn)


def _stored_headers(block: bytes) -> dict[str, str]:
    """The SEND headers kept in a payload (escaped lines `name:value`)."""
    headers: dict[str, str] = {}
    for line in block.decode("utf-8", "replace").splitlines():
        name, _, value = line.partition(":")
        try:
            headers.setdefault(unescape(name), unescape(value))
        except ProtocolError:
            headers.setdefault(name, value)
    return headers
