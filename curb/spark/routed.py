"""A destination of a `curb router` as the Spark connector's endpoints.

The source browses and ACKs up to an id on each instance, which a router does not route,
and the sink's tasks each write to one instance: so the connector reaches the instances
themselves, and the router only tells which they are. Its `./NAME/count` subscription lists
a destination's instances in route order (`endpoints`); they are read once, on the driver, when the
query or the write starts, and from then on the connector works on them exactly as on
`endpoints` (the offsets are keyed by their HOST:PORT). A router that refuses (an unknown
destination, no `count` permission) fails at once with its reason.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TypeVar

from curb.spark.connection import EndpointError, open_client, reporting
from curb.spark.options import OptionError, SinkOptions, SourceOptions, parse_endpoint

Options = TypeVar("Options", SourceOptions, SinkOptions)


def resolved(options: Options) -> Options:
    """`options` with the router's destination's instances as the endpoints (unchanged when
    they name endpoints themselves)."""
    if options.routed is None:
        return options
    router, name = options.routed.router, options.routed.destination
    try:
        client = open_client(router, options.connection)
        try:
            with reporting(router, f"reading ./{name}/count"):
                client.subscribe("instances", destination=f"./{name}/count", ack="auto")
                frame = client.receive(options.connection.timeout_s)
        finally:
            client.close()
    except EndpointError as err:
        raise EndpointError(
            f"curb router {router.label} (options 'router' and 'destination'): {err.__cause__ or err}"
        ) from err
    if frame is None or frame.command != "MESSAGE":
        raise EndpointError(f"curb router {router.label}: sent no counts of {name!r} (got {frame})")
    listed = json.loads(frame.body).get("endpoints")
    if not isinstance(listed, list) or not listed:
        raise EndpointError(
            f"curb router {router.label}: its counts of {name!r} list no instances (a router too old to list them?)"
        )
    try:
        endpoints = tuple(parse_endpoint(str(item)) for item in listed)
    except OptionError as err:
        raise EndpointError(f"curb router {router.label}: an instance of {name!r} is not HOST:PORT: {err}") from None
    return dataclasses.replace(options, endpoints=endpoints)
