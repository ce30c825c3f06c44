"""curb.instance in process: a broker is a Config and an Instance, started and stopped on
the test's own event loop, with no child process."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from curb.client import Client
from curb.instance import EXIT_USAGE, Config, Instance, StartError
from curb.redelivery import Redelivery


def test_an_instance_serves_stomp_and_a_restart_on_its_file_recovers_what_was_receipted(tmp_path):
    config = Config(path=str(tmp_path / "q.log"), cap=1 << 20, addr=("127.0.0.1", 0), heartbeat_ms=0)

    def produce(port: int) -> None:
        with Client("127.0.0.1", port) as client:
            client.send(b"kept", receipt="r1")
            client.wait_receipt("r1", timeout=10)

    def consume(port: int) -> bytes:
        with Client("127.0.0.1", port) as client:
            client.subscribe(ack="client-individual")
            frame = client.receive(timeout=10)
            assert frame is not None, "the recovered message was not delivered"
            return frame.body

    async def run() -> tuple[int, bytes, int]:
        async with Instance(config) as first:
            await asyncio.to_thread(produce, first.addresses[0][1])
            sent = first.metrics.sent
        async with Instance(config) as second:
            assert second.log.core.recovery.messages == 1
            body = await asyncio.to_thread(consume, second.addresses[0][1])
            status = await second.stop()
        return sent, body, status

    sent, body, status = asyncio.run(run())
    assert (sent, body, status) == (1, b"kept", 0)


def test_a_port_in_use_is_a_start_error_and_leaves_the_log_unopened(tmp_path):
    """Listeners come before the log, so a taken port is refused before a recovery, and
    the log file is not even made."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = Config(path=str(tmp_path / "q.log"), addr=("127.0.0.1", port))
        with pytest.raises(StartError) as raised:
            asyncio.run(Instance(config).start())
    assert raised.value.status == EXIT_USAGE and f":{port}" in raised.value.line and "-addr" in raised.value.line
    assert not (tmp_path / "q.log").exists()


def test_request_stop_ends_wait_and_stop_drains_to_status_0(tmp_path):
    said: list[str] = []
    config = Config(path=str(tmp_path / "q.log"), cap=1 << 20, addr=("127.0.0.1", 0))

    async def run() -> int:
        curb = Instance(config, events=lambda event, text, **fields: said.append(event))
        await curb.start()
        asyncio.get_running_loop().call_later(0.01, curb.request_stop)
        await asyncio.wait_for(curb.wait(), 5)
        return await curb.stop()

    assert asyncio.run(run()) == 0
    assert said[0] == "recovered" and said[-3:] == ["listening", "stopping", "stopped"]


def test_the_start_up_line_counts_every_state_a_recovered_message_can_be_in(tmp_path):
    """rdy, delayed and dead messages are all recovered, and the line says how many of each."""
    config = Config(path=str(tmp_path / "q.log"), cap=1 << 20, addr=("127.0.0.1", 0), heartbeat_ms=0)
    lines: list[tuple[str, dict]] = []

    def produce(port: int) -> None:
        with Client("127.0.0.1", port) as client:
            client.send(b"poison", receipt="r1")
            client.send(b"ready", receipt="r2")
            for n in range(2):
                client.send(b"later", headers={"curb-delay": "3600000"}, receipt=f"d{n}")
            client.wait_receipt("d1", timeout=10)
            client.subscribe(ack="client-individual", prefetch=1)
            poison = client.receive(timeout=10)
            assert poison is not None and poison.body == b"poison"
            client.unsubscribe()
            client.nack(poison.headers["ack"], receipt="n1")  # past -max-deliveries 1: dead
            client.wait_receipt("n1", timeout=10)

    async def run() -> None:
        async with Instance(replace(config, redelivery=Redelivery(max_deliveries=1))) as first:
            await asyncio.to_thread(produce, first.addresses[0][1])
        async with Instance(config, events=lambda event, text, **fields: lines.append((text, fields))):
            pass

    asyncio.run(run())
    [(text, fields)] = [(text, fields) for text, fields in lines if text.startswith("recovered")]
    assert text.startswith("recovered 4 messages (1 rdy, 2 delayed, 1 dead; "), text
    assert (fields["messages"], fields["rdy"], fields["delayed"], fields["dead"]) == (4, 1, 2, 1)
