"""Every ERROR the session can send, one row per source, in memory over the real log on a
simulated disk: each has a `message` header saying what happened and a body saying what
to do. The sources are the `error(` calls and the `raise QueueError` / `raise Refused` /
`ProtocolError` sites of curb.session, curb.commands, curb.access, curb.deadlines, curb.receipts,
curb.broker, curb.queue, curb.message_limits and curb.frame (the parser's errors share one body,
so a few stand for all)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from memworld import MemPeer, MemWorld
from test_session_access import USERS

from curb.frame import MAX_HEADER_LINE, MAX_HEADERS, Frame, encode
from curb.logins import MAX_QUEUED_PER_SOURCE
from curb.message_limits import ADDED_HEADERS, RESERVE
from curb.session import Session

Step = bytes | Callable[[MemWorld, Session], None]


def later(seconds: float) -> Step:
    """Time passes and the session's deadline comes."""

    def tick(world: MemWorld, session: Session) -> None:
        world.now += seconds
        session.tick(world.now)

    return tick


def disk_fails(world: MemWorld, session: Session) -> None:
    """Every fdatasync from now on fails (EIO): the log stops for good."""
    world.disk.sync_eio = 1.0


def login_queue_full(world: MemWorld, session: Session) -> None:
    """Password checks stop finishing and fill the queue's share of the session's address."""
    logins = world.broker.logins
    logins.offload = lambda work, then: None
    for n in range(MAX_QUEUED_PER_SOURCE + 1):  # one runs, the rest wait
        logins.check(n, session.peer, "all", f"guess {n}", lambda answer: None)


def frame(command: str, body: bytes = b"", **headers: str) -> bytes:
    return encode(command, {k.replace("_", "-"): v for k, v in headers.items()}, body)


SUBSCRIBE = frame("SUBSCRIBE", id="s", destination="/queue/curb", ack="client-individual")


@dataclass(frozen=True)
class Row:
    message: str  # words of the ERROR's message header: what happened
    advice: str  # words of its body: what to do
    steps: tuple[Step, ...] = ()  # after CONNECT: reads of bytes, and things that happen
    connect: bool = True
    users: bool = False
    cap: int = 256 * 1024
    max_frame: int | None = None
    held: int = 0  # messages in the queue before the peer connects


