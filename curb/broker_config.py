"""The broker's settings, fixed at start-up: one frozen value the broker and its
sessions read, instead of a coordinator with a keyword for each.

The defaults are what `curb` runs with when no flag says otherwise; the command line
(curb.instance) and the tests build their own with `BrokerConfig(...)` or
`dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from curb.redelivery import Redelivery

# How long a connection may take to send its CONNECT (0: no limit).
CONNECT_TIMEOUT_SECONDS = 10.0
# How long a delivered message may wait for its ACK or NACK before it goes back to the
# queue, unless the SUBSCRIBE says otherwise (curb-ack-timeout).
ACK_TIMEOUT_SECONDS = 30 * 60.0
# How long after a failed CONNECT its "access refused" leaves, whatever the failure was.
REFUSE_DELAY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """-prefetch, -max-frame, -heartbeat, -connect-timeout, -max-connections,
    -ack-timeout, the redelivery flags and -expired, plus the delay of a refused login."""

    prefetch: int = 100
    max_frame: int = 16 << 20
    heartbeat_ms: int = 10000
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS  # 0: no limit
    refuse_delay: float = REFUSE_DELAY_SECONDS
    max_connections: int | None = None  # None: no limit
    ack_timeout: float = ACK_TIMEOUT_SECONDS
    redelivery: Redelivery = field(default_factory=Redelivery)
    drop_expired: bool = False  # -expired drop: an expired message is ACKed, not dead-lettered
