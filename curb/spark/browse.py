"""The browse the streaming source reads with, on top of `Client.browse` (see "Browse
and ACK up to an id" in docs/guide.md for the two frames).

A browsed MESSAGE never carries an `ack` header; one that does comes from a broker without
browse subscriptions, which would be handing the message to us as a consumer: refused.
"""

from __future__ import annotations

from collections.abc import Iterator

from curb.client import Client, StompError
from curb.frame import Frame

# Headers the broker adds to a browsed MESSAGE; the rest are the producer's (the `headers` column).
BROKER_HEADERS = frozenset({"subscription", "message-id", "destination", "content-length", "ack"})


def browse(client: Client, first: int, last: int) -> Iterator[Frame]:
    """The live messages with `first` <= id <= `last`, in log order."""
    for frame in client.browse(first, last):
        if "ack" in frame.headers:
            raise StompError(
                "this broker does not support browse subscriptions (browser:true); "
                "the Spark source needs a Curb broker with message-id range reads",
                frame,
            )
        yield frame


def first_live_id(client: Client, after: int, last: int) -> int | None:
    """The id of the first live message (in log order) with `after` < id <= `last`, None if there
    is none. Every live id in (after, that id) is one compaction moved behind it. Stops reading
    there: the caller must close this connection, which still has a browse running (an
    UNSUBSCRIBE could cross the browse's end marker, and one for an ended browse is an ERROR)."""
    for frame in browse(client, after + 1, last):
        return int(frame.headers["message-id"])
    return None
