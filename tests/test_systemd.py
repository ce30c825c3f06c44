"""systemd readiness, socket activation and the shipped unit files."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import CURB, STARTUP_S, free_port, wait_until

import curb
from curb.client import Client
from curb.spawn import BrokerProcess
from curb.systemd import listen_sockets, notify

UNITS = Path(curb.__file__).parent / "units"


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    """A bound datagram socket standing in for systemd's, named by $NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def test_notify_sends_lines_as_one_datagram(notify_socket):
    assert notify("READY=1", "STATUS=recovered 3 messages") is True
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=recovered 3 messages"


def test_notify_reaches_an_abstract_socket(monkeypatch):
    name = f"curb-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("STOPPING=1") is True
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("value", [None, "", "@", "vsock:2:1234", "relative/path"])
def test_notify_without_a_usable_socket_returns_false(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    else:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert notify("READY=1") is False


def test_notify_send_failure_returns_false_instead_of_raising(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens-here"))
    assert notify("READY=1") is False


def test_notify_refuses_a_line_that_would_smuggle_another_assignment(notify_socket):
    with pytest.raises(ValueError, match="newline"):
        notify("STATUS=one\nREADY=1")


def test_listen_sockets_ignores_variables_meant_for_another_process(monkeypatch):
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "curb")
    assert listen_sockets() == []
    assert not {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} & os.environ.keys()


def test_listen_sockets_is_empty_outside_socket_activation(monkeypatch):
    monkeypatch.delenv("LISTEN_PID", raising=False)
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    assert listen_sockets() == []


ACTIVATED_CHILD = textwrap.dedent(
    """
    import os, sys
    from curb.systemd import listen_sockets
    sockets = listen_sockets()
    left = sorted(k for k in os.environ if k.startswith("LISTEN_"))
    conn, _ = sockets[0].accept()
    conn.sendall(f"{len(sockets)} {sockets[0].fileno()} {left}".encode())
    conn.close()
    """
)

ACTIVATING_WRAPPER = textwrap.dedent(
    """
    import os, sys
    os.dup2(int(sys.argv[1]), 3)
    os.environ["LISTEN_PID"] = str(os.getpid())
    os.environ["LISTEN_FDS"] = "1"
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2]])
    """
)


def test_listen_sockets_adopts_the_socket_passed_at_fd_3():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-c", ACTIVATING_WRAPPER, str(server.fileno()), ACTIVATED_CHILD],
            pass_fds=[server.fileno()],
        )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            reply = conn.makefile("rb").read()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
    assert reply == b"1 3 []"


def _verifiable_copy(unit: str, directory: Path) -> Path:
    """A copy of a shipped unit whose ExecStart names the curb script of this environment."""
    curb_script = Path(sys.executable).with_name("curb")
    if not curb_script.exists():
        pytest.skip("the curb console script is not installed in this environment")
    text = (UNITS / unit).read_text()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={curb_script}", text, flags=re.M)
    copy = directory / unit
    copy.write_text(text)
    return copy


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing (Debian package: systemd)",
)
def test_unit_files_pass_systemd_analyze_verify(tmp_path):
    _verifiable_copy("curb@.service", tmp_path)
    _verifiable_copy("curb@.socket", tmp_path)
    _verify(tmp_path, tmp_path / "curb@orders.service", tmp_path / "curb@orders.socket")


def _verify(directory: Path, *units: Path) -> None:
    """systemd-analyze verify passes the units (found in `directory`) without a word."""
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{directory}:"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing (Debian package: systemd)",
)
def test_router_unit_passes_systemd_analyze_verify(tmp_path):
    unit = _verifiable_copy("curb-router.service", tmp_path)
    _verify(tmp_path, unit)
    assert re.search(r"^ExecStart=\S+ router \$CURB_ROUTER_ARGS$", unit.read_text(), flags=re.M)


def test_service_unit_reads_its_settings_from_the_instance_environment_file():
    service = (UNITS / "curb@.service").read_text()
    example = (UNITS / "curb.env.example").read_text()
    assert "EnvironmentFile=-/etc/curb/%i.env" in service
    assert re.search(r"^ExecStart=\S+/curb \$CURB_ARGS$", service, flags=re.M)
    assert re.search(r"^CURB_ARGS=.*-cap \S+", example, flags=re.M)


def env_without_notify_socket() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "NOTIFY_SOCKET"}


def test_ready_comes_after_recovery_and_stopping_on_sigterm(curb_broker, notify_socket, tmp_path):
    first = curb_broker(env=env_without_notify_socket())
    with Client("127.0.0.1", first.port) as client:
        for i in range(3):
            client.send(b"m%d" % i, receipt=f"r{i}")
        client.wait_receipt("r2")
    assert first.stop() == 0

    child = BrokerProcess(cwd=tmp_path, timeout=STARTUP_S)
    try:
        port = child.start(["-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(first.file)])
        ready = notify_socket.recv(4096).decode().split("\n")
        assert "READY=1" in ready
        assert any(re.match(r"STATUS=.*\b3 recovered messages", line) for line in ready), ready
        assert "recovered 3 messages" in child.output()
        client = Client("127.0.0.1", port, timeout=5)
        try:
            assert client.connect().command == "CONNECTED"
        finally:
            client.close()
        child.process.send_signal(signal.SIGTERM)
        assert notify_socket.recv(4096) == b"STOPPING=1"
        assert child.stop(timeout=STARTUP_S) == 0
    finally:
        child.kill()


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None,
    reason="systemd-socket-activate is missing (Debian package: systemd)",
)
def test_socket_activation_serves_a_stomp_client_on_the_passed_socket(tmp_path, stomp_conn):
    # Not curb.spawn: systemd-socket-activate starts the broker only at the first
    # connection, so there is no start-up line to wait for; its own line says it listens.
    port, ignored, stderr = free_port(), free_port(), tmp_path / "activated.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [
                "systemd-socket-activate",
                "-l",
                f"127.0.0.1:{port}",
                *CURB,
                "-cap",
                "1MiB",
                "-addr",
                f"127.0.0.1:{ignored}",
                "-file",
                str(tmp_path / "q.log"),
            ],
            cwd=tmp_path,
            env=env_without_notify_socket(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        assert wait_until(lambda: f"Listening on 127.0.0.1:{port}" in stderr.read_text(), STARTUP_S)
        conn, inbox = stomp_conn(port)
        conn.send("/queue/curb", "through the passed socket", receipt="sent")
        inbox.wait_receipt("sent")
        conn.subscribe("/queue/curb", id="s", ack="client-individual")
        [message] = inbox.wait_messages(1)
        assert message.body == "through the passed socket"
        assert "socket passed by systemd; -addr ignored" in stderr.read_text()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", ignored), timeout=5).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STARTUP_S) == 0
    finally:
        proc.kill()
        proc.wait()
