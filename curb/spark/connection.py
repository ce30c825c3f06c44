"""Opening STOMP connections to the configured endpoints, with errors that name the endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from curb.client import Client, StompError
from curb.spark.options import Connection, Endpoint


class EndpointError(RuntimeError):
    """Talking to one Curb endpoint failed (refused, lost, or an ERROR frame); the message names it."""


@contextmanager
def reporting(endpoint: Endpoint, doing: str) -> Iterator[None]:
    """Turn client and socket errors into an EndpointError saying which endpoint failed doing what."""
    try:
        yield
    except (StompError, OSError) as err:
        raise EndpointError(f"curb endpoint {endpoint.label}: {doing} failed: {err}") from err


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
