"""ssh/segments.py: one write per event-loop turn, acknowledgements at once
(issue 34). The effect on real sshds is timed in
tests/test_prompt_acks_sandbox.py; these pin the mechanics."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from orchestrator.ssh.segments import acknowledge_promptly, coalesce_writes


class _Slotted:
    """A transport whose methods cannot be replaced (as uvloop's)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def write_eof(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


def test_a_transport_whose_methods_cannot_be_replaced_is_left_writing_at_once() -> None:
    async def main() -> list[bytes]:
        transport = _Slotted()
        assert coalesce_writes(transport) is False
        transport.write(b"a")
        return transport.sent

    assert anyio.run(main) == [b"a"]


class _Socket:
    def __init__(self, family: int) -> None:
        self.family = family
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options.append((level, option, value))


class _Protocol:
    def __init__(self, sock: _Socket) -> None:
        self.sock = sock
        self.read: list[bytes] = []

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None

    def data_received(self, data: bytes) -> None:
        self.read.append(data)


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_quickack_is_re_armed_after_every_read_of_a_tcp_connection() -> None:
    sock = _Socket(socket.AF_INET)
    protocol = _Protocol(sock)
    assert acknowledge_promptly(protocol) is True
    protocol.data_received(b"one")
    protocol.data_received(b"two")
    assert protocol.read == [b"one", b"two"]
    quickack = (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    assert sock.options == [quickack, quickack, quickack]  # at once, then per read


def test_a_connection_that_is_not_tcp_is_left_alone() -> None:
    sock = _Socket(socket.AF_UNIX)
    protocol = _Protocol(sock)
    assert acknowledge_promptly(protocol) is False
    protocol.data_received(b"one")
    assert sock.options == []


class _Connection(_Protocol):
    """An asyncssh connection as the client factory's `connection_made` sees it."""

    def __init__(self, sock: _Socket) -> None:
        super().__init__(sock)
        self._transport = _Slotted()


@pytest.mark.parametrize("direct", [True, False])
def test_only_a_connection_on_a_socket_of_our_own_is_tuned(direct: bool) -> None:
    """Through a jump, asyncssh's connection reports the jump's socket as its
    own: that one is left alone (the jump's connection is tuned as itself)."""
    from orchestrator.ssh.transport import _AttemptTrace, _traced_factory

    sock = _Socket(socket.AF_INET)
    conn = _Connection(sock)
    reads = conn.data_received

    async def main() -> None:
        client = _traced_factory(None, _AttemptTrace(), direct=direct)()
        client.connection_made(conn)  # type: ignore[arg-type]

    anyio.run(main)
    assert (conn.data_received != reads) is (direct and hasattr(socket, "TCP_QUICKACK"))
