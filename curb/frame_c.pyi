"""Types of the C module frame_c.c: a STOMP frame's common case in C. Each function
returns what curb/frame.py's own steps give, or None for frame.py to do the step itself."""

def split_head(buf: bytes | bytearray, pos: int, end: int) -> tuple[str, dict[str, str]] | None: ...
def next_frame(
    buf: bytes | bytearray, pos: int, max_frame: int, max_body: int, short_head: int
) -> tuple[str, dict[str, str], bytes, int] | None: ...
