"""The `curb` command as an operator meets it: --help, usage errors, addresses, the default
log file, signals and the lines it logs."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import curb
from curb import cli, instance
from curb.instance import Config
from curb.log import LogCore, LogError
from curb.log.disk import FileDisk
from curb.redelivery import Redelivery

DOCUMENTED_FLAGS = [
    "-cap",
    "-addr",
    "-file",
    "-prefetch",
    "-max-frame",
    "-heartbeat",
    "-tls-addr",
    "-tls-cert",
    "-tls-key",
    "-tls-ca",
    "-users",
    "-connect-timeout",
    "-max-connections",
    "-ack-timeout",
    "-redelivery-delay",
    "-redelivery-multiplier",
    "-redelivery-max-delay",
    "-max-deliveries",
    "-expired",
    "--version",
]


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """A usage error: exit status 2 and exactly one line on stderr, which is returned."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, f"exit {result.returncode}, stderr: {result.stderr}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    return lines[0]


def test_help_lists_every_flag(run_curb):
    result = run_curb("--help")
    assert result.returncode == 0
    for flag in DOCUMENTED_FLAGS:
        assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", result.stdout), f"--help does not mention {flag}"


@pytest.mark.parametrize(
    "flag, value, fix",
    [
        ("-cap", "10XB", "MiB"),
        ("-addr", "nohost", "PORT"),
        ("-addr", ":70000", "65535"),
    ],
)
def test_bad_flag_value_is_a_one_line_usage_error(run_curb, tmp_path, flag, value, fix):
    args = {"-cap": "10MiB", "-addr": "127.0.0.1:0", "-file": str(tmp_path / "curb.log")}
    args[flag] = value
    line = one_line(run_curb(*[x for pair in args.items() for x in pair]))
    assert value in line, "the error should name the bad value"
    assert fix in line, f"the error should show what a good value looks like ({fix!r})"


def test_port_in_use_is_a_one_line_usage_error(run_curb, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(run_curb("-cap", "10MiB", "-addr", f"127.0.0.1:{port}", "-file", str(tmp_path / "curb.log")))
    assert str(port) in line and "-addr" in line


def test_unwritable_log_path_is_a_one_line_usage_error(run_curb, tmp_path):
    (tmp_path / "afile").write_text("a regular file, not a directory\n")
    path = tmp_path / "afile" / "x.log"
    line = one_line(run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(path)))
    assert str(path) in line and "-file" in line


def test_second_broker_on_the_same_log_is_refused(curb_broker, run_curb, raw):
    first = curb_broker()
    line = one_line(run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(first.file)))
    assert str(first.file.name) in line
    assert "another" in line or "lock" in line
    assert first.running()
    raw(first.port).connect()


def test_a_file_that_is_not_a_curb_log_is_refused_and_left_alone(run_curb, tmp_path):
    path = tmp_path / "notes.txt"
    content = "dear diary\n" * 100
    path.write_text(content)
    line = one_line(run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(path)))
    assert "notes.txt" in line and "not a curb log" in line
    assert path.read_text() == content


