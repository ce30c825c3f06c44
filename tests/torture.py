"""Kill -9 torture for Curb: crash the real broker again and again under load and check
that it kept every promise README.md makes about RECEIPTs and the cap (What it promises).

    bin/torture --cycles 100 --cap 256KiB [--seed S] [--port P] [--dir D] [--json]

Each cycle starts (or restarts) `python -m curb` on one log file and port (with a short
`-ack-timeout` and a low `-max-deliveries`, see --ack-timeout and --max-deliveries),
runs 2 producers (pipelined SENDs, a receipt each, every body unique; some delayed by
`curb-delay` 50-1500 ms, some expiring by `curb-ttl` 200-3000 ms, a few poison) and 2
consumers (client-individual, a prefetch, an ACK with a receipt each; some held 0.2-2.5 s
first, past the ack deadline at times, 3% NACKed instead, some of those with a
`curb-delay`, and every poison message NACKed, so that it becomes a dead letter) until
a SIGKILL 0.3-3 s later. After the last cycle the queue is drained until it stays empty
(delayed messages included; poison is NACKed there too), the dead letters are read from
`./dead` and ACKed, the broker is killed once more and both are drained again, then it
is stopped with SIGTERM. The checks:

- lost: a SEND got its RECEIPT but no ACK was ever sent for that message, on the queue
  or on `./dead`;
- resurrections: a message delivered again after its ACK got a RECEIPT (one with
  `curb-late:true` changed nothing and is no ACK; it answers that ACK only, not a later
  ACK of the same message delivered again, which the late one's RECEIPT may follow; one
  with `curb-unconfirmed:true` alone, from a router that lost the instance first, is as
  an ACK without a RECEIPT: it may or may not have removed the message);
- early: a message delivered before its SEND's `curb-delay` had passed, or before its
  NACK's `curb-delay` had (after a restart only when that NACK's RECEIPT came);
- past the limit: a MESSAGE whose `curb-deliveries` is above `-max-deliveries`;
- within-run duplicates: a message delivered again in the same broker run although the
  consumer holding it neither NACKed it nor lost its connection, and well before its ack
  deadline (DEADLINE_SLACK_S before: the consumer cannot see when it was sent);
- corrupt: a MESSAGE whose body or headers are not what was sent;
- stored though refused: a SEND refused as "queue full" that is delivered anyway;
- the log file (its size, and the bytes allocated to its data) never exceeds the cap. The
  blocks the file system adds of its own are reported beside them, not checked: ext4, for
  one, takes a 4 KiB extent-index block once a file's extent list outgrows the inode (a
  fallocated range that is partly written counts as two extents), whoever writes it;
- the broker comes back within 15 s, never dies by itself, and sends no ERROR other
  than "queue full" (which is counted, and the producer sends again after a pause).
  A producer connection reset while the broker runs is counted, not failed: the broker
  closes a refused producer's connection with SENDs still unread, and the kernel's reset
  can destroy the ERROR frame before the client reads it.

With --router the clients go through `curb router` (one route, `curb`, to the broker),
and each cycle kills the broker, the router or both (chosen at random); the drain reads
the broker directly. The checks are the same: a router adds no way to lose a receipted
SEND or undo a receipted ACK.

Exit status 0 when every check passed, 1 otherwise (with examples), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import heapq
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

from curb import durations
from curb.client import Client, StompError
from curb.frame import encode
from curb.spawn import BrokerProcess, StartError

HOST = "127.0.0.1"
PRODUCERS = 2
CONSUMERS = 2
WINDOW = 32  # SENDs awaiting their RECEIPT per producer
PREFETCHES = (4, 32, 128)  # a consumer picks one per connection
NACK_SHARE = 0.03
NACK_DELAY_SHARE = 0.5  # of the NACKs, those with a curb-delay
NACK_DELAY_MS = (20, 600)
HOLD_SHARE = 0.05
HOLD_S = (0.2, 2.5)  # some past the ack deadline: the message goes to another consumer
DELAY_SHARE = 0.15
DELAY_MS = (50, 1500)
TTL_SHARE = 0.1
TTL_MS = (200, 3000)
POISON_SHARE = 0.02  # every consumer NACKs these, so they become dead letters
POISON = "p"  # the suffix of a poison message's id
ACK_TIMEOUT = "1s"
MAX_DELIVERIES = 4
DEADLINE_SLACK_S = 0.5
KILL_AFTER_S = (0.3, 3.0)
REFUSED_PAUSE_S = (0.05, 0.3)  # a producer's pause after "queue full"
RECONNECT_PAUSE_S = 0.1
CLIENT_TIMEOUT_S = 5.0
STARTUP_S = 15.0
JOIN_S = 15.0
RUN_LIMIT_S = 30.0  # a worker stops by itself this long after its run began
WATCH_EVERY_S = 0.05
DRAIN_PREFETCH = 500
DRAIN_S = 300.0
QUIET_S = 1.0
EXAMPLES = 5
HISTORY = 6  # deliveries remembered per message, for the examples
ID_HEADER = "torture-id"
LOG_NAME = "curb.log"
STDERR_NAME = "curb.stderr"
ROUTER_STDERR_NAME = "router.stderr"
KILLS = ("broker", "router", "both")  # what a cycle kills, with --router
_SIZE = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_STACK_LINES = ("Traceback (most recent call last):", "protocol: ", "transport: ", "handle: ")
_VARYING = re.compile(r"0x[0-9a-f]+|fd=\d+|127\.0\.0\.1:\d+")


def parse_size(text: str) -> int:
    """Bytes in a -cap value, as the broker reads it, so the cap check uses the same number."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 256KiB, 4MiB or a byte count")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def body_for(msg_id: str) -> bytes:
    """A body that names its message and has a length of its own (0-399 bytes of filler),
    so that a delivery proves which SEND it is and that it came back intact."""
    filler = (msg_id.encode() + b".") * 400
    return msg_id.encode() + b"|" + filler[: zlib.crc32(msg_id.encode()) % 400]


