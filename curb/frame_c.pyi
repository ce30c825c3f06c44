"""Types of the C module frame_c.c: a STOMP frame head's common case in C. It returns
what curb/frame.py's own steps give, or None for frame.py to parse the head itself."""

def split_head(buf: bytes | bytearray, pos: int, end: int) -> tuple[str, dict[str, str]] | None: ...
