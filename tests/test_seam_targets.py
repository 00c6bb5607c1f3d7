"""The seam takes a host or a container's sshd (ssh/target.py): one `send`
and one `held_process` for both, `SSHPool` owning both kinds of connection.
Real sshd behaviour is the sandbox modules' (tests/test_sshexec_sandbox.py,
tests/test_workers_sandbox.py); here the shape and the pool's ownership."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest

from orchestrator.config import ClusterConfig
from orchestrator.ssh.container_channel import _Link
from orchestrator.ssh.seam import HeldRequest, Request
from orchestrator.ssh.target import Counters, Endpoint, NotStarted
from orchestrator.ssh.transport import SSHPool, _HostLink
from orchestrator.testing import ScriptedHosts, Unscripted

EP = Endpoint("h1", "127.0.0.1", 2224, "root", "ssh-ed25519 AAAA", "c0ffee")


def _config(tmp_path: Path) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"hosts": [{"name": "h1", "address": "127.0.0.1"}], "state_dir": str(tmp_path)}
    )


def test_the_scripted_hosts_answer_a_command_to_a_container_endpoint_by_its_rules() -> None:
    hosts = ScriptedHosts({})
    hosts.answer("exec", lambda host, text: (0, "in c\n", "") if host == "h1" else None)

    result = anyio.run(lambda: hosts.send(EP, Request("true", label="exec")))

    assert result.ok and result.host == "h1" and result.stdout == "in c\n"
    assert hosts.endpoints == [EP] and hosts.calls == [("h1", "exec", "true")]


def test_the_scripted_hosts_hold_no_process_in_a_container_nobody_scripted() -> None:
    hosts = ScriptedHosts({})

    async def main() -> None:
        async with hosts.held_process(EP, HeldRequest(["cat"], encoding=None)):
            pass

    with pytest.raises(Unscripted, match="only the lock"):
        anyio.run(main)


def test_a_pool_without_the_containers_key_starts_nothing_in_a_container(
    tmp_path: Path,
) -> None:
    pool = SSHPool(_config(tmp_path))

    async def held() -> None:
        async with pool.held_process(EP, HeldRequest("cat", encoding=None)):
            pass

    with pytest.raises(NotStarted) as sent:
        anyio.run(lambda: pool.send(EP, Request("true")))
    assert sent.value.kind == "host" and sent.value.host == "h1"
    with pytest.raises(NotStarted):
        anyio.run(held)
    assert pool.container_counters == Counters()


class _Conn:
    """What the pool's close calls on a connection, recorded."""

    def __init__(self, name: str, closed: list[str]) -> None:
        self.name, self._closed = name, closed

    def close(self) -> None:
        self._closed.append(self.name)

    async def wait_closed(self) -> None:
        pass

    def is_closed(self) -> bool:
        return self.name in self._closed


def test_a_pool_closes_its_container_connections_before_the_hosts_they_ride_on(
    tmp_path: Path,
) -> None:
    closed: list[str] = []
    key = asyncssh.generate_private_key("ssh-ed25519")

    async def main() -> None:
        async with SSHPool(_config(tmp_path)) as pool:
            pool.use_container_key(key)
            assert pool.containers is not None
            host: Any = _Conn("host h1", closed)
            container: Any = _Conn("container on h1", closed)
            pool._links["h1"] = _HostLink(host, anyio.Semaphore(1), anyio.Semaphore(1))
            pool.containers._links[("h1", "root")] = _Link(
                container, EP, anyio.Semaphore(1), anyio.Semaphore(1)
            )

    anyio.run(main)
    assert closed == ["container on h1", "host h1"]


def test_a_second_containers_key_serves_the_same_connections(tmp_path: Path) -> None:
    pool = SSHPool(_config(tmp_path))
    pool.use_container_key(asyncssh.generate_private_key("ssh-ed25519"))
    first = pool.containers
    pool.use_container_key(asyncssh.generate_private_key("ssh-ed25519"))
    assert pool.containers is first  # one connection per container, whatever the key
