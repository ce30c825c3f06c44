"""Which destinations a SEND or a SUBSCRIBE may name: Curb's own `./` names and near
misses of them.

A Curb instance is one queue and ignores an ordinary destination, so a SEND that meant
one of Curb's own names but missed it would be stored as a job and handed to a worker,
and such a SUBSCRIBE would take jobs. The rules (docs/guide.md: Delays, retries and dead letters), pure:

- `./redrive` is the one `./` name a SEND may use: a redrive (curb.dead).
- Every other destination that starts with `./` is refused: `./dead` and `./count` are
  read with SUBSCRIBE, and Curb has no other `./` name (`./purge`).
- So is any destination whose last `/`-separated part is `redrive` in any letter case,
  spaces around it ignored (`/queue/redrive`, `./Redrive`, `Redrive`): its ERROR asks
  "did you mean ./redrive?". Only `redrive` is guarded so: a SEND to `/queue/dead` or
  `/queue/count` is no plausible slip for something a SEND does, and such names may be
  a router's ordinary routes.
- A SUBSCRIBE may name `./dead` and `./count`, exactly; any other destination that
  starts with `./` is refused (`./Dead`, `./counts`, `./redrive`), one that is `./dead`
  or `./count` in another letter case or with spaces around it with "did you mean ...?".
"""

from __future__ import annotations

from curb.counts import COUNT_DESTINATION
from curb.dead import DEAD_DESTINATION, REDRIVE_DESTINATION
from curb.queue_errors import QueueError

LOCAL_PREFIX = "./"
# Ordinary destinations already judged so: a producer names the same few again and again,
# and every SEND asks (bounded: cleared when full); a caller may look here first.
ORDINARY: set[str] = set()
ORDINARY_KEPT = 1024
_SUBSCRIBE_ONLY = (DEAD_DESTINATION, COUNT_DESTINATION)
_OWN_NAMES = f"{REDRIVE_DESTINATION} (SEND), {DEAD_DESTINATION} and {COUNT_DESTINATION} (SUBSCRIBE)"


def send_refusal(destination: str | None) -> QueueError | None:
    """The ERROR for a SEND to `destination` that must not be stored as a job, or None
    (an ordinary destination, or `./redrive` itself)."""
    if destination is None or destination in ORDINARY or destination == REDRIVE_DESTINATION:
        return None
    name = destination.strip().rpartition("/")[2].lower()
    shown = destination[:60]
    if name == REDRIVE_DESTINATION[len(LOCAL_PREFIX) :]:
        return QueueError(
            f"SEND to {shown} refused: did you mean {REDRIVE_DESTINATION}?",
            f"Nothing was stored. To move dead letters back to the queue, SEND to {REDRIVE_DESTINATION} "
            "(in lower case, nothing around it); to send a job, use another destination, such as /queue/work.",
        )
    if not destination.startswith(LOCAL_PREFIX):
        if len(ORDINARY) >= ORDINARY_KEPT:
            ORDINARY.clear()
        ORDINARY.add(destination)
        return None
    if destination.strip().lower() in _SUBSCRIBE_ONLY:
        return QueueError(
            f"SEND to {shown} refused",
            f"Nothing was stored. {shown} is read with SUBSCRIBE, never sent to; to move dead letters back "
            f"to the queue, SEND to {REDRIVE_DESTINATION}.",
        )
    return QueueError(
        f"SEND to {shown} refused",
        f"Nothing was stored. Curb's own names are {_OWN_NAMES}, and it has no other name starting "
        f"{LOCAL_PREFIX!r}; to send a job, use another destination, such as /queue/work.",
    )


def subscribe_refusal(destination: str | None) -> QueueError | None:
    """The ERROR for a SUBSCRIBE to a `./` name Curb does not have, which would otherwise
    be a queue subscription taking jobs; None for Curb's own and ordinary destinations."""
    if destination is None or not destination.startswith(LOCAL_PREFIX) or destination in _SUBSCRIBE_ONLY:
        return None
    shown = destination[:60]
    near = destination.strip().lower()
    if near in _SUBSCRIBE_ONLY:
        return QueueError(
            f"SUBSCRIBE to {shown} refused: did you mean {near}?",
            f"No subscription was made. Curb's own names are {_OWN_NAMES}, spelt exactly so (in lower "
            "case, nothing around them); to take jobs, subscribe to another destination, such as /queue/work.",
        )
    return QueueError(
        f"SUBSCRIBE to {shown} refused",
        f"No subscription was made. Curb's own names are {_OWN_NAMES}, and it has no other name starting "
        f"{LOCAL_PREFIX!r}; to take jobs, subscribe to another destination, such as /queue/work.",
    )
