"""A message's headers and body in HTTP's and JSON's terms, both ways, as STOMP sees them.

- HTTP in: `Content-Type` becomes the STOMP header content-type, and each
  `x-msg-NAME: VALUE` header the STOMP header NAME (lower case, as HTTP header names are
  case-insensitive): `x-msg-x-trace: 7` reaches a STOMP consumer as `x-trace:7`.
- HTTP out: the stored content-type is `Content-Type` (application/octet-stream when
  none), Narconi's `x-msg-redelivered` (true once delivered before) and
  `x-msg-timestamp` (when it was published, in ms since the epoch), every other stored
  header NAME `x-msg-NAME` (a STOMP header `redelivered` or `timestamp` is left out:
  those names are Narconi's), and Curb's `x-curb-id` and `x-curb-deliveries` say which
  message it is and how often it was delivered. A header
  HTTP cannot carry (a value with a line break or a control character, a name that is not
  an HTTP token) is left out; the JSON form carries every header.
- JSON (the batch form, Narconi's WebSocket protocols): `{"message": BODY, "headers":
  {...}}`, BODY encoded as the request's `encoding` says: utf-8 (the default), base64 or hex.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from curb import payload

ENCODINGS = ("utf-8", "base64", "hex")
PREFIX = "x-msg-"
DEFAULT_TYPE = "application/octet-stream"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # what an HTTP header name may hold (RFC 9110)


class BadMessage(ValueError):
    """A message the client sent that cannot be read; str() says why and what to do."""


def headers_in(http_headers: Mapping[str, str], content_type: str | None) -> dict[str, str]:
    """The STOMP headers of a message published over HTTP."""
    headers = {}
    if content_type:
        headers["content-type"] = content_type
    for name, value in http_headers.items():
        lower = name.lower()
        if lower.startswith(PREFIX) and len(lower) > len(PREFIX):
            headers[lower[len(PREFIX) :]] = value
    return headers


NARCONI_NAMES = frozenset({"redelivered", "timestamp"})  # x-msg- names Narconi gives a meaning


def headers_out(stored: Mapping[str, str], msg_id: int, deliveries: int, timestamp_ms: int) -> dict[str, str]:
    """The HTTP headers of a message taken over HTTP: every one an HTTP header can carry
    (a STOMP header may hold a line break, or a name with a colon or a space: those are
    left out, and a content-type like that is the default), so that no stored header can
    break the response its message is consumed in."""
    content_type = stored.get("content-type", DEFAULT_TYPE)
    headers = {
        "Content-Type": content_type if _carried(content_type) else DEFAULT_TYPE,
        PREFIX + "redelivered": "true" if deliveries > 1 else "false",
        PREFIX + "timestamp": str(timestamp_ms),
    }
    for name, value in stored.items():
        if name != "content-type" and name not in NARCONI_NAMES and _TOKEN.fullmatch(name) and _carried(value):
            headers[PREFIX + name] = value
    headers["x-curb-id"] = str(msg_id)
    headers["x-curb-deliveries"] = str(deliveries)
    return headers


def _carried(value: str) -> bool:
    return value.isascii() and not _UNSAFE.search(value)


def check_encoding(name: str) -> str:
    if name not in ENCODINGS:
        raise BadMessage(f"unknown encoding {name[:40]!r}: use one of {', '.join(ENCODINGS)}")
    return name


def encode_body(body: bytes, encoding: str) -> str:
    """The body as JSON text; BadMessage when utf-8 is asked of bytes that are not."""
    if encoding == "base64":
        return base64.b64encode(body).decode()
    if encoding == "hex":
        return body.hex()
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadMessage("a message body is not UTF-8: ask for encoding=base64 or encoding=hex") from None


def decode_body(text: object, encoding: str) -> bytes:
    if not isinstance(text, str):
        raise BadMessage('"message" must be a string (the body, in the request\'s encoding)')
    try:
        if encoding == "base64":
            return base64.b64decode(text, validate=True)
        if encoding == "hex":
            return bytes.fromhex(text)
    except (ValueError, binascii.Error):
        raise BadMessage(f'"message" is not valid {encoding}') from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadMessage('"message" holds text that is not valid Unicode') from None


def json_headers(raw: object) -> dict[str, str]:
    """A message's `headers` (or Narconi's metadata object) as STOMP headers."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str | int | float) for v in raw.values()):
        raise BadMessage('"headers" must be an object of names to strings')
    return {str(k): str(v) for k, v in raw.items()}


def as_json(stored_payload: bytes, encoding: str) -> dict[str, object]:
    """A taken message as JSON: its body in `encoding` (base64 for a body that is not
    UTF-8 when utf-8 was asked: `encoding` says which) and its headers."""
    headers, body = payload.decode(stored_payload)
    try:
        text = encode_body(body, encoding)
    except BadMessage:
        encoding, text = "base64", encode_body(body, "base64")
    return {"message": text, "encoding": encoding, "headers": headers}
