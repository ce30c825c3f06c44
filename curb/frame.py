"""STOMP 1.2 frame codec, sans I/O: feed received bytes in, get frames out; encode frames.

Rules (STOMP 1.2): a frame is a command line, header lines `name:value`, a blank line,
the body and a NUL. Lines end with LF or CRLF; a CR anywhere else in the head is an error.
A header splits at its first colon and nothing is trimmed; the first of repeated headers
wins. Header escapes (\\r \\n \\c \\\\) apply to every frame except CONNECT, STOMP and
CONNECTED; an undefined escape is an error. With `content-length` the body is exactly that
many bytes (NULs allowed) followed by a NUL; without it the body ends at the first NUL.
EOLs between frames are heart-beats; encode() ends every frame with NUL and LF, as
ActiveMQ and RabbitMQ do, since some clients read exactly two bytes after a sized body.
The head ends at the first LF LF or LF CR LF, whichever starts first, however the bytes
were split. Every limit is checked as soon as the buffered bytes prove it exceeded (a
content-length as soon as the head is complete), so a peer cannot make the parser buffer
more than one frame's worth. Frames completed before a bad one are handed over with the
error (ProtocolError.frames), so they are answered first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

try:  # the compiled build's C step (frame_c.c); the pure-Python build has none
    from curb import frame_c as _c

    NATIVE = True
except ImportError:
    NATIVE = False

HEARTBEAT = b"\n"
FRAME_END = b"\0\n"
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
ALWAYS_SIZED_COMMANDS = frozenset({"SEND", "MESSAGE", "ERROR"})

_EOLS = re.compile(rb"(?:\r?\n)+")
_LONE_CR = re.compile(rb"\r[^\n]")
_ESCAPE_SEQUENCE = re.compile(r"\\(.?)", re.DOTALL)
_UNESCAPES = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
# An incomplete head's scan: complete lines seen, where the current line starts, CR seen.
_NO_HEAD_SCAN = (0, 0, False)
# Default limits of a frame, the same for the broker's incoming frames and the client's.
MAX_FRAME = 16 * 1024 * 1024
MAX_HEADERS = 128
MAX_HEADER_LINE = 16 * 1024
# A sized body at least this large that a read leaves incomplete is gathered as the list
# of the reads' bytes and joined once complete: growing one buffer read by read costs far
# more than the copy (every growth reallocates, and new pages fault in).
GATHER_FROM = 32 * 1024


class ProtocolError(Exception):
    """The peer sent bad STOMP. str(err) is a short reason fit for an ERROR frame's `message`
    header; `frames` holds the good frames that came before the bad one in the same feed;
    `receipt` the bad frame's receipt header, when its head could be read."""

    def __init__(self, reason: str, receipt: str | None = None):
        super().__init__(reason)
        self.frames: list[Frame] = []
        self.receipt = receipt


def decimal(text: str, name: str, maximum: int) -> int:
    """A header's non-negative decimal integer, at most `maximum`; leading zeros are allowed
    and never make int() slow. ValueError (naming the header and the bound) otherwise."""
    if 0 < len(text) < 10 and text.isascii() and text.isdigit():  # the common case, at once
        value = int(text)
        if value <= maximum:
            return value
    digits = text.lstrip("0") or ("0" if text else "")
    if not (digits.isdigit() and digits.isascii()):
        raise ValueError(f"{name} must be a decimal integer from 0 to {maximum}, not {text[:40]!r}")
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise ValueError(f"{name} {text[:40]}{'...' if len(text) > 40 else ''} exceeds the limit of {maximum}")
    return int(digits)


class Frame:
    """One STOMP frame: its command, headers (the first of repeated names) and body.
    A plain class, not a dataclass: the compiled build makes one for every frame, and a
    dataclass's generated __init__ would run as Python code."""

    __slots__ = ("body", "command", "headers")

    def __init__(self, command: str, headers: dict[str, str], body: bytes = b""):
        self.command = command
        self.headers = headers
        self.body = body

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return self.command == other.command and self.headers == other.headers and self.body == other.body

    def __repr__(self) -> str:
        return f"Frame(command={self.command!r}, headers={self.headers!r}, body={self.body!r})"


