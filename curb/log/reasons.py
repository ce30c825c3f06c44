"""Why a waiter for durability failed, when the reason says more than its text: a kind
of `str` the broker and the router tell apart with isinstance.

A module of its own, not compiled: a compiled class cannot inherit from `str`.
"""

from __future__ import annotations


class MaybeStored(str):
    """A failure's reason for a waiter whose write was issued: it may be on disk."""
