"""Browse throughput: how fast one client reads a full queue with a browse
(SUBSCRIBE browser:true), and the broker's memory meanwhile.

    bin/bench-browse [--messages 1000000] [--body 100] [--cap 512MiB]

It starts a broker on a new log in a temporary directory, fills it with pipelined SENDs
(receipts every 1000), then browses everything once (the queue is left as it was),
reading the bytes with a plain socket so that the client is not what is measured, and
prints: messages, seconds, messages/s, MB/s of frames, and the broker's RSS before the
browse and its peak during it (sampled every 10 ms); then the time of a browse of the
last 1000 messages, which starts at a mark near them rather than at the oldest message.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time

from benchmark.broker import rss_bytes
from benchmark.workloads import PeakRss
from curb.client import Client
from curb.frame import encode
from curb.spawn import BrokerProcess

RECEIPT_EVERY = 1000
READ_SIZE = 1 << 20
MARKER = b"MESSAGE\nsubscription:"  # the start of a MESSAGE (the bodies never hold it)
END = b"\nbrowser:end\n"


def fill(port: int, messages: int, body: bytes) -> float:
    """SEND `messages` copies of `body`; returns the seconds it took, all stored."""
    started = time.monotonic()
    frame = encode("SEND", {"destination": "/queue/curb"}, body)
    with Client("127.0.0.1", port, timeout=120) as c:
        for n in range(messages):
            if n % RECEIPT_EVERY == RECEIPT_EVERY - 1 or n == messages - 1:
                c.send(body, receipt=f"r{n}")
                if n >= 10 * RECEIPT_EVERY:
                    c.wait_receipt(f"r{n - 10 * RECEIPT_EVERY}")  # a window of receipts
            else:
                c.write(frame)
        c.wait_receipt(f"r{messages - 1}")
    return time.monotonic() - started


def browse_all(port: int, headers: dict[str, str] | None = None) -> tuple[int, int, float]:
    """(MESSAGE frames before the end marker, bytes read, seconds) of one browse."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(encode("CONNECT", {"accept-version": "1.2"}))
        connected = b""
        while b"\0" not in connected:
            connected += sock.recv(4096)
        started = time.monotonic()
        subscribe = {"id": "b", "destination": "/queue/curb", "browser": "true", **(headers or {})}
        sock.sendall(encode("SUBSCRIBE", subscribe))
        frames = total = 0
        prev = b""
        while True:
            data = sock.recv(READ_SIZE)
            if not data:
                raise RuntimeError("the broker closed the connection during the browse")
            total += len(data)
            # a marker cut by the last read is completed by this one; a whole one in the
            # kept bytes was counted already, so keep fewer bytes than a marker
            frames += (prev[-(len(MARKER) - 1) :] + data).count(MARKER)
            if END in prev[-(len(END) - 1) :] + data:
                break
            prev = data
        seconds = time.monotonic() - started
        sock.sendall(encode("DISCONNECT", {}))
    return frames - 1, total, seconds  # the end marker is a MESSAGE too


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-browse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages queued (default 1000000)")
    parser.add_argument("--body", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--cap", default="512MiB", help="the broker's -cap (default 512MiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="curb-bench-browse-") as workdir:
        broker = BrokerProcess(cwd=workdir)
        port = broker.start(["-cap", args.cap, "-addr", "127.0.0.1:0", "-file", "curb.log"])
        try:
            fill_seconds = fill(port, args.messages, b"x" * args.body)
            print(f"filled {args.messages} messages of {args.body} B in {fill_seconds:.1f} s")
            before = rss_bytes(broker.pid)
            with PeakRss(broker.pid) as rss:
                frames, total, seconds = browse_all(port)
            if frames != args.messages:
                raise SystemExit(f"browse returned {frames} messages, expected {args.messages}")
            print(
                f"browse: {frames} messages in {seconds:.2f} s = {frames / seconds:,.0f} messages/s, "
                f"{total / seconds / 1e6:.1f} MB/s of frames; broker RSS {before / 2**20:.1f} MiB before, "
                f"peak {rss.peak / 2**20:.1f} MiB during"
            )
            first = max(1, args.messages - 999)
            frames, _, seconds = browse_all(port, {"curb-from-id": str(first)})
            print(f"browse of the last {frames} messages (from id {first}): {seconds * 1000:.1f} ms")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
