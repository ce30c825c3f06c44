"""Routes: which Curb instances hold which destination, and a destination's name in a frame.

A route is `NAME=HOST:PORT` (one instance) or `NAME=HOST:PORT,HOST:PORT,...` (a partitioned
destination: one queue spread over several instances). A routes file holds one route a
line; blank lines and lines starting with `#` are skipped. Names are letters, digits and
`-_.`, so that `/queue/NAME` and `./NAME` name them without escapes. One instance serves
one destination (an instance is one queue), so an address may appear in one route only.
Everything here is pure: parsing, checking, naming.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from curb.addr import parse_addr
from curb.users import DESTINATION_NAME

# The names `-spawn` starts an instance for (each becomes DIR/NAME.log): a letter or digit
# first, so that no name is `.`, `..`, hidden or taken for a flag, and 64 characters at most.
SPAWN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
QUEUE_PREFIX = "/queue/"
LOCAL_PREFIX = "./"
Address = tuple[str, int]


class RouteError(ValueError):
    """A route that cannot be used; str() says which and how to write it."""


@dataclass(frozen=True, slots=True)
class Routes:
    """Destination name -> its instances' addresses, in the order given."""

    table: dict[str, tuple[Address, ...]]

    def instances(self, name: str) -> tuple[Address, ...] | None:
        return self.table.get(name)


def parse_route(text: str) -> tuple[str, tuple[Address, ...]]:
    """One `NAME=HOST:PORT[,HOST:PORT...]`."""
    name, sep, where = text.partition("=")
    name, where = name.strip(), where.strip()
    if not sep or not where:
        raise RouteError(f"bad route {text!r}: write NAME=HOST:PORT or NAME=HOST:PORT,HOST:PORT,...")
    check_name(name)
    addresses: list[Address] = []
    for part in where.split(","):
        try:
            host, port = parse_addr(part.strip())
        except ValueError as err:
            raise RouteError(f"bad route {text!r}: {err}") from None
        if not port:
            raise RouteError(f"bad route {text!r}: an instance needs a port other than 0")
        address = (host or "127.0.0.1", port)
        if address in addresses:
            raise RouteError(f"bad route {text!r}: {part.strip()} is named twice")
        addresses.append(address)
    return name, tuple(addresses)


def check_name(name: str) -> None:
    if not DESTINATION_NAME.fullmatch(name):
        raise RouteError(
            f"bad destination name {name[:60]!r}: use 1 to 200 letters, digits, '-', '_' or '.', e.g. orders"
        )


def build(routes: list[str] | tuple[str, ...]) -> Routes:
    """Routes from `-route` values (or a file's lines), checked together: a name once,
    an instance in one route only."""
    table: dict[str, tuple[Address, ...]] = {}
    owner: dict[Address, str] = {}
    for text in routes:
        name, addresses = parse_route(text)
        if name in table:
            raise RouteError(f"destination {name!r} is routed twice: give each name one route")
        for address in addresses:
            if address in owner:
                raise RouteError(
                    f"instance {address[0]}:{address[1]} is in the routes of {owner[address]!r} and {name!r}: "
                    "an instance holds one queue, so it serves one destination"
                )
            owner[address] = name
        table[name] = addresses
    return Routes(table)


def parse_file(text: str) -> list[str]:
    """The routes of a routes file's text: a route a line; `#` starts a comment, on a line
    of its own or after a route (no name or address holds one)."""
    routes = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [route for route in routes if route]


def own_name(header: str | None, suffix: str) -> str | None:
    """The destination whose own name a `destination` header gives (`./NAME/count` or
    `/queue/NAME/count` for suffix "/count"; "/dead", "/redrive" alike), or None."""
    if header is None or not header.endswith(suffix):
        return None
    return destination_name(header[: -len(suffix)])


def destination_name(header: str | None) -> str | None:
    """The destination a `destination` header names (`/queue/NAME` or `./NAME`), or None."""
    if header is None:
        return None
    for prefix in (QUEUE_PREFIX, LOCAL_PREFIX):
        if header.startswith(prefix):
            name = header[len(prefix) :]
            return name if DESTINATION_NAME.fullmatch(name) else None
    return None
