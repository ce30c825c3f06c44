"""Real STOMP client libraries of other languages against Curb, direct and through `curb router`.

Each library has one script in tests/clients/ that connects, sends COUNT messages with
receipts, consumes them with client-individual acks and a prefetch, NACKs the first and
ACKs it when it comes back marked `redelivered`, and prints one JSON line: what it sent
(receipted), what it ACKed, what it NACKed and saw again, and every error its library
reported. Here each script runs against a broker, and through a router in front of one
instance (Ruby's also over a destination partitioned over two), and the test checks that
exactly the messages sent came back and nothing is left queued. stomp.py is used by the
rest of the suite. The Debian packages are installed by `bin/test` when it runs as root;
a test whose interpreter or library is missing is skipped, saying which package it needs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from curb.client import Client

SCRIPTS = Path(__file__).parent / "clients"
COUNT = 20
PREFETCH = 5
RUN_S = 60.0


@dataclass(frozen=True)
class Library:
    name: str
    argv: tuple[str, ...]  # the interpreter and the script; HOST PORT DESTINATION COUNT PREFETCH follow
    probe: tuple[str, ...]  # exits 0 when the interpreter has the library
    package: str  # what installs it

    def missing(self) -> str | None:
        """Why the library cannot run here, or None."""
        if shutil.which(self.probe[0]) is None:
            return f"{self.probe[0]} is not installed ({self.package}; bin/test installs it when run as root)"
        if subprocess.run(self.probe, capture_output=True, timeout=RUN_S).returncode != 0:
            return f"{self.name} is not installed ({self.package}; bin/test installs it when run as root)"
        return None


LIBRARIES = {
    "ruby": Library(
        "Ruby's stomp gem",
        ("ruby", str(SCRIPTS / "ruby_stomp.rb")),
        ("ruby", "-rstomp", "-e", ""),
        "Debian: ruby-stomp",
    ),
    "perl": Library(
        "Net::Stomp",
        ("perl", str(SCRIPTS / "perl_net_stomp.pl")),
        ("perl", "-MNet::Stomp", "-e", ""),
        "Debian: libnet-stomp-perl",
    ),
    "php": Library(
        "PHP's stomp extension",
        ("php", str(SCRIPTS / "php_stomp.php")),
        ("php", "-r", "exit(class_exists('Stomp') ? 0 : 1);"),
        "Debian: php-cli and php-stomp",
    ),
    "stompman": Library(
        "stompman",
        (sys.executable, str(SCRIPTS / "python_stompman.py")),
        (sys.executable, "-c", "import stompman"),
        "PyPI: stompman, in the test extra",
    ),
}


def run_client(key: str, port: int, destination: str) -> dict:
    library = LIBRARIES[key]
    if (why := library.missing()) is not None:
        pytest.skip(why)
    argv = [*library.argv, "127.0.0.1", str(port), destination, str(COUNT), str(PREFETCH)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_S)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"{library.name} exited {done.returncode}: {done.stdout}{done.stderr}"
    result: dict = json.loads(lines[-1])
    assert result["errors"] == [], f"{library.name} saw errors: {result['errors']}\n{done.stderr}"
    return result


def assert_every_message_once(result: dict, key: str) -> None:
    sent = [f"{key}-{n}" for n in range(COUNT)]  # each script's bodies are KEY-N
    assert result["sent"] == sent, "every SEND got its RECEIPT"
    assert sorted(result["acked"]) == sorted(sent), "each message sent was ACKed once"
    assert result["nacked"] is not None and result["redelivered"] == result["nacked"], result
    assert result["version"] in ("1.2", None), f"{result['client']} speaks {result['version']}"


def queued(port: int, destination: str = "./count") -> dict:
    """The counts a `./count` (or a router's `./NAME/count`) subscription reports first."""
    with Client("127.0.0.1", port) as client:
        client.subscribe("counts", destination=destination, ack="auto")
        frame = client.receive(10)
    assert frame is not None and frame.command == "MESSAGE", frame
    counts: dict = json.loads(frame.body)
    return counts


def drained(port: int, destination: str = "./count") -> bool:
    counts = queued(port, destination)
    return counts["rdy"] == 0 and counts["wip"] == 0


@pytest.mark.parametrize("key", sorted(LIBRARIES))
def test_a_client_library_direct(key, curb_broker, wait_until):
    broker = curb_broker(extra_args=["-redelivery-delay", "0"])
    assert_every_message_once(run_client(key, broker.port, "/queue/jobs"), key)
    assert wait_until(lambda: drained(broker.port)), queued(broker.port)


@pytest.mark.parametrize("key", sorted(LIBRARIES))
def test_a_client_library_through_the_router(key, curb_broker, curb_router, wait_until):
    instance = curb_broker(extra_args=["-redelivery-delay", "0"])
    router = curb_router([f"jobs=127.0.0.1:{instance.port}"])
    assert_every_message_once(run_client(key, router.port, "/queue/jobs"), key)
    assert wait_until(lambda: drained(instance.port)), queued(instance.port)
    assert wait_until(lambda: drained(router.port, "./jobs/count")), queued(router.port, "./jobs/count")


def test_ruby_through_the_router_over_a_partitioned_destination(curb_broker, curb_router, wait_until):
    instances = [curb_broker(file=f"p{n}.log", extra_args=["-redelivery-delay", "0"]) for n in range(2)]
    router = curb_router(["p=" + ",".join(f"127.0.0.1:{i.port}" for i in instances)])
    assert_every_message_once(run_client("ruby", router.port, "/queue/p"), "ruby")
    for instance in instances:
        assert wait_until(lambda: drained(instance.port)), queued(instance.port)  # noqa: B023 (waited on here)
