"""Connections to the configured endpoints: errors that name the endpoint, and links that
come back after an outage.

An endpoint that goes away (refused, reset, silent past its heart-beat, no receipt in time) is
an outage, not a failure: a `Link` reconnects with backoff for up to `reconnectTimeout`
seconds, logging one line when the outage starts and one when it ends, and only then fails
with a one-line error naming the endpoint. An ERROR frame is the broker refusing what we
asked: retrying would not help, so it fails at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from curb.client import Client, StompError
from curb.spark.options import Connection, Endpoint

LOG = logging.getLogger("curb.spark")
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0

T = TypeVar("T")


class EndpointError(RuntimeError):
    """Talking to one Curb endpoint failed (refused, lost, or an ERROR frame); the message names it."""


class EndpointLost(EndpointError):
    """The connection to an endpoint failed or could not be made: worth a reconnect."""


@contextmanager
def reporting(endpoint: Endpoint, doing: str) -> Iterator[None]:
    """Turn client and socket errors into an EndpointError (EndpointLost for a lost connection)
    saying which endpoint failed doing what."""
    try:
        yield
    except StompError as err:
        kind = EndpointLost if err.frame is None else EndpointError
        raise kind(f"curb endpoint {endpoint.label}: {doing} failed: {err}") from err
    except OSError as err:
        raise EndpointLost(f"curb endpoint {endpoint.label}: {doing} failed: {err}") from err


def open_client(endpoint: Endpoint, connection: Connection) -> Client:
    """A connected client. Heart-beats are asked of the broker only: between Spark's calls the
    connector is silent for as long as a batch runs, so it promises none itself."""
    client = Client(
        endpoint.host,
        endpoint.port,
        login=connection.login,
        passcode=connection.passcode,
        heartbeat=(0, connection.heartbeat_ms),
        timeout=connection.timeout_s,
    )
    with reporting(endpoint, "connecting (option 'endpoints')"):
        client.connect()
    return client


class Link:
    """One endpoint's connection, reopened after an outage of up to `reconnect_timeout_s`."""

    def __init__(self, endpoint: Endpoint, connection: Connection, reconnect_timeout_s: float) -> None:
        self.endpoint = endpoint
        self.connection = connection
        self.reconnect_timeout_s = reconnect_timeout_s
        self._client: Client | None = None
        self._outage_since: float | None = None  # monotonic time the current outage began
        self._backoff = FIRST_BACKOFF_S

    def run(self, action: Callable[[Client], T]) -> T:
        """`action(client)`, again on a new connection after each outage; `action` must be safe to repeat."""
        while True:
            try:
                result = action(self.client())
            except EndpointLost as err:
                self.lost(err)
                continue
            self.working()
            return result

    def client(self) -> Client:
        """The open connection, or a new one (reconnecting through an outage)."""
        while self._client is None:
            try:
                self._client = open_client(self.endpoint, self.connection)
            except EndpointLost as err:
                self.lost(err)
        return self._client

    def lost(self, err: EndpointLost) -> None:
        """Drop the connection and wait before the next attempt; raise once the outage is too long."""
        self.close()
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            LOG.warning("%s; reconnecting for up to %.0f s (option 'reconnectTimeout')", err, self.reconnect_timeout_s)
        left = self._outage_since + self.reconnect_timeout_s - now
        if left <= 0:
            raise EndpointError(
                f"curb endpoint {self.endpoint.label}: unreachable for {self.reconnect_timeout_s:.0f} s "
                f"(option 'reconnectTimeout'); last error: {err.__cause__ or err}"
            ) from err
        time.sleep(min(self._backoff, left))
        self._backoff = min(2 * self._backoff, MAX_BACKOFF_S)

    def working(self) -> None:
        """The last call went through: an outage, if there was one, is over."""
        if self._outage_since is not None:
            LOG.warning(
                "curb endpoint %s: back after %.1f s", self.endpoint.label, time.monotonic() - self._outage_since
            )
            self._outage_since = None
            self._backoff = FIRST_BACKOFF_S

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
