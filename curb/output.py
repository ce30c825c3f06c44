"""A connection's output: what the session has made and the transport has not yet taken.

Output is a list of pieces that are never joined past PIECE_BYTES: a large body is queued
as a view of the bytes read from the log, and the transport takes the output piece by
piece (`next_piece`), so the work per piece does not grow with what waits behind it. A
framed output (WebSocket) also knows where each frame ends, and hands out whole frames
(`next_frame`). Offsets count bytes ever made and ever taken, so `unsent` is exact and
an item (an auto-acked message) can be marked done once the bytes up to its frame's end
are taken (`after_last`, `handed`).

Pure: no transport, no clock; the session decides what the counts mean for flow control.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Generic, Never, TypeVar

# The most output handed to the transport at once: small frames are joined up to it,
# larger pieces are cut to it, so that what a socket does not take at once is small.
PIECE_BYTES = 256 * 1024

Piece = bytes | memoryview
T = TypeVar("T")
NONE: Sequence[Never] = []  # what `handed` returns when nothing is due; never changed


class Output(Generic[T]):
    """Pieces queued for one transport, and the items done once their bytes are taken."""

    __slots__ = ("_ends", "_handoff", "_pieces", "made", "taken")

    def __init__(self, framed: bool = False):
        self._pieces: collections.deque[Piece] = collections.deque()
        # framed: where each whole frame ends (values of `made`), for next_frame
        self._ends: collections.deque[int] | None = collections.deque() if framed else None
        # items done once handed over: (value of `made` after their frame, item)
        self._handoff: collections.deque[tuple[int, T]] = collections.deque()
        self.made = 0  # bytes ever queued
        self.taken = 0  # bytes ever handed to the transport

    def write(self, data: Piece, end: bool = True) -> None:
        """Queue `data`; `end`: a frame ends with it."""
        self._pieces.append(data)
        self.made += len(data)
        if end and self._ends is not None:
            self._ends.append(self.made)

    def after_last(self, item: T) -> None:
        """`item` is done once the frame written last is taken (`handed`)."""
        self._handoff.append((self.made, item))

    @property
    def unsent(self) -> int:
        return self.made - self.taken

    def __bool__(self) -> bool:
        return bool(self._pieces)

    def next_piece(self) -> Piece | None:
        """A run of small pieces joined, or at most PIECE_BYTES of a larger one (a view,
        not a copy); None when nothing waits."""
        out = self._pieces
        if not out:
            return None
        piece = out.popleft()
        size = len(piece)
        if size > PIECE_BYTES:
            view = memoryview(piece)
            out.appendleft(view[PIECE_BYTES:])
            piece, size = view[:PIECE_BYTES], PIECE_BYTES
        else:
            piece, size = self._join(piece, size, PIECE_BYTES)
        self.taken += size
        return piece

    def next_frame(self) -> Piece | None:
        """The next whole frame (framed output only); None when nothing waits."""
        out, ends = self._pieces, self._ends
        if not out or not ends:
            return None
        piece = out.popleft()
        piece, size = self._join(piece, len(piece), ends.popleft() - self.taken)
        self.taken += size
        return piece

    def _join(self, piece: Piece, size: int, limit: int) -> tuple[Piece, int]:
        """`piece` (of `size` bytes) and the pieces after it, joined while the run stays
        within `limit` bytes: (the run, its size)."""
        out = self._pieces
        if not out or size + len(out[0]) > limit:
            return piece, size
        run = [piece]
        while out and size + len(out[0]) <= limit:
            nxt = out.popleft()
            run.append(nxt)
            size += len(nxt)
        return b"".join(run), size

    def handed(self) -> Sequence[T]:
        """The items whose frames are now all taken, in order (usually none)."""
        handoff, taken = self._handoff, self.taken
        if not handoff or handoff[0][0] > taken:
            return NONE
        done = []
        while handoff and handoff[0][0] <= taken:
            done.append(handoff.popleft()[1])
        return done

    def discard(self) -> None:
        """The transport can take nothing more: forget what waits (its items stay undone)."""
        self._pieces.clear()
        if self._ends is not None:
            self._ends.clear()
        self._handoff.clear()
        self.taken = self.made
