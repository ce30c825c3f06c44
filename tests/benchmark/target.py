"""Where a broker under test listens and what its STOMP dialect needs, and the few steps the
load processes take on a connection. The connection itself is Curb's own client
(`curb.client.Client`), shared with the Spark connector and the tests: it buffers writes
and sends them in one system call when it next waits for the broker, so a load process
pipelines hundreds of frames encoded before the clock starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from curb.client import Client
from curb.frame import Frame, FrameParser, encode

DEFAULT_MAX_FRAME = FrameParser().max_frame_bytes


class BrokerError(Exception):
    """The broker sent what the benchmark did not expect, fell silent, or failed to start or stop."""


@dataclass(frozen=True)
class Target:
    """Where a broker listens and what its STOMP dialect needs (headers, credentials)."""

    host: str
    port: int
    dest: str = "/queue/bench"
    send_headers: tuple[tuple[str, str], ...] = ()
    sub_headers: tuple[tuple[str, str], ...] = ()
    prefetch_header: str = "prefetch-count"
    login: str | None = None
    passcode: str | None = None

    def send_frame(self, body: bytes, receipt: str | None = None) -> bytes:
        headers = [("destination", self.dest), *self.send_headers]
        if receipt is not None:
            headers.append(("receipt", receipt))
        return encode("SEND", headers, body)

    def connect(self, timeout: float, max_body: int = 0) -> tuple[Client, Frame]:
        """A connected client (no heart-beats, virtual host "/") and the CONNECTED frame."""
        client = Client(
            self.host,
            self.port,
            login=self.login,
            passcode=self.passcode,
            timeout=timeout,
            virtual_host="/",
            max_frame_bytes=max_frame_bytes(max_body),
        )
        return client, client.connect()

    def subscribe(
        self, client: Client, prefetch: int | None, sub_id: str = "0", ack: str = "client-individual"
    ) -> None:
        """SUBSCRIBE to the target's destination, its prefetch bound in its own header."""
        headers = {self.prefetch_header: str(prefetch)} if prefetch is not None else {}
        headers.update(self.sub_headers)
        client.subscribe(sub_id, self.dest, ack, headers=headers)


def max_frame_bytes(max_body: int) -> int:
    """The largest frame a load process accepts from the broker, for bodies of up to `max_body` bytes."""
    return max(DEFAULT_MAX_FRAME, 2 * max_body)


def next_frame(client: Client, timeout: float) -> Frame:
    """The next frame; BrokerError if none comes within `timeout` seconds."""
    frame = client.receive(timeout)
    if frame is None:
        raise BrokerError(f"no frame from the broker for {timeout:g} s")
    return frame


def ack(client: Client, message: Frame, receipt: str | None = None) -> None:
    """Queue the ACK of a MESSAGE (STOMP 1.2 `ack` header, else its message-id)."""
    headers = message.headers
    client.ack(headers.get("ack") or headers["message-id"], receipt)


def wait_receipt(client: Client, receipt: str, on_frame: Callable[[Frame], None] | None = None) -> None:
    """Block until RECEIPT `receipt`; frames before it go to on_frame (or are an error)."""
    for frame in client.wait_receipt(receipt):
        if on_frame is None:
            raise BrokerError(f"unexpected {frame.command} while waiting for receipt {receipt}")
        on_frame(frame)


def close(client: Client, on_frame: Callable[[Frame], None] | None = None) -> None:
    """DISCONNECT with a receipt, so that every frame written before it has taken effect;
    frames that arrive before the receipt go to on_frame (or are an error)."""
    try:
        client.write(encode("DISCONNECT", {"receipt": "bye"}))
        wait_receipt(client, "bye", on_frame)
    finally:
        client.close()
