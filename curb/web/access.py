"""Who may use the web front: HTTP Basic against the users file, its permissions, and Origin.

- Without -users everyone may do everything, as over STOMP.
- With -users each request logs in with HTTP Basic as a user of the same file, checked
  as a STOMP CONNECT is (curb.logins: a login verified before is known at once, others
  wait for a check off the loop, fairly by source address, or are shed as "server busy":
  503 with Retry-After). Over -http-tls with -tls-ca, a client certificate whose CN names
  a user stands in for the login. No login: 401 at once; a wrong one: 401 after the
  broker's refusal delay, as a failed CONNECT. A missing permission: 403, naming it.
- Origin: a request that carries an Origin header (a browser's) is served only when that
  origin is the broker's own or on the operator's list (-http-origin; `*` allows every
  origin). Otherwise 403, so a page on another site cannot publish or consume with a
  user's browser credentials. The broker's own origin is its listening address, by IP or
  by one of this machine's names (`localhost`, its host name, the -http host), never
  whatever name the request's Host header says: a page on a name its owner points at
  127.0.0.1 (DNS rebinding) sends a matching Host, and is still another site. An allowed page of another origin
  gets CORS headers (credentials allowed), and its preflight OPTIONS a 204. Requests without Origin (curl,
  programs) are not browsers' and pass.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from curb.backend import Backend
from curb.logins import SHED, Answer
from curb.tls import peer_name
from curb.users import User, allows
from curb.web.peers import HttpPeer
from curb.web.replies import Handler, Refusal

REALM = 'Basic realm="curb", charset="UTF-8"'
RETRY_SHED_SECONDS = 1
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE"
CORS_EXPOSED = "Location, Retry-After, x-curb-id, x-curb-deliveries"


def peer_of(request: web.Request) -> str:
    """HOST:PORT of the request's client, for log lines and fair login checks."""
    transport = request.transport
    name = transport.get_extra_info("peername") if transport is not None else None
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(request.remote or "local")


async def log_in(request: web.Request, broker: Backend, permission: str | None, destination: str = "") -> User | None:
    """The user the request logs in as (None without -users); Refusal unless it may
    `permission` (on `destination`, a router's: `send@orders` grants it there only)."""
    table = broker.users
    if table is None:
        return None
    transport = request.transport
    caller = HttpPeer(peer_of(request))
    cn = peer_name(transport.get_extra_info("peercert")) if transport is not None else None
    header = request.headers.get("Authorization")
    user: User | None
    if header is None:
        user = table.get(cn) if cn is not None else None
        if user is None:
            raise Refusal(
                401,
                "log in: send HTTP Basic credentials of a user of the broker's users file",
                {"WWW-Authenticate": REALM},
            )
    else:
        user = await authenticate(broker, caller, *_basic(header))
    return permitted(broker, user, permission, destination)


async def authenticate(broker: Backend, caller: HttpPeer, login: str, passcode: str) -> User:
    """The user of these credentials, checked as a STOMP CONNECT's; Refusal (401, 503) otherwise."""
    user = broker.logins.remembered(login, passcode)
    return user if user is not None else await _check(broker, caller, login, passcode)


def permitted(broker: Backend, user: User, permission: str | None, destination: str = "") -> User:
    """`user`, if it has `permission` (on `destination`); else 403 naming it."""
    if permission is not None and not allows(user.permissions, permission, destination):
        broker.refusals.permission_refused()
        raise Refusal(
            403,
            f"user {user.name!r} may not do this without the {permission!r} permission; the operator grants it "
            f"with `curb passwd USERS-FILE {user.name} --perm {permission} ...`",
        )
    return user


async def _check(broker: Backend, caller: HttpPeer, login: str, passcode: str) -> User:
    answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

    def then(answer: Answer) -> None:
        if not answered.done():
            answered.set_result(answer)

    broker.check_login(caller, login, passcode, then)
    try:
        answer = await answered
    finally:
        broker.logins.forget(caller)
    if answer is SHED:
        raise Refusal(
            503,
            "server busy: too many password checks are waiting; try again",
            {"Retry-After": str(RETRY_SHED_SECONDS)},
        )
    if answer is None:
        broker.refusals.access_refused(caller, login)
        await asyncio.sleep(broker.config.refuse_delay)
        raise Refusal(401, "access refused: unknown user or wrong password", {"WWW-Authenticate": REALM})
    assert isinstance(answer, User)
    return answer


def _basic(header: str) -> tuple[str, str]:
    scheme, _, encoded = header.partition(" ")
    try:
        if scheme.lower() != "basic":
            raise ValueError
        login, sep, passcode = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        if not sep:
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Refusal(
            401, "the Authorization header must be HTTP Basic: base64 of NAME:PASSWORD", {"WWW-Authenticate": REALM}
        ) from None
    return login, passcode


def own_names(listen_host: str | None) -> frozenset[str]:
    """The names by which a page of the broker's own is served: this machine's, and the
    -http host when it is a name."""
    names = {"localhost", socket.gethostname().lower()}
    if listen_host:
        names.add(listen_host.lower())
    return frozenset(names)


def is_own(origin: str, request: web.Request, names: frozenset[str]) -> bool:
    """Whether `origin` is the broker's own: the request's scheme and Host (so its port)
    with a host that is an IP address or one of `names`."""
    if origin != f"{request.scheme}://{request.host}":
        return False
    host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
    host = host.strip("[]").lower()
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host in names
    return True


def origin_check(allowed: Iterable[str], names: frozenset[str] = frozenset({"localhost"})) -> Middleware:
    """Middleware: a request whose Origin is neither the broker's own (`is_own`) nor in
    `allowed` gets 403. A page of an allowed other origin gets CORS headers, so that its
    scripts may read the answers (and its preflight OPTIONS an answer of its own)."""
    origins = frozenset(origin.rstrip("/") for origin in allowed)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None or is_own(origin, request, names):
            return await handler(request)
        if "*" not in origins and origin not in origins:
            raise Refusal(
                403,
                f"a page from {origin} may not use this broker: only its own pages and the origins of "
                "-http-origin may; ask the operator to add it",
            )
        cors = {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Expose-Headers": CORS_EXPOSED,
            "Vary": "Origin",
        }
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            asked = request.headers.get("Access-Control-Request-Headers", "")
            return web.Response(
                status=204,
                headers={**cors, "Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Allow-Headers": asked},
            )
        try:
            response = await handler(request)
        except Refusal as err:
            err.headers.update(cors)
            raise
        if not response.prepared:  # a WebSocket's headers are sent already (and need none)
            response.headers.update(cors)
        return response

    return check
