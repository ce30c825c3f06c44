"""Reading records back from a log file: one windowed reader for recovery, the offline
readers and the broker's read cursor, so that all three judge damage the same way.

A record is taken only when it is *intact*: its header parses, its length fits both the
ring and the largest record this log can hold (so a corrupt length never makes us read,
or allocate, more than that), it ends inside the readable span, and its CRC holds. After
damage, `resync` finds the next intact record whose write sequence the caller accepts;
records in a log are in write-sequence order, so that check keeps a record that merely
appears inside some payload from being taken for a real one.

Invariant of the window: it holds bytes as they were read, so its owner must `drop()` it
whenever the bytes it covers may have been rewritten (the read cursor drops it at every
lap of the ring). Reads past the end of the file come back short and count as damage.
"""

from __future__ import annotations

from collections.abc import Callable

from curb.log.disk import Disk
from curb.log.record import RING_START, V2, FormatError, Layout, RecordHeader

CHUNK = 1 << 20


class RecordReader:
    """Intact records at given offsets of a disk, read through one window of bytes."""

    def __init__(self, disk: Disk, max_size: int, layout: Layout = V2):
        self.disk = disk
        self.max_size = max_size
        self.layout = layout
        self.buf = b""
        self.base = 0

    def drop(self) -> None:
        """Forget the window: the bytes under it may have changed."""
        self.buf = b""

    def window(self, pos: int, n: int, limit: int) -> tuple[bytes, int]:
        """(buffer, index) with buffer[index:index + n] the bytes at pos, reading ahead up
        to `limit` (a CHUNK at most). Short when the file ends first."""
        off = pos - self.base
        if off < 0 or off + n > len(self.buf):
            self.buf = self.disk.pread(max(n, min(CHUNK, limit - pos)), pos)
            self.base, off = pos, 0
        return self.buf, off

    def header(self, pos: int, limit: int) -> RecordHeader | None:
        """The well-formed header of a record at pos that fits before `limit` and under the
        size bound; None otherwise. The CRC is not checked (see `intact`)."""
        found = self._header(pos, limit)
        return None if found is None else found[0]

    def intact(self, pos: int, limit: int) -> tuple[RecordHeader, bytes, int] | None:
        """(header, buffer, index) of an intact record at pos ending by `limit`, else None."""
        found = self._header(pos, limit)
        if found is None:
            return None
        hdr, size, buf, off = found
        if off + size > len(buf):
            # Read the record and the next one's header: a reader of records larger than
            # a CHUNK then reads each once, not once for its header and once whole.
            buf, off = self.window(pos, min(size + self.layout.header, limit - pos), limit)
        if not self.layout.check(buf, off, hdr):
            return None
        return hdr, buf, off

    def _header(self, pos: int, limit: int) -> tuple[RecordHeader, int, bytes, int] | None:
        """(header, record size, buffer, index) for `header`, the window read inline: the
        read cursor calls this once a message."""
        header = self.layout.header
        if pos + header > limit:
            return None
        buf, off = self.buf, pos - self.base
        if off < 0 or off + header > len(buf):
            buf, off = self.window(pos, header, limit)
        try:
            hdr = self.layout.parse(buf, off)
        except FormatError:
            return None
        size = hdr.size
        if size > self.max_size or pos + size > limit:
            return None
        return hdr, size, buf, off

    def past_damage(self, pos: int, limit: int, after: int, before: int, head: int) -> int:
        """Where a reader of the ring goes on after damaged bytes at pos: the next intact
        record of this lap with a write sequence in (after, before), else the next lap
        (the ring's start) or, in the head's lap, the head; the window is dropped then."""
        nxt = self.resync(pos, limit, lambda h: after < h.wseq < before)
        if nxt is None:
            nxt = RING_START if pos > head else head
            self.drop()
        return nxt

    def resync(self, pos: int, limit: int, accept: Callable[[RecordHeader], bool]) -> int | None:
        """The offset of the first intact record after pos and before `limit` that
        `accept` takes; None if there is none. Candidates are found by the shape of a
        header's start, wherever they are: the byte before one may be damaged too."""
        at = pos + 1
        while at < limit:
            span = self.disk.pread(min(CHUNK, limit - at) + self.layout.header, at)
            for match in self.layout.candidate.finditer(span):
                cand = at + match.start()
                if cand >= limit or cand >= at + CHUNK:
                    break
                found = self.intact(cand, limit)
                if found is not None and accept(found[0]):
                    return cand
            at += CHUNK
        return None
