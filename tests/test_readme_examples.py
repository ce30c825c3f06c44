"""Every example in README.md, ARCHITECTURE.md and docs/*.md runs as written, against real brokers.

tests/readme_examples.py finds the blocks of each document and reads the marker before each, which says
what a block needs (a broker, a users file, certificates, a terminal) or why it cannot
run here; a block without a usable marker fails `test_every_block_says_how_it_runs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from fcntl import ioctl
from pathlib import Path

import pytest
import readme_examples
import trustme
from conftest import free_port
from readme_examples import (
    PASSWORD,
    PORTS,
    TOP,
    Block,
    Example,
    MarkerError,
    Rewrite,
    all_blocks,
    blocks,
    example,
    name,
)

from curb import users
from curb.client import Client
from curb.spawn import LISTENING

RUN_S = 30.0  # at most, for one block; they take about a second each
SPARK_TEST = "tests/spark/test_spark_readme_examples.py"


def _examples() -> list[Example]:
    found = []
    for block in all_blocks():
        with contextlib.suppress(MarkerError):  # reported by test_every_block_says_how_it_runs
            found.append(example(block))
    return found


def _cases() -> list:
    """One test per block that runs, and one per example (or command) that is skipped."""
    cases = []
    for ex in _examples():
        if ex.kind in ("skip", "spark"):
            cases.append(pytest.param(ex, False, id=_name(ex, ex.block.text)))
        elif ex.kind == "python":
            cases.append(pytest.param(ex, True, id=_name(ex, ex.block.text)))
        elif ex.kind == "shell":
            run = [c for c in ex.commands() if ex.runs(c)]
            cases.extend(pytest.param(ex, False, id=_name(ex, c)) for c in ex.commands() if not ex.runs(c))
            if run:
                cases.append(pytest.param(ex, True, id=_name(ex, run[0])))
    return cases


def _name(ex: Example, text: str) -> str:
    """DOCUMENT:LINE and the first line of `text`, without its comment."""
    first = next(line for line in text.splitlines() if line.strip()).split("  #")[0].strip()
    return f"{ex.block.document}:{ex.block.line} {first[:70]}"


def test_every_block_says_how_it_runs():
    problems = []
    for block in all_blocks():
        try:
            example(block)
        except MarkerError as err:
            problems.append(str(err))
    assert not problems, "\n".join(problems)


def test_the_examples_are_looked_for_in_every_document():
    """README.md, ARCHITECTURE.md and each page of docs/, every one of them a test id's prefix."""
    documents = {block.document for block in all_blocks()}
    assert {"README.md", "docs/guide.md", "docs/spark.md"} <= documents
    assert {name(d) for d in readme_examples.documents()} >= {"README.md", "ARCHITECTURE.md", "docs/guide.md"}


def test_the_spark_examples_have_the_test_that_runs_them():
    assert any(ex.kind == "spark" for ex in _examples()) <= (TOP / SPARK_TEST).is_file()


@pytest.mark.parametrize("ex, runs", _cases())
def test_readme_example(ex: Example, runs: bool, tmp_path: Path, curb_broker: Callable) -> None:
    if ex.kind == "spark":
        pytest.skip(f"run by {SPARK_TEST}")
    if not runs:
        pytest.skip(f"not run: {ex.options['reason']}")
    rewrite = Rewrite(tmp_path, {port: free_port() for port in PORTS})
    options = {name: rewrite(value) for name, value in ex.options.items()}
    rewrite.make_dirs("\n".join([rewrite(ex.block.text), *options.values()]))
    env = _environment(options.get("env", ""))
    if "users" in options:
        alice = users.User("alice", users.hash_password(PASSWORD), frozenset(users.PERMISSIONS))
        Path(options["users"]).write_text(users.format_users([alice]))
    if "certs" in options:
        _certificates(Path(options["certs"]))
    broker = None
    if "broker" in options:
        broker = curb_broker(
            addr=f"127.0.0.1:{rewrite.ports['61613']}",
            extra_args=shlex.split(options["broker"]),
            cwd=tmp_path,
            default_file=True,
        )
    if ex.kind == "python":
        script = tmp_path / "example.py"
        script.write_text(rewrite(ex.block.text))
        output = _run([sys.executable, str(script)], tmp_path, env)
    else:
        output = ""
        for command in filter(ex.runs, ex.commands()):
            line = rewrite.command(command)
            if "serves" in options:
                output += _serve(line, tmp_path, env)
            elif "terminal" in options:
                output += _run_on_a_terminal(line, tmp_path, env)
            else:
                output += _run(["bash", "-c", line], tmp_path, env)
    if "expect" in options:
        assert options["expect"] in output, f"{ex.block.describe()}: no {options['expect']!r} in its output:\n{output}"
    if "rdy" in options:
        assert broker is not None
        assert _rdy(broker.port) == int(options["rdy"]), f"{ex.block.describe()}: output:\n{output}"


