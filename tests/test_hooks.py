"""ssh/hooks.py: asyncssh's internals used on the versions they were tested
on, declined plainly on another. CI runs this file on the oldest asyncssh
of the pin as well (.ci/venvs)."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest

from orchestrator.ssh import hooks
from orchestrator.ssh.segments import coalesce_writes

REPO = Path(__file__).resolve().parents[1]


def test_the_pin_in_pyproject_is_the_range_the_hooks_were_tested_on() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("asyncssh")]
    low, high = hooks.TESTED
    assert pin.replace(" ", "") == f"asyncssh>={low[0]}.{low[1]},<{high[0]}.{high[1]}"


def test_the_installed_asyncssh_is_one_the_hooks_were_tested_on() -> None:
    assert hooks.tested(asyncssh.__version__), asyncssh.__version__


@pytest.mark.parametrize(
    ("version", "tested"),
    [("2.14.0", True), ("2.24.1", True), ("2.13.9", False), ("2.25.0", False), ("3.0", False)],
)
def test_a_version_is_tested_only_inside_the_pin(version: str, tested: bool) -> None:
    assert hooks.tested(version) is tested


class _Conn:
    """What a hook could touch on a connection, recorded."""

    def __init__(self) -> None:
        self._transport = "the transport"
        self.sent: list[Any] = []
        self.ran: list[str] = []

    def send_packet(self, *args: Any) -> None:
        self.sent.append(args)

    async def _make_global_request(self, name: bytes) -> None:
        self.sent.append(name)

    async def run(self, command: str, check: bool) -> None:
        self.ran.append(command)


def test_on_an_untested_asyncssh_every_hook_declines_to_the_plain_behaviour(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(asyncssh, "__version__", "9.0.0")
    monkeypatch.setattr(hooks, "_said", set())
    conn = _Conn()
    with caplog.at_level(logging.DEBUG, logger="cvs.ssh"):
        assert hooks.raw_transport(conn) is None
        assert hooks.send_ignore(conn) is False
        assert hooks.send_ignore(conn) is False
        anyio.run(hooks.round_trip, conn)
    assert conn.sent == []
    assert conn.ran == ["true"]
    declined = [r.getMessage() for r in caplog.records if "declined" in r.getMessage()]
    assert len(declined) == 3  # once per hook
    assert all("asyncssh 9.0.0 is outside 2.14-2.24" in m for m in declined), declined


def test_a_part_asyncssh_no_longer_has_is_declined_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hooks, "_said", set())

    class Bare:
        async def run(self, command: str, check: bool) -> None:
            self.ran = command

    conn = Bare()
    assert hooks.raw_transport(conn) is None
    assert hooks.send_ignore(conn) is False
    anyio.run(hooks.round_trip, conn)
    assert conn.ran == "true"


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: a test server on the loopback


def test_every_hook_works_on_a_real_asyncssh_connection() -> None:
    """Against asyncssh's own server on the loopback: the transport's writes
    are gathered, an SSH_MSG_IGNORE and a keepalive request go through, and
    the connection still runs a command after them."""

    async def handle(process: Any) -> None:
        process.stdout.write("hello\n")
        process.exit(0)

    async def main() -> tuple[str, bool]:
        key = asyncssh.generate_private_key("ssh-ed25519")
        server = await asyncssh.create_server(
            _Server, "127.0.0.1", 0, server_host_keys=[key], process_factory=handle
        )
        port = server.sockets[0].getsockname()[1]
        try:
            async with asyncssh.connect(
                "127.0.0.1", port, known_hosts=None, username="u", client_keys=None
            ) as conn:
                transport = hooks.raw_transport(conn)
                assert transport is not None
                coalesced = coalesce_writes(transport)
                assert hooks.send_ignore(conn) is True
                with anyio.fail_after(10):
                    await hooks.round_trip(conn)
                    done = await conn.run("anything", check=True)
                return str(done.stdout), coalesced
        finally:
            server.close()
            await server.wait_closed()

    out, coalesced = anyio.run(main)
    assert (out, coalesced) == ("hello\n", True)


def test_no_module_but_the_hooks_touches_asyncssh_internals() -> None:
    private = re.compile(r"\._transport\b|send_packet|_make_global_request|\bMSG_IGNORE\b")
    found = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "orchestrator").rglob("*.py"))
        if path.name != "hooks.py"
        for line in path.read_text().splitlines()
        if private.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == [], found
