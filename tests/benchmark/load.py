"""The tasks a load process runs: produce, consume, ping-pong.

Each opens its own connection, pre-encodes what it can before the common start, and
reports times on the system-wide monotonic clock plus what it received (seqs as
array('q') bytes, and counts of foreign or altered bodies) for the tally.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass

from benchmark.bodies import SEQ_STRIDE, BodyReader, make_body
from benchmark.crew import Worker
from benchmark.incoming import Incoming, ack_frame, messages, receipt_ids
from benchmark.target import BrokerError, Target, ack, close, max_frame_bytes, next_frame, wait_receipt
from curb.client import StompError
from curb.frame import Frame

POLL_SECONDS = 0.05
GRACE_SECONDS = 0.2  # how long a drain that has everything it wanted waits for duplicates
GATE_SLEEP_SECONDS = 0.0002


@dataclass(frozen=True)
class Gate:
    """Keeps production and consumption within `slack` messages of each other (until the
    deadline), so a queue holds its depth: producers wait while they are ahead by `slack`
    sends, consumers while they have acknowledged `slack` more than was receipted. Both
    can never wait at once as long as 2 * slack exceeds the producers' combined window."""

    producers: tuple[int, ...]
    consumers: tuple[int, ...]
    slack: int

    def may_send(self, worker: Worker) -> bool:
        return (sum(worker.sent[i] for i in self.producers) - sum(worker.done[i] for i in self.consumers)) < self.slack

    def may_ack(self, worker: Worker) -> bool:
        return (sum(worker.done[i] for i in self.consumers) - sum(worker.done[i] for i in self.producers)) < self.slack


def produce(
    worker: Worker,
    target: Target,
    run_id: str,
    producer: int,
    size: int,
    window: int,
    timeout: float,
    count: int | None = None,
    seconds: float | None = None,
    gate: Gate | None = None,
) -> dict:
    """SEND with a receipt on each, at most `window` unreceipted: `count` messages, or as many
    as fit in `seconds`. Returns how many were sent (all receipted) and when it ended."""
    conn, _ = target.connect(timeout, size)
    base = producer * SEQ_STRIDE

    def frame(index: int) -> bytes:
        return target.send_frame(make_body(run_id, base + index, size), str(index))

    frames = [frame(index) for index in range(count)] if count is not None else None
    limit = count if count is not None else float("inf")
    me = worker.index
    incoming = Incoming(conn, max_frame_bytes(size))
    outstanding: set[bytes] = set()
    sent = 0
    start = worker.start()
    deadline = start + seconds if seconds is not None else None
    while True:
        while len(outstanding) < window and sent < limit:
            if deadline is not None and time.monotonic() >= deadline:
                limit = sent
                break
            if gate is not None and not gate.may_send(worker):
                break
            conn.write(frames[sent] if frames is not None else frame(sent))
            outstanding.add(b"%d" % sent)
            sent += 1
            worker.sent[me] = sent
        if not outstanding:
            if sent >= limit:
                break
            conn.flush()
            time.sleep(GATE_SLEEP_SECONDS)
            continue
        try:
            ids = receipt_ids(incoming, timeout)
        except BrokerError as err:
            raise BrokerError(f"producer {producer}: {err}") from None
        settle(outstanding, ids, producer)
        worker.done[me] += len(ids)
    end = time.monotonic()
    incoming.hand_back()
    close(conn)
    return {"producer": producer, "sent": sent, "start": start, "end": end}


def settle(outstanding: set[bytes], ids: list[bytes], producer: int) -> None:
    """Remove the receipted SENDs from `outstanding`, one set operation per read; BrokerError
    if some receipt-id was not outstanding (unknown, or receipted twice)."""
    left = len(outstanding) - len(ids)
    outstanding.difference_update(ids)
    if len(outstanding) != left:
        shown = ", ".join(repr(i.decode(errors="replace")) for i in ids[:8])
        raise BrokerError(
            f"producer {producer}: {len(outstanding) - left} of {len(ids)} RECEIPTs in one read "
            f"for no outstanding SEND (unknown or repeated ids; the first: {shown})"
        )


