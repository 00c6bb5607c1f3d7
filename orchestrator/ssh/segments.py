"""How our SSH connections' bytes leave and are acknowledged: fewer
segments, no 40 ms waits.

Two habits of the peers cost more than the work itself on a step (measured
with asyncssh's debug log, tcpdump and perf on a 2-host sandbox):

- **asyncssh writes an SSH_MSG_IGNORE ahead of every packet**, as a write of
  its own: two `send` calls and two TCP segments per packet, and on a
  loopback or veth hop each segment is the kernel's whole receive path run in
  our process. `coalesce_writes` gathers a connection's writes into one per
  turn of the event loop (the host's socket, and the channel a container's
  connection is tunnelled through, where each write also became a segment of
  the host sshd's own).
- **OpenSSH's sshd leaves TCP_NODELAY off** on non-interactive sessions, so a
  small write waits while an earlier one is unacknowledged, and a Linux peer
  in "ping-pong" mode delays its acknowledgement by at least 40 ms, hoping to
  send it with data. Whenever the sshd writes twice before we answer (after a
  login: its success, its host keys, the `debug` messages of the key's
  options), that is 40 ms. `acknowledge_promptly` re-arms TCP_QUICKACK on our
  socket after each read, which also sends an acknowledgement still pending:
  one setsockopt per read. (A container's sshd is acknowledged by the host's
  kernel, which we do not hold: ssh/container_channel.py answers its first
  reads instead.)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def coalesce_writes(target: Any, errors: tuple[type[BaseException], ...] = (OSError,)) -> bool:
    """`target.write` buffered until the event loop's next turn, so the writes
    of one turn leave as one; whatever ends `target` (`write_eof`, `close`,
    `abort`) sends the buffer first. `target`: an asyncio transport or an
    asyncssh channel (anything with those four methods); `errors`: what a
    write of the buffer may raise once `target` is gone, ignored (the reader
    learns of the loss on its side). False, and `target` left as it was,
    where its methods cannot be replaced (uvloop's transports)."""
    pending: list[bytes] = []
    write, write_eof, close, abort = target.write, target.write_eof, target.close, target.abort
    loop = asyncio.get_running_loop()

    def flush() -> None:
        if pending:
            data = b"".join(pending)
            pending.clear()
            with contextlib.suppress(*errors):
                write(data)

    def buffered(data: bytes) -> None:
        if not pending:
            loop.call_soon(flush)
        pending.append(data)

    def ending(then: Callable[[], None]) -> Callable[[], None]:
        def end() -> None:
            flush()
            then()

        return end

    try:
        target.write = buffered
    except (AttributeError, TypeError):
        return False
    target.write_eof = ending(write_eof)
    target.close = ending(close)
    target.abort = ending(abort)
    return True


def tcp_socket(conn: Any) -> Any:
    """The TCP socket under `conn` (an asyncio protocol's transport, or an
    asyncssh connection), or None (a tunnelled connection, a pipe)."""
    sock = conn.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock


def acknowledge_promptly(conn: Any) -> bool:
    """Re-arm TCP_QUICKACK after each read of `conn` (an asyncio protocol on a
    TCP socket); False where that cannot be done (not Linux, not TCP)."""
    sock = tcp_socket(conn)
    if _QUICKACK is None or sock is None:
        return False
    quickack = _QUICKACK
    try:
        sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
    except OSError:
        return False
    received = conn.data_received

    def data_received(data: bytes, *rest: Any) -> None:
        received(data, *rest)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)

    conn.data_received = data_received
    return True