def test_a_log_whose_checkpoints_are_both_damaged_exits_3_with_one_line(run_curb, tmp_path):
    """Damage start-up cannot skip is its own exit status (the unit does not restart on
    it), one line, no traceback; the file is left as it was."""
    path = tmp_path / "curb.log"
    disk = FileDisk(str(path))
    LogCore(disk, 1 << 20)
    disk.close()
    raw = bytearray(path.read_bytes())
    for slot in (256, 384):
        raw[slot + 10] ^= 0x01
    path.write_bytes(bytes(raw))
    result = run_curb("-cap", "1MiB", "-addr", "127.0.0.1:0", "-file", str(path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr
    assert len(lines) == 1 and "damaged" in lines[0] and "move it away" in lines[0]
    assert path.read_bytes() == bytes(raw)


def start_with_a_failing_log(monkeypatch, capsys, path: Path, error: Exception) -> tuple[int, list[str]]:
    """Run the command in this process with opening the log at `path` raising `error`:
    (exit status, lines on stderr)."""

    def failing_log(*args, **kwargs):
        raise error

    monkeypatch.delenv("LISTEN_FDS", raising=False)
    monkeypatch.setattr(instance, "Log", failing_log)
    with pytest.raises(SystemExit) as exited:
        cli.main(["-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(path)])
    code = exited.value.code
    assert isinstance(code, int), f"main exits with a numeric status, not {code!r}"
    return code, capsys.readouterr().err.strip().splitlines()


def usage_error(capsys, args: list[str]) -> str:
    """cli.main(args) as a usage error: exit status 2 and exactly one line on stderr,
    which is returned."""
    with pytest.raises(SystemExit) as exit:
        cli.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(lines) == 1, (exit.value.code, lines)
    return lines[0]


def bad_flag(tmp_path: Path, flag: str, value: str) -> list[str]:
    """A start-up with one bad flag value. -file names a directory, so that a flag the
    CLI let through ends start-up at once (on -file) instead of serving."""
    return ["-cap", "1MiB", "-addr", "127.0.0.1:0", "-file", str(tmp_path), flag, value]


@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_a_connect_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(capsys, tmp_path, value):
    """With -connect-timeout nan, every connection that had not sent CONNECT yet kept
    the event loop busy at 100% CPU: a deadline of nan is always due and never met."""
    line = usage_error(capsys, bad_flag(tmp_path, "-connect-timeout", value))
    assert "-connect-timeout" in line and "0 for no limit" in line, line


def test_a_heart_beat_longer_than_a_day_is_a_usage_error(capsys, tmp_path):
    """The broker refuses a client's heart-beat over a day (curb.heartbeat.MAX_MS); it
    offered its own -heartbeat unbounded, up to 23 digits in CONNECTED."""
    line = usage_error(capsys, bad_flag(tmp_path, "-heartbeat", "86400001"))
    assert "-heartbeat" in line and "24h" in line, line


@pytest.mark.parametrize(
    ("flag", "value"),
    [("-heartbeat", "5x"), ("-heartbeat", "-1s"), ("-connect-timeout", "ten"), ("-ack-timeout", "30 minutes")],
)
def test_a_duration_flag_names_its_units(capsys, tmp_path, flag, value):
    """`-heartbeat 5s` was refused with click's "'5s' is not a valid integer range":
    every time flag takes a unit, and a bad value is told which ones."""
    line = usage_error(capsys, bad_flag(tmp_path, flag, value))
    assert flag in line and "500ms, 10s, 30m or 2h" in line, line


@pytest.mark.parametrize("value", ["0", "4095B", "1KiB"])
def test_a_max_frame_too_small_for_a_connect_is_a_usage_error(capsys, tmp_path, value):
    """`-max-frame 0` started a broker that answered every frame, CONNECT included,
    with `frame exceeds 0 bytes`."""
    line = usage_error(capsys, bad_flag(tmp_path, "-max-frame", value))
    assert "-max-frame" in line and value in line and "at least 4096 bytes" in line, line


def test_the_smallest_max_frame_serves_a_connect_and_a_message(curb_broker, raw):
    broker = curb_broker(extra_args=("-max-frame", "4KiB"))
    client = raw(broker.port)
    client.connect(login="someone", passcode="x" * 100, heart_beat="0,0")
    client.send_frame("SEND", {"destination": "/queue/curb", "receipt": "r"}, b"b" * 1000)
    client.send_frame("SUBSCRIBE", {"id": "s", "destination": "/queue/curb"})
    frames = {frame.command: frame for frame in (client.read_frame(), client.read_frame()) if frame is not None}
    assert set(frames) == {"RECEIPT", "MESSAGE"} and frames["MESSAGE"].body == b"b" * 1000


def test_a_users_file_without_users_is_a_usage_error_saying_how_to_add_one(capsys, tmp_path):
    """It started with `0 users` and no warning, then refused every login."""
    users = tmp_path / "users"
    users.write_text("# nobody yet\n\n")
    line = usage_error(capsys, ["-cap", "1MiB", "-addr", "127.0.0.1:0", "-file", str(tmp_path), "-users", str(users)])
    assert f"users file {users} has no users" in line, line
    assert f"curb passwd {users} NAME --perm send --perm consume" in line, line


def test_a_cap_above_the_free_space_is_a_start_up_warning(tmp_path):
    """Start-up did not say that the disk would fill before the queue."""
    said: list[tuple[str, str, dict]] = []
    space = os.statvfs(tmp_path)
    free = space.f_bavail * space.f_frsize
    path = str(tmp_path / "curb.log")
    for cap in (1 << 20, free + (1 << 30)):
        instance._warn_if_disk_is_short(
            lambda event, text, **fields: said.append((event, text, fields)), path, cap, 4096
        )
    [(event, text, fields)] = said
    assert event == "disk_space" and fields["level"] == "warning" and fields["cap"] == free + (1 << 30)
    assert text.startswith(f"WARNING: -cap is {(free + (1 << 30)) / (1 << 20):.1f} MiB") and str(tmp_path) in text
    assert "free space there or lower -cap" in text


@pytest.mark.parametrize("value", ["25h", "nan", "1e400"])
def test_an_ack_timeout_past_a_day_or_not_finite_is_a_usage_error(capsys, tmp_path, value):
    line = usage_error(capsys, bad_flag(tmp_path, "-ack-timeout", value))
    assert "-ack-timeout" in line and "0 for no deadline" in line, line


def serve_given(monkeypatch, *args: str) -> Config:
    """The Config the command passes to `serve` for these flags."""
    given: list[Config] = []

    async def serve(config, events) -> int:
        given.append(config)
        return 0

    monkeypatch.setattr(cli, "serve", serve)
    with pytest.raises(SystemExit) as exit:
        cli.main(["-cap", "1MiB", *args])
    assert exit.value.code == 0
    return given[0]


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 1800.0), ("0", 0.0), ("300ms", 0.3), ("90", 90.0), ("2h", 7200.0)]
)
def test_the_ack_timeout_reaches_the_broker_in_seconds(monkeypatch, value, seconds):
    """30 minutes unless told; a plain number is seconds; 0 turns deadlines off."""
    config = serve_given(monkeypatch, *([] if value is None else ["-ack-timeout", value]))
    assert config.ack_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    "args, named, hint",
    [
        (["-caps", "1MiB"], "-caps", "did you mean -cap?"),
        (["-cap", "1MiB", "-heartbeet", "5"], "-heartbeet", "did you mean -heartbeat?"),
        (["--adr", ":1"], "--adr", "did you mean -addr?"),
        (["-data", "q.log"], "-data", "`curb --help`"),
        (["passwd", "-permm", "send", "users", "ann"], "-permm", "did you mean -perm?"),
        # The broker's own flags given to the router: named as typed, not as "-t" or "-m".
        (["router", "-cap", "1GiB"], "-cap", "`curb router --help`"),
        (["router", "-max-deliveries", "3"], "-max-deliveries", "`curb router --help`"),
        (["router", "-prefech", "3"], "-prefech", "did you mean -prefetch?"),
    ],
)
def test_an_unknown_flag_is_named_as_typed_with_the_nearest_real_one(capsys, args, named, hint):
    """Click alone reports `-caps` as "No such option '-c'", naming a flag nobody typed."""
    line = usage_error(capsys, args)
    assert line.startswith(f"curb: no such option {named}") and hint in line, line


