"""The log: the one owner of the queue's bytes on disk, as a package of its units.

The file is a header (magic and two checkpoint slots) followed by a ring of records
(`record`). New records go at the head (`ring`); the queue is read from the tail in file
order by the read cursor (`cursor`), so the broker keeps only a read position and its
in-flight records in memory. ACK flips a record's state in place, except for the oldest
message in flight, which the next checkpoint's tail retires with no write at all
(consumers ACK in order, so that is nearly every ACK).

The units: `record` is the file format, read through `reader` by recovery's walk and
offline reads (`scan`), by the cursor and by browses (`browse`, kept and told of the
log's changes by `browses`, started near their range by `marks`); `recovery` builds the
log from the file at start-up; `ring` is placement arithmetic and `placement` the writes
and compaction that use it; `appends` is the line of messages not yet written, `kept`
the parked records and those the log keeps (indexed by `parked`); `checkpoints` is the
checkpoint pipeline, `syncing` group commit, `sizes` the bound on the largest live
record, `admission` whether a message is taken now, `waiters` who waits for durability,
and `disk` the only way to the file. `core` ties them into the log, sans I/O of its own:
`pacing` is what it asks of whoever runs it, `events` what it tells its owner, and
`driver` runs it on an asyncio loop. Each module's docstring states the invariants it
keeps.

The public names below are imported from their modules on first use, not when the
package is: an offline reader (`curb inspect`, Spark's log-file source) imports
`curb.log.scan` and so this package, and must not load the broker's log, its event loop
or its threads with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from curb.log.admission import QueueFull, TooLarge
    from curb.log.core import LogCore, max_message_for, parse_size
    from curb.log.cursor import Record
    from curb.log.driver import Log
    from curb.log.scan import Entry, LogDamaged, LogError, LogReader, Summary

# Each public name and the module that defines it.
HOMES = {
    "Entry": "scan",
    "Log": "driver",
    "LogCore": "core",
    "LogDamaged": "scan",
    "LogError": "scan",
    "LogReader": "scan",
    "QueueFull": "admission",
    "Record": "cursor",
    "Summary": "scan",
    "TooLarge": "admission",
    "max_message_for": "core",
    "parse_size": "core",
}

__all__ = [
    "Entry",
    "Log",
    "LogCore",
    "LogDamaged",
    "LogError",
    "LogReader",
    "QueueFull",
    "Record",
    "Summary",
    "TooLarge",
    "max_message_for",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
