"""The ceiling for moving bytes on this machine: one loopback TCP connection between a
trivial sender (another process, writing one buffer over and over) and a trivial reader
(reading into one buffer), with nothing parsed or checked. A consumer of large messages
cannot go faster than this, whatever the broker."""

from __future__ import annotations

import socket
import threading
import time

from benchmark.crew import Crew, Worker

CHUNK = 1 << 20


def send(worker: Worker, port: int, seconds: float) -> dict:
    """The sender: connect, then write CHUNK bytes at a time for `seconds`."""
    data = b"x" * CHUNK
    with socket.create_connection(("127.0.0.1", port)) as sock:
        start = worker.start()
        sent = 0
        while time.monotonic() < start + seconds:
            sock.sendall(data)
            sent += CHUNK
    return {"sent": sent}


def bytes_per_second(crew: Crew, seconds: float) -> float:
    """Bytes a second through one loopback connection, as the reader saw them."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        got: dict[str, float] = {}
        reader = threading.Thread(target=_read, args=(server, got), daemon=True)
        reader.start()
        [result] = crew.run([(send, dict(port=server.getsockname()[1], seconds=seconds))])
        reader.join()
    if got.get("bytes") != result["sent"]:
        raise OSError(f"loopback probe: sent {result['sent']:,} bytes, read {got.get('bytes', 0):,.0f}")
    return got["bytes"] / (got["end"] - got["start"])


def _read(server: socket.socket, got: dict[str, float]) -> None:
    conn, _ = server.accept()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    with conn:
        n = conn.recv_into(view)
        got["start"] = time.monotonic()
        while n:
            total += n
            got["end"] = time.monotonic()
            n = conn.recv_into(view)
    got["bytes"] = total