@pytest.mark.parametrize(
    "code", [errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EMFILE], ids=["EIO", "ENOSPC", "EDQUOT", "EMFILE"]
)
def test_io_error_on_the_log_at_start_up_exits_1_so_a_supervisor_retries(monkeypatch, capsys, tmp_path, code):
    path = tmp_path / "curb.log"
    status, lines = start_with_a_failing_log(monkeypatch, capsys, path, OSError(code, os.strerror(code), str(path)))
    assert status == 1 and len(lines) == 1, (status, lines)
    assert str(path) in lines[0] and os.strerror(code) in lines[0] and errno.errorcode[code] in lines[0]
    assert "-addr" not in lines[0], "an error on the log file is not about the address"


@pytest.mark.parametrize(
    "code",
    [errno.EACCES, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR],
    ids=["EACCES", "EROFS", "ENOENT", "ENOTDIR", "EISDIR"],
)
def test_log_file_the_operator_must_fix_is_a_usage_error(monkeypatch, capsys, tmp_path, code):
    path = tmp_path / "curb.log"
    status, lines = start_with_a_failing_log(monkeypatch, capsys, path, OSError(code, os.strerror(code), str(path)))
    assert status == 2 and len(lines) == 1, (status, lines)
    assert str(path) in lines[0] and os.strerror(code) in lines[0] and "-file" in lines[0]
    assert "-addr" not in lines[0]


