"""Upgrading a log file of the first format (`curb log 1`) to the current one, at start-up.

Records of the first format have 4-digit delivery counts, no due or expiry time, and are
not aligned (curb.log.record). A broker that opens such a file upgrades it first:

1. It reads the old file's live messages in queue order through the first layout (the
   recovery walk of curb.log.scan, every CRC checked, damage skipped and reported).
2. It writes them to a new file beside it (`<file>.upgrade`, made afresh), one after the
   other from the ring's start, each with its id, delivery count and send time, then one
   checkpoint naming them with the old checkpoint's ack-up-to watermark and id
   reservation (so no id is ever reused), and syncs it.
3. It renames the new file over the old one and syncs the directory.

A crash before the rename leaves the old file as it was, and the next start begins
again; after it, the new file is whole. When the messages do not fit under -cap (the new
records are larger), nothing changes and the error says which -cap they need.
"""

from __future__ import annotations

import os

from curb.log import record as fmt
from curb.log.disk import Disk, FileDisk
from curb.log.scan import LogError, Scan

WRITE_BATCH = 1 << 20


def upgrade(old: Disk, path: str, end: int) -> int | None:
    """Upgrade the log at `path`, open (and locked) as `old`, to the current format if it
    is of the first, for a ring ending at `end`; returns how many messages it moved (the
    caller then opens `path` again), or None if it is not of the first format."""
    header = old.pread(fmt.RING_START, 0)
    if not header.startswith(fmt.MAGIC_V1):
        return None
    try:
        ckpt = fmt.latest_checkpoint(header)
    except fmt.FormatError:
        return None  # recovery reports a damaged header, whatever its format
    scan_end = max(old.size(), ckpt.head, ckpt.tail, fmt.RING_START + fmt.PAD_SIZE)
    scan = Scan(old, ckpt, scan_end, layout=fmt.V1)
    scan.run()
    temp = path + ".upgrade"
    if os.path.exists(temp):
        os.unlink(temp)  # a crashed upgrade's: its bytes must not pass for records
    new = FileDisk(temp)
    try:
        moved = _write(new, scan, ckpt, end, path)
        new.sync()
    except BaseException:
        new.close()
        os.unlink(temp)
        raise
    new.close()
    os.rename(temp, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return moved


def _write(disk: FileDisk, scan: Scan, ckpt: fmt.Checkpoint, end: int, path: str) -> int:
    """Lay the live messages of `scan` out from the ring's start and checkpoint them."""
    disk.pwrite(fmt.initial_header(end), 0)
    head = fmt.RING_START
    wseq = 1
    batch: list[bytes] = []
    at = head
    for _, hdr, buf, off in scan.records():
        if hdr.state != fmt.STATE_RDY or hdr.id <= scan.upto:
            continue
        payload = bytes(hdr.payload(buf, off))
        size = fmt.record_size(len(payload))
        if head + size + fmt.PAD_SIZE > end:
            need = scan.live_bytes * fmt.record_size(0) // fmt.RECORD_HEADER_V1 + fmt.RING_START + end // 4
            raise LogError(
                f"{path} is a log of an older format whose messages do not fit under this -cap in the "
                f"current one; start with -cap {-(-need // (1 << 20))}MiB or larger to upgrade it"
            )
        header = fmt.encode_record(fmt.STATE_RDY, hdr.deliveries, hdr.id, wseq, hdr.timestamp_ms, payload)
        batch.extend(fmt.record_bytes(header, payload))
        wseq += 1
        head += size
        if head - at >= WRITE_BATCH:
            disk.allocate(head + fmt.PAD_SIZE)
            disk.pwritev(batch, at)
            batch, at = [], head
    disk.allocate(head + fmt.PAD_SIZE)
    if batch:
        disk.pwritev(batch, at)
    next_id = max(ckpt.next_id, scan.max_id + 1, ckpt.acked_upto + 1)
    disk.sync()  # the records before the checkpoint that names them
    named = fmt.Checkpoint(2, fmt.RING_START, head, next_id, wseq, ckpt.acked_upto)
    disk.pwrite(named.encode(), fmt.SLOT_OFFSETS[named.gen % 2])
    return wseq - 1
