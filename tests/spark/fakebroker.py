"""A stand-in for a Curb broker speaking only what the streaming source needs: CONNECT, SEND
with receipts, browse subscriptions by id range and `ACK curb-upto`, as the broker documents
them. It lets the reader's own rules be tested without Spark, and tests choose the order a
browse lists messages in (a real broker's log order differs from id order after compaction).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from curb.frame import FrameParser, encode

Order = Callable[[list[int]], list[int]]


class FakeBroker:
    def __init__(self, order: Order = sorted) -> None:
        self.order = order  # the browse order of the live ids
        self.messages: dict[int, tuple[dict[str, str], bytes]] = {}
        self.highest = 0
        self.browses: list[tuple[int, int]] = []  # (from, to) of every browse served
        self.cut_next_browse: int | None = None  # the next browse drops its connection after this many messages
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, count: int) -> list[int]:
        with self._lock:
            ids = list(range(self.highest + 1, self.highest + count + 1))
            for number in ids:
                self.messages[number] = ({"n": str(number)}, b"body-%d" % number)
            self.highest += count
        return ids

    def drop_connections(self) -> None:
        """Close every client connection, as a broker restart would."""
        with self._lock:
            for sock in self._connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._connections.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which a close alone may not
        self._listener.close()
        self.drop_connections()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        parser = FrameParser()
        with contextlib.suppress(OSError), sock:
            while data := sock.recv(65536):
                for frame in parser.feed(data):
                    answer, cut = self._answer(frame.command, frame.headers, frame.body)
                    sock.sendall(answer)
                    if cut:
                        return

    def _answer(self, command: str, headers: dict[str, str], body: bytes) -> tuple[bytes, bool]:
        """The reply to a frame, and whether the connection drops after it."""
        out = b""
        if command in ("CONNECT", "STOMP"):
            return encode("CONNECTED", {"version": "1.2", "heart-beat": "0,0"}), False
        if command == "SEND":
            with self._lock:
                self.highest += 1
                self.messages[self.highest] = ({k: v for k, v in headers.items() if k != "receipt"}, body)
        elif command == "SUBSCRIBE" and headers.get("browser") == "true":
            out, cut = self._browse(headers)
            if cut:
                return out, True
        elif command == "ACK" and "curb-upto" in headers:
            upto = int(headers["curb-upto"])
            with self._lock:
                if upto > self.highest:
                    return encode("ERROR", {"message": f"curb-upto {upto} is above the highest id"}), True
                for number in [number for number in self.messages if number <= upto]:
                    del self.messages[number]
        else:
            return encode("ERROR", {"message": f"the fake broker does not do {command}"}), True
        if "receipt" in headers:
            out += encode("RECEIPT", {"receipt-id": headers["receipt"]})
        return out, False

    def _browse(self, headers: dict[str, str]) -> tuple[bytes, bool]:
        """The browse's frames, and whether it was cut short (`cut_next_browse`)."""
        sub = headers["id"]
        with self._lock:
            first = int(headers.get("curb-from-id", "1"))
            last = int(headers.get("curb-to-id", str(self.highest)))
            self.browses.append((first, last))
            live = self.order([number for number in self.messages if first <= number <= last])
            frames = [
                encode(
                    "MESSAGE",
                    {"subscription": sub, "message-id": str(number), "destination": "/queue/curb", **stored[0]},
                    stored[1],
                )
                for number in live
                for stored in [self.messages[number]]
            ]
            cut, self.cut_next_browse = self.cut_next_browse, None
        if cut is not None:
            return b"".join(frames[:cut]), True
        end = encode("MESSAGE", {"subscription": sub, "browser": "end", "curb-last-id": str(last)})
        return b"".join(frames) + end, False
