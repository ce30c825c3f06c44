"""The answers, other than success, that a frame waiting for durability can be given:
kinds of `str` (the reason), told apart with isinstance by the receipt line
(curb.receipts) and the router.

A module of its own, not compiled: a compiled class cannot inherit from `str`.
"""

from __future__ import annotations


class Refusal(str):
    """An answer to a waiting frame that is an ERROR of its own (a router passing on an
    instance's): `message` its header, str() its body."""

    message: str

    def __new__(cls, message: str, detail: str) -> Refusal:
        refusal = super().__new__(cls, detail)
        refusal.message = message
        return refusal


class Unconfirmed(str):
    """An answer to a waiting RECEIPT that says whether the frames before it took effect
    can no longer be known (a router's link to an instance was lost before the instance
    answered): the RECEIPT carries `curb-unconfirmed:true`, which promises nothing. It is
    not `curb-late:true`, which says that the frame changed nothing: an ACK lost with its
    link may well have removed its message."""
