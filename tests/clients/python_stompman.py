"""stompman (PyPI, an asyncio client) against Curb, direct or through `curb router`.

Usage: python python_stompman.py HOST PORT DESTINATION COUNT PREFETCH
Sends COUNT messages, each awaiting its RECEIPT, consumes them with client-individual acks
and a prefetch, NACKs the first and ACKs its redelivery, then prints one JSON line (see
tests/test_clients.py). stompman speaks STOMP 1.2 only; ERROR frames reach `on_error_frame`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

import stompman

WAIT_S = 10.0


async def run(host: str, port: int, destination: str, count: int, prefetch: str, result: dict) -> None:
    done = asyncio.Event()
    seen: set[str] = set()

    async def handle(message: stompman.AckableMessageFrame) -> None:
        body = message.body.decode()
        if result["nacked"] is None:
            result["nacked"] = body
            await message.nack()
            return
        if message.headers.get("redelivered") == "true":
            if body == result["nacked"] and result["redelivered"] is None:
                result["redelivered"] = body
            else:
                result["errors"].append(f"unexpected redelivery of {body}")
        if body in seen:
            result["errors"].append(f"{body} delivered twice")
        seen.add(body)
        await message.ack()
        result["acked"].append(body)
        if len(result["acked"]) == count:
            done.set()

    def on_error(frame: stompman.ErrorFrame) -> None:
        result["errors"].append(f"ERROR {dict(frame.headers)} {frame.body!r}")
        done.set()

    server = stompman.ConnectionParameters(host=host, port=port, login="", passcode="")
    async with stompman.Client(servers=[server], on_error_frame=on_error) as client:
        result["version"] = client.PROTOCOL_VERSION
        for n in range(count):
            body = f"stompman-{n}"
            await client.send(body.encode(), destination, content_type="text/plain", receipt_timeout=WAIT_S)
            result["sent"].append(body)
        subscription = await client.subscribe_with_manual_ack(
            destination, handle, ack="client-individual", headers={"prefetch-count": prefetch}, receipt_timeout=WAIT_S
        )
        try:
            await asyncio.wait_for(done.wait(), WAIT_S)
        finally:
            await subscription.unsubscribe()  # the client waits for its subscriptions to end before it disconnects


def main() -> None:
    host, port, destination, count, prefetch = sys.argv[1:]
    result: dict = {"client": f"stompman {version('stompman')}", "sent": [], "acked": []}
    result |= {"nacked": None, "redelivered": None, "errors": [], "version": None}
    try:
        asyncio.run(run(host, int(port), destination, int(count), prefetch, result))
    except Exception as err:  # reported in the result line, as the other languages' scripts do
        result["errors"].append(f"{type(err).__name__}: {err}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
