"""The web front under load, beside RabbitMQ's Web-STOMP and management HTTP API in the same run.

    bin/bench-web [--messages 20000] [--body 100] [--window 256] [--http-seconds 10] [--no-rabbitmq]

Workloads (100-byte bodies by default), each on a fresh broker log:

- WS produce: one STOMP-over-WebSocket connection pipelines receipted SENDs, `--window`
  in flight, every SEND with its own receipt (so each is fsynced before its RECEIPT).
- WS consume: the queue filled first; one subscription (client-individual, prefetch
  `--window`) ACKs every message.
- TCP produce and consume: the same client and workloads over Curb's plain STOMP port, the
  baseline the WebSocket figures are a share of.
- HTTP publish: `wrk` with 64 connections keeping alive, each POSTing one message at a
  time for `--http-seconds`; every 201 leaves after its message's fsync. RabbitMQ's is
  its management API's publish of a persistent message to a durable queue.
- RSS with 1,000 idle WebSockets (after their upgrade, before any STOMP frame).

RabbitMQ runs from ../shared/bench/peers/rabbitmq.sh with RABBIT_WEB=1 (Web-STOMP at
ws://127.0.0.1:15674/ws, management at :15672); its messages are persistent on a
durable queue, so its RECEIPTs and 201s also wait for its disk. The client is this
module's asyncio one (websockets for WebSocket), the same for every broker and transport.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from curb.frame import FrameParser, encode
from curb.spawn import BrokerProcess

TOP = Path(__file__).resolve().parents[2]
# The peer scripts live beside the checkout, in ../shared/bench/peers (--peers to say where).
PEERS = [TOP.parent / "shared" / "bench" / "peers", TOP.parent.parent / "shared" / "bench" / "peers"]
RABBIT_HEADERS = {"persistent": "true", "durable": "true", "auto-delete": "false"}
IDLE_SOCKETS = 1000


class Stomp:
    """A pipelining STOMP client over a WebSocket or a TCP stream."""

    def __init__(self) -> None:
        self.parser = FrameParser(max_frame_bytes=1 << 26, max_body_bytes=1 << 26)
        self.ws: ClientConnection | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, url: str, login: str | None = None) -> Stomp:
        self = cls()
        if url.startswith("ws"):
            self.ws = await connect(url, subprotocols=[Subprotocol("v12.stomp")], max_size=None)
        else:
            host, port = url.split(":")
            self.reader, self.writer = await asyncio.open_connection(host, int(port))
        headers = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}
        if login:
            headers.update(login=login, passcode=login)
        await self.send(encode("CONNECT", headers))
        [connected] = await self.frames()
        assert connected.command == "CONNECTED", connected
        return self

    async def send(self, data: bytes) -> None:
        if self.ws is not None:
            await self.ws.send(data)
        else:
            assert self.writer is not None
            self.writer.write(data)
            await self.writer.drain()

    async def frames(self) -> list:
        while True:
            if self.ws is not None:
                data = await self.ws.recv()
                data = data.encode() if isinstance(data, str) else data
            else:
                assert self.reader is not None
                data = await self.reader.read(1 << 16)
                if not data:
                    raise ConnectionError("closed")
            got = self.parser.feed(data)
            if got:
                return got

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        elif self.writer is not None:
            self.writer.close()


async def produce(
    url: str, messages: int, body: bytes, window: int, dest: str, extra: dict, login: str | None
) -> float:
    """Receipted SENDs, `window` in flight; messages a second."""
    client = await Stomp.open(url, login)
    sent = answered = 0
    started = time.monotonic()
    while answered < messages:
        batch = []
        while sent < messages and sent - answered < window:
            batch.append(encode("SEND", {"destination": dest, "receipt": str(sent), **extra}, body))
            sent += 1
        if batch:
            await client.send(b"".join(batch))
        for frame in await client.frames():
            assert frame.command == "RECEIPT", frame
            answered += 1
    seconds = time.monotonic() - started
    await client.close()
    return messages / seconds


async def consume(url: str, messages: int, window: int, dest: str, extra: dict, login: str | None) -> float:
    """ACK every message of a filled queue, prefetch `window`; messages a second."""
    client = await Stomp.open(url, login)
    sub = {"id": "1", "destination": dest, "ack": "client-individual", "prefetch-count": str(window), **extra}
    await client.send(encode("SUBSCRIBE", sub))
    got = 0
    started = time.monotonic()
    while got < messages:
        acks = []
        for frame in await client.frames():
            if frame.command == "MESSAGE":
                acks.append(encode("ACK", {"id": frame.headers["ack"]}))
                got += 1
        await client.send(b"".join(acks))
    seconds = time.monotonic() - started
    await client.close()
    return messages / seconds


def wrk(url: str, seconds: int, body: bytes, headers: dict[str, str]) -> tuple[float, int, int]:
    """(requests a second, requests, non-2xx answers) of wrk -c64 POSTing `body` to url."""
    script = Path(tempfile.mkdtemp(prefix="curb-bench-web-")) / "post.lua"
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body.decode())}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    script.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        ["wrk", "-t2", "-c64", f"-d{seconds}s", "-s", str(script), url], capture_output=True, text=True, check=True
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rate, total, int(bad.group(1)) if bad else 0


async def idle_rss(url: str, pid: int, login: str | None = None) -> tuple[int, int]:
    """(RSS KiB before, after) IDLE_SOCKETS WebSockets are open and idle."""
    before = rss_kib(pid)
    sockets = [
        await connect(url, subprotocols=[Subprotocol("v12.stomp")], open_timeout=60) for _ in range(IDLE_SOCKETS)
    ]
    await asyncio.sleep(1)
    after = rss_kib(pid)
    for ws in sockets:
        await ws.close()
    return before, after


def rss_kib(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total = int(line.split()[1])
    return total


def rabbit(peers: Path, command: str) -> str:
    return subprocess.run(
        ["bash", str(peers / "rabbitmq.sh"), command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "RABBIT_WEB": "1"},
    ).stdout.strip()


def rabbit_http(method: str, path: str, body: dict | None = None) -> None:
    subprocess.run(
        [
            "curl",
            "-sf",
            "-u",
            "guest:guest",
            "-X",
            method,
            "-H",
            "content-type: application/json",
            *(["--data", json.dumps(body)] if body is not None else []),
            f"http://127.0.0.1:15672{path}",
        ],
        check=True,
        capture_output=True,
    )


def row(name: str, curb: float, peer: float | None, unit: str = "msg/s") -> None:
    ratio = f"{curb / peer:5.1f}x" if peer else "     "
    peer_text = f"{peer:>12,.0f}" if peer else f"{'-':>12}"
    print(f"  {name:<34} {curb:>12,.0f} {peer_text} {ratio}  {unit}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="messages per WebSocket or TCP run (20000)")
    parser.add_argument("--body", type=int, default=100, help="body bytes (100)")
    parser.add_argument("--window", type=int, default=256, help="SENDs in flight, and the consumer's prefetch (256)")
    parser.add_argument("--http-seconds", type=int, default=10, help="seconds of wrk per broker (10)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="Curb only")
    parser.add_argument(
        "--rabbitmq-running",
        action="store_true",
        help="RabbitMQ already runs with RABBIT_WEB=1: neither start nor stop it",
    )
    parser.add_argument("--peers", type=Path, help="the directory of rabbitmq.sh (default: ../shared/bench/peers)")
    args = parser.parse_args()
    peers = args.peers or next((p for p in PEERS if (p / "rabbitmq.sh").is_file()), None)
    if peers is None and not args.no_rabbitmq:
        raise SystemExit("bin/bench-web: no ../shared/bench/peers/rabbitmq.sh: give --peers DIR, or --no-rabbitmq")
    body = b"x" * args.body
    use_rabbit = not args.no_rabbitmq
    if shutil.which("wrk") is None:
        raise SystemExit("bin/bench-web needs wrk (Debian: apt-get install wrk)")
    print(f"{args.messages:,} messages of {args.body} B, window {args.window}; Curb, RabbitMQ, Curb/RabbitMQ")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="curb-bench-web-") as workdir:
        broker = BrokerProcess(cwd=workdir, timeout=120)
        flags = [
            "-cap",
            "2GiB",
            "-addr",
            "127.0.0.1:0",
            "-http",
            "127.0.0.1:18161",
            "-file",
            "curb.log",
            "-connect-timeout",
            "0",
            "-prefetch",
            str(args.window),
        ]
        try:
            port = broker.start(flags)
            ws, tcp = "ws://127.0.0.1:18161/ws", f"127.0.0.1:{port}"
            for name, url in (("tcp", tcp), ("ws", ws)):
                results[f"{name} produce"] = asyncio.run(
                    produce(url, args.messages, body, args.window, "/queue/curb", {}, None)
                )
                results[f"{name} consume"] = asyncio.run(
                    consume(url, args.messages, args.window, "/queue/curb", {}, None)
                )
            rate, _, bad = wrk("http://127.0.0.1:18161/v2/bench/queues/bench/messages", args.http_seconds, body, {})
            results["http"], results["http bad"] = rate, bad
            before, after = asyncio.run(idle_rss(ws, broker.pid))
            results["rss idle"], results["rss 1000"] = before, after
        finally:
            broker.stop()
    print(f"  Curb: {json.dumps({k: round(v) for k, v in results.items()})}", flush=True)
    peer: dict[str, float] = {}
    if use_rabbit and peers is not None:
        if not args.rabbitmq_running:
            print(rabbit(peers, "start"), flush=True)
        try:
            rabbit_http("PUT", "/api/queues/%2F/bench", {"durable": True})
            ws = "ws://127.0.0.1:15674/ws"
            peer["ws produce"] = asyncio.run(
                produce(ws, args.messages, body, args.window, "/queue/bench", RABBIT_HEADERS, "guest")
            )
            peer["ws consume"] = asyncio.run(
                consume(ws, args.messages, args.window, "/queue/bench", RABBIT_HEADERS, "guest")
            )
            publish = json.dumps(
                {
                    "properties": {"delivery_mode": 2},
                    "routing_key": "bench",
                    "payload": body.decode(),
                    "payload_encoding": "string",
                }
            )
            rate, _, bad = wrk(
                "http://127.0.0.1:15672/api/exchanges/%2F/amq.default/publish",
                args.http_seconds,
                publish.encode(),
                {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"},
            )
            peer["http"], peer["http bad"] = rate, bad
            rabbit_http("DELETE", "/api/queues/%2F/bench/contents")
            print(f"  RabbitMQ: {json.dumps({k: round(v) for k, v in peer.items()})}", flush=True)
            pid = int(rabbit(peers, "pid"))
            try:
                before, after = asyncio.run(idle_rss(ws, pid))
                peer["rss idle"], peer["rss 1000"] = before, after
            except (OSError, TimeoutError) as err:
                print(f"  RabbitMQ: {IDLE_SOCKETS:,} idle WebSockets could not be opened: {err!r}", flush=True)
        finally:
            if not args.rabbitmq_running:
                rabbit(peers, "stop")
    row("WS produce, receipt each", results["ws produce"], peer.get("ws produce"))
    row("WS consume + ACK", results["ws consume"], peer.get("ws consume"))
    row("TCP produce, receipt each (Curb)", results["tcp produce"], None)
    row("TCP consume + ACK (Curb)", results["tcp consume"], None)
    row("HTTP publish, 64 keep-alive", results["http"], peer.get("http"), "req/s")
    print(f"  non-2xx answers: Curb {results['http bad']:.0f}, RabbitMQ {peer.get('http bad', 0):.0f}")
    row(
        "RSS, 1,000 idle WebSockets",
        (results["rss 1000"] - results["rss idle"]) / 1024,
        (peer["rss 1000"] - peer["rss idle"]) / 1024 if "rss 1000" in peer else None,
        "MiB more",
    )
    print(
        f"  WS / TCP (Curb): produce {results['ws produce'] / results['tcp produce']:.0%}, "
        f"consume {results['ws consume'] / results['tcp consume']:.0%}"
    )


if __name__ == "__main__":
    main()