def consume(
    worker: Worker,
    target: Target,
    run_id: str,
    size: int,
    prefetch: int | None,
    timeout: float,
    count: int | None = None,
    seconds: float | None = None,
    wanted: bytes | None = None,
    quiet: float = 0.5,
    gate: Gate | None = None,
    subscribe_at_start: bool = False,
) -> dict:
    """Receive and ACK (client-individual, no receipts): exactly `count` messages, the last
    ACK receipted; or, with `seconds`, until the deadline and then until `quiet` seconds
    pass without a message; or, with `wanted` (seqs as array('q') bytes), until all of them
    came (then a short grace for stragglers) or `quiet` seconds pass without a message."""
    reader = BodyReader(run_id, size)
    conn, _ = target.connect(timeout, size)
    if not subscribe_at_start:
        target.subscribe(conn, prefetch)
    want = set(array("q", wanted)) if wanted is not None else None
    if want is not None and not want:
        quiet = min(quiet, GRACE_SECONDS)
    seqs = array("q")
    me = worker.index
    received = before_deadline = 0

    def take_and_ack(message: Frame) -> None:
        if message.command != "MESSAGE":
            raise BrokerError(f"consumer: expected MESSAGE, got {message.command}")
        take(message.body)
        ack(conn, message)

    def take(body: bytes) -> None:
        nonlocal received, quiet
        received += 1
        seq = reader.seq(body)
        if seq is not None:
            seqs.append(seq)
            if want:
                want.discard(seq)
                if not want:
                    quiet = min(quiet, GRACE_SECONDS)

    incoming = Incoming(conn, max_frame_bytes(size))
    start = worker.start()
    if subscribe_at_start:
        target.subscribe(conn, prefetch)
    deadline = start + seconds if seconds is not None else None
    last = start
    finished = False
    while not finished:
        try:
            batch = messages(incoming, timeout if count is not None else POLL_SECONDS)
            if batch is None and count is not None:
                raise BrokerError(f"no frame from the broker for {timeout:g} s")
        except (BrokerError, StompError) as err:
            raise BrokerError(f"consumer, after {received:,} messages: {err}") from None
        now = time.monotonic()
        if batch is None:
            if (deadline is None or now >= deadline) and now - last >= quiet:
                break
            continue
        last = now
        acks: list[bytes] = []  # written at once, after the read's messages are checked
        for body, ack_id in batch:
            take(body)
            if deadline is not None and now < deadline:
                before_deadline += 1
                if gate is not None:
                    conn.write(b"".join(acks))
                    acks.clear()
                    conn.flush()
                    while not gate.may_ack(worker) and time.monotonic() < deadline:
                        time.sleep(GATE_SLEEP_SECONDS)
            if count is not None and received >= count and not finished:
                acks.append(ack_frame(ack_id, receipt="last"))
                finished = True
            else:
                acks.append(ack_frame(ack_id))
        conn.write(b"".join(acks))
        worker.done[me] = received
    incoming.hand_back()
    if finished:
        wait_receipt(conn, "last", take_and_ack)
        last = time.monotonic()
    close(conn, take_and_ack)
    return {
        "seqs": seqs.tobytes(),
        "received": received,
        "before_deadline": before_deadline,
        "foreign": reader.foreign,
        "altered": reader.altered,
        "start": start,
        "end": last,
    }


def pingpong(worker: Worker, target: Target, run_id: str, size: int, rounds: int, warmup: int, timeout: float) -> dict:
    """One connection, prefetch 1: SEND (no receipt), wait for its MESSAGE, ACK; the round
    trip from SEND to MESSAGE is timed. The ACK leaves with the next SEND."""
    reader = BodyReader(run_id, size)
    conn, _ = target.connect(timeout, size)
    target.subscribe(conn, 1)
    frames = [target.send_frame(make_body(run_id, index, size)) for index in range(warmup + rounds)]
    seqs = array("q")
    latency_ns = array("q")
    worker.start()
    for index, frame in enumerate(frames):
        conn.write(frame)
        sent = time.perf_counter_ns()
        message = next_frame(conn, timeout)
        arrived = time.perf_counter_ns()
        if message.command != "MESSAGE":
            raise BrokerError(f"ping-pong: expected MESSAGE, got {message.command}")
        if index >= warmup:
            latency_ns.append(arrived - sent)
        seq = reader.seq(message.body)
        if seq is not None:
            seqs.append(seq)
        ack(conn, message)
    close(conn)
    return {
        "latency_ns": latency_ns.tobytes(),
        "seqs": seqs.tobytes(),
        "received": len(frames),
        "foreign": reader.foreign,
        "altered": reader.altered,
    }
