"""STOMP 1.2 frame codec, sans I/O: feed received bytes in, get frames out; encode frames.

Rules (STOMP 1.2): a frame is a command line, header lines `name:value`, a blank line,
the body and a NUL. Lines end with LF or CRLF; a CR anywhere else in the head is an error.
A header splits at its first colon and nothing is trimmed; the first of repeated headers
wins. Header escapes (\\r \\n \\c \\\\) apply to every frame except CONNECT, STOMP and
CONNECTED; an undefined escape is an error. With `content-length` the body is exactly that
many bytes (NULs allowed) followed by a NUL; without it the body ends at the first NUL.
EOLs between frames are heart-beats. Every limit is checked as soon as the buffered bytes
prove it exceeded, so a peer cannot make the parser buffer more than one frame's worth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

HEARTBEAT = b"\n"
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
ALWAYS_SIZED_COMMANDS = frozenset({"SEND", "MESSAGE", "ERROR"})

_EOLS = re.compile(rb"(?:\r?\n)+")
_LONE_CR = re.compile(rb"\r[^\n]")
_ESCAPE_SEQUENCE = re.compile(r"\\(.?)", re.DOTALL)
_UNESCAPES = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
_NEEDS_ESCAPE = re.compile(r"[\\\r\n:]")
# Decimal digits of a content-length beyond which it can only be too large (and int() slow).
_MAX_LENGTH_DIGITS = 19


class ProtocolError(Exception):
    """The peer sent bad STOMP. str(err) is a short reason fit for an ERROR frame's `message` header."""


@dataclass(slots=True)
class Frame:
    command: str
    headers: dict[str, str]
    body: bytes = b""


def escape(text: str) -> str:
    """Escape a header name or value for the wire (STOMP 1.2)."""
    if not _NEEDS_ESCAPE.search(text):
        return text
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")


def _unescape_one(match: re.Match[str]) -> str:
    char = _UNESCAPES.get(match.group(1))
    if char is None:
        if not match.group(1):
            raise ProtocolError("header ends with a lone backslash")
        raise ProtocolError(f"undefined escape \\{match.group(1)} in header")
    return char


def unescape(text: str) -> str:
    """Decode STOMP 1.2 header escapes; raise ProtocolError on an undefined one."""
    if "\\" not in text:
        return text
    return _ESCAPE_SEQUENCE.sub(_unescape_one, text)


def encode(command: str, headers: dict[str, str] | Iterable[tuple[str, str]] = (), body: bytes = b"") -> bytes:
    """One wire frame with escaped headers (CONNECT, STOMP, CONNECTED excepted) and an
    exact content-length: emitted when the body is non-empty and always for SEND, MESSAGE
    and ERROR; a caller-given content-length is replaced."""
    pairs = [(name, value) for name, value in (headers.items() if isinstance(headers, dict) else headers)
             if name != "content-length"]
    if command in UNESCAPED_COMMANDS:
        if any("\n" in name or "\r" in name or ":" in name or "\n" in value or "\r" in value
               for name, value in pairs):
            raise ValueError(f"{command} headers cannot carry CR, LF or a colon in a name (no escaping)")
    elif _NEEDS_ESCAPE.search("".join(name + value for name, value in pairs)):
        pairs = [(escape(name), escape(value)) for name, value in pairs]
    lines = [command]
    lines.extend(f"{name}:{value}" for name, value in pairs)
    if body or command in ALWAYS_SIZED_COMMANDS:
        lines.append(f"content-length:{len(body)}")
    lines.append("\n")
    return b"".join(("\n".join(lines).encode(), body, b"\0"))


