"""The Narconi protocol's settings, as its README names them, given as flags of `curb`.

Narconi (the HTTP and WebSocket protocol the web front speaks under /v2) has three
settings: the largest message (NARCONI_MAX_MESSAGE_SIZE, 64 KB), the TTL of a published
message (NARCONI_MAX_MESSAGE_TTL, an hour) and a WebSocket consumer's default limit of
unacknowledged messages (NARCONI_DEFAULT_LIMIT, 10). Curb keeps those defaults and takes
them as -narconi-max-message, -narconi-ttl and -narconi-limit. Plain data: the broker
builds it without importing the web front.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_MESSAGE = 64 << 10
TTL_SECONDS = 3600.0
LIMIT = 10
MAX_LIMIT = 10_000  # the most unacknowledged messages a consumer may ask for (as -prefetch)


@dataclass(frozen=True, slots=True)
class NarconiSettings:
    max_message: int = MAX_MESSAGE  # bytes of a message's payload published over /v2
    ttl: float = TTL_SECONDS  # seconds a message published over /v2 lives; 0: until consumed
    limit: int = LIMIT  # a WebSocket consumer's unacknowledged messages when it names no ?limit


SEED = NarconiSettings()  # the seed's defaults
