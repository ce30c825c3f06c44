"""A TCP proxy in front of a broker that notes, for every `ACK curb-upto` on its way to the
broker, which Spark batches were in the checkpoint's commit log at that moment.

The commit log is read before the ACK is forwarded, so a batch listed for an ACK was
committed before the broker could act on it: a direct check of "ACK only after commit".
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from curb.frame import FrameParser


@dataclass(frozen=True)
class SeenAck:
    upto: int  # the ACK's curb-upto
    committed: frozenset[int]  # batch ids in the commit log when the ACK passed


class AckProxy:
    def __init__(self, broker_port: int, commits: Path) -> None:
        self.broker_port = broker_port
        self.commits = commits
        self.acks: list[SeenAck] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _committed(self) -> frozenset[int]:
        return frozenset(int(name) for name in (p.name for p in self.commits.glob("*")) if name.isdigit())

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            broker = socket.create_connection(("127.0.0.1", self.broker_port))
            with self._lock:
                self._sockets += [client, broker]
            threading.Thread(target=self._pump, args=(client, broker, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, to_broker: bool) -> None:
        parser = FrameParser()
        try:
            while data := source.recv(65536):
                if to_broker:
                    for frame in parser.feed(data):
                        if frame.command == "ACK":
                            seen = SeenAck(int(frame.headers["curb-upto"]), self._committed())
                            with self._lock:
                                self.acks.append(seen)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
