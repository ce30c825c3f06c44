"""systemd integration without a dependency: readiness datagrams and socket activation.

Both protocols are small and stable (see sd_notify(3) and sd_listen_fds(3)): a
datagram of newline-separated assignments to the socket named by $NOTIFY_SOCKET,
and listening sockets inherited from fd 3 on, announced by $LISTEN_PID and
$LISTEN_FDS. Outside systemd both calls do nothing, so the broker calls them
unconditionally.
"""

import os
import socket

LISTEN_FDS_START = 3
_ACTIVATION_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def notify(*lines: str) -> bool:
    """Send state lines such as "READY=1" or "STATUS=..." to the service manager.

    Returns True when the datagram was sent, False when there is no (usable)
    $NOTIFY_SOCKET or sending failed: readiness reporting must never take the
    broker down. A line holding a newline is a caller bug (it would smuggle in
    another assignment) and raises ValueError.
    """
    for line in lines:
        if "\n" in line:
            raise ValueError(f"a notify line cannot contain a newline: {line!r}")
    address = _notify_address(os.environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(lines).encode(), address)
    except OSError:
        return False
    return True


def _notify_address(value: str) -> str | None:
    """The AF_UNIX address in $NOTIFY_SOCKET: a path, or "@name" for the abstract namespace."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def listen_sockets() -> list[socket.socket]:
    """The listening sockets systemd passed to this process, in fd order ([] when none).

    The variables are removed from the environment either way, so a child process
    never mistakes them for its own; the sockets are made close-on-exec for the
    same reason.
    """
    pid = os.environ.get("LISTEN_PID", "")
    count = os.environ.get("LISTEN_FDS", "")
    for name in _ACTIVATION_VARIABLES:
        os.environ.pop(name, None)
    if not (pid.isdigit() and count.isdigit()) or int(pid) != os.getpid():
        return []
    sockets = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets
