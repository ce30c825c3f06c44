"""curb.output as tables: pieces joined and cut at PIECE_BYTES, whole frames for a framed
output, and items done only once every byte up to their frame's end is taken."""

from __future__ import annotations

import pytest

from curb.output import PIECE_BYTES, Output


@pytest.mark.parametrize(
    "writes, pieces",
    [
        ([b"a", b"b", b"c"], [b"abc"]),
        ([b"x" * PIECE_BYTES, b"y"], [b"x" * PIECE_BYTES, b"y"]),
        ([b"x" * (PIECE_BYTES + 3)], [b"x" * PIECE_BYTES, b"xxx"]),
    ],
    ids=["small joined", "a full piece alone", "a large one cut"],
)
def test_pieces_are_joined_and_cut_at_the_bound(writes, pieces):
    out: Output[str] = Output()
    for data in writes:
        out.write(data)
    got = [bytes(piece) for piece in iter(out.next_piece, None)]
    assert got == pieces and out.unsent == 0


def test_a_framed_output_hands_out_whole_frames_however_they_were_written():
    out: Output[str] = Output(framed=True)
    out.write(b"head", False)
    out.write(b"x" * (PIECE_BYTES + 1), False)
    out.write(b"\0")
    out.write(b"\n")
    frames = [bytes(frame) for frame in iter(out.next_frame, None)]
    assert frames == [b"head" + b"x" * (PIECE_BYTES + 1) + b"\0", b"\n"]


def test_an_item_is_handed_over_only_with_the_last_byte_of_its_frame():
    out: Output[str] = Output()
    out.write(b"m" * (PIECE_BYTES + 10))
    out.after_last("first")
    out.write(b"n")
    out.after_last("second")
    assert out.next_piece() is not None and out.handed() == []
    assert out.next_piece() is not None and out.handed() == ["first", "second"]
    out.write(b"o")
    out.after_last("dropped")
    out.discard()
    assert out.unsent == 0 and out.handed() == []