def test_log_error_keeps_its_own_exit_status_if_it_has_one(monkeypatch, capsys, tmp_path):
    """The log may mark a LogError as transient with an `exit_status` attribute."""

    class TransientLogError(LogError):
        exit_status = 1

    plain, _ = start_with_a_failing_log(monkeypatch, capsys, tmp_path / "a.log", LogError("damaged beyond use"))
    marked, lines = start_with_a_failing_log(monkeypatch, capsys, tmp_path / "b.log", TransientLogError("device gone"))
    assert (plain, marked) == (2, 1)
    assert lines == ["curb: device gone"]


def test_a_log_path_that_is_a_directory_is_a_usage_error(run_curb, tmp_path):
    line = one_line(run_curb("-cap", "10MiB", "-addr", "127.0.0.1:0", "-file", str(tmp_path)))
    assert str(tmp_path) in line and "-file" in line and "-addr" not in line


def test_http_port_in_use_is_a_usage_error_naming_http(run_curb, tmp_path):
    """-http is bound once the log is recovered, so the recovery's line comes first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_curb(
            "-cap", "10MiB", "-addr", "127.0.0.1:0", "-http", f"127.0.0.1:{port}", "-file", str(tmp_path / "curb.log")
        )
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stderr
    assert str(port) in line and "-http" in line and "-addr" not in line


def dual_stack_port(free_port) -> int:
    """A port free on both 127.0.0.1 and ::1."""
    while True:
        port = free_port("::1")
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def test_empty_host_listens_on_ipv4_and_ipv6(curb_broker, raw, free_port):
    port = dual_stack_port(free_port)
    broker = curb_broker(addr=f":{port}")
    assert broker.port == port
    assert raw(port, "127.0.0.1").connect().headers["version"] == "1.2"
    assert raw(port, "::1").connect().headers["version"] == "1.2"


def test_bracketed_ipv6_address_works(curb_broker, raw, free_port):
    # A port free on 127.0.0.1 too: otherwise another program listening there on the
    # same number would answer the check below.
    port = dual_stack_port(free_port)
    broker = curb_broker(addr=f"[::1]:{port}")
    assert raw(broker.port, "::1").connect().headers["version"] == "1.2"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", broker.port), timeout=2).close()


def test_default_log_file_is_curb_log_in_the_working_directory(curb_broker, tmp_path):
    broker = curb_broker(default_file=True)
    assert broker.file == tmp_path / "curb.log"
    assert broker.file.is_file()
    assert str(broker.file.name) in broker.stderr_text()


def test_default_log_file_is_under_state_directory(curb_broker, tmp_path):
    state, cwd = tmp_path / "state", tmp_path / "cwd"
    state.mkdir()
    cwd.mkdir()
    broker = curb_broker(default_file=True, cwd=cwd, env={**os.environ, "STATE_DIRECTORY": str(state)})
    assert broker.file == state / "curb.log"
    assert broker.file.is_file()
    assert not (cwd / "curb.log").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_stop_cleanly(broker, raw, sig):
    client = raw(broker.port)
    client.connect()
    assert broker.stop(sig) == 0
    assert "stopped" in broker.stderr_text().splitlines()[-1]
    assert client.closed()


def test_start_up_reports_recovered_messages(broker, raw):
    client = raw(broker.port)
    client.connect()
    for i in range(3):
        client.send_frame("SEND", {"destination": "/queue/curb", "receipt": f"r{i}"}, b"kept %d" % i)
    assert [client.read_frame().headers.get("receipt-id") for _ in range(3)] == ["r0", "r1", "r2"]
    broker.restart()
    assert re.search(r"recovered 3 messages", broker.stderr_text()), broker.stderr_text()


def test_client_protocol_error_is_logged_with_the_peer_address(broker, raw, wait_until):
    client = raw(broker.port)
    client.send(b"HELLO\n\n\0")
    assert client.closed()
    host, port = client.sock.getsockname()[:2]
    assert wait_until(lambda: f"{host}:{port}" in broker.stderr_text()), broker.stderr_text()


def test_version_from_the_script_and_the_module(run_curb):
    module = run_curb("--version")
    assert module.returncode == 0 and curb.__version__ in module.stdout
    script = Path(sys.executable).parent / "curb"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=15)
    assert result.returncode == 0 and curb.__version__ in result.stdout


def test_sigterm_right_after_the_listening_line_is_a_clean_stop(curb_broker):
    """A supervisor may signal curb the moment it reads `listening on`: the handler is
    already in place, so the broker drains and exits 0 rather than dying of the signal."""
    broker = curb_broker()
    for _ in range(3):
        assert broker.stop() == 0
        assert broker.stderr_text().rstrip().endswith("curb: stopped"), broker.stderr_text()
        broker.start()


def test_a_listener_queues_a_reconnect_storm_in_the_kernel_while_accepting_a_few_per_pass():
    """asyncio listens with the backlog it accepts per loop pass; the broker listens again
    with a kernel queue for thousands, so a storm's SYNs are not dropped (a client resends
    one only after a second). Nothing is accepted here: the loop does not run meanwhile."""
    storm = 600  # past the old backlog of 128, within the smallest somaxconn of 4096 (Linux 5.4+)

    async def listen_and_connect() -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, backlog=instance.ACCEPT_BATCH)
        instance._widen_backlog(server)
        port = server.sockets[0].getsockname()[1]
        clients = []
        try:
            for _ in range(storm):
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        except OSError:
            pass
        finally:
            for client in clients:
                client.close()
            server.close()
        return len(clients)

    assert asyncio.run(listen_and_connect()) == storm


@pytest.mark.parametrize(
    ("args", "policy", "drop"),
    [
        ((), Redelivery(1000, 2.0, 60_000, 20), False),
        (
            ("-redelivery-delay", "1s", "-redelivery-multiplier", "3", "-redelivery-max-delay", "2m"),
            Redelivery(1000, 3.0, 120_000, 20),
            False,
        ),
        (
            ("-redelivery-delay", "250ms", "-max-deliveries", "0", "-expired", "drop"),
            Redelivery(250, 2.0, 60_000, 0),
            True,
        ),
        (("-redelivery-delay", "2", "-redelivery-max-delay", "90"), Redelivery(2000, 2.0, 90_000, 20), False),
    ],
)
def test_the_redelivery_flags_reach_the_broker(monkeypatch, args, policy, drop):
    """Defaults: a second, doubling, at most a minute, 20 deliveries, expired ones dead; a
    plain number is seconds, as for every duration flag."""
    config = serve_given(monkeypatch, *args)
    assert (config.redelivery, config.drop_expired) == (policy, drop)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("-redelivery-delay", "31d", "500ms, 10s, 30m or 2h"),
        ("-redelivery-delay", "721h", "longer than the most allowed"),
        ("-redelivery-multiplier", "0.5", "1.0<=x<=100.0"),
        ("-max-deliveries", "-1", "x>=0"),
        ("-expired", "keep", "'dead', 'drop'"),
    ],
)
def test_a_bad_redelivery_flag_is_a_usage_error(capsys, tmp_path, flag, value, says):
    line = usage_error(capsys, bad_flag(tmp_path, flag, value))
    assert flag in line and says in line, line


def test_the_flags_both_commands_take_are_declared_once_in_curb_flags():
    """`curb` and `curb router` share their listener, TLS, users, prefetch, frame,
    heart-beat and log flags: declared in curb/flags.py, never again in either command."""
    import ast
    from pathlib import Path

    import click

    from curb.cli import command as broker_command
    from curb.router.cli import router_command

    def names(cmd: click.Command) -> set[str]:
        return {name for param in cmd.params for name in param.opts if name.startswith("-") and name[1] != "-"}

    shared = names(broker_command) & names(router_command)
    assert {"-addr", "-tls-addr", "-tls-cert", "-tls-key", "-users", "-prefetch", "-max-frame"} <= shared
    assert {"-heartbeat", "-log-format"} <= shared
    top = Path(__file__).resolve().parent.parent / "curb"
    for source in (top / "cli.py", top / "router" / "cli.py"):
        declared = sorted(
            node.args[0].value
            for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "option"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in shared
        )
        assert not declared, f"{source.name} declares {declared} again (curb/flags.py has them)"