def id_of(body: bytes, header: str | None) -> str | None:
    """The message id a delivered body and header name, or None if they do not agree
    with what body_for() made."""
    msg_id = body.split(b"|", 1)[0].decode(errors="replace")
    return msg_id if header == msg_id and body_for(msg_id) == body else None


def disk_bytes(path: Path) -> tuple[int, int, int]:
    """The log file's size, the bytes allocated to its data, and the bytes all its blocks
    take, the file system's metadata included (0, 0, 0 before it exists)."""
    try:
        with path.open("rb") as file:
            st = os.fstat(file.fileno())
            data = extent_bytes(file.fileno())
    except FileNotFoundError:
        return 0, 0, 0
    blocks = st.st_blocks * 512
    return st.st_size, blocks if data is None else data, blocks


# FS_IOC_FIEMAP: the file's extents. struct fiemap is 32 bytes; each extent 56, holding
# its logical offset, physical offset and length (u64 each) and its flags (u32 at 40).
FIEMAP = 0xC020660B
FIEMAP_HEAD = struct.Struct("=QQIIII")
FIEMAP_EXTENT = struct.Struct("=QQQ16xI12x")
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_BATCH = 64


def extent_bytes(fd: int) -> int | None:
    """Bytes in the file's data extents (Linux FIEMAP); None where the file system
    cannot say (tmpfs, say), and st_blocks has to do."""
    total, start = 0, 0
    while True:
        request = bytearray(FIEMAP_HEAD.size + FIEMAP_BATCH * FIEMAP_EXTENT.size)
        FIEMAP_HEAD.pack_into(request, 0, start, (1 << 64) - 1 - start, 0, 0, FIEMAP_BATCH, 0)
        try:
            fcntl.ioctl(fd, FIEMAP, request)
        except OSError:
            return None
        mapped = FIEMAP_HEAD.unpack_from(request)[3]
        if mapped == 0:
            return total
        for index in range(mapped):
            logical, _, length, flags = FIEMAP_EXTENT.unpack_from(
                request, FIEMAP_HEAD.size + index * FIEMAP_EXTENT.size
            )
            total += length
            start = logical + length
            if flags & FIEMAP_EXTENT_LAST:
                return total