class FrameParser:
    """Incremental STOMP frame parser for one connection's byte stream.

    Between feeds it keeps the bytes of the one incomplete frame, how far they were already
    searched, and (once the head is parsed) the frame's command, headers and body length,
    so resuming never rescans: a frame trickling in byte by byte costs O(n).
    """

    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024, max_headers: int = 128,
                 max_header_line: int = 16 * 1024):
        self.max_frame_bytes = max_frame_bytes
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        self._pending = bytearray()  # unparsed bytes, starting at the incomplete frame
        self._searched = 0           # bytes of the pending frame already searched
        self._head_lines = 0         # complete lines (command included) in the incomplete head
        self._line_start = 0         # where the incomplete head's current line starts
        self._head_has_cr = False    # a CR was seen in the incomplete head
        # Parsed head of the pending frame: command, headers, body offset, content-length.
        self._head: tuple[str, dict[str, str], int, int | None] | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return every frame now complete, in order (possibly []).
        EOLs between frames (heart-beats) are consumed silently. Raises ProtocolError on bad input or a
        limit exceeded; after that the parser is unusable (the broker closes the connection)."""
        frames: list[Frame] = []
        pending = self._pending
        if pending:
            # Finish the frame that straddles the feeds on the pending buffer, then parse
            # the rest straight from `data`, so only the straddling frame is ever copied.
            held = len(pending)
            pending += data
            start = self._parse(pending, 0, frames, 1)
            if not frames:
                del pending[:start]
                return frames
            frames[0].body = bytes(frames[0].body)
            pending.clear()
            pos = start - held
        else:
            pos = 0
        start = self._parse(data, pos, frames, -1)
        if start < len(data):
            pending += memoryview(data)[start:]
        return frames

    def _parse(self, buf: bytes | bytearray, pos: int, frames: list[Frame], limit: int) -> int:
        """Append up to `limit` (-1: all) complete frames from buf[pos:] to frames and return
        where the unparsed rest starts (the incomplete frame's state is saved, relative to it)."""
        end = len(buf)
        find = buf.find
        while pos < end:
            if self._head is None:
                if buf[pos] == 10 or buf[pos] == 13:
                    match = _EOLS.match(buf, pos)
                    if match:
                        pos = match.end()
                        self._reset()
                        if pos == end:
                            break
                searched = self._searched
                # A terminator (LF LF or LF CR LF) may straddle feeds: search from a bit back.
                head_end = find(b"\n\n", pos + searched - 1 if searched else pos)
                has_cr = self._head_has_cr or find(b"\r", pos + searched, end if head_end < 0 else head_end) >= 0
                if has_cr:
                    head_end = self._crlf_head_end(buf, max(pos, pos + searched - 2), head_end)
                if head_end < 0:
                    self._check_incomplete_head(buf, pos, has_cr)
                    break
                command, headers, body_start = self._parse_head(buf, pos, head_end, has_cr)
                length = headers.get("content-length")
                if length is not None:
                    length = self._content_length(length, body_start - pos)
                self._head = (command, headers, body_start - pos, length)
                self._searched = body_start - pos
            command, headers, body_offset, length = self._head
            if length is None:
                nul = find(b"\0", pos + self._searched)
                if nul < 0:
                    self._searched = end - pos
                    if self._searched > self.max_frame_bytes:
                        raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes")
                    break
                if nul - pos > self.max_frame_bytes:
                    raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes")
            else:
                nul = pos + body_offset + length
                if nul >= end:
                    break
                if buf[nul]:
                    raise ProtocolError("body is not followed by NUL at content-length")
            frames.append(Frame(command, headers, buf[pos + body_offset:nul]))
            self._reset()
            pos = nul + 1
            if len(frames) == limit:
                break
        return pos

    def _reset(self) -> None:
        """Forget the pending frame's state: the next byte starts a new frame."""
        self._head = None
        self._searched = self._head_lines = self._line_start = 0
        self._head_has_cr = False

    @staticmethod
    def _crlf_head_end(buf: bytes | bytearray, start: int, lf_lf: int) -> int:
        """Where a head that may use CRLF ends: the earlier of LF LF and LF CR LF."""
        lf_crlf = buf.find(b"\n\r\n", start, len(buf) if lf_lf < 0 else lf_lf)
        return lf_crlf if lf_crlf >= 0 else lf_lf

    def _check_incomplete_head(self, buf: bytes | bytearray, pos: int, has_cr: bool) -> None:
        """Record how far the incomplete head was searched and fail early on a limit."""
        end = len(buf)
        searched = pos + self._searched
        unchecked = pos + self._line_start  # lines from here on were not length-checked yet
        self._head_lines += buf.count(b"\n", searched, end)
        last_lf = buf.rfind(b"\n", searched, end)
        if last_lf >= 0:
            self._line_start = last_lf + 1 - pos
        self._searched = end - pos
        self._head_has_cr = has_cr
        if has_cr and _LONE_CR.search(buf, max(pos, searched - 1), end):
            raise ProtocolError("CR not followed by LF in frame head")
        if self._head_lines - 1 > self.max_headers:
            raise ProtocolError(f"more than {self.max_headers} headers")
        if end - unchecked > self.max_header_line and max(
                len(line.rstrip(b"\r")) for line in buf[unchecked:end].split(b"\n")) > self.max_header_line:
            raise ProtocolError(f"header line exceeds {self.max_header_line} bytes")
        if end - pos > self.max_frame_bytes:
            raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes")

    def _parse_head(self, buf: bytes | bytearray, pos: int, head_end: int,
                    has_cr: bool) -> tuple[str, dict[str, str], int]:
        """Decode the command and headers in buf[pos:head_end]; return them and the body start."""
        try:
            text = buf[pos:head_end].decode()
        except UnicodeDecodeError:
            raise ProtocolError("frame head is not valid UTF-8") from None
        lines = text.split("\n")
        body_start = head_end + (3 if buf[head_end + 1] == 13 else 2)
        if has_cr:
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
            if any("\r" in line for line in lines):
                raise ProtocolError("CR not followed by LF in frame head")
        if len(lines) > self.max_headers + 1:
            raise ProtocolError(f"more than {self.max_headers} headers")
        if head_end - pos > self.max_header_line and max(len(line.encode()) for line in lines) > self.max_header_line:
            raise ProtocolError(f"header line exceeds {self.max_header_line} bytes")
        if body_start - pos > self.max_frame_bytes:
            raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes")
        command = lines[0]
        del lines[0]
        return command, _headers(lines, "\\" in text and command not in UNESCAPED_COMMANDS), body_start

    def _content_length(self, value: str, head_bytes: int) -> int:
        """The announced body length, checked against the frame size limit."""
        if not (value.isdigit() and value.isascii()):
            raise ProtocolError("content-length is not a non-negative decimal integer")
        if len(value) > _MAX_LENGTH_DIGITS or head_bytes + int(value) > self.max_frame_bytes:
            raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes")
        return int(value)


def _headers(lines: list[str], escaped: bool) -> dict[str, str]:
    """Header lines to a dict in wire order, first occurrence winning."""
    try:
        headers = dict(line.split(":", 1) for line in lines)
    except ValueError:
        raise ProtocolError("header line without a colon") from None
    if escaped or len(headers) != len(lines):
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            if escaped:
                name, value = unescape(name), unescape(value)
            headers.setdefault(name, value)
    if "" in headers:
        raise ProtocolError("header with an empty name")
    return headers
