"""What the disk itself allows, measured where the brokers keep their files: appends made
durable with fdatasync, one record per sync and a batch of records per sync."""

from __future__ import annotations

import os
import time


def synced_appends_per_second(directory: str, record_bytes: int, records_per_sync: int, seconds: float) -> float:
    """Append `records_per_sync` records, fdatasync, repeat for `seconds`; records per second."""
    path = os.path.join(directory, f"disk-probe-{records_per_sync}")
    batch = b"r" * (record_bytes * records_per_sync)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        records = 0
        start = time.monotonic()
        deadline = start + seconds
        while True:
            os.write(fd, batch)
            os.fdatasync(fd)
            records += records_per_sync
            now = time.monotonic()
            if now >= deadline:
                return records / (now - start)
    finally:
        os.close(fd)
        os.unlink(path)