def _environment(assignments: str) -> dict[str, str]:
    """The tests' environment with `curb` and `python` from the tests' Python first on PATH,
    and bin/ scripts pointed at that environment as already set up."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    stamps = sorted(Path(sys.prefix).glob(".curb-installed*"), key=lambda p: p.stat().st_mtime)
    if stamps:  # what bin/test or bin/check set up: bin/curb uses it as it is
        env["CURB_VENV"] = sys.prefix
        env["CURB_EXTRAS"] = stamps[-1].name.removeprefix(".curb-installed").removeprefix("-")
    env.update(word.partition("=")[::2] for word in shlex.split(assignments))
    return env


def _certificates(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.private_key_pem.write_to_path(str(directory / "tls.key"))
    (directory / "tls.pem").write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=RUN_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{argv[-1]!r} did not finish in {RUN_S:.0f} s; its output:\n{err.stdout!r}\n{err.stderr!r}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{argv[-1]!r} exited {done.returncode}:\n{output}"
    return output


def _serve(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Start a server command, wait for its `listening on` line, stop it with SIGTERM."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if LISTENING.search(line):
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + RUN_S
        while not listening.wait(0.05) and process.poll() is None and time.monotonic() < deadline:
            pass
        assert listening.is_set(), f"{command!r} did not say it listens:\n{''.join(lines)}"
        process.send_signal(signal.SIGTERM)
        status = process.wait(RUN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(RUN_S)
    assert status == 0, f"{command!r} exited {status} on SIGTERM:\n{''.join(lines)}"
    return "".join(lines)


def _run_on_a_terminal(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Run `command` with a pseudo-terminal as its controlling terminal, typing PASSWORD
    at each password prompt, as a person at a terminal would."""
    controller, terminal = pty.openpty()

    def take_the_terminal() -> None:
        ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        preexec_fn=take_the_terminal,
    )
    os.close(terminal)
    output, typed = b"", 0
    deadline = time.monotonic() + RUN_S
    try:
        while time.monotonic() < deadline:
            if select.select([controller], [], [], 0.1)[0]:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # EIO: every process on the terminal has closed it
                    break
                if not chunk:
                    break
                output += chunk
                prompts = len(re.findall(rb"Password for \S+: |Again: ", output))
                while typed < prompts:
                    os.write(controller, PASSWORD.encode() + b"\n")
                    typed += 1
            elif process.poll() is not None:
                break
        else:
            pytest.fail(f"{command!r} did not finish in {RUN_S:.0f} s; its output:\n{output!r}")
        status = process.wait(RUN_S)
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait()
    text = output.decode(errors="replace")
    assert status == 0, f"{command!r} exited {status}:\n{text}"
    return text


def _rdy(port: int) -> int:
    """The queue's waiting messages once no message is wip (the block's connections are
    gone, their ACKs handled), from the ./count subscription."""
    with Client("127.0.0.1", port) as client:
        client.subscribe("count", destination="./count")
        deadline = time.monotonic() + RUN_S
        while (counts := client.receive(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            current = json.loads(counts.body)
            if current["wip"] == 0:
                return current["rdy"]
        pytest.fail(f"messages still wip {RUN_S:.0f} s after the block ended")


# ---------------------------------------------------------------- the helper itself


def test_blocks_finds_fenced_and_indented_blocks_with_their_markers():
    text = "\n".join(
        [
            "# Title",
            "Text, then:",
            "",
            '<!-- example: text reason="a picture" -->',
            "```",
            "a -> b",
            "```",
            "- a list item",
            "  that goes on",
            "",
            "### Run",
            "    curb -cap 1MiB \\",
            "      -addr :61613",
            "",
            "    curb inspect curb.log",
            "",
            "A paragraph",
            "    with an indented line is not code.",
            "<!-- example: python broker -->",
            "```python",
            "    indented(inside)",
            "```",
        ]
    )
    assert blocks(text, "docs/page.md") == [
        Block(6, "", "a -> b", 'text reason="a picture"', "docs/page.md"),
        Block(12, None, "curb -cap 1MiB \\\n  -addr :61613\n\ncurb inspect curb.log", None, "docs/page.md"),
        Block(21, "python", "    indented(inside)", "python broker", "docs/page.md"),
    ]
    assert blocks(text, "docs/page.md")[0].describe() == "docs/page.md:6 a -> b"
    shell = Example(blocks(text, "docs/page.md")[1], "shell", {"skip": "curb inspect", "reason": "r"})
    assert shell.commands() == ["curb -cap 1MiB  -addr :61613", "curb inspect curb.log"]
    assert [shell.runs(c) for c in shell.commands()] == [True, False]


@pytest.mark.parametrize(
    "marker, complaint",
    [
        (None, "no marker on the line before it"),
        ("run", "kind must be one of"),
        ("shell brokr", "unknown marker option 'brokr'"),
        ("skip", 'reason="..."'),
        ('shell skip="systemctl"', 'reason="..."'),
        ("shell expect", "needs a value"),
        ("python broker", "must be a ```python block"),
        ("spark", "a spark example must be a ```python block"),
        ("shell rdy=1", "rdy=N needs a number and the broker option"),
        ('shell reason="unclosed', "No closing quotation"),
    ],
)
def test_a_block_without_a_usable_marker_is_refused_with_what_to_write(marker, complaint):
    with pytest.raises(MarkerError, match=re.escape(complaint)):
        example(Block(3, None, "curb inspect curb.log", marker, "README.md"))


def test_the_rewrites_move_ports_system_paths_and_bin_scripts_only(tmp_path):
    rewrite = Rewrite(tmp_path, {"61613": 40001, "61614": 40002, "8161": 40003})
    assert rewrite('("127.0.0.1", 61613) :61614 127.0.0.1:8161 6161399 1.61613') == (
        '("127.0.0.1", 40001) :40002 127.0.0.1:40003 6161399 1.61613'
    )
    assert rewrite("-tls-key /etc/curb/tls.key /var/lib/curb/orders/curb.log /etc/curbside /opt/etc/curb/x") == (
        f"-tls-key {tmp_path}/etc/curb/tls.key {tmp_path}/var/lib/curb/orders/curb.log /etc/curbside /opt/etc/curb/x"
    )
    assert rewrite.command("bin/curb -addr :61613") == f"{TOP}/bin/curb -addr :40001"
    assert rewrite.command("curb inspect bin/x") == "curb inspect bin/x"
    rewrite.make_dirs(rewrite("curb inspect /var/lib/curb/orders/curb.log"))
    assert (tmp_path / "var/lib/curb/orders").is_dir() and (tmp_path / "etc/curb").is_dir()
