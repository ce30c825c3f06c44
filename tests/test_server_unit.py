"""Session rules that need a failing disk, driven without sockets: the sans-I/O session
over a real log whose sync fails."""

import asyncio

from curb.broker import Broker
from curb.log import Log
from curb.session import Session


def test_a_disconnect_receipt_is_not_sent_when_the_sync_fails(tmp_path):
    async def run():
        log = Log(tmp_path / "q.log", 64 * 1024)
        log.start(asyncio.get_running_loop())
        broker = Broker(log)
        session = Session(broker, 0.0)
        session.receive_data(b"CONNECT\naccept-version:1.2\n\n\0DISCONNECT\nreceipt:bye\n\n\0", 0.0)
        log._fail("fdatasync failed: injected")
        broker.flush_out()
        await log.close()
        return session

    session = asyncio.run(run())
    sent = session.data_to_send(1.0)
    assert sent.startswith(b"CONNECTED")
    assert b"RECEIPT" not in sent
    assert session.close_wanted == "close"