def escape(text: str) -> str:
    """Escape a header name or value for the wire (STOMP 1.2)."""
    if text.isalnum():  # the common case: nothing to escape
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
    items = headers.items() if isinstance(headers, dict) else list(headers)
    lines = [command]
    lines += [f"{name}:{value}" for name, value in items if name != "content-length"]
    head = "\n".join(lines)
    # Usually no header holds a character that needs escaping: one colon per line, no CR or \.
    count = len(lines) - 1
    if head.count(":") != count or head.count("\n") != count or "\\" in head or "\r" in head:
        head = "\n".join([command, *_special_header_lines(command, items)])
    if body or command in ALWAYS_SIZED_COMMANDS:
        head = f"{head}\ncontent-length:{len(body)}"
    return b"".join((head.encode(), b"\n\n", body, FRAME_END))


def _special_header_lines(command: str, items: Iterable[tuple[str, str]]) -> list[str]:
    """Header lines when some name or value holds a backslash, CR, LF or colon: escaped, or,
    for the frames that are never escaped, checked to be representable at all."""
    pairs = [(name, value) for name, value in items if name != "content-length"]
    if command not in UNESCAPED_COMMANDS:
        return [f"{escape(name)}:{escape(value)}" for name, value in pairs]
    if any("\n" in name or "\r" in name or ":" in name or "\n" in value or "\r" in value for name, value in pairs):
        raise ValueError(f"{command} headers cannot carry CR, LF or a colon in a name (no escaping)")
    return [f"{name}:{value}" for name, value in pairs]


