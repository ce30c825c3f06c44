"""Session rules that need a failing disk, driven without sockets: a fake transport and a
log whose sync fails."""

import asyncio

from curb.log import Log
from curb.server import Broker, Session


class FakeTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.sent = b""
        self.closed = False

    def write(self, data):
        self.sent += data

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass


def test_a_disconnect_receipt_is_not_sent_when_the_sync_fails(tmp_path):
    async def run():
        log = Log(tmp_path / "q.log", 64 * 1024)
        log.start(asyncio.get_running_loop())
        session = Session(Broker(log))
        transport = FakeTransport()
        session.connection_made(transport)
        session.data_received(b"CONNECT\naccept-version:1.2\n\n\0DISCONNECT\nreceipt:bye\n\n\0")
        log._fail("fdatasync failed: injected")
        session.broker._flush_out()
        await log.close()
        return transport

    transport = asyncio.run(run())
    assert transport.sent.startswith(b"CONNECTED")
    assert b"RECEIPT" not in transport.sent
    assert transport.closed
