"""STOMP 1.2 heart-beat negotiation, shared by the broker's session and the client.

Each side says in its `heart-beat` header how often it can send (first number) and how
often it wants to hear (second), in milliseconds, 0 for never. A direction beats only if
its sender can and its receiver wants to, at the slower of the two rates.
Each number is bounded (MAX_MS, a day), so no later arithmetic or timer can overflow.
"""

from __future__ import annotations

from curb.frame import decimal

MAX_MS = 24 * 60 * 60 * 1000


def parse(value: str) -> tuple[int, int]:
    """The two numbers of a `heart-beat` header; ValueError, saying what is allowed, unless
    both are decimal integers from 0 to MAX_MS."""
    parts = value.split(",")
    if len(parts) != 2:
        raise ValueError(f"heart-beat must be two comma-separated integers, not {value[:40]!r}")
    sends, wants = (decimal(part, "heart-beat", MAX_MS) for part in parts)
    return sends, wants


def negotiate(ours: tuple[int, int], theirs: tuple[int, int]) -> tuple[float, float]:
    """(seconds between the beats we send, seconds between the beats we expect), 0 for
    none, from our header's numbers and the peer's."""
    we_send, we_want = ours
    they_send, they_want = theirs
    send = max(we_send, they_want) / 1000 if we_send and they_want else 0.0
    expect = max(they_send, we_want) / 1000 if they_send and we_want else 0.0
    return send, expect


def tolerance(every: float) -> float:
    """How long a peer may stay silent: twice its interval, and at least a second more,
    since networks and busy peers are late."""
    return max(2 * every, every + 1.0)
