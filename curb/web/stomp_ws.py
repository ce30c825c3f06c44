"""STOMP over WebSocket at /ws, as RabbitMQ's Web-STOMP serves it: a thin adapter over curb.driver.

The session is the same as over TCP (curb.session, through curb.driver.Driver): the same
rules, users and permissions, limits, heart-beats and flow control. This module only
moves bytes between the WebSocket and the driver:

- In: every WebSocket message, text or binary, is bytes for the session's parser, so a
  frame may be split across messages or several merged into one; a `\\n` is a heart-beat.
  A message larger than -max-frame closes the WebSocket (1009) before it is buffered.
- Out: the session is framed, so each WebSocket message is one whole frame (a heart-beat
  is a message of one `\\n`). A frame that is UTF-8 goes as a text message, as Web-STOMP
  sends; one that is not (a binary body) as a binary message, so its bytes survive.
- Subprotocols v12.stomp, v11.stomp and v10.stomp are offered; a client that asks for
  none is served too.

Flow control, out: frames wait in `_out` for the one writer task, which awaits each send
(aiohttp waits there while the socket's buffer is full). Once OUTPUT_HELD bytes wait, the
driver is paused (`pause_writing`), so the session makes nothing more for a tab that
stops reading; the writer resumes it once `_out` is empty. In: while the driver asks to
stop reading, the reader awaits before its next receive, so aiohttp's own bounded buffer
fills and TCP stops the peer.
"""

from __future__ import annotations

import asyncio
import collections

from aiohttp import WSCloseCode, WSMsgType, web

from curb.broker import Broker
from curb.driver import Driver
from curb.session import Piece

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
# Output bytes waiting for the writer task past which the driver is paused.
OUTPUT_HELD = 64 * 1024


class WebSocketLink:
    """The driver's Link for one aiohttp WebSocket."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport | None):
        self.ws = ws
        self.transport = transport
        self.driver: Driver  # set right after, by serve
        self._out: collections.deque[Piece] = collections.deque()
        self._held = 0  # bytes in _out
        self._paused = False  # the driver was told to stop writing
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self.reading = asyncio.Event()
        self.reading.set()

    def write(self, data: Piece) -> None:
        self._out.append(data)
        self._held += len(data)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._send())
        if self._held >= OUTPUT_HELD and not self._paused:
            self._paused = True
            self.driver.pause_writing()

    async def _send(self) -> None:
        ws, out = self.ws, self._out
        try:
            while out:
                piece = bytes(out.popleft())
                self._held -= len(piece)
                try:
                    piece.decode()
                    kind = WSMsgType.TEXT
                except UnicodeDecodeError:
                    kind = WSMsgType.BINARY
                await ws.send_frame(piece, kind)
        except (ConnectionError, RuntimeError):  # the peer is gone: the reader ends too
            out.clear()
            self._held = 0
            self._closing = True
            self.reading.set()
            return
        finally:
            self._writer = None
        if self._closing:
            await ws.close()
        elif self._paused:
            self._paused = False
            self.driver.resume_writing()

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def finish(self) -> None:
        """Close once the last frames are sent (the writer closes after them)."""
        self._closing = True
        self.reading.set()
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._send())

    def abort(self) -> None:
        self._closing = True
        self.reading.set()
        if self.transport is not None:
            self.transport.abort()

    def is_closing(self) -> bool:
        return self._closing or self.ws.closed


async def serve(request: web.Request, broker: Broker, peer: str) -> web.WebSocketResponse:
    """One STOMP session over the WebSocket of this request, until either side closes."""
    ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=broker.max_frame, autoping=True)
    await ws.prepare(request)
    link = WebSocketLink(ws, request.transport)
    link.driver = driver = Driver(broker, link, peer, framed=True)
    try:
        while not link.is_closing():
            await link.reading.wait()
            message = await ws.receive()
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                data = message.data
                driver.received(data.encode() if isinstance(data, str) else data)
            elif message.type is WSMsgType.ERROR and not ws.closed:
                await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG, message=str(ws.exception()).encode()[:120])
                break
            else:  # CLOSE, CLOSING, CLOSED
                break
    finally:
        driver.lost()
        writer = link._writer
        if writer is not None:  # the last frames (an ERROR, a RECEIPT) before the close
            await writer
        if not ws.closed:
            await ws.close()
    return ws
