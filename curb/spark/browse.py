"""The two Curb frames the streaming source is built on, client side.

- Browse: `SUBSCRIBE browser:true` with `curb-from-id`/`curb-to-id` (both inclusive) streams
  one MESSAGE per live message in that id range, changing no state, then an end marker
  (`browser:end`, `curb-last-id`: the to-id the broker used) that ends the subscription.
  A browse from above the highest id yields only the marker: the highest id, cheaply.
- `ACK curb-upto:N` acknowledges every message with id <= N, delivered or not; its RECEIPT
  means the acknowledgement is durable.

A browsed MESSAGE never carries an `ack` header; one that does comes from a broker without
browse subscriptions, which would be handing the message to us as a consumer: refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from curb.client import Client, StompError
from curb.frame import Frame, encode

# Above any id a broker assigns: a browse from here returns only the end marker.
BEYOND_IDS = 2**63 - 1
# Headers the broker adds to a browsed MESSAGE; the rest are the producer's (the `headers` column).
BROKER_HEADERS = frozenset({"subscription", "message-id", "destination", "content-length", "ack"})

_subscriptions = itertools.count(1)
_receipts = itertools.count(1)


def browse(client: Client, first: int, last: int | None = None) -> Iterator[Frame]:
    """The live messages with `first` <= id <= `last` (None: up to the highest id now), in log order."""
    sub = f"browse-{next(_subscriptions)}"
    headers = {"browser": "true", "curb-from-id": str(first)}
    if last is not None:
        headers["curb-to-id"] = str(last)
    client.subscribe(sub_id=sub, ack="client-individual", headers=headers)
    while True:
        frame = client.receive(client.timeout)
        if frame is None:
            raise StompError(f"browse: no frame within {client.timeout:.0f} s")
        if frame.command != "MESSAGE" or frame.headers.get("subscription") != sub:
            continue
        if frame.headers.get("browser") == "end":
            return
        if "ack" in frame.headers:
            raise StompError(
                "this broker does not support browse subscriptions (browser:true); "
                "the Spark source needs a Curb broker with message-id range reads",
                frame,
            )
        yield frame


def highest_id(client: Client) -> int:
    """The highest message id the broker has assigned (0 if none): a browse that starts beyond it."""
    sub = f"browse-{next(_subscriptions)}"
    client.subscribe(sub_id=sub, ack="client-individual", headers={"browser": "true", "curb-from-id": str(BEYOND_IDS)})
    while True:
        frame = client.receive(client.timeout)
        if frame is None:
            raise StompError(f"browse: no end marker within {client.timeout:.0f} s")
        if frame.command == "MESSAGE" and frame.headers.get("subscription") == sub:
            if frame.headers.get("browser") != "end":
                raise StompError("a browse beyond the highest id returned a message", frame)
            return int(frame.headers["curb-last-id"])


def first_live_id(client: Client, last: int) -> int | None:
    """The id of the first live message (in log order) with id <= `last`, None if there is none.
    Stops reading there: the caller must close this connection, which still has a browse running."""
    for frame in browse(client, 1, last):
        return int(frame.headers["message-id"])
    return None


def ack_upto(client: Client, last: int) -> None:
    """Acknowledge every message with id <= `last`; return once the broker says it is durable."""
    receipt = f"upto-{next(_receipts)}"
    client.write(encode("ACK", {"curb-upto": str(last), "receipt": receipt}))
    client.wait_receipt(receipt)
