"""`curb inspect`: the offline report on a log file."""

import json
import os
import subprocess
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import CURB

import curb.inspect
from curb.client import Client
from curb.inspect import inspect_command
from curb.log import LogReader
from curb.log import record as fmt

HOUR_MS = 3600 * 1000


def entry(id, state="rdy", deliveries=0, age_ms=0, headers=None, body=b"x"):
    return SimpleNamespace(
        id=id,
        state=state,
        deliveries=deliveries,
        timestamp_ms=time.time_ns() // 1_000_000 - age_ms,
        offset=512 + 100 * id,
        size=100,
        headers=headers or {},
        body=body,
        due_ms=0,
        expires_ms=0,
    )


def summary(entries, torn=None, cap=1 << 20):
    waiting = [e for e in entries if e.state == "rdy"]
    return SimpleNamespace(
        path="/srv/q/curb.log",
        file_bytes=64 * 1024,
        cap=cap,
        messages=len(waiting),
        acked=len(entries) - len(waiting),
        live_bytes=100 * len(waiting),
        dead_bytes=100 * (len(entries) - len(waiting)),
        oldest_timestamp_ms=waiting[0].timestamp_ms if waiting else None,
        torn=torn,
        delayed=0,
        dead=0,
    )


@pytest.fixture
def log_file(tmp_path, monkeypatch):
    """A path whose reading is served by a stand-in LogReader; returns a function that sets what it holds."""
    path = tmp_path / "curb.log"
    path.write_bytes(b"")
    held: dict[str, Any] = {}  # "entries", "torn" and "cap", as holding() was last given them

    class FakeReader:
        def __init__(self, given):
            assert str(given) == str(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def entries(self):
            return iter(held["entries"])

        def summary(self):
            return summary(held["entries"], held["torn"], held["cap"])

    monkeypatch.setattr(curb.inspect, "LogReader", FakeReader)

    def holding(entries, torn=None, cap=1 << 20):
        held.update(entries=entries, torn=torn, cap=cap)
        return str(path)

    return holding


def run(*args):
    return CliRunner().invoke(inspect_command, [str(a) for a in args])


def test_summary_answers_how_many_wait_since_when_and_whether_one_keeps_coming_back(log_file):
    path = log_file(
        [
            entry(1, state="ack"),
            entry(2, deliveries=3, age_ms=3 * HOUR_MS + 5000),
            entry(3, deliveries=17, age_ms=HOUR_MS),
            entry(4),
        ]
    )
    result = run(path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "curb log /srv/q/curb.log"
    assert lines[1] == "  messages  3 rdy, 0 delayed, 0 dead letters, 1 ack not yet reclaimed"
    assert lines[2].startswith("  oldest    #2, sent 3h00m ago (")
    assert lines[2].endswith(" UTC), delivered 3 times")
    assert lines[3] == "  retried   2 of them delivered before; most: #3, delivered 17 times"
    assert lines[4] == "  space     live 300 B (0% of cap 1.0 MiB), dead 100 B, file 64.0 KiB"
    assert lines[5] == "  tail      clean"
    assert len(lines) == 6


def test_summary_of_an_empty_queue(log_file):
    result = run(log_file([entry(1, state="ack")]))
    assert "  messages  0 rdy (queue empty), 0 delayed, 0 dead letters, 1 ack not yet reclaimed" in result.output
    assert "  oldest    -" in result.output
    assert "  retried   -" in result.output


def test_summary_says_none_came_back_when_no_waiting_message_was_delivered(log_file):
    result = run(log_file([entry(1, age_ms=90_000)]))
    assert "  oldest    #1, sent 1m30s ago (" in result.output
    assert "never delivered" in result.output
    assert "  retried   none of them delivered before" in result.output


def test_a_torn_tail_is_reported_and_explained(log_file):
    result = run(log_file([entry(1)], torn="37 bytes at offset 4096"))
    assert "  tail      TORN: 37 bytes at offset 4096" in result.output
    assert "never acknowledged to its producer" in result.output


def test_messages_lists_the_waiting_messages_with_headers_and_an_escaped_body(log_file):
    path = log_file(
        [
            entry(1, state="ack", body=b"done"),
            entry(
                2, deliveries=1, headers={"content-type": "text/plain", "trace": "a\nb"}, body=b"line1\nline2\x00\xff"
            ),
            entry(3, body="grüße".encode() + b"z" * 100),
            entry(4, body=b""),
        ]
    )
    result = run(path, "--messages")
    assert result.exit_code == 0, result.output
    listing = result.output.split("\n\n", 1)[1].splitlines()
    assert listing[0].startswith("#2 rdy, sent 0s ago (")
    assert listing[0].endswith("delivered once, 13 B body")
    assert listing[1:4] == ["    content-type: text/plain", "    trace: a\\nb", "    body: line1\\nline2\\x00\\xff"]
    assert listing[4].endswith("never delivered, 107 B body")
    assert listing[5] == "    body: grüße" + "z" * 57 + " ... (43 more bytes)"
    assert listing[7] == "    body: (empty)"
    assert len(listing) == 8


def test_acked_records_are_listed_only_on_request(log_file):
    path = log_file([entry(1, state="ack"), entry(2)])
    assert "#1 ack" not in run(path, "--messages").output
    assert "#1 ack" in run(path, "--messages", "--acked").output


def test_limit_bounds_the_listing_and_says_how_many_are_left(log_file):
    path = log_file([entry(i) for i in range(1, 6)])
    result = run(path, "--messages", "--limit", 2)
    assert "#2 rdy" in result.output and "#3 rdy" not in result.output
    assert result.output.rstrip().endswith("... 3 more not listed (--limit 2; --limit 0 lists all)")
    assert "#5 rdy" in run(path, "--messages", "--limit", 0).output


def test_json_carries_the_summary_and_the_messages(log_file):
    path = log_file(
        [entry(1, state="ack"), entry(2, deliveries=4, age_ms=HOUR_MS, headers={"k": "v"}, body=b"\x01hi")],
        torn="9 bytes at offset 700",
    )
    result = run(path, "--json", "--messages")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    head = document["summary"]
    assert head["messages"] == 1 and head["acked"] == 1 and head["torn"] == "9 bytes at offset 700"
    assert head["most_delivered"] == {"id": 2, "deliveries": 4}
    assert head["oldest_age_seconds"] == pytest.approx(3600, abs=60)
    [message] = document["messages"]
    assert message["id"] == 2 and message["headers"] == {"k": "v"}
    assert message["body_bytes"] == 3 and message["body_preview"] == "\\x01hi"


def test_json_without_messages_has_only_the_summary(log_file):
    assert json.loads(run(log_file([entry(1)]), "--json").output).keys() == {"summary"}


def test_a_file_that_is_not_a_curb_log_is_a_clear_error_with_the_brokers_exit_status(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("001 rdy first\n")
    result = run(path)
    assert result.exit_code == 2, "the broker exits 2 on the same file: a usage error"
    assert result.output.startswith("Error: ") and "not a curb log" in result.output


def test_a_curb_log_whose_header_is_damaged_exits_3_as_the_broker_does(tmp_path):
    path = tmp_path / "curb.log"
    header = bytearray(fmt.initial_header(1 << 20))
    for offset in fmt.SLOT_OFFSETS:
        header[offset : offset + 4] = b"xxxx"
    path.write_bytes(bytes(header))
    result = run(path)
    assert result.exit_code == 3
    assert "damaged (no intact checkpoint)" in result.output


def test_limit_or_acked_without_messages_lists_the_messages(log_file):
    path = log_file([entry(1, state="ack"), entry(2), entry(3), entry(4)])
    limited = run(path, "--limit", 2).output
    assert "#2 rdy" in limited and "#3 rdy" in limited and "#4 rdy" not in limited
    assert limited.rstrip().endswith("... 1 more not listed (--limit 2; --limit 0 lists all)")
    assert "#1 ack" in run(path, "--acked").output
    assert [m["id"] for m in json.loads(run(path, "--json", "--limit", 1).output)["messages"]] == [2]
    assert "#2 rdy" not in run(path).output, "without any of them, only the summary"


def test_a_file_that_does_not_record_its_cap_says_so(log_file):
    path = log_file([entry(1)], cap=None)
    assert (
        "  space     live 100 B (cap not recorded in this file: the broker records it when it next opens the file)"
        in (run(path).output)
    )
    assert json.loads(run(path, "--json").output)["summary"]["cap"] is None


def test_a_missing_file_is_a_usage_error(tmp_path):
    result = run(tmp_path / "nope.log")
    assert result.exit_code == 2
    assert "does not exist" in result.output


def send(port: int, *bodies: bytes, headers: dict[str, str] | None = None) -> None:
    with Client("127.0.0.1", port) as client:
        for i, body in enumerate(bodies):
            client.send(body, headers=headers, receipt=f"r{i}")
        client.wait_receipt(f"r{len(bodies) - 1}")


def test_reports_a_log_written_by_a_real_broker(curb_broker):
    broker = curb_broker(extra_args=["-redelivery-delay", "0"])  # the NACKed message is rdy at once
    send(broker.port, b"first")
    send(broker.port, b"bin\x00ary", headers={"content-type": "application/octet-stream", "order": "17"})
    send(broker.port, b"third")
    with Client("127.0.0.1", broker.port) as client:
        client.subscribe(prefetch=2)
        first, second = client.receive(timeout=10), client.receive(timeout=10)
        assert first is not None and second is not None
        client.unsubscribe()
        client.ack(first.headers["ack"], receipt="acked")
        client.nack(second.headers["ack"], receipt="nacked")
        client.wait_receipt("nacked")
    assert broker.stop() == 0

    text = run(broker.file).output
    assert "  messages  2 rdy," in text
    assert f"  oldest    #{second.headers['message-id']}, sent 0s ago (" in text
    assert f"  retried   1 of them delivered before; most: #{second.headers['message-id']}, delivered once" in text
    assert "  tail      clean" in text

    document = json.loads(run(broker.file, "--json", "--messages").output)
    assert document["summary"]["messages"] == 2 and document["summary"]["torn"] is None
    nacked, third = document["messages"]
    assert nacked["id"] == int(second.headers["message-id"]) and nacked["deliveries"] == 1
    assert nacked["headers"].items() >= {"content-type": "application/octet-stream", "order": "17"}.items()
    assert (nacked["body_bytes"], nacked["body_preview"]) == (7, "bin\\x00ary")
    assert (third["deliveries"], third["body_preview"]) == (0, "third")


def test_reports_the_torn_tail_a_crash_left(curb_broker):
    broker = curb_broker()
    send(broker.port, b"one", b"two", b"three")
    broker.kill()
    last = list(LogReader(broker.file).entries())[-1]
    os.truncate(broker.file, last.offset + last.size // 2)

    result = run(broker.file, "--messages")
    assert result.exit_code == 0, result.output
    assert "  messages  2 rdy," in result.output
    assert "  tail      TORN: torn tail" in result.output
    assert "body: two" in result.output and "body: three" not in result.output


def test_reads_the_log_of_a_running_broker_through_the_curb_command(curb_broker):
    broker = curb_broker()
    send(broker.port, b"waiting")
    result = subprocess.run([*CURB, "inspect", str(broker.file)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "  messages  1 rdy," in result.stdout
    send(broker.port, b"still served")


def stats(http_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats", timeout=10) as response:
        return json.loads(response.read())


def test_space_is_measured_against_the_brokers_cap_not_the_files_size(curb_broker, free_port):
    http_port = free_port()
    broker = curb_broker(cap="10MiB", extra_args=("-http", f"127.0.0.1:{http_port}"))
    send(broker.port, *[bytes(100 * 1024)] * 9)
    cap = stats(http_port)["cap"]
    assert cap == 10 << 20
    text = run(broker.file).output
    assert "% of cap 10.0 MiB), dead " in text and "  space     live 90" in text and "(9% of cap" in text
    assert json.loads(run(broker.file, "--json").output)["summary"]["cap"] == cap

    broker.stop()
    broker.cap = "20MiB"
    broker.start()
    assert json.loads(run(broker.file, "--json").output)["summary"]["cap"] == stats(http_port)["cap"] == 20 << 20


def test_a_log_from_before_the_cap_was_recorded_says_so_until_a_broker_opens_it(curb_broker, tmp_path):
    broker = curb_broker(cap="1MiB")
    send(broker.port, b"kept")
    assert broker.stop() == 0
    with open(broker.file, "r+b") as f:  # the header as brokers wrote it before the cap line existed
        f.seek(fmt.CAP_OFFSET)
        f.write(b" " * len(fmt.cap_line(0)))
    document = json.loads(run(broker.file, "--json").output)["summary"]
    assert document["cap"] is None and document["messages"] == 1
    broker.start()
    assert json.loads(run(broker.file, "--json").output)["summary"]["cap"] == 1 << 20