class FrameParser:
    """Incremental STOMP frame parser for one connection's byte stream.

    Between feeds it keeps the bytes of the one incomplete frame, how far they were already
    searched, and (once the head is parsed) the frame's command, headers and body length,
    so resuming never rescans: a frame trickling in byte by byte costs O(n).
    """

    def __init__(
        self,
        max_frame_bytes: int = MAX_FRAME,
        max_headers: int = MAX_HEADERS,
        max_header_line: int = MAX_HEADER_LINE,
        max_body_bytes: int | None = None,
        gather_from: int = GATHER_FROM,
    ):
        self.max_frame_bytes = max_frame_bytes
        self.gather_from = gather_from
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        # The largest body (content-length, or bytes before the NUL) taken; default: the frame's.
        self.max_body_bytes = max_frame_bytes if max_body_bytes is None else max_body_bytes
        self._short_head = min(max_headers, max_header_line)  # a head this long passes both at once
        self._pending = bytearray()  # unparsed bytes, starting at the incomplete frame
        self._searched = 0  # bytes of the incomplete frame already searched
        self._head_scan = _NO_HEAD_SCAN
        # Parsed head of the incomplete frame: command, headers, body offset, content-length.
        self._head: tuple[str, dict[str, str], int, int | None] | None = None
        # A large sized body being gathered: its pieces, the bytes (with the NUL) still to
        # come, and the bytes of the frame held so far (head included).
        self._parts: list[bytes | memoryview] = []
        self._missing = 0
        self._held = 0

    @property
    def buffered(self) -> int:
        """Bytes held for the incomplete frame: at most max_frame_bytes + 1 (its NUL)."""
        return len(self._pending) + self._held

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return every frame now complete, in order (possibly []).
        EOLs between frames (heart-beats) are consumed silently. Raises ProtocolError on bad input or a
        limit exceeded; after that the parser is unusable (the broker closes the connection)."""
        frames: list[Frame] = []
        try:
            return self._feed(data, frames)
        except ProtocolError as err:
            err.frames = frames
            raise

    def _feed(self, data: bytes, frames: list[Frame]) -> list[Frame]:
        pending = self._pending
        if self._missing:
            pos = self._gather(data, frames)
            if pos < 0:
                return frames
        elif pending:
            # Finish the frame that straddles the feeds on the pending buffer, then parse
            # the rest straight from `data`, so only the straddling frame is ever copied.
            held = len(pending)
            pending += data
            start = self._parse(pending, 0, frames, 1)
            if not frames:
                del pending[:start]
                return frames
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
        where the unparsed rest starts: in the compiled build the C step takes the simple
        frames in front (frame_c.next_frame), and _parse_rest the rest."""
        if NATIVE and self._head is None and not self._searched:
            end = len(buf)
            while pos < end and len(frames) != limit:
                whole = _c.next_frame(buf, pos, self.max_frame_bytes, self.max_body_bytes, self._short_head)
                if whole is None:
                    break
                command, headers, body, pos = whole
                frames.append(Frame(command, headers, body))
        return self._parse_rest(buf, pos, frames, limit)

    def _parse_rest(self, buf: bytes | bytearray, pos: int, frames: list[Frame], limit: int) -> int:
        """Append up to `limit` (-1: all) complete frames from buf[pos:] to frames and return
        where the unparsed rest starts (the incomplete frame's state is saved, relative to it).
        A frame that comes whole takes one call, _parse_head; the rare cases (a CR in the
        head, an incomplete or oversized frame) take calls of their own."""
        end = len(buf)
        find = buf.find
        append = frames.append
        head = self._head
        searched = self._searched
        max_body = self.max_body_bytes
        length: int | None  # declared: mypyc types a local by its first assignment's narrowed type
        while pos < end and len(frames) != limit:
            if head is None:
                if buf[pos] <= 13:  # maybe LF or CR: heart-beats
                    if buf[pos] == 10 and pos + 1 < end and buf[pos + 1] > 13:
                        pos += 1  # the common case, one LF after a frame's NUL, at once
                        searched = 0
                    else:
                        match = _EOLS.match(buf, pos)
                        if match:
                            pos = match.end()
                            searched = 0
                            continue  # at the end of buf, or at a CR that is no EOL, or at a head
                # A head end (LF LF or LF CR LF) may straddle feeds: resume a little back.
                resume = pos + searched - 2 if searched > 2 else pos
                head_end = find(b"\n\n", resume)
                has_cr = (searched > 0 and self._head_scan[2]) or find(
                    b"\r", pos + searched, end if head_end < 0 else head_end
                ) >= 0
                if has_cr:
                    head_end = _head_end_with_cr(buf, resume, head_end)
                if head_end < 0:
                    searched = self._check_incomplete_head(buf, pos, searched, has_cr)
                    break
                command, headers, body_offset, length = self._parse_head(buf, pos, head_end, has_cr)
                searched = body_offset
            else:
                command, headers, body_offset, length = head
                head = None
            if length is None:
                nul = find(b"\0", pos + searched)
                if nul < 0 or nul - pos - body_offset > max_body or nul - pos > self.max_frame_bytes:
                    # No NUL yet, or one past a limit: _check_unsized raises then, so only the
                    # incomplete frame gets past it, to wait for more bytes.
                    searched = (end if nul < 0 else nul) - pos
                    self._check_unsized(searched, body_offset, headers)
                    head = (command, headers, body_offset, length)
                    break
            else:
                nul = pos + body_offset + length
                if nul >= end:
                    head = (command, headers, body_offset, length)
                    pos = self._maybe_gather(buf, pos, body_offset, length)
                    break
                if buf[nul]:
                    raise ProtocolError("body is not followed by NUL at content-length", headers.get("receipt"))
            # One copy of each body: a slice of bytes is one, of the pending bytearray two.
            start = pos + body_offset
            append(
                Frame(command, headers, buf[start:nul] if isinstance(buf, bytes) else bytes(memoryview(buf)[start:nul]))
            )
            searched = 0
            pos = nul + 1
        self._head = head
        self._searched = searched
        return pos

    def _maybe_gather(self, buf: bytes | bytearray, pos: int, body_offset: int, length: int) -> int:
        """Where the unparsed rest starts once the incomplete frame at buf[pos:] is saved: at
        pos, or past buf when its body is large enough to be gathered from here on, its
        bytes so far the first piece (a view of a received bytes, a copy of the pending
        buffer, which is reused)."""
        if length < self.gather_from:
            return pos
        start, end = pos + body_offset, len(buf)
        view = memoryview(buf)[start:end]
        self._parts.append(view if isinstance(buf, bytes) else bytes(view))
        self._missing = length + 1 - (end - start)
        self._held = end - pos
        return end

    def _gather(self, data: bytes, frames: list[Frame]) -> int:
        """Take received bytes for the body being gathered: -1 while it is incomplete, else
        (the frame appended to frames) where the bytes after its NUL start."""
        missing, parts = self._missing, self._parts
        if len(data) < missing:
            parts.append(data)
            self._missing = missing - len(data)
            self._held += len(data)
            return -1
        head = self._head
        assert head is not None
        command, headers = head[0], head[1]
        if data[missing - 1]:
            raise ProtocolError("body is not followed by NUL at content-length", headers.get("receipt"))
        parts.append(memoryview(data)[: missing - 1])
        frames.append(Frame(command, headers, b"".join(parts)))
        parts.clear()
        self._missing = self._held = 0
        self._head = None
        self._searched = 0
        return missing

    def _check_unsized(self, size: int, body_offset: int, headers: dict[str, str]) -> None:
        """Fail once a frame without content-length holds more bytes than the limits allow,
        naming the limit that the shorter prefix proves exceeded."""
        frame_at = self.max_frame_bytes + 1
        body_at = body_offset + self.max_body_bytes + 1
        if size >= min(frame_at, body_at):
            if frame_at <= body_at:
                raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes", headers.get("receipt"))
            raise ProtocolError(f"body exceeds {self.max_body_bytes} bytes", headers.get("receipt"))

    def _check_incomplete_head(self, buf: bytes | bytearray, pos: int, searched: int, has_cr: bool) -> int:
        """Save how far the incomplete head at pos was scanned, fail early on a limit or a bad CR,
        and return the new count of searched bytes."""
        end = len(buf)
        # The scan so far is this head's only once some of it was searched (a new head's is stale).
        lines, line_start, _ = self._head_scan if searched else _NO_HEAD_SCAN
        unchecked = pos + line_start  # lines from here on were not length-checked yet
        lines += buf.count(b"\n", pos + searched, end)
        last_lf = buf.rfind(b"\n", pos + searched, end)
        if last_lf >= 0:
            line_start = last_lf + 1 - pos
        self._head_scan = (lines, line_start, has_cr)
        if (
            (has_cr and _LONE_CR.search(buf, max(pos, pos + searched - 1), end))
            or lines - 1 > self.max_headers
            or (
                end - unchecked > self.max_header_line
                and max(len(line.rstrip(b"\r")) for line in buf[unchecked:end].split(b"\n")) > self.max_header_line
            )
            or end - pos > self.max_frame_bytes
        ):
            raise ProtocolError(self._first_head_error(buf, pos, end))
        return end - pos

    def _first_head_error(self, buf: bytes | bytearray, pos: int, stop: int) -> str:
        """The head error in buf[pos:stop] that the shortest prefix proves, so that the
        reason never depends on how the bytes were split (ties: in the order below)."""
        found: list[tuple[int, int, str]] = []  # (prefix length that proves it, order, reason)
        cr = _LONE_CR.search(buf, pos, stop)
        if cr:
            found.append((cr.start() + 2, 0, "CR not followed by LF in frame head"))
        lf = pos - 1
        for _ in range(self.max_headers + 2):
            lf = buf.find(b"\n", lf + 1, stop)
            if lf < 0:
                break
        else:
            found.append((lf + 1, 1, f"more than {self.max_headers} headers"))
        start = pos
        for line in bytes(buf[pos:stop]).split(b"\n"):
            if len(line.rstrip(b"\r")) > self.max_header_line:
                at = start + self.max_header_line + 1 + (line[self.max_header_line] == 13)
                found.append((at, 2, f"header line exceeds {self.max_header_line} bytes"))
                break
            start += len(line) + 1
        if stop - pos > self.max_frame_bytes:
            found.append((pos + self.max_frame_bytes + 1, 3, f"frame exceeds {self.max_frame_bytes} bytes"))
        return min(found)[2]

    def _parse_head(
        self, buf: bytes | bytearray, pos: int, head_end: int, has_cr: bool
    ) -> tuple[str, dict[str, str], int, int | None]:
        """Decode the head in buf[pos:head_end]: command, headers, body offset, content-length.
        Limits and bad CRs are checked first, as the incomplete head's checks would find them."""
        body_offset = head_end - pos + (3 if buf[head_end + 1] == 13 else 2)
        # A head no longer than max_headers bytes (nor max_header_line) cannot have more
        # lines than the one limit (nor a longer line than the other): the common case.
        long_head = head_end - pos > self._short_head
        if (
            (has_cr and _LONE_CR.search(buf, pos, head_end))
            or (long_head and buf.count(b"\n", pos, head_end) > self.max_headers)
            or (
                long_head
                and head_end - pos > self.max_header_line
                and max(len(line.rstrip(b"\r")) for line in buf[pos:head_end].split(b"\n")) > self.max_header_line
            )
            or body_offset > self.max_frame_bytes
        ):
            raise ProtocolError(self._first_head_error(buf, pos, pos + body_offset))
        split = _c.split_head(buf, pos, head_end) if NATIVE and not has_cr else None
        command, headers = _split_head(buf, pos, head_end, has_cr) if split is None else split
        size = body_offset
        length = None
        raw_length = headers.get("content-length")
        if raw_length is not None:
            try:
                # decimal()'s common case inline (this runs for every frame); the rest is its
                length = (
                    int(raw_length)
                    if 0 < len(raw_length) < 10 and raw_length.isascii() and raw_length.isdigit()
                    else -1
                )
                if not 0 <= length <= self.max_body_bytes:
                    length = decimal(raw_length, "content-length", self.max_body_bytes)
            except ValueError as err:
                if raw_length.strip("0123456789") or not raw_length:
                    raise ProtocolError(
                        "content-length is not a non-negative decimal integer", headers.get("receipt")
                    ) from None
                raise ProtocolError(f"body too large: {err} bytes", headers.get("receipt")) from None
            size += length
        if size > self.max_frame_bytes:
            raise ProtocolError(f"frame exceeds {self.max_frame_bytes} bytes", headers.get("receipt"))
        return command, headers, body_offset, length