class Ledger:
    """Everything the clients did and saw, shared by all threads; judges each delivery
    as it arrives, since whether it is a resurrection depends on what was known then."""

    def __init__(self, ack_timeout_s: float = 1.0, max_deliveries: int = 0) -> None:
        self.lock = threading.Lock()
        self.ack_timeout_s = ack_timeout_s
        self.max_deliveries = max_deliveries
        self.sent: set[str] = set()
        self.receipted: set[str] = set()
        self.refused: set[str] = set()
        # ACKs written and not yet answered as late, by message: a late RECEIPT answers one
        # ACK, not a later one of the same message (delivered again, ACKed again) that
        # may well have removed it.
        self.acks_sent: collections.Counter[str] = collections.Counter()
        self.ack_receipts: dict[str, str] = {}  # message id -> connection that got the RECEIPT
        self.holders: dict[str, tuple[str, float]] = {}  # message id -> (connection holding it unNACKed, since)
        self.history: dict[str, list[str]] = {}  # message id -> its first deliveries
        self.send_due: dict[str, int] = {}  # message id -> wall ms its curb-delay ends at, at the earliest
        self.expires: dict[str, int] = {}  # message id -> wall ms its curb-ttl ends at, at the latest
        # message id -> (wall ms its NACK's curb-delay ends at, at the earliest; the run; receipted)
        self.nack_due: dict[str, tuple[int, int, bool]] = {}
        self.dead: dict[str, str] = {}  # message id -> reason, for the dead letters ACKed on ./dead
        self.max_lag_ms = 0  # the longest a delayed SEND waited past its due time to arrive
        self.counts = dict.fromkeys(
            (
                "delivered",
                "redelivered",
                "acked",
                "nacked",
                "nacked_delayed",
                "late_acks",
                "unconfirmed_acks",
                "after_expiry",
            ),
            0,
        )
        self.problems: dict[str, list[str]] = {
            name: []
            for name in (
                "resurrections",
                "duplicates",
                "early",
                "past_limit",
                "corrupt",
                "stored_refused",
                "unexpected_errors",
            )
        }
        self.problem_counts = dict.fromkeys(self.problems, 0)
        self.resurrected: set[str] = set()
        self.resets = 0
        self.max_size = 0
        self.max_data = 0
        self.max_blocks = 0

    def problem(self, kind: str, example: str) -> None:
        """Count a broken promise and keep the first few examples (caller holds the lock)."""
        self.problem_counts[kind] += 1
        if len(self.problems[kind]) < EXAMPLES:
            self.problems[kind].append(example)

    def sending(self, msg_id: str, delay_ms: int = 0, ttl_ms: int = 0) -> None:
        """Called just before the SEND is written: its due time is at least now plus the
        delay, its expiry at most now plus the ttl (the broker reads its clock later)."""
        now_ms = time.time_ns() // 1_000_000
        with self.lock:
            self.sent.add(msg_id)
            if delay_ms:
                self.send_due[msg_id] = now_ms + delay_ms
            if ttl_ms:
                self.expires[msg_id] = now_ms + 1 + ttl_ms

    def send_receipted(self, msg_id: str) -> None:
        with self.lock:
            self.receipted.add(msg_id)

    def send_refused(self, msg_id: str) -> None:
        with self.lock:
            self.refused.add(msg_id)

    def reset(self) -> None:
        with self.lock:
            self.resets += 1

    def unexpected(self, conn: str, what: object) -> None:
        with self.lock:
            self.problem("unexpected_errors", f"{conn}: {what}")

    def delivered(self, conn: str, headers: dict[str, str], body: bytes) -> str:
        """Record one MESSAGE on connection `conn` (named run/worker/epoch) and judge it;
        returns the key its ACK is tracked by."""
        now = time.time()
        now_ms = int(now * 1000)
        msg_id = id_of(body, headers.get(ID_HEADER))
        note = f"run {conn.split('/')[0]} to {conn} as message-id {headers.get('message-id')}" + (
            f" (redelivered, curb-deliveries {headers.get('curb-deliveries')})" if "redelivered" in headers else ""
        )
        with self.lock:
            self.counts["delivered"] += 1
            self.counts["redelivered"] += "redelivered" in headers
            if msg_id is None or msg_id not in self.sent:
                key = f"?{headers.get('message-id')}"
                self.problem(
                    "corrupt",
                    f"{conn} got message-id {headers.get('message-id')} "
                    f"{ID_HEADER} {headers.get(ID_HEADER)!r}, body {body[:60]!r}",
                )
                return key
            seen = self.history.setdefault(msg_id, [])
            if msg_id in self.refused:
                self.problem("stored_refused", f"{msg_id}: refused as queue full, delivered {note}")
            if msg_id in self.ack_receipts:
                self.resurrected.add(msg_id)
                self.problem(
                    "resurrections",
                    f"{msg_id}: ACK receipted on {self.ack_receipts[msg_id]}, "
                    f"delivered again {note}; before: {'; '.join(seen)}",
                )
            holder, since = self.holders.get(msg_id, ("", 0.0))
            if holder.split("/")[0] == conn.split("/")[0] and now < since + self.ack_timeout_s - DEADLINE_SLACK_S:
                self.problem(
                    "duplicates",
                    f"{msg_id}: held by {holder} for {now - since:.2f} s (not NACKed, connection up, ack "
                    f"deadline {self.ack_timeout_s:g} s), delivered again {note}",
                )
            self.holders[msg_id] = (conn, now)
            self._judge_times(msg_id, conn, now_ms, note)
            count = int(headers.get("curb-deliveries", "1"))
            if self.max_deliveries and count > self.max_deliveries:
                self.problem("past_limit", f"{msg_id}: curb-deliveries {count} > -max-deliveries, {note}")
            if len(seen) < HISTORY:
                seen.append(note)
            return msg_id

    def _judge_times(self, msg_id: str, conn: str, now_ms: int, note: str) -> None:
        """Not before its SEND's delay, nor its NACK's (whose due time is kept across a
        restart once that NACK's RECEIPT came); its expiry only measured, since a MESSAGE
        sent just before it arrives after it (caller holds the lock)."""
        due = self.send_due.get(msg_id)
        if due is not None:
            if now_ms < due:
                self.problem("early", f"{msg_id}: {due - now_ms} ms before its SEND's curb-delay ended, {note}")
            elif not self.history.get(msg_id):
                self.max_lag_ms = max(self.max_lag_ms, now_ms - due)
        nacked = self.nack_due.pop(msg_id, None)
        if nacked is not None:
            due, run, receipted = nacked
            if now_ms < due and (receipted or run == int(conn.split("/")[0])):
                self.problem("early", f"{msg_id}: {due - now_ms} ms before its NACK's curb-delay ended, {note}")
        expires = self.expires.get(msg_id)
        if expires is not None and now_ms > expires + 1000:
            self.counts["after_expiry"] += 1

    def acking(self, msg_id: str) -> None:
        """Called before the ACK is written: from now on the message may be gone."""
        with self.lock:
            self.counts["acked"] += 1
            self.acks_sent[msg_id] += 1

    def ack_receipted(self, msg_id: str, conn: str, late: bool = False, unconfirmed: bool = False) -> None:
        """An ACK's RECEIPT; with curb-late:true the ACK changed nothing (the message's
        ack deadline had passed and it went back to the queue); with
        curb-unconfirmed:true alone (a router lost the instance before it answered)
        whether it took effect is unknown, as for an ACK without a RECEIPT."""
        with self.lock:
            if unconfirmed and not late:
                self.counts["unconfirmed_acks"] += 1
                return
            if late:
                self.counts["late_acks"] += 1
                self.acks_sent[msg_id] -= 1
                if self.acks_sent[msg_id] <= 0:
                    del self.acks_sent[msg_id]
                return
            self.ack_receipts[msg_id] = conn
            self.holders.pop(msg_id, None)

    def nacking(self, msg_id: str, conn: str, delay_ms: int | None = None) -> None:
        """Called before the NACK is written: the message may come back at once, or
        after its curb-delay."""
        now_ms = time.time_ns() // 1_000_000
        with self.lock:
            self.counts["nacked"] += 1
            if delay_ms:
                self.counts["nacked_delayed"] += 1
                self.nack_due[msg_id] = (now_ms + delay_ms, int(conn.split("/")[0]), False)
            if self.holders.get(msg_id, ("",))[0] == conn:
                del self.holders[msg_id]

    def nack_receipted(self, msg_id: str) -> None:
        """The NACK's RECEIPT: where it put the message is durable, its due time too."""
        with self.lock:
            due = self.nack_due.get(msg_id)
            if due is not None:
                self.nack_due[msg_id] = (due[0], due[1], True)

    def dead_letter(self, conn: str, headers: dict[str, str], body: bytes) -> str:
        """A MESSAGE from ./dead: judged like any delivery for corruption and
        resurrection; its reason kept."""
        msg_id = id_of(body, headers.get(ID_HEADER))
        with self.lock:
            if msg_id is None or msg_id not in self.sent:
                self.problem("corrupt", f"{conn} got dead letter {headers.get('message-id')}, body {body[:60]!r}")
                return f"?{headers.get('message-id')}"
            if msg_id in self.ack_receipts:
                self.resurrected.add(msg_id)
                self.problem(
                    "resurrections", f"{msg_id}: ACK receipted on {self.ack_receipts[msg_id]}, then a dead letter"
                )
            self.dead[msg_id] = headers.get("curb-dead-reason", "?")
            return msg_id

    def released(self, conn: str) -> None:
        """A consumer's connection is gone: what it held may be delivered again."""
        with self.lock:
            for msg_id in [m for m, (holder, _) in self.holders.items() if holder == conn]:
                del self.holders[msg_id]

    def saw_file(self, path: Path) -> None:
        size, data, blocks = disk_bytes(path)
        with self.lock:
            self.max_size = max(self.max_size, size)
            self.max_data = max(self.max_data, data)
            self.max_blocks = max(self.max_blocks, blocks)

    def lost(self) -> list[str]:
        """Receipted SENDs that no consumer ever ACKed, on the queue or as a dead letter
        (after the drains, nothing may be left)."""
        with self.lock:
            return sorted(self.receipted - self.acks_sent.keys() - self.ack_receipts.keys())

    def lost_example(self, msg_id: str) -> str:
        deliveries = self.history.get(msg_id)
        return f"{msg_id}: SEND receipted; " + (
            f"delivered {'; '.join(deliveries)}, never ACKed" if deliveries else "never delivered"
        )


