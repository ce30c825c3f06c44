"""Where a message that came back unfinished goes: the broker's one policy, pure.

A message comes back by NACK, a passed ack deadline, its consumer's disconnect or lost
heart-beat. The return policy (`curb.returns.Returns.requeue`) asks `Redelivery.fate`
once per message and does what it says, so every way back obeys the same rules:

- The delivery limit: a message delivered `max_deliveries` times that comes back once
  more is a dead letter (reason `max-deliveries`), whatever brought it back, a consumer
  that crashed on it included. 0: no limit.
- Otherwise it is rdy again after a delay: the one the NACK asked for (`curb-delay`),
  else the default policy, `delay_ms` for the first return, times `multiplier` for each
  delivery before, at most `max_delay_ms` (ActiveMQ's redelivery policy and LavinMQ's
  shape). `delay_ms` 0: at once, at the front of the line.
- The defaults do not hot-loop: a second, doubling, at most a minute. At once, a
  consumer that NACKs a poison message spent its 20 deliveries in milliseconds and,
  with no limit, redelivered it thousands of times a second; now the 20 take about a
  quarter of an hour (long enough to outlast a dependency's restart) and a message
  comes back at most once a minute, while a first retry still comes within a second.

Times are whole milliseconds; a delay never exceeds MAX_DELAY_MS, the longest the broker
takes anywhere (SEND and NACK headers too), so a due time always fits the log.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_DELAY_MS = 30 * 24 * 3600 * 1000  # 30 days: the longest delay, of a SEND, a NACK or the policy
MAX_MULTIPLIER = 100.0
DEAD = -1  # `fate`'s answer for a message past the delivery limit
REASON_MAX_DELIVERIES = "max-deliveries"
REASON_EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Redelivery:
    """The flags -redelivery-delay, -redelivery-multiplier, -redelivery-max-delay and
    -max-deliveries."""

    delay_ms: int = 1000
    multiplier: float = 2.0
    max_delay_ms: int = 60 * 1000
    max_deliveries: int = 20

    def __post_init__(self) -> None:
        if not 0 <= self.delay_ms <= MAX_DELAY_MS or not 0 <= self.max_delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"redelivery delays must be from 0 to {MAX_DELAY_MS} ms")
        if not 1.0 <= self.multiplier <= MAX_MULTIPLIER:
            raise ValueError(f"the redelivery multiplier must be from 1 to {MAX_MULTIPLIER:g}")
        if self.max_deliveries < 0:
            raise ValueError("max deliveries must be at least 0 (0: no limit)")

    def fate(self, deliveries: int, asked_ms: int | None = None) -> int:
        """For a message back after `deliveries` deliveries, with the delay its NACK asked
        for (None: none asked): DEAD, or the milliseconds until it is rdy again."""
        if self.max_deliveries and deliveries >= self.max_deliveries:
            return DEAD
        if asked_ms is not None:
            return asked_ms
        if not self.delay_ms:
            return 0
        # The exponent is bounded so the float stays finite (100 ** 64 is far below 1e308).
        grown = self.delay_ms * self.multiplier ** min(max(deliveries - 1, 0), 64)
        return min(self.max_delay_ms, round(grown))