def _split_head(buf: bytes | bytearray, pos: int, head_end: int, has_cr: bool) -> tuple[str, dict[str, str]]:
    """The command and headers of the head in buf[pos:head_end] (see the module's rules)."""
    try:
        text = buf[pos:head_end].decode()
    except UnicodeDecodeError:
        raise ProtocolError("frame head is not valid UTF-8") from None
    lines = text.split("\n")
    if has_cr:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    command = lines[0]
    headers = _headers(lines)
    if "\\" in text and command not in UNESCAPED_COMMANDS:
        headers = _unescaped_headers(lines)
    return command, headers


def _head_end_with_cr(buf: bytes | bytearray, resume: int, head_end: int) -> int:
    """Where a head with a CR in it ends: at an LF CR LF that starts before its first LF LF
    (head_end, -1 if none yet), or at that LF LF."""
    lf_crlf = buf.find(b"\n\r\n", resume, len(buf) if head_end < 0 else head_end + 2)
    return lf_crlf if lf_crlf >= 0 else head_end


def _headers(lines: list[str]) -> dict[str, str]:
    """The header lines after the command line (lines[0]) to a dict, first occurrence
    winning, split at the first colon; ProtocolError for a line without one (whichever
    line it is) before one for an empty name. A loop of str.partition, which the compiled
    build runs without a Python call."""
    headers: dict[str, str] = {}
    empty_name = False
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ProtocolError("header line without a colon")
        if not name:
            empty_name = True
        if name not in headers:
            headers[name] = value
    if empty_name:
        raise ProtocolError("header with an empty name")
    return headers


def _unescaped_headers(lines: list[str]) -> dict[str, str]:
    """Header lines (after the command line), which `_headers` found well formed, to a
    dict unescaped, first occurrence winning after unescaping."""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(unescape(name), unescape(value))
    return headers
