"""Acknowledge an sshd's packets at once, not 40 ms later.

OpenSSH's sshd sets TCP_NODELAY only on interactive sessions (a pty, X11).
On a `cvs` connection it is off, so Nagle's algorithm holds an sshd's small
write while an earlier one is unacknowledged; and a Linux client in
"ping-pong" mode delays its acknowledgement up to 40 ms, hoping to send it
with data of its own. When the sshd writes twice before we answer (the
host-keys message after a login, a command's output then its exit status),
each such turn costs one delayed-ACK timeout: two of them, 80 ms, in a
2-host attach here (tcpdump). So after each read of a TCP connection to an
sshd the client re-arms TCP_QUICKACK, which also sends an acknowledgement
that is pending: one setsockopt per read.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def acknowledge_promptly(conn: Any) -> bool:
    """Re-arm TCP_QUICKACK after each read of `conn` (an asyncio protocol
    whose transport is a TCP socket); False where that cannot be done (not
    Linux, not TCP: a tunnelled connection)."""
    if _QUICKACK is None:
        return False
    sock = conn.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    quickack = _QUICKACK
    try:
        sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
    except OSError:
        return False
    received = conn.data_received

    def data_received(data: bytes) -> None:
        received(data)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)

    conn.data_received = data_received
    return True