class Run:
    """One broker lifetime, from its start to its SIGKILL."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.killed = threading.Event()
        self.deadline = time.monotonic() + RUN_LIMIT_S

    def over(self) -> bool:
        return self.killed.is_set() or time.monotonic() >= self.deadline


class Worker(threading.Thread):
    """A client that reconnects after an error until its run is over; an error that is
    not the kill is a finding (except what `refused` accepts)."""

    def __init__(self, name: str, life: Run, port: int, ledger: Ledger, seed: str) -> None:
        super().__init__(name=name, daemon=True)
        self.life = life
        self.port = port
        self.ledger = ledger
        self.rng = random.Random(f"{seed}/{life.number}/{name}")

    def run(self) -> None:
        for epoch in range(10_000):
            if self.life.over():
                return
            conn = f"{self.life.number}/{self.name}/{epoch}"
            client = Client(HOST, self.port, timeout=CLIENT_TIMEOUT_S)
            try:
                client.connect()
                self.session(client, conn)
            except (StompError, OSError) as err:
                if self.life.killed.is_set():
                    return
                if not self.refused(err):
                    self.ledger.unexpected(conn, err)
                    time.sleep(RECONNECT_PAUSE_S)
            finally:
                client.close()
                self.ledger.released(conn)

    def session(self, client: Client, conn: str) -> None:
        raise NotImplementedError

    def refused(self, err: Exception) -> bool:
        return False


class Producer(Worker):
    """Pipelined SENDs with a receipt each; the receipt id is the message id."""

    def session(self, client: Client, conn: str) -> None:
        outstanding: set[str] = set()
        seq = 0
        while not self.life.over():
            while len(outstanding) < WINDOW:
                rng = self.rng
                msg_id = f"{conn}/{seq}{POISON if rng.random() < POISON_SHARE else ''}"
                seq += 1
                headers = {ID_HEADER: msg_id}
                delay = rng.randint(*DELAY_MS) if rng.random() < DELAY_SHARE else 0
                ttl = rng.randint(*TTL_MS) if rng.random() < TTL_SHARE else 0
                if delay:
                    headers["curb-delay"] = str(delay)
                if ttl:
                    headers["curb-ttl"] = str(ttl)
                self.ledger.sending(msg_id, delay, ttl)
                outstanding.add(msg_id)
                client.send(body_for(msg_id), headers, receipt=msg_id)
            frame = client.receive(timeout=0.1)
            if frame is None or frame.command != "RECEIPT":
                continue
            msg_id = frame.headers.get("receipt-id", "")
            if msg_id in outstanding:
                outstanding.discard(msg_id)
                self.ledger.send_receipted(msg_id)
            else:
                self.ledger.unexpected(conn, f"RECEIPT for {msg_id!r}, which was not awaited")

    def refused(self, err: Exception) -> bool:
        """ "queue full" is the cap working: note which SEND it was, pause, send again.
        It comes at once ("queue full"), or once the log finds no room while writing
        ("message not stored", with "queue full" in the body), or is lost to a reset
        (see the module docstring)."""
        frame = getattr(err, "frame", None)
        if frame is None and isinstance(err.__context__, (ConnectionResetError, BrokenPipeError)):
            self.ledger.reset()
        elif frame is None:
            return False
        elif frame.headers.get("message") == "queue full" or (
            frame.headers.get("message") == "message not stored" and frame.body.startswith(b"queue full")
        ):
            self.ledger.send_refused(frame.headers.get("receipt-id", "?"))
        else:
            return False
        time.sleep(self.rng.uniform(*REFUSED_PAUSE_S))
        return True


class Consumer(Worker):
    """ACKs with a receipt each; holds some messages a while first and NACKs a few."""

    def session(self, client: Client, conn: str) -> None:
        self.held: list[tuple[float, int, str, str]] = []  # (due, tiebreak, ack id, message id)
        self.pending: dict[str, tuple[str, str]] = {}  # receipt id -> (ACK or NACK, message id)
        self.n = 0
        client.subscribe("q", ack="client-individual", prefetch=self.rng.choice(PREFETCHES))
        while not self.life.over():
            while self.held and self.held[0][0] <= time.monotonic():
                _, _, ack_id, msg_id = heapq.heappop(self.held)
                self.answer(client, "ACK", ack_id, msg_id, conn)
            wait = 0.1 if not self.held else min(0.1, max(0.0, self.held[0][0] - time.monotonic()))
            frame = client.receive(timeout=wait)
            if frame is None:
                continue
            if frame.command == "MESSAGE":
                self.on_message(client, frame.headers, frame.body, conn)
            elif frame.command == "RECEIPT":
                kind, msg_id = self.pending.pop(frame.headers.get("receipt-id", ""), ("?", ""))
                if kind == "ACK":
                    late = frame.headers.get("curb-late") == "true"
                    self.ledger.ack_receipted(msg_id, conn, late, frame.headers.get("curb-unconfirmed") == "true")
                elif kind == "NACK":
                    self.ledger.nack_receipted(msg_id)

    def on_message(self, client: Client, headers: dict[str, str], body: bytes, conn: str) -> None:
        msg_id = self.ledger.delivered(conn, headers, body)
        if self.life.killed.is_set():
            return  # an ACK written now cannot arrive, yet would count as sent
        ack_id = headers.get("ack", "")
        roll = self.rng.random()
        if msg_id.endswith(POISON) or roll < NACK_SHARE:
            self.answer(client, "NACK", ack_id, msg_id, conn)
        elif roll < NACK_SHARE + HOLD_SHARE:
            due = time.monotonic() + self.rng.uniform(*HOLD_S)
            heapq.heappush(self.held, (due, self.n, ack_id, msg_id))
            self.n += 1
        else:
            self.answer(client, "ACK", ack_id, msg_id, conn)

    def answer(self, client: Client, kind: str, ack_id: str, msg_id: str, conn: str) -> None:
        """ACK or NACK (some with a curb-delay) with a receipt, recorded in the ledger
        before it is written."""
        receipt = f"{kind[0].lower()}{self.n}"
        self.n += 1
        self.pending[receipt] = (kind, msg_id)
        if kind == "ACK":
            self.ledger.acking(msg_id)
            client.ack(ack_id, receipt=receipt)
        elif self.rng.random() < NACK_DELAY_SHARE:
            delay = self.rng.randint(*NACK_DELAY_MS)
            self.ledger.nacking(msg_id, conn, delay)
            client.write(encode("NACK", {"id": ack_id, "receipt": receipt, "curb-delay": str(delay)}))
        else:
            self.ledger.nacking(msg_id, conn)
            client.nack(ack_id, receipt=receipt)


class TortureBroker:
    """The real broker on one file and port (port 0: the kernel picks it at the first
    start and restarts keep it), started by curb.spawn as every tool starts it. Its stderr,
    across restarts, goes to one file so that a failure can show it. Answers are None when
    all went well, else what happened, for the cycle's report."""

    def __init__(self, workdir: Path, cap: str, port: int, flags: list[str]) -> None:
        self.file = workdir / LOG_NAME
        self.cap = cap
        self.port = port
        self.flags = flags  # -ack-timeout and -max-deliveries
        self.child = BrokerProcess(cwd=workdir, output=workdir / STDERR_NAME, timeout=STARTUP_S)

    def start(self) -> str | None:
        try:
            self.port = self.child.start(
                ["-cap", self.cap, "-addr", f"{HOST}:{self.port}", "-file", str(self.file), *self.flags]
            )
        except StartError as err:
            return f"broker {err}"
        return None

    def alive(self) -> bool:
        return self.child.running()

    def kill(self) -> None:
        """SIGKILL: a crash with no chance to sync or answer."""
        self.child.kill()

    def stop(self) -> str | None:
        """SIGTERM and wait."""
        if not self.alive():
            return None
        try:
            status = self.child.stop(signal.SIGTERM, STARTUP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"broker ignored SIGTERM for {STARTUP_S:.0f}s"
        return None if status == 0 else f"broker exited with status {status} after SIGTERM"

    def stderr_text(self) -> str:
        return self.child.output()


class TortureRouter:
    """`curb router` in front of the broker, on a port of its own that restarts keep."""

    def __init__(self, workdir: Path, broker: TortureBroker) -> None:
        self.broker = broker
        self.port = 0
        self.child = BrokerProcess(cwd=workdir, output=workdir / ROUTER_STDERR_NAME, timeout=STARTUP_S)

    def start(self) -> str | None:
        flags = ["router", "-addr", f"{HOST}:{self.port}", "-route", f"curb={HOST}:{self.broker.port}"]
        try:
            self.port = self.child.start(flags)
        except StartError as err:
            return f"router {err}"
        return None

    def alive(self) -> bool:
        return self.child.running()

    def kill(self) -> None:
        self.child.kill()


def watch(broker: TortureBroker, ledger: Ledger, seconds: float, router: TortureRouter | None = None) -> bool:
    """Let the run go on for `seconds`, sampling the file size; False if the broker died."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ledger.saw_file(broker.file)
        if not broker.alive() or (router is not None and not router.alive()):
            return False
        time.sleep(min(WATCH_EVERY_S, max(0.0, deadline - time.monotonic())))
    return broker.alive() and (router is None or router.alive())


def one_cycle(
    number: int,
    broker: TortureBroker,
    ledger: Ledger,
    seed: str,
    rng: random.Random,
    router: TortureRouter | None = None,
) -> str | None:
    """Load, SIGKILL, wait for every client to notice, restart; None or the failure."""
    life = Run(number)
    port = broker.port if router is None else router.port
    workers: list[Worker] = [Producer(f"p{i}", life, port, ledger, seed) for i in range(PRODUCERS)]
    workers += [Consumer(f"c{i}", life, port, ledger, seed) for i in range(CONSUMERS)]
    for worker in workers:
        worker.start()
    if not watch(broker, ledger, rng.uniform(*KILL_AFTER_S), router):
        life.killed.set()
        text = broker.stderr_text() if router is None else broker.stderr_text() + router.child.output()
        return f"cycle {number}: the broker or router died by itself:\n{text[-4000:]}"
    life.killed.set()
    kill = "broker" if router is None else rng.choice(KILLS)
    if kill != "router":
        broker.kill()
    if router is not None and kill != "broker":
        router.kill()
    ledger.saw_file(broker.file)
    deadline = time.monotonic() + JOIN_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    stuck = [worker.name for worker in workers if worker.is_alive()]
    if stuck:
        return f"cycle {number}: clients {stuck} still busy {JOIN_S:.0f}s after the kill"
    if kill == "router":
        return router.start() if router is not None else None
    return broker.start() or (router.start() if router is not None and kill == "both" else None)


def drain(port: int, ledger: Ledger, number: int, dead: bool = False) -> str | None:
    """Consume until ./count says empty, every receipt is in and nothing came for
    QUIET_S; None when done, else why not. The queue (delayed messages included, so it
    waits for them): ACK each with a receipt, but NACK poison, which so becomes a dead
    letter. The dead letters (`dead`, from ./dead): ACK each with a receipt."""
    conn = f"{number}/{'drain-dead' if dead else 'drain'}/0"
    client = Client(HOST, port, timeout=CLIENT_TIMEOUT_S)
    pending: dict[str, tuple[str, str]] = {}  # receipt -> (ACK or NACK, message id)
    answers = 0
    empty = False
    last = time.monotonic()
    deadline = last + DRAIN_S
    counts = "no ./count yet"
    try:
        client.connect()
        client.subscribe("q", destination="./dead" if dead else "/queue/curb", prefetch=DRAIN_PREFETCH)
        client.subscribe("n", destination="./count", ack="auto")
        while time.monotonic() < deadline:
            frame = client.receive(timeout=0.1)
            if frame is not None and frame.command == "MESSAGE" and frame.headers.get("subscription") == "n":
                left = ("dead",) if dead else ("rdy", "wip", "delayed")
                counts = ", ".join(f"{name} {frame.headers.get(name)}" for name in ("rdy", "wip", "delayed", "dead"))
                empty = all(frame.headers.get(name, "0") == "0" for name in left)
            elif frame is not None and frame.command == "MESSAGE":
                if dead:
                    msg_id, kind = ledger.dead_letter(conn, frame.headers, frame.body), "ACK"
                else:
                    msg_id = ledger.delivered(conn, frame.headers, frame.body)
                    kind = "NACK" if msg_id.endswith(POISON) else "ACK"
                receipt = f"a{answers}"
                answers += 1
                pending[receipt] = (kind, msg_id)
                if kind == "ACK":
                    ledger.acking(msg_id)
                    client.ack(frame.headers.get("ack", ""), receipt=receipt)
                else:
                    ledger.nacking(msg_id, conn)
                    client.nack(frame.headers.get("ack", ""), receipt=receipt)
                last = time.monotonic()
            elif frame is not None and frame.command == "RECEIPT":
                kind, msg_id = pending.pop(frame.headers.get("receipt-id", ""), ("?", ""))
                if kind == "ACK":
                    ledger.ack_receipted(msg_id, conn, frame.headers.get("curb-late") == "true")
            if empty and not pending and time.monotonic() - last >= QUIET_S:
                client.disconnect()
                return None
        what = "dead letters" if dead else "queue"
        return f"drain {number}: {what} not empty after {DRAIN_S:.0f}s ({counts}; {len(pending)} receipts owed)"
    except (StompError, OSError, ValueError) as err:
        return f"drain {number}: {err}"
    finally:
        client.close()


def stderr_report(text: str) -> dict[str, object]:
    """The broker's stderr in brief: refusals, recoveries that dropped a torn tail, and
    the unusual lines (not a routine start, stop or refusal, whose reasons the clients
    check), grouped, each with its count and the run it first appeared in; a traceback
    shows as its message lines, without the stack."""
    routine = ("curb: listening on ", "curb: stopping", "curb: stopped", "curb: recovered ")
    refusals = (": queue full", ": message not stored")
    lines = text.splitlines()
    run, odd = 0, 0
    torn: list[str] = []
    groups: dict[str, list[int]] = {}  # line -> [count, first run]
    for line in lines:
        run += line.startswith("curb: listening on ")
        if line.startswith("curb: recovered ") and "; " in line:
            torn.append(f"run {run + 1}: {line}")
        if line.startswith(routine) or line.endswith(refusals):
            continue
        odd += 1
        if not line[:1].isspace() and not line.startswith(_STACK_LINES):
            groups.setdefault(_VARYING.sub("...", line), [0, max(run, 1)])[0] += 1
    top = sorted(groups.items(), key=lambda item: -item[1][0])[:EXAMPLES]
    return {
        "lines": len(lines),
        "refusals": sum(line.endswith(refusals) for line in lines),
        "torn_recoveries": len(torn),
        "torn_examples": torn[:EXAMPLES],
        "odd_lines": odd,
        "odd_examples": [f"{count}x {line} (first in run {first})" for line, (count, first) in top],
    }


def torture(
    cycles: int,
    cap: str,
    seed: str,
    port: int,
    workdir: Path,
    progress: bool,
    ack_timeout: str = ACK_TIMEOUT,
    max_deliveries: int = MAX_DELIVERIES,
    routed: bool = False,
) -> dict[str, object]:
    """The whole run; returns the summary (its `failures` list is empty when all is well)."""
    began = time.monotonic()
    ledger = Ledger(durations.parse(ack_timeout), max_deliveries)
    flags = ["-ack-timeout", ack_timeout, "-max-deliveries", str(max_deliveries)]
    broker = TortureBroker(workdir, cap, port, flags)
    rng = random.Random(seed)
    failures: list[str] = []
    done = 0
    failure = broker.start()
    router = TortureRouter(workdir, broker) if routed else None
    if router is not None and failure is None:
        failure = router.start()
    for number in range(1, cycles + 1):
        if failure:
            break
        failure = one_cycle(number, broker, ledger, seed, rng, router)
        done = number if failure is None else number - 1
        if progress and (number % 10 == 0 or number == cycles):
            print(
                f"torture: cycle {number}/{cycles}, {len(ledger.receipted)} SENDs receipted, "
                f"{ledger.counts['delivered']} delivered, {time.monotonic() - began:.0f}s",
                file=sys.stderr,
            )
    if failure is None:
        failure = drain(broker.port, ledger, cycles + 1) or drain(broker.port, ledger, cycles + 1, dead=True)
    if failure is None:
        broker.kill()
        ledger.saw_file(broker.file)
        failure = (
            broker.start()
            or drain(broker.port, ledger, cycles + 2)
            or drain(broker.port, ledger, cycles + 2, dead=True)
        )
    drained = failure is None
    failures += [failure] if failure else []
    failures += [stopped] if (stopped := broker.stop()) else []
    broker.kill()
    if router is not None:
        router.kill()
    ledger.saw_file(broker.file)
    return summarize(
        ledger, failures, drained, cycles, done, cap, seed, port, workdir, broker, time.monotonic() - began
    )


def summarize(
    ledger: Ledger,
    failures: list[str],
    drained: bool,
    cycles: int,
    done: int,
    cap: str,
    seed: str,
    port: int,
    workdir: Path,
    broker: TortureBroker,
    seconds: float,
) -> dict[str, object]:
    """Figures and verdict in one dict (one JSON line with --json); `lost` needs a
    completed drain, since until then a message may still be waiting."""
    cap_bytes = parse_size(cap)
    lost = ledger.lost() if drained else []
    examples = {kind: found for kind, found in ledger.problems.items() if found}
    if lost:
        examples["lost"] = [ledger.lost_example(msg_id) for msg_id in lost[:EXAMPLES]]
    if ledger.max_size > cap_bytes or ledger.max_data > cap_bytes:
        failures.append(
            f"log file reached {ledger.max_size} bytes ({ledger.max_data} allocated to data), cap {cap_bytes}"
        )
    broken = len(lost) + sum(ledger.problem_counts.values())
    return {
        "ok": not failures and not broken,
        "cycles": cycles,
        "cycles_done": done,
        "seed": seed,
        "cap": cap,
        "cap_bytes": cap_bytes,
        "port": port,
        "sent": len(ledger.sent),
        "receipted": len(ledger.receipted),
        "refused_full": len(ledger.refused),
        "delivered": ledger.counts["delivered"],
        "redelivered": ledger.counts["redelivered"],
        "acked": ledger.counts["acked"],
        "ack_receipted": len(ledger.ack_receipts),
        "nacked": ledger.counts["nacked"],
        "nacked_delayed": ledger.counts["nacked_delayed"],
        "late_acks": ledger.counts["late_acks"],
        "unconfirmed_acks": ledger.counts["unconfirmed_acks"],
        "delayed_sent": len(ledger.send_due),
        "expiring_sent": len(ledger.expires),
        "poison_sent": sum(msg_id.endswith(POISON) for msg_id in ledger.sent),
        "dead_letters": len(ledger.dead),
        "dead_by_reason": {
            reason: sum(r == reason for r in ledger.dead.values()) for reason in sorted(set(ledger.dead.values()))
        },
        "poison_dead": sum(msg_id.endswith(POISON) for msg_id in ledger.dead),
        "max_delay_lag_ms": ledger.max_lag_ms,
        "delivered_over_1s_after_expiry": ledger.counts["after_expiry"],
        "lost": len(lost),
        **ledger.problem_counts,
        "resurrected_messages": len(ledger.resurrected),
        "acked_unconfirmed": len(ledger.acks_sent.keys() - ledger.ack_receipts.keys()),
        "resets": ledger.resets,
        "max_file_bytes": ledger.max_size,
        "max_data_bytes": ledger.max_data,
        "max_disk_bytes": ledger.max_blocks,
        "seconds": round(seconds, 1),
        "dir": str(workdir),
        "broker_stderr": stderr_report(broker.stderr_text()),
        "failures": failures,
        "examples": examples,
    }


def text_report(s: dict) -> str:
    """The summary for a person: figures first, then what went wrong, with ids."""
    err = s["broker_stderr"]
    lines = [
        f"curb torture: {s['cycles_done']}/{s['cycles']} kill -9 cycles, cap {s['cap']}, seed {s['seed']}, "
        f"{s['seconds']}s",
        f"  SENDs: {s['sent']} sent, {s['receipted']} receipted, {s['refused_full']} refused as queue full, "
        f"{s['resets']} producer connections reset by the running broker",
        f"  MESSAGEs: {s['delivered']} delivered ({s['redelivered']} redelivered), {s['acked']} ACKs sent, "
        f"{s['ack_receipted']} ACK receipts ({s['unconfirmed_acks']} unconfirmed), {s['nacked']} NACKs, "
        f"{s['acked_unconfirmed']} ACKed without a plain receipt (killed first, or unconfirmed)",
        f"  work queue: {s['delayed_sent']} SENDs delayed (arrived at most {s['max_delay_lag_ms']} ms late), "
        f"{s['expiring_sent']} expiring ({s['delivered_over_1s_after_expiry']} arrived over 1 s after expiry), "
        f"{s['poison_sent']} poison ({s['poison_dead']} read from ./dead), {s['nacked_delayed']} NACKs with a "
        f"delay, {s['late_acks']} late ACKs; dead letters {s['dead_letters']} {s['dead_by_reason']}",
        f"  lost {s['lost']}, resurrections {s['resurrections']} (of {s['resurrected_messages']} messages), "
        f"early {s['early']}, past the delivery limit {s['past_limit']}, within-run duplicates {s['duplicates']}, "
        f"corrupt {s['corrupt']}, stored though refused {s['stored_refused']}, "
        f"unexpected errors {s['unexpected_errors']}",
        f"  largest log file: {s['max_file_bytes']} bytes, {s['max_data_bytes']} allocated to data "
        f"({s['max_disk_bytes']} on disk with the file system's metadata), cap {s['cap_bytes']}",
        f"  broker stderr: {err['lines']} lines, {err['refusals']} refusals, "
        f"{err['torn_recoveries']} recoveries dropped a torn tail, {err['odd_lines']} unusual lines",
    ]
    lines += [f"    {line}" for line in err["odd_examples"]]
    lines += [f"FAILED: {failure}" for failure in s["failures"]]
    for kind, found in s["examples"].items():
        lines.append(f"{kind}:")
        lines += [f"    {example}" for example in found]
    lines.append("OK: every promise kept" if s["ok"] else f"BROKEN (files kept in {s['dir']})")
    return "\n".join(lines)


def parse_args(argv: Iterable[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100, help="kill -9 cycles (default 100)")
    parser.add_argument("--cap", default="256KiB", help="the broker's -cap (default 256KiB)")
    parser.add_argument("--seed", default=None, help="seed for the random choices (default: a fresh one)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="make the working directory (log file, broker stderr) in here and keep it",
    )
    parser.add_argument(
        "--router", action="store_true", help="clients go through `curb router`; cycles kill it, the broker or both"
    )
    parser.add_argument(
        "--ack-timeout",
        default=ACK_TIMEOUT,
        help=f"the broker's -ack-timeout (default {ACK_TIMEOUT}: holds of up to 2.5 s pass it at times)",
    )
    parser.add_argument(
        "--max-deliveries",
        type=int,
        default=MAX_DELIVERIES,
        help=f"the broker's -max-deliveries (default {MAX_DELIVERIES}: poison becomes a dead letter soon)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(list(argv))
    if not 1 <= args.cycles <= 100_000:
        parser.error("--cycles must be between 1 and 100000")
    try:
        parse_size(args.cap)
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    try:
        durations.parse(args.ack_timeout)
    except ValueError as err:
        parser.error(f"--ack-timeout: {err}")
    if args.max_deliveries < 0:
        parser.error("--max-deliveries must be 0 (no limit) or more")
    return args


def main(argv: Iterable[str] = sys.argv[1:]) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else str(random.SystemRandom().randrange(1 << 32))
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="curb-torture-", dir=args.dir))
    summary = torture(
        args.cycles,
        args.cap,
        seed,
        args.port,
        workdir,
        not args.quiet,
        args.ack_timeout,
        args.max_deliveries,
        args.router,
    )
    print(json.dumps(summary) if args.json else text_report(summary), flush=True)
    if summary["ok"] and args.dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
