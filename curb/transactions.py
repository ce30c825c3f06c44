"""The transactions a session holds for its client until COMMIT, bounded.

Where the backend takes transactions (`curb router`), a SEND, ACK or NACK with a
`transaction` header waits in the session until its COMMIT hands it on
(curb.transaction_rules). Held frames are memory a client chooses, so they are
bounded: at most MAX_FRAMES frames and MAX_BYTES bytes a connection, and SHARED_BYTES
bytes for all connections together; a frame past a bound is refused with an ERROR (the
connection closes, its transactions are dropped, nothing of them was forwarded).

Invariant: `Budget.held` and `Budget.frames` are the sums of the bytes and frames every
connection's `Transactions` holds; whatever ends a transaction (COMMIT, ABORT, a DISCONNECT, an ERROR, a connection
gone) gives its bytes back.
"""

from __future__ import annotations

from curb.frame import Frame
from curb.queue_errors import QueueError

MAX_FRAMES = 10_000  # frames held by one connection's transactions
MAX_BYTES = 64 << 20  # bytes held by one connection's transactions
SHARED_BYTES = 256 << 20  # bytes held by all connections' transactions


def frame_bytes(frame: Frame) -> int:
    """What a held frame costs, near enough: its body and header text."""
    return len(frame.body) + sum(len(name) + len(value) + 2 for name, value in frame.headers.items())


class Budget:
    """The bytes and frames held in transactions by all of a backend's connections."""

    def __init__(self, limit: int = SHARED_BYTES):
        self.limit = limit
        self.held = 0
        self.frames = 0  # read by the router's figures (/metrics)


class Transactions:
    """One connection's open transactions: name -> the frames held for its COMMIT."""

    def __init__(self, budget: Budget, max_frames: int = MAX_FRAMES, max_bytes: int = MAX_BYTES):
        self.budget = budget
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.open: dict[str, list[Frame]] = {}
        self.frames = 0
        self.bytes = 0

    def __contains__(self, tx: str) -> bool:
        return tx in self.open

    def begin(self, tx: str) -> None:
        self.open[tx] = []

    def hold(self, tx: str, frame: Frame) -> None:
        """Hold `frame` for transaction `tx` (begun), or QueueError past a bound."""
        size = frame_bytes(frame)
        if self.frames + 1 > self.max_frames or self.bytes + size > self.max_bytes:
            raise QueueError(
                "transaction too large",
                f"A connection's transactions hold at most {self.max_frames} frames and {self.max_bytes} bytes "
                "until COMMIT: commit smaller transactions, or send without one.",
            )
        budget = self.budget
        if budget.held + size > budget.limit:
            raise QueueError(
                "router busy: transactions hold too much",
                f"All connections' transactions together hold at most {budget.limit} bytes until COMMIT: "
                "commit smaller transactions, or try again once others have committed.",
            )
        self.open[tx].append(frame)
        self.frames += 1
        self.bytes += size
        budget.held += size
        budget.frames += 1

    def take(self, tx: str) -> list[Frame] | None:
        """The frames of transaction `tx`, which ends (None: there is no such transaction)."""
        frames = self.open.pop(tx, None)
        if frames is not None:
            self._release(frames)
        return frames

    def clear(self) -> None:
        """Every transaction ends, its frames dropped."""
        for frames in self.open.values():
            self._release(frames)
        self.open.clear()

    def _release(self, frames: list[Frame]) -> None:
        size = sum(frame_bytes(frame) for frame in frames)
        self.frames -= len(frames)
        self.bytes -= size
        self.budget.held -= size
        self.budget.frames -= len(frames)
