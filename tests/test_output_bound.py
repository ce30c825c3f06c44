"""The output path's bounds, checked by structure rather than by time: what waits unsent
for a connection stays under OUTPUT_LIMIT plus one frame whatever the message size or
the prefetch, the pump stops for a connection at that bound while credit remains, a
large body reaches the transport as views of the payload read (never copied), and the
transport is handed pieces of at most PIECE_BYTES only while its buffer is empty, so
no write moves a backlog."""

from __future__ import annotations

import asyncio

from test_session_rules import World

from curb.broker import Broker
from curb.broker_config import BrokerConfig
from curb.frame import FRAME_END, FrameParser
from curb.log.cursor import Record
from curb.output import PIECE_BYTES
from curb.server import Connection
from curb.session import OUTPUT_LIMIT

MB = 1 << 20
FRAME = MB + 300  # one MESSAGE frame of a 1 MB body, its headers included


def queue_large(world: World, count: int) -> bytes:
    """`count` messages of a 1 MB body, sharing one stored payload."""
    stored = b"\n" + b"x" * MB
    log = world.log
    for _ in range(count):
        log.ready.append(Record(log.next_id, 0, len(stored), 0, 0, stored))
        log.next_id += 1
    return stored


def subscribed_to_large(count: int, ack: str):
    """A connected session subscribed at prefetch 64 to a queue of `count` 1 MB messages,
    after one pump pass: (world, peer, the stored payload)."""
    world = World()
    peer = world.session()
    peer.connect()
    stored = queue_large(world, count)
    peer.send("SUBSCRIBE", id="s", destination="/queue/curb", ack=ack, prefetch_count="64")
    world.run_scheduled()
    return world, peer, stored


def test_a_slow_reader_of_large_messages_at_prefetch_64_holds_at_most_the_bound_plus_one_frame():
    world, peer, stored = subscribed_to_large(100, "client-individual")
    session, queue = peer.session, world.broker.queue
    assert queue.wip_count == 1, "the first 1 MB frame passed the bound: no more while credit remains"
    assert not session.writable and not session.reading
    assert OUTPUT_LIMIT <= session.unsent <= OUTPUT_LIMIT + FRAME
    parser, frames, copied = FrameParser(max_frame_bytes=2 * MB), [], 0
    while (piece := session.next_output(0.0)) is not None:  # the reader takes a piece at a time
        assert len(piece) <= PIECE_BYTES
        if isinstance(piece, memoryview) and piece.obj is stored:
            pass  # a view of the payload as the log holds it
        elif len(piece) > 4096:
            copied += len(piece)
        frames += parser.feed(bytes(piece))
        world.run_scheduled()
        assert session.unsent <= OUTPUT_LIMIT + FRAME
        assert queue.wip_count <= 64
    assert len(frames) == 64 and queue.wip_count == 64, "the reader got its whole prefetch, no more"
    assert all(frame.body == stored[1:] for frame in frames)
    assert copied == 0, "no body was copied into its frame"


def test_an_auto_message_is_done_once_the_last_piece_of_its_frame_is_handed_over():
    world, peer, _ = subscribed_to_large(1, "auto")
    session = peer.session
    taken = 0
    while session.unsent > len(FRAME_END):
        taken += len(session.next_output(0.0) or b"")
        assert world.log.acked == []
    assert session.next_output(0.0) == FRAME_END
    assert world.log.acked == [1] and taken > MB


class ShortTransport(asyncio.Transport):
    """asyncio's TCP transport as the glue meets it: a write sends what the socket has room
    for and buffers (copies) the rest, and then pauses the protocol until `drain` has sent
    the buffer. Records each write's size, the bytes it copied and its largest buffer."""

    def __init__(self, protocol: Connection, room: int) -> None:
        super().__init__()
        self.protocol, self.room = protocol, room
        self.buffer = bytearray()
        self.sent = bytearray()
        self.writes: list[int] = []
        self.copied_per_write: list[int] = []
        self.peak_buffer = 0

    def write(self, data) -> None:
        self.writes.append(len(data))
        if not self.buffer:
            taken = min(self.room, len(data))
            self.sent += data[:taken]
            data = data[taken:]
        self.copied_per_write.append(len(data))
        self.buffer += data
        self.peak_buffer = max(self.peak_buffer, len(self.buffer))
        if self.buffer:
            self.protocol.pause_writing()

    def drain(self) -> None:
        """The peer read some: the socket takes `room` bytes of the buffer."""
        self.sent += self.buffer[: self.room]
        del self.buffer[: self.room]
        if not self.buffer:
            self.protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.buffer)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # this transport pauses as soon as anything is left unsent, as a mark of 0 does

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_the_glue_writes_bounded_pieces_only_into_an_empty_transport_buffer():
    async def run() -> tuple[ShortTransport, list[int]]:
        world = World()
        world.broker = world.log.events.broker = Broker(world.log, BrokerConfig(heartbeat_ms=0))  # on this event loop
        queue_large(world, 24)
        connection = Connection(world.broker)
        transport = ShortTransport(connection, room=200_000)
        connection.connection_made(transport)
        connection.data_received(
            b"CONNECT\naccept-version:1.2\n\n\0"
            b"SUBSCRIBE\nid:s\ndestination:/queue/curb\nack:client-individual\nprefetch-count:16\n\n\0"
        )
        held = []
        for _ in range(150):  # a slow reader: 200 KB a turn, 30 MB in all
            await asyncio.sleep(0)
            held.append(connection.session.unsent + len(transport.buffer))
            transport.drain()
        return transport, held

    transport, held = asyncio.run(run())
    frames = FrameParser(max_frame_bytes=2 * MB).feed(bytes(transport.sent))
    assert [f.headers["message-id"] for f in frames[1:]] == [str(i) for i in range(1, 17)]
    assert max(transport.writes) <= PIECE_BYTES
    assert max(transport.copied_per_write) <= PIECE_BYTES and transport.peak_buffer <= PIECE_BYTES
    assert max(held) <= OUTPUT_LIMIT + FRAME, "unsent output, the session's and the transport's, stays bounded"


def test_draining_the_output_of_a_closing_session_makes_no_message_after_its_error():
    world, peer, _ = subscribed_to_large(10, "client-individual")
    assert not peer.session.writable, "the bound stopped the deliveries"
    peer.feed(b"FROB\n\n\0")  # a bad frame: ERROR, then the output is drained at once
    world.run_scheduled()
    frames = FrameParser(max_frame_bytes=2 * MB).feed(peer.session.data_to_send(0.0))
    assert [f.command for f in frames] == ["MESSAGE", "ERROR"]
    assert world.broker.queue.wip_count == 1
