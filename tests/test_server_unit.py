"""Session rules that need a failing disk, driven without sockets: the sans-I/O session
over a real log whose sync fails."""

import asyncio

from curb import server
from curb.broker import Broker, BrokerEvents
from curb.log import Log
from curb.server import Connection
from curb.session import Session


def test_a_disconnect_receipt_is_not_sent_when_the_sync_fails(tmp_path):
    async def run():
        events = BrokerEvents()
        log = Log(tmp_path / "q.log", 64 * 1024, events=events)
        log.start(asyncio.get_running_loop())
        broker = events.broker = Broker(log.core)
        session = Session(broker, 0.0)
        session.receive_data(b"CONNECT\naccept-version:1.2\n\n\0DISCONNECT\nreceipt:bye\n\n\0", 0.0)
        log.core.fail("fdatasync failed: injected")
        broker.passes.flush_out()
        await log.close()
        return session

    session = asyncio.run(run())
    sent = session.data_to_send(1.0)
    assert sent.startswith(b"CONNECTED")
    assert b"RECEIPT" not in sent
    assert session.close_wanted == "close"


class FakeTransport(asyncio.Transport):
    """What Connection uses of a transport, recorded."""

    def __init__(self, eof: bool | str = False) -> None:
        super().__init__()
        self.sent = b""
        self.closed = False
        self.reading = True
        self.eof_supported = eof
        self.eof = False
        self.aborted = False

    def can_write_eof(self) -> bool:
        return bool(self.eof_supported)

    def write_eof(self) -> None:
        if self.eof_supported == "reset":
            raise OSError(107, "Transport endpoint is not connected")
        self.eof = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def test_the_glue_stops_reading_while_the_unsent_output_is_above_its_bound_and_closes_when_asked(tmp_path):
    long_receipt = "r" * 15000
    answers = b"".join(
        b"SUBSCRIBE\nid:s\ndestination:/queue/q\nreceipt:%s\n\n\0UNSUBSCRIBE\nid:s\nreceipt:%s\n\n\0"
        % (long_receipt.encode(), long_receipt.encode())
        for _ in range(10)
    )

    async def run() -> tuple[FakeTransport, list[bool]]:
        events = BrokerEvents()
        log = Log(tmp_path / "q.log", 64 * 1024, events=events)
        log.start(asyncio.get_running_loop())
        events.broker = Broker(log.core)
        connection = Connection(events.broker)
        transport = FakeTransport()
        connection.connection_made(transport)
        connection.data_received(b"CONNECT\naccept-version:1.2\n\n\0")
        seen = []
        connection.pause_writing()
        seen.append(transport.reading)  # a full socket alone does not stop reading
        connection.data_received(answers)  # 300 KB of receipts, none of them written
        await asyncio.sleep(0)
        seen.append(transport.reading)
        seen.append(len(transport.sent) < 1000)  # nothing was written while paused
        connection.resume_writing()
        seen.append(transport.reading)
        connection.data_received(b"FROB\n\n\0")
        await asyncio.sleep(0)
        connection.connection_lost(None)
        await log.close()
        return transport, seen

    transport, seen = asyncio.run(run())
    assert seen == [True, False, True, True]
    assert transport.sent.startswith(b"CONNECTED") and transport.sent.count(b"RECEIPT") == 20
    assert b"ERROR" in transport.sent and transport.closed


def test_after_an_error_the_glue_shuts_writing_drops_input_and_closes_after_the_linger(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "LINGER_SECONDS", 0.01)

    async def run() -> tuple[FakeTransport, bool, bytes]:
        events = BrokerEvents()
        log = Log(tmp_path / "q.log", 64 * 1024, events=events)
        log.start(asyncio.get_running_loop())
        events.broker = Broker(log.core)
        connection = Connection(events.broker)
        transport = FakeTransport(eof=True)
        connection.connection_made(transport)
        connection.data_received(b"CONNECT\naccept-version:1.2\n\n\0FROB\n\n\0")
        await asyncio.sleep(0)
        answered = transport.sent
        aborted_at_once = transport.aborted
        connection.data_received(b"SEND\ndestination:/q\n\nmore from a client that did not listen\0")
        await asyncio.sleep(0.2)
        connection.connection_lost(None)
        await log.close()
        return transport, aborted_at_once, answered

    transport, aborted_at_once, answered = asyncio.run(run())
    assert b"ERROR" in answered and transport.eof and transport.reading
    assert not aborted_at_once, "no reset while the peer may still be reading the ERROR"
    assert transport.sent == answered, "what comes after the ERROR is dropped"
    assert transport.aborted, "closed once the linger is over"


def test_a_peer_reset_before_the_linger_is_aborted_without_an_exception(tmp_path):
    async def run() -> FakeTransport:
        events = BrokerEvents()
        log = Log(tmp_path / "q.log", 64 * 1024, events=events)
        log.start(asyncio.get_running_loop())
        broker = events.broker = Broker(log.core)
        connection = Connection(broker)
        transport = FakeTransport(eof="reset")
        connection.connection_made(transport)
        connection.data_received(b"FROB\n\n\0")
        broker.passes.flush_out()
        connection.connection_lost(None)
        await log.close()
        return transport

    transport = asyncio.run(run())
    assert transport.aborted and b"ERROR" in transport.sent


def test_a_tls_connection_reads_into_32_kib_not_asyncios_256():
    """asyncio keeps a read buffer of SSLProtocol.max_size for each TLS connection's whole
    life; the server module sets it to two TLS records' worth (curb.server)."""
    import asyncio.sslproto

    assert asyncio.sslproto.SSLProtocol.max_size == server.TLS_READ_BUFFER == 32 * 1024
