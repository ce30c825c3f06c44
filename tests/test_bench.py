"""The benchmark: its verification (unit), a smoke run against a real Curb, and failure
against a broker that loses a message it acknowledged."""

from __future__ import annotations

import json
import os
import platform
import pstats
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from benchmark import instructions
from benchmark.bodies import SEQ_STRIDE, BodyReader, Tally, make_body
from benchmark.incoming import Incoming, ack_frame, messages, receipt_ids
from benchmark.target import BrokerError

from curb.client import StompError
from curb.frame import FrameParser, encode

TESTS = Path(__file__).resolve().parent


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m benchmark ARGS`, as bin/bench runs it: with tests/ on the path. The
    timeout only stops a hang: a loaded machine runs the quick benchmark several times
    slower than a quiet one, and that is no failure."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "benchmark", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": path},
    )


def test_body_reader_returns_the_seq_of_a_good_body_and_counts_the_rest():
    reader = BodyReader("run1", 40)
    assert reader.seq(make_body("run1", 7, 40)) == 7
    assert reader.seq(make_body("run2", 7, 40)) is None
    assert reader.seq(make_body("run1", 7, 40)[:-1] + b"x") is None
    assert reader.seq(b"run1:x:") is None
    assert (reader.foreign, reader.altered) == (1, 2)


def test_body_reader_accepts_exactly_the_bodies_that_were_made():
    reader = BodyReader("r", 12)
    for seq in (0, 7, 123456789012):
        assert reader.seq(make_body("r", seq, 12)) == seq
    made = make_body("r", 42, 12)
    for bad in (
        b"r:042:......",
        b"r:42:........",
        b"r:42:......",
        b"r:42:...x...",
        b"r:42........",
        b"r::.........",
        b"r:+4:.......",
    ):
        assert bad != made and reader.seq(bad) is None
    assert (reader.foreign, reader.altered) == (0, 7)


def test_tally_finds_lost_duplicated_and_unexpected_messages():
    tally = Tally({0: 3, 2: 2})
    tally.add([0, 2, 2, 2 * SEQ_STRIDE + 1, 5, SEQ_STRIDE])
    verdict = tally.verdict()
    assert (verdict.expected, verdict.unique, verdict.duplicates, verdict.unexpected) == (5, 3, 1, 2)
    assert list(tally.missing()) == [1, 2 * SEQ_STRIDE]
    assert "2 of 5 messages lost" in "; ".join(verdict.problems())


def test_tally_of_everything_once_has_no_problems():
    tally = Tally({1: 2})
    tally.add([SEQ_STRIDE + 1, SEQ_STRIDE])
    assert tally.verdict().problems() == [] and len(tally.missing()) == 0


class FakeBroker:
    """A STOMP broker just good enough for the benchmark's produce and drain steps: one
    queue, MESSAGEs pushed to a subscriber without flow control, ACKs ignored. It can
    drop or duplicate the n-th SEND (after acknowledging it with a RECEIPT)."""

    def __init__(self, lose: int | None = None, duplicate: int | None = None):
        self.lose = lose
        self.duplicate = duplicate
        self.sends = 0
        self.messages: queue.Queue[bytes] = queue.Queue()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        parser = FrameParser()
        lock = threading.Lock()
        closed = threading.Event()

        def send(data: bytes) -> None:
            with lock:
                sock.sendall(data)

        def deliver(sub_id: str) -> None:
            for serial in range(1, sys.maxsize):
                while True:
                    try:
                        body = self.messages.get(timeout=0.02)
                        break
                    except queue.Empty:
                        if closed.is_set():
                            return
                headers = {"subscription": sub_id, "message-id": str(serial), "ack": str(serial)}
                with lock:
                    if closed.is_set():
                        self.messages.put(body)
                        return
                    sock.sendall(encode("MESSAGE", headers, body))

        try:
            while not closed.is_set() and (data := sock.recv(65536)):
                for frame in parser.feed(data):
                    if frame.command in ("CONNECT", "STOMP"):
                        send(encode("CONNECTED", {"version": "1.2"}))
                    elif frame.command == "SEND":
                        self.sends += 1
                        copies = (self.sends != self.lose) + (self.sends == self.duplicate)
                        for _ in range(copies):
                            self.messages.put(frame.body)
                    elif frame.command == "SUBSCRIBE":
                        threading.Thread(target=deliver, args=(frame.headers["id"],), daemon=True).start()
                    if "receipt" in frame.headers:
                        send(encode("RECEIPT", {"receipt-id": frame.headers["receipt"]}))
                    if frame.command == "DISCONNECT":
                        with lock:
                            closed.set()
        finally:
            closed.set()
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def fake_broker(request):
    broker = FakeBroker(**request.param)
    yield broker
    broker.close()


@pytest.mark.parametrize("fake_broker", [{"lose": 50}], indirect=True)
def test_a_broker_that_loses_an_acknowledged_message_fails_the_benchmark(fake_broker, tmp_path):
    result = bench(
        "--addr",
        f"127.0.0.1:{fake_broker.port}",
        "--quick",
        "--only",
        "produce-w1",
        "--timeout",
        "1",
        "--dir",
        str(tmp_path),
    )
    assert result.returncode == 1
    assert "FAILED: produce-w1 on curb: 1 of 100 messages lost" in result.stderr
    assert "produce, receipt each" not in result.stdout


@pytest.mark.parametrize("fake_broker", [{"duplicate": 10}], indirect=True)
def test_duplicates_are_reported_but_allowed(fake_broker, tmp_path):
    result = bench(
        "--addr",
        f"127.0.0.1:{fake_broker.port}",
        "--quick",
        "--only",
        "produce-w1",
        "--timeout",
        "1",
        "--dir",
        str(tmp_path),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["duplicates"] == {"produce-w1 on curb": 1}
    assert [row["key"] for row in report["rows"]] == ["produce-w1"]


def test_quick_run_against_curb_prints_the_table(tmp_path):
    result = bench("--quick", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Curb benchmark: 100-byte bodies, 1 run")
    for label in (
        "produce, receipt each, 1 producer, window 1",
        "consume + ACK, prefetch 256",
        "ping-pong SEND -> MESSAGE, p99",
        "broker RSS, 2,000 queued",
        "restart with 2,000 queued",
        "balanced 2+2, 90% full / empty",
        "disk: append + fdatasync, 64 records per sync",
    ):
        row = next(line for line in lines if line.startswith(label))
        assert row.split()[-1][0].isdigit(), row


class ChunkedClient:
    """Stands in for a Client's raw reads: hands out the given chunks, keeps what is unread."""

    holds_input = False  # no frames parsed by the client itself

    def __init__(self, *chunks: bytes):
        self.chunks = list(chunks)
        self.unread_bytes = b""

    def receive_bytes(self, timeout: float) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def unread(self, data: bytes) -> None:
        self.unread_bytes += data


def test_messages_of_any_shape_give_body_and_ack_id_across_reads():
    plain = encode("MESSAGE", {"subscription": "0", "message-id": "7", "ack": "a7"}, b"x\0y")
    unsized = b"MESSAGE\nmessage-id:8\n\nbody8\0\n"
    escaped = encode("MESSAGE", {"message-id": "ID:host-1:1", "destination": "/q\\b"}, b"e")
    crlf = b"MESSAGE\r\nmessage-id:9\r\n\r\nc\0"
    stream = plain + unsized + escaped + crlf + plain
    incoming = Incoming(ChunkedClient(stream[:30], stream[30:-10], stream[-10:]), 1 << 20)  # type: ignore[arg-type]
    got = []
    while (batch := messages(incoming, 0)) is not None:
        got += batch
    assert got == [(b"x\0y", b"a7"), (b"body8", b"8"), (b"e", b"ID:host-1:1"), (b"c", b"9"), (b"x\0y", b"a7")]
    assert ack_frame(b"ID:host-1:1") == encode("ACK", {"id": "ID:host-1:1"})
    assert ack_frame(b"8") == encode("ACK", {"id": "8"})


def test_a_large_message_cut_by_reads_is_completed_in_one_read_call():
    body = b"b" * (1 << 20)
    frame = encode("MESSAGE", {"message-id": "1", "ack": "1"}, body)
    chunks = [frame[:100]] + [frame[i : i + 65536] for i in range(100, len(frame), 65536)]
    incoming = Incoming(ChunkedClient(*chunks), 2 << 20)  # type: ignore[arg-type]
    assert messages(incoming, 0) == []  # its head came: the frame's length is known
    assert messages(incoming, 0) == [(body, b"1")]  # the rest gathered, joined once


def test_receipts_are_read_in_runs_and_other_frames_fail():
    stream = b"".join(encode("RECEIPT", {"receipt-id": str(n)}) for n in range(3))
    incoming = Incoming(ChunkedClient(stream[:-3], stream[-3:] + encode("ERROR", {"message": "full"})), 1 << 20)  # type: ignore[arg-type]
    assert receipt_ids(incoming, 0) == [b"0", b"1"]
    with pytest.raises(StompError, match="full"):
        receipt_ids(incoming, 0)
    incoming = Incoming(ChunkedClient(stream[:5]), 1 << 20)  # type: ignore[arg-type]
    assert receipt_ids(incoming, 0) == []  # the cut frame is kept
    with pytest.raises(BrokerError, match="no frame"):
        receipt_ids(incoming, 0)
    incoming.hand_back()
    assert incoming.client.unread_bytes == stream[:5]  # type: ignore[attr-defined]


ANNOTATED = """\
--------------------------------------------------------------------------------
58,958,468 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
60,500,517 (102.6%)  /src/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/lib/libpython3.11.so.1.0]
58,511,724 (99.24%)  /src/Python/context.c:context_run [/lib/libpython3.11.so.1.0]
 4,106,177 ( 6.96%)  /src/Objects/bytesobject.c:bytes_mod [/lib/libpython3.11.so.1.0]
 4,100,000 ( 6.95%)  /src/Include/object.h:bytes_mod
 1,958,719 ( 3.32%)  /src/Objects/clinic/unicodeobject.c.h:unicode_split [/lib/libpython3.11.so.1.0]
"""


def test_callgrind_lines_become_per_message_costs_of_the_functions_that_do_work():
    small = instructions.parse_annotated(ANNOTATED)
    assert small == {
        "_PyEval_EvalFrameDefault'2": 60_500_517,
        "context_run": 58_511_724,
        "bytes_mod": 4_106_177,  # listed under two files: counted once
        "unicode_split": 1_958_719,
    }
    large = {name: cost * 3 for name, cost in small.items()}
    # the interpreter's dispatch is in every call's inclusive cost, so it is left out
    top = instructions._top(instructions._diff(small, large), 1_000)
    assert top == [("bytes_mod", 8_212.354), ("unicode_split", 3_917.438)]


def test_python_shares_rank_curbs_functions_by_their_growth_in_cpu_time():
    def stats(scale: float) -> pstats.Stats:
        profile: dict[tuple[str, int, str], tuple[int, int, float, float, dict]] = {
            (f"{instructions.CURB_DIR}/cli.py", 1, "main"): (1, 1, 0.5 + 2.0 * scale, 8.5 * scale, {}),
            (f"{instructions.CURB_DIR}/frame.py", 10, "feed"): (9, 9, 3.0 * scale, 4.0 * scale, {}),
            (f"{instructions.CURB_DIR}/session.py", 20, "receive_data"): (9, 9, 1.0 * scale, 6.0 * scale, {}),
            (f"{instructions.CURB_DIR}/router/links.py", 30, "forward"): (9, 9, 1.0 * scale, 1.0 * scale, {}),
            ("/lib/asyncio/events.py", 78, "_run"): (9, 9, 1.0 + 2.0 * scale, 6.0 * scale, {}),
        }
        return cast(pstats.Stats, SimpleNamespace(stats=profile))

    # CPU time grows by 2 + 3 + 1 + 1 + 2; main, called once, holds all of it; the loop's
    # _run is not Curb's; a subpackage's function keeps its folder
    shares = instructions.python_shares(stats(1.0), stats(2.0))
    assert shares == [
        ("session.py:20(receive_data)", 6 / 9),
        ("frame.py:10(feed)", 4 / 9),
        ("router/links.py:30(forward)", 1 / 9),
    ]


def test_instructions_refuses_a_broker_it_does_not_start():
    result = bench("--instructions", "--addr", "127.0.0.1:1", timeout=300)
    assert result.returncode == 2
    assert "--instructions counts a Curb it starts itself" in result.stderr
    result = bench("--instructions", "--only", "mixed", timeout=300)
    assert result.returncode == 2
    assert "unknown workload(s) mixed; choose from produce-4x256, produce-w1, consume-p256, pingpong" in result.stderr


def _measured(key: str, per_message: float) -> instructions.Measured:
    return instructions.Measured(key, key, per_message, [], [])


def test_the_instruction_check_fails_a_workload_more_than_the_margin_over_its_baseline():
    baseline = {
        "python": platform.python_version(),
        "instructions_per_message": {"produce-4x256": 100_000, "consume-p256": 100_000},
    }
    within = [_measured("produce-4x256", 102_900), _measured("consume-p256", 90_000)]
    table, ok = instructions.check(within, baseline)
    assert ok, table
    over = [_measured("produce-4x256", 103_100), _measured("consume-p256", 90_000)]
    table, ok = instructions.check(over, baseline)
    assert not ok
    assert "produce-4x256" in table and "FAIL" in table.splitlines()[1]


@pytest.mark.parametrize(
    ("kind", "environ", "compiler", "fails"),
    [
        ("pure", {}, "sh", True),  # a compiler is here and nobody asked for pure: the compile failed
        ("pure", {"CURB_PURE_PYTHON": "1"}, "sh", False),  # asked for
        ("pure", {}, "no-such-compiler-here", False),  # no compiler: pure is all there is
        ("compiled", {}, "sh", False),
    ],
)
def test_the_guard_refuses_a_pure_build_that_a_failed_compile_left(monkeypatch, kind, environ, compiler, fails):
    monkeypatch.setattr(instructions, "build_kind", lambda: kind)
    why = instructions.fell_back_to_pure(environ, compiler)
    assert bool(why) == fails and (not fails or "compiling the hot modules failed" in why)


def test_the_instruction_check_fails_a_workload_the_baseline_lacks():
    table, ok = instructions.check([_measured("pingpong", 1.0)], {"instructions_per_message": {}})
    assert not ok and "not in the baseline" in table


@pytest.mark.parametrize("kind", sorted(instructions.BASELINES))
def test_the_committed_baselines_name_every_workload_at_the_check_loads(kind):
    baseline = instructions.read_baseline(instructions.BASELINES[kind])
    assert baseline["loads"] == list(instructions.CHECK_LOADS)
    figures = baseline["instructions_per_message"]
    assert isinstance(figures, dict) and set(figures) == set(instructions.WORKLOADS)
