"""A SEND's due and expiry times, and a NACK's delay, from their headers: pure rules.

Delays (`curb-delay`, ActiveMQ's and Artemis's `AMQ_SCHEDULED_DELAY`) and times to live
(`curb-ttl`) are milliseconds from now; `AMQ_SCHEDULED_TIME` and `expires` are wall-clock
milliseconds since the epoch. A SEND names at most one due time; with both `expires`
and `curb-ttl` the sooner counts; `expires:0` and `curb-ttl:0` mean never. A delay
longer than MAX_DELAY_MS is refused, never shortened, and so is a due time further
ahead; a bad value (negative, not a number, too large) is refused with an error that
says what the header takes. ActiveMQ's repetitions (`AMQ_SCHEDULED_REPEAT`,
`AMQ_SCHEDULED_PERIOD`, `AMQ_SCHEDULED_CRON`) are refused too: kept and ignored, they
would promise runs that never come. Times are returned as wall-clock ms (0: none).

Never early: a delay counts from the wall clock's next millisecond (`due_after`), so a
delayed message is never delivered before its SEND (or NACK) plus the delay, however
the clock's reading rounds the true time down.
"""

from __future__ import annotations

from collections.abc import Mapping

from curb.frame import decimal
from curb.queue_errors import QueueError
from curb.redelivery import MAX_DELAY_MS

# The latest time the log keeps: 44 bits of milliseconds (the year 2527).
MAX_EPOCH_MS = (1 << 44) - 1
DUE_HEADERS = ("curb-delay", "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME")
# ActiveMQ's repeated deliveries of one SEND: Curb delivers a message once (until ACKed).
REPEAT_HEADERS = ("AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_CRON")
TIME_HEADERS = (*DUE_HEADERS, "expires", "curb-ttl", *REPEAT_HEADERS)
_TAKES = {
    "curb-delay": f"milliseconds from now, 0 to {MAX_DELAY_MS} (30 days)",
    "AMQ_SCHEDULED_DELAY": f"milliseconds from now, 0 to {MAX_DELAY_MS} (30 days)",
    "AMQ_SCHEDULED_TIME": f"a time in milliseconds since the epoch, at most {MAX_DELAY_MS} ms (30 days) from now",
    "expires": "a time in milliseconds since the epoch (0: never)",
    "curb-ttl": "milliseconds from now (0: never)",
}


def _refused(name: str, why: str) -> QueueError:
    return QueueError(
        f"bad {name} header: {why}",
        f"Give {name} {_TAKES[name]}, or leave it out.",
    )


def _value(headers: Mapping[str, str], name: str, maximum: int) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        return decimal(raw.strip(), name, maximum)
    except ValueError as err:
        raise _refused(name, str(err)) from None


def due_after(wall_ms: int, delay_ms: int) -> int:
    """The due time of a delay of `delay_ms` from now, never early: the wall clock reads
    whole milliseconds rounded down (`wall_ms`), so the true time may be up to a
    millisecond past the reading, and the delay counts from the next millisecond. A due
    time is released once the clock reads it (true time at or past it), so a message is
    never delivered before now plus its delay, and at most about a millisecond after."""
    return wall_ms + 1 + delay_ms


def send_times(headers: Mapping[str, str], wall_ms: int) -> tuple[int, int]:
    """(due_ms, expires_ms) of a SEND with these headers at wall-clock ms `wall_ms`, each
    0 for none. QueueError (the frame's ERROR) for a bad or conflicting value, and for a
    repetition, which Curb does not do."""
    repeat = [name for name in REPEAT_HEADERS if name in headers]
    if repeat:
        raise QueueError(
            f"Curb does not repeat messages: {repeat[0]} refused",
            "Nothing was stored: each SEND is one message, delivered until a consumer ACKs it. Leave out "
            f"{' and '.join(repeat)}, and SEND once for each run (a cron job or a systemd timer can; "
            "curb-delay or AMQ_SCHEDULED_DELAY delays one).",
        )
    named = [name for name in DUE_HEADERS if name in headers]
    if len(named) > 1:
        raise QueueError(
            f"SEND names two due times: {' and '.join(named)}",
            "Give a SEND one of curb-delay, AMQ_SCHEDULED_DELAY (ms from now) or AMQ_SCHEDULED_TIME "
            "(ms since the epoch).",
        )
    due = 0
    if named:
        name = named[0]
        if name == "AMQ_SCHEDULED_TIME":
            at = _value(headers, name, MAX_EPOCH_MS) or 0
            if at - wall_ms > MAX_DELAY_MS:
                raise _refused(name, f"{at} is {at - wall_ms} ms from now, more than {MAX_DELAY_MS}")
            due = at if at > wall_ms else 0
        else:
            delay = _value(headers, name, MAX_DELAY_MS) or 0
            due = due_after(wall_ms, delay) if delay else 0
    expires = _value(headers, "expires", MAX_EPOCH_MS) or 0
    ttl = _value(headers, "curb-ttl", MAX_EPOCH_MS) or 0
    if ttl:
        expires = min(expires or MAX_EPOCH_MS, min(MAX_EPOCH_MS, wall_ms + ttl))
    return due, expires


def nack_delay(headers: Mapping[str, str]) -> int | None:
    """The delay a NACK asks for (`curb-delay`, ms), None when it asks for none."""
    return _value(headers, "curb-delay", MAX_DELAY_MS)
