"""Accept only what can be delivered: the limits a SEND must meet so that the MESSAGE it
becomes fits the frame limits of every reader, Curb's own client included.

Invariants:
- A MESSAGE carries the SEND's kept headers (escaped, as stored) plus at most
  ADDED_HEADERS lines the broker writes (subscription, destination, message-id, ack,
  redelivered, curb-deliveries, content-length), so a SEND may keep at most
  MAX_HEADERS - ADDED_HEADERS headers.
- Each kept header line, after escaping, is at most MAX_HEADER_LINE bytes. The
  subscription and destination lines are at most MAX_SUBSCRIPTION_LINE bytes each, which
  SUBSCRIBE checks; short, so that a small -max-frame still leaves room for bodies.
- The broker's own lines take at most RESERVE bytes, so a stored payload of n bytes
  (kept lines, blank line, body) makes a MESSAGE of at most n - 1 + RESERVE bytes, which
  must not exceed the frame limit.
"""

from __future__ import annotations

from curb.frame import MAX_HEADER_LINE, MAX_HEADERS

ADDED_HEADERS = 7
MAX_SUBSCRIPTION_LINE = 1024
# "MESSAGE\n", message-id, ack, redelivered, curb-deliveries and content-length lines at
# their longest, the blank line and the NUL LF: 138 bytes, rounded up; and the
# subscription and destination lines with their LFs.
RESERVE = 256 + 2 * (MAX_SUBSCRIPTION_LINE + 1)
# The smallest -max-frame a broker can be used with: the lines the broker adds to a
# MESSAGE (RESERVE) and 1,790 bytes for a SEND's headers and body, which is also room
# for any ordinary CONNECT (version, host, login, passcode and heart-beat lines).
MIN_FRAME = 4096


def line_problem(line: bytes, limit: int = MAX_HEADER_LINE) -> str | None:
    """Why a header line (escaped, without its LF) cannot go out, or None."""
    if len(line) > limit:
        return f"header line of {len(line)} bytes after escaping exceeds the limit of {limit} bytes"
    return None


def send_problem(stored_lines: bytes, payload_size: int, max_frame: int) -> tuple[str, str] | None:
    """(ERROR message, detail) when a SEND whose stored payload is `payload_size` bytes and
    whose kept header lines are `stored_lines` (each ending in LF) would make a MESSAGE
    beyond the limits; None when every reader can take it."""
    count = stored_lines.count(b"\n")
    if count > MAX_HEADERS - ADDED_HEADERS:
        return (
            "too many headers",
            f"The SEND keeps {count} headers; its MESSAGE adds up to {ADDED_HEADERS} and may carry "
            f"{MAX_HEADERS}, so a SEND may carry at most {MAX_HEADERS - ADDED_HEADERS} besides "
            "destination, content-length, receipt and transaction: send fewer, or put them in the body.",
        )
    for line in stored_lines.split(b"\n") if len(stored_lines) > MAX_HEADER_LINE else ():
        problem = line_problem(line)
        if problem is not None:
            return (
                "header too long",
                f"A SEND {problem} (a colon, CR, LF or backslash takes two bytes escaped): "
                "shorten it, or put the value in the body.",
            )
    size = payload_size - 1 + RESERVE
    if size > max_frame:
        return (
            "message too large",
            f"Its MESSAGE could take {size} bytes, over the frame limit of {max_frame} bytes "
            f"({RESERVE} of them are kept for the headers the broker adds): send a smaller body, "
            "or ask the operator for a larger -max-frame.",
        )
    return None