ROWS = {
    # ------------------------------------------------ the session's own rules
    "frame before CONNECT": Row("SEND not allowed before CONNECT", "Send CONNECT", (frame("SEND"),), connect=False),
    "CONNECT twice": Row("CONNECT not allowed after CONNECT", "open a new connection", (frame("CONNECT"),)),
    "unknown command": Row("unknown command 'FROB'", "send CONNECT (or STOMP), SEND", (frame("FROB"),)),
    "transaction": Row("transactions are not supported", "send frames without", (frame("BEGIN", transaction="t"),)),
    "protocol version": Row(
        "unsupported protocol version", "send accept-version:1.2", (frame("CONNECT", accept_version="1.0"),), False
    ),
    "bad heart-beat": Row(
        "bad heart-beat header",
        "must be two comma-separated integers",
        (frame("CONNECT", accept_version="1.2", heart_beat="5"),),
        connect=False,
    ),
    "CONNECT timeout": Row("CONNECT timeout", "Send CONNECT within 10 s", (later(10.5),), connect=False),
    "access refused": Row(
        "access refused",
        "Send the login and passcode of a user",
        (frame("CONNECT", accept_version="1.2", login="all", passcode="wrong"), later(1.5)),
        connect=False,
        users=True,
    ),
    "server busy": Row(
        "server busy",
        "Connect again in a few seconds",
        (login_queue_full, frame("CONNECT", accept_version="1.2", login="all", passcode="pw-all")),
        connect=False,
        users=True,
    ),
    "permission needed": Row(
        "consume permission needed",
        "curb passwd USERS-FILE producer --perm consume",
        (frame("CONNECT", accept_version="1.2", login="producer", passcode="pw-p"), SUBSCRIBE),
        connect=False,
        users=True,
    ),
    # ------------------------------------------------ frames that do not parse (one body for all)
    "header without colon": Row("header line without a colon", "fix the frame", (b"SEND\nno-colon\n\nx\0",)),
    "undefined escape": Row("undefined escape", "fix the frame", (b"SEND\nx:a\\tb\n\nx\0",)),
    "body over the limit": Row("body exceeds", "fix the frame", (b"SEND\n\n" + b"x" * 5000 + b"\0",), max_frame=4096),
    "frame head over -max-frame": Row(
        "frame exceeds 4096 bytes", "fix the frame", (b"SEND\nh:" + b"v" * 5000 + b"\n\n\0",), max_frame=4096
    ),
    # ------------------------------------------------ SENDs refused (curb.message_limits, curb.broker)
    "too many headers": Row(
        "too many headers",
        "send fewer, or put them in the body",
        (frame("SEND", b"", **{f"h{i}": "v" for i in range(MAX_HEADERS - ADDED_HEADERS + 1)}),),
    ),
    "header too long": Row(
        "header too long", "shorten it", (b"SEND\nh:" + b":" * (MAX_HEADER_LINE // 2 + 1) + b"\n\n\0",)
    ),
    "MESSAGE over -max-frame": Row(
        "message too large",
        "send a smaller body, or ask the operator for a larger -max-frame",
        (frame("SEND", b"x" * (8192 - RESERVE), h="v"),),
        max_frame=8192,
    ),
    "message over the cap": Row(
        "message too large",
        "send a smaller message, or ask the operator for a larger -cap",
        (frame("SEND", b"x" * 10_000, h="v" * 2000),),
        cap=64 * 1024,
    ),
    "queue full": Row(
        "queue full",
        "retry once consumers have caught up",
        (b"".join(frame("SEND", b"x" * 8000) for _ in range(12)),),
        cap=64 * 1024,
    ),
    # ------------------------------------------------ QueueError: subscriptions
    "SUBSCRIBE without id": Row("SUBSCRIBE needs an id header", "Give SUBSCRIBE an id header", (frame("SUBSCRIBE"),)),
    "subscription line too long": Row(
        "SUBSCRIBE header line", "Use a shorter subscription id", (frame("SUBSCRIBE", id="i" * 2000),)
    ),
    "second SUBSCRIBE": Row(
        "already subscribed as 's'", "UNSUBSCRIBE it before subscribing again", (SUBSCRIBE, frame("SUBSCRIBE", id="t"))
    ),
    "unknown ack mode": Row(
        "unknown ack mode 'sometimes'",
        "Send SUBSCRIBE with an ack header of auto, client, client-individual",
        (frame("SUBSCRIBE", id="s", ack="sometimes"),),
    ),
    "prefetch 0": Row("bad prefetch '0'", "Give prefetch-count", (frame("SUBSCRIBE", id="s", prefetch_count="0"),)),
    "prefetch not a number": Row(
        "bad prefetch 'ten': use a whole number from 1 to",
        "Give prefetch-count",
        (frame("SUBSCRIBE", id="s", prefetch_count="ten"),),
    ),
    "UNSUBSCRIBE without id": Row(
        "UNSUBSCRIBE needs an id header", "Give UNSUBSCRIBE the id header its SUBSCRIBE had", (frame("UNSUBSCRIBE"),)
    ),
    "UNSUBSCRIBE of an unknown id": Row(
        "no active subscription 'x'",
        "UNSUBSCRIBE with the id of this connection's SUBSCRIBE",
        (frame("UNSUBSCRIBE", id="x"),),
    ),
    "bad curb-ack-timeout": Row(
        "bad curb-ack-timeout header",
        "from 0 (no deadline) to 86400000 (a day)",
        (frame("SUBSCRIBE", id="s", ack="client", curb_ack_timeout="soon"),),
    ),
    # ------------------------------------------------ QueueError: delays, expiry, redrive
    "bad curb-delay on SEND": Row(
        "bad curb-delay header",
        "Give curb-delay milliseconds from now, 0 to 2592000000",
        (frame("SEND", curb_delay="-5"),),
    ),
    "curb-delay past 30 days": Row(
        "bad curb-delay header: curb-delay 2592000001 exceeds the limit",
        "Give curb-delay milliseconds from now, 0 to 2592000000 (30 days)",
        (frame("SEND", curb_delay="2592000001"),),
    ),
    "bad AMQ_SCHEDULED_DELAY": Row(
        "bad AMQ_SCHEDULED_DELAY header",
        "Give AMQ_SCHEDULED_DELAY milliseconds from now",
        (encode("SEND", {"AMQ_SCHEDULED_DELAY": "soon"}),),
    ),
    "AMQ_SCHEDULED_TIME past 30 days": Row(
        "bad AMQ_SCHEDULED_TIME header",
        "at most 2592000000 ms (30 days) from now",
        (encode("SEND", {"AMQ_SCHEDULED_TIME": "99999999999999"}),),
    ),
    "two due times": Row(
        "SEND names two due times: curb-delay and AMQ_SCHEDULED_DELAY",
        "Give a SEND one of curb-delay",
        (encode("SEND", {"curb-delay": "5", "AMQ_SCHEDULED_DELAY": "5"}),),
    ),
    "bad expires": Row(
        "bad expires header",
        "Give expires a time in milliseconds since the epoch (0: never)",
        (frame("SEND", expires="x"),),
    ),
    "bad curb-ttl": Row("bad curb-ttl header", "Give curb-ttl milliseconds from now", (frame("SEND", curb_ttl="-1"),)),
    "bad curb-delay on NACK": Row(
        "bad curb-delay header",
        "Give curb-delay milliseconds from now",
        (SUBSCRIBE, frame("NACK", id="1", curb_delay="later")),
        held=1,
    ),
    "bad curb-count on ./redrive": Row(
        "bad curb-count header",
        "give the number of dead letters to move back",
        (frame("SEND", destination="./redrive", curb_count="all"),),
    ),
    "SEND to ./dead": Row(
        "SEND to ./dead refused",
        "./dead is read with SUBSCRIBE",
        (frame("SEND", destination="./dead"),),
    ),
    "SEND to a misspelt ./redrive": Row(
        "SEND to ./Redrive refused: did you mean ./redrive?",
        "SEND to ./redrive (in lower case",
        (frame("SEND", destination="./Redrive"),),
    ),
    "SEND to /queue/redrive": Row(
        "SEND to /queue/redrive refused: did you mean ./redrive?",
        "SEND to ./redrive (in lower case",
        (frame("SEND", destination="/queue/redrive"),),
    ),
    "SEND to an unknown ./ name": Row(
        "SEND to ./purge refused",
        "Curb's own names are ./redrive (SEND), ./dead and ./count (SUBSCRIBE)",
        (frame("SEND", destination="./purge"),),
    ),
    "SUBSCRIBE to an unknown ./ name": Row(
        "SUBSCRIBE to ./counts refused",
        "Curb's own names are ./redrive (SEND), ./dead and ./count (SUBSCRIBE)",
        (frame("SUBSCRIBE", id="s", destination="./counts"),),
    ),
    "SUBSCRIBE to a misspelt ./dead": Row(
        "SUBSCRIBE to ./Dead refused: did you mean ./dead?",
        "spelt exactly so",
        (frame("SUBSCRIBE", id="s", destination="./Dead"),),
    ),
    "./redrive with a delay": Row(
        "./redrive takes no curb-delay",
        "A redrive moves dead letters at once",
        (frame("SEND", destination="./redrive", curb_delay="5000"),),
    ),
    "./redrive with a body": Row(
        "./redrive takes no body",
        "send ./redrive with an empty body",
        (frame("SEND", b"all of them", destination="./redrive"),),
    ),
    "AMQ_SCHEDULED_REPEAT": Row(
        "Curb does not repeat messages: AMQ_SCHEDULED_REPEAT",
        "each SEND is one message",
        (encode("SEND", {"AMQ_SCHEDULED_REPEAT": "3", "AMQ_SCHEDULED_PERIOD": "1000"}),),
    ),
    "AMQ_SCHEDULED_PERIOD": Row(
        "Curb does not repeat messages: AMQ_SCHEDULED_PERIOD",
        "each SEND is one message",
        (encode("SEND", {"AMQ_SCHEDULED_DELAY": "1000", "AMQ_SCHEDULED_PERIOD": "1000"}),),
    ),
    # ------------------------------------------------ QueueError: browses and their ids
    "browse still running": Row(
        "browse 'b' is still running",
        "Wait for the browse's end marker",
        (frame("SUBSCRIBE", id="b", browser="true") + frame("SUBSCRIBE", id="b", browser="true"),),
        held=3,
    ),
    "bad curb-from-id": Row(
        "bad curb-from-id 'x'",
        "Give curb-from-id a message id",
        (frame("SUBSCRIBE", id="b", browser="true", curb_from_id="x"),),
    ),
    "bad curb-to-id": Row(
        "bad curb-to-id 'x'",
        "Give curb-to-id a message id",
        (frame("SUBSCRIBE", id="b", browser="true", curb_to_id="x"),),
    ),
    # ------------------------------------------------ QueueError: ACK and NACK
    "ACK without id": Row("ACK needs an id header", "Give ACK the id header", (frame("ACK"),)),
    "NACK without id": Row("NACK needs an id header", "Give NACK the id header", (frame("NACK"),)),
    "unknown ack id": Row("unknown ack id 'abc'", "Give ACK the ack header of a MESSAGE", (frame("ACK", id="abc"),)),
    "ACK of a message not held": Row(
        "message 99 is not awaiting ACK or NACK on this connection",
        "ACK or NACK only the ack header of a MESSAGE this connection received",
        (frame("ACK", id="99"),),
    ),
    "NACK of a message not held": Row(
        "message 99 is not awaiting ACK or NACK", "ACK or NACK only the ack header", (frame("NACK", id="99"),)
    ),
    "bad curb-touch": Row(
        "bad curb-touch header",
        "from 1 to 86400000 (a day)",
        (SUBSCRIBE, frame("NACK", id="1", curb_touch="0")),
        held=1,
    ),
    "bad curb-upto": Row("bad curb-upto 'x'", "Give curb-upto a message id", (frame("ACK", curb_upto="x"),)),
    "curb-upto above the last id": Row(
        "curb-upto 5 is above the highest message id so far (2)",
        "ACK up to an id the broker has assigned",
        (frame("ACK", curb_upto="5"),),
        held=2,
    ),
    # ------------------------------------------------ the log could not make a frame's effect durable
    "SEND not stored": Row(
        "message not stored", "send it again once the broker can store it", (disk_fails, frame("SEND", receipt="r"))
    ),
    "SEND without receipt not stored": Row(
        "message not stored", "send it again once the broker can store it", (disk_fails, frame("SEND"))
    ),
    "ACK not stored": Row(
        "ACK not stored",
        "reconnect once it is back",
        (SUBSCRIBE, disk_fails, frame("ACK", id="1", receipt="r")),
        held=1,
    ),
    "NACK not stored": Row(
        "NACK not stored",
        "reconnect once it is back",
        (SUBSCRIBE, disk_fails, frame("NACK", id="1", receipt="r")),
        held=1,
    ),
    "ACK curb-upto not stored": Row(
        "ACK not stored", "reconnect once it is back", (disk_fails, frame("ACK", curb_upto="1", receipt="r")), held=1
    ),
    "DISCONNECT not stored": Row(
        "DISCONNECT not stored",
        "reconnect once it is back",
        (SUBSCRIBE, frame("ACK", id="1"), disk_fails, frame("DISCONNECT", receipt="r")),
        held=1,
    ),
}


def the_error(row: Row) -> Frame:
    """Play the row's steps on a fresh broker and return the one ERROR they drew."""
    options: dict[str, Any] = {} if row.max_frame is None else {"max_frame": row.max_frame}
    world = MemWorld(cap=row.cap, **options)
    if row.held:
        world.peer().produce([b"held %d" % n for n in range(row.held)])
    if row.users:
        world.broker.users = USERS
    peer = MemPeer(world, Session(world.broker, world.now, "test"))
    if row.connect:
        peer.send("CONNECT", accept_version="1.2")
    frames: list[Frame] = []
    for step in row.steps:
        frames += peer.frames()
        if isinstance(step, bytes):
            peer.session.receive_data(step, world.now)
        else:
            step(world, peer.session)
        world.settle()
    frames += peer.frames()
    errors = [f for f in frames if f.command == "ERROR"]
    assert len(errors) == 1 and frames[-1] is errors[0], f"one ERROR, last: {frames}"
    assert peer.session.close_wanted == "close"
    return errors[0]


@pytest.mark.parametrize("name", list(ROWS))
def test_every_error_says_what_happened_and_what_to_do(name):
    row = ROWS[name]
    error = the_error(row)
    assert row.message in error.headers["message"]
    assert error.headers["content-type"] == "text/plain"
    body = error.body.decode()
    assert body.strip() and body.endswith("\n"), f"an ERROR needs a body: {error}"
    assert row.advice in body, f"the body should say {row.advice!r}: {body!r}"


def test_an_error_without_a_body_cannot_be_sent():
    world = MemWorld()
    peer = world.peer()
    with pytest.raises(ValueError, match="needs a body"):
        peer.session.error("something", " ")
    assert peer.frames() == [] and peer.session.close_wanted is None
