"""Every refusal of the web front has one shape: a status and `{"code": N, "message": "...",
"error": "..."}` (Narconi's `message`; `error` the same text, as the WebSocket protocols'
errors have it). `refused` and `not_stored` are the answers to a message the broker
would not take or could not store.

Handlers raise `Refusal`; the `json_errors` middleware also turns aiohttp's own
refusals (404, 405, 413 for a body over the limit) and any failure of a handler (500)
into the same shape, so a client parses one kind of error whatever refused it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from curb.refused import BAD_HEADERS, FULL, TOO_LARGE, NotStored, Refused

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refusal(Exception):
    """A request the web front refuses: the status, what to tell the client, extra headers."""

    def __init__(
        self,
        status: int,
        error: str,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, object] | None = None,
    ):
        super().__init__(error)
        self.status = status
        self.error = error
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})  # more members of the JSON answer


def refusal(
    status: int, error: str, headers: Mapping[str, str] | None = None, extra: Mapping[str, object] | None = None
) -> web.Response:
    """The JSON answer for a refusal: Narconi's `message`, and the same text as `error`
    (with `code`, as the WebSocket protocols' errors have)."""
    body = json.dumps({"code": status, "message": error, "error": error, **(extra or {})}).encode() + b"\n"
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def json_reply(data: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode() + b"\n", content_type="application/json", headers=headers
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refusal as err:
        return refusal(err.status, err.error, err.headers, err.extra)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        headers = {k: v for k, v in err.headers.items() if k in ("Allow", "Retry-After", "WWW-Authenticate")}
        return refusal(err.status, _advice(err), headers)
    except Exception:
        log.exception("the web front could not answer %s %s", request.method, request.path)
        return refusal(500, "could not read the broker's state; see its log")


def _advice(err: web.HTTPException) -> str:
    if isinstance(err, web.HTTPRequestEntityTooLarge):
        return f"{err.text}: send a smaller body, or ask the operator for a larger -max-frame"
    if isinstance(err, web.HTTPNotFound):
        return "no such path: see OPTIONS /v2 for the API's paths, /ws for STOMP, /metrics and /stats"
    if isinstance(err, web.HTTPMethodNotAllowed):
        return f"method {err.method} not allowed here; allowed: {', '.join(sorted(err.allowed_methods))}"
    return err.text or err.reason


STATUS_OF = {TOO_LARGE: 413, BAD_HEADERS: 400, FULL: 503}


def refused(err: Refused, extra: dict[str, object] | None = None) -> Refusal:
    """The HTTP answer to a message the broker would not take."""
    retry = {"Retry-After": str(math.ceil(err.retry_after))} if err.retry_after else None
    return Refusal(STATUS_OF.get(err.reason, 400), f"{err.message}: {err}", retry, extra)


def not_stored(err: NotStored) -> Refusal:
    if err.maybe:
        return Refusal(
            503,
            f"may not be stored: {err}; the log failed after the message was written, so it may "
            "be on disk and then delivered: send it again later if a second copy does no harm",
        )
    return Refusal(503, f"not stored: {err}; the message will not be delivered: send it again later")
