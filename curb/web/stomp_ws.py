"""STOMP over WebSocket at /ws, as RabbitMQ's Web-STOMP serves it: a thin adapter over curb.driver.

The session is the same as over TCP (curb.session, through curb.driver.Driver): the same
rules, users and permissions, limits, heart-beats and flow control. This module only
moves bytes between the WebSocket and the driver:

- In: every WebSocket message, text or binary, is bytes for the session's parser, so a
  frame may be split across messages or several merged into one; a `\\n` is a heart-beat.
  The messages that have arrived by the time the reader would wait are handed to the
  driver together, once per loop pass (`_flush_in`), as a TCP read hands it all that
  came: a client that sends one frame per message gets its frames handled, logged and
  fsynced in batches, not one pass each. A message larger than -max-frame closes the
  WebSocket (1009) before it is buffered.
- Out: the session is framed, so each WebSocket message is one whole frame (a heart-beat
  is a message of one `\\n`). A frame that is UTF-8 goes as a text message, as Web-STOMP
  sends; one that is not (a binary body) as a binary message, so its bytes survive. The
  link writes the messages to the transport itself (a server's frame is a short header and
  the bytes, unmasked) and gathers those of one loop pass into one write (`_flush_out`),
  so a pass's frames cost the socket one send, not one each; aiohttp keeps the handshake,
  pings and the close.
- Subprotocols v12.stomp, v11.stomp and v10.stomp are offered; a client that asks for
  none is served too. No compression is negotiated.

Flow control, out: once OUTPUT_HELD bytes wait (gathered, or in the transport's buffer)
the driver is paused (`pause_writing`), so the session makes nothing more for a tab that stops reading;
the link checks the buffer every DRAIN_CHECK_SECONDS while paused and resumes the driver
once it is below OUTPUT_HELD / 4. In: while the driver asks to stop reading, the reader
awaits before its next receive, so aiohttp's own bounded buffer fills and TCP stops the
peer.
"""

from __future__ import annotations

import asyncio
import struct

from aiohttp import WSCloseCode, WSMsgType, web

from curb.backend import Backend
from curb.driver import Driver
from curb.output import Piece

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
# Bytes waiting in the transport's buffer past which the driver is paused.
OUTPUT_HELD = 64 * 1024
DRAIN_CHECK_SECONDS = 0.005
_TEXT, _BINARY = 0x81, 0x82  # FIN and the opcode


def ws_frame(data: Piece) -> bytes:
    """One unmasked WebSocket message (a server's) holding `data`: text if it is UTF-8."""
    payload = bytes(data)
    try:
        payload.decode()
        first = _TEXT
    except UnicodeDecodeError:
        first = _BINARY
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", first, size) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", first, 126, size) + payload
    return struct.pack("!BBQ", first, 127, size) + payload


class WebSocketLink:
    """The driver's Link for one aiohttp WebSocket."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport):
        self.ws = ws
        self.transport = transport
        self.driver: Driver  # set right after, by serve
        self._loop = asyncio.get_running_loop()
        self._paused = False  # the driver was told to stop writing
        self._closing = False
        self._in: list[bytes] = []  # messages received, not yet handed to the driver
        self._out: list[bytes] = []  # messages written in this loop pass, not yet sent
        self._held = 0  # bytes in _out
        self._closer: asyncio.Task[bool] | None = None  # held: the loop keeps only a weak reference
        self.reading = asyncio.Event()
        self.reading.set()

    def received(self, data: bytes) -> None:
        if not self._in:
            self._loop.call_soon(self._flush_in)
        self._in.append(data)

    def _flush_in(self) -> None:
        data, self._in = b"".join(self._in), []
        self.driver.received(data)

    def write(self, data: Piece) -> None:
        if not self._out:
            self._loop.call_soon(self._flush_out)
        message = ws_frame(data)
        self._out.append(message)
        self._held += len(message)
        if not self._paused and self._held + self.transport.get_write_buffer_size() >= OUTPUT_HELD:
            self._paused = True
            self.driver.pause_writing()

    def _flush_out(self) -> None:
        """The messages of this loop pass, in one write."""
        out, self._out, self._held = self._out, [], 0
        if out and not self.transport.is_closing():
            self.transport.write(b"".join(out))
        if self._paused:
            self._check_drained()

    def _check_drained(self) -> None:
        if self.transport.is_closing() or self._out:  # the flush of the next pass checks again
            return
        if self.transport.get_write_buffer_size() < OUTPUT_HELD // 4:
            self._paused = False
            self.driver.resume_writing()
        else:
            self._loop.call_later(DRAIN_CHECK_SECONDS, self._check_drained)

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def finish(self) -> None:
        """Close (after the frames written, which the transport sends first): aiohttp
        sends the close frame and the reader sees the peer's answer."""
        self._closing = True
        self.reading.set()
        self._flush_out()
        self._closer = self._loop.create_task(self.ws.close())

    def abort(self) -> None:
        self._closing = True
        self.reading.set()
        self.transport.abort()

    def is_closing(self) -> bool:
        return self._closing or self.ws.closed


async def serve(request: web.Request, backend: Backend, peer: str) -> web.WebSocketResponse:
    """One STOMP session over the WebSocket of this request, until either side closes."""
    ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=backend.config.max_frame, compress=False)
    await ws.prepare(request)
    transport = request.transport
    assert transport is not None
    link = WebSocketLink(ws, transport)
    link.driver = driver = Driver(backend, link, peer, framed=True)
    try:
        while not link.is_closing():
            await link.reading.wait()
            message = await ws.receive()
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                data = message.data
                link.received(data.encode() if isinstance(data, str) else data)
            elif message.type is WSMsgType.ERROR and not ws.closed:
                await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG, message=str(ws.exception()).encode()[:120])
                break
            else:  # CLOSE, CLOSING, CLOSED
                break
    finally:
        if link._in:
            link._flush_in()
        driver.lost()
        if not ws.closed:
            await ws.close()
    return ws
