"""The router's settings, fixed at start-up: what its clients' sessions read (the
`curb.backend.SessionConfig` fields, as an instance's `BrokerConfig` has them) and what
its links to instances use."""

from __future__ import annotations

from dataclasses import dataclass

from curb.broker_config import ACK_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS, REFUSE_DELAY_SECONDS


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """-prefetch, -max-frame, -heartbeat, -ack-timeout, -link-heartbeat, -link-wait and the
    instance credentials; the CONNECT timeout and refusal delay as an instance's."""

    prefetch: int = 100
    max_frame: int = 16 << 20
    heartbeat_ms: int = 10_000
    ack_timeout: float = ACK_TIMEOUT_SECONDS  # a delivery's deadline unless SUBSCRIBE sets one; 0: none
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS
    refuse_delay: float = REFUSE_DELAY_SECONDS
    link_heartbeat_ms: int = 2_000
    link_wait: float = 5.0  # how long a SEND waits for an instance of its destination
    login: str | None = None  # the router's own login on instances with -users
    passcode: str | None = None


@dataclass(frozen=True)
class WebConfig:
    """-http, -http-open and -http-origin (curb.router.web)."""

    addr: tuple[str | None, int]
    open: bool = False  # serve the network without -users
    origins: tuple[str, ...] = ()
