"""SSHPool against the real sandbox sshd: retries under throttling, fast final
failures (auth, host key), accept-new, connection reuse.

Variants of the sandbox cluster file are written to tmp_path rather than
changing the shared sandbox; the one test that must change a daemon (the
throttled sshd) restores it in a `finally`. Its helpers are in sandboxtools.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest
from sandboxtools import (
    cluster_variant,
    foreign_known_hosts,
    keygen,
    known_hosts_line,
    run_once,
    sshd_option,
)

from orchestrator.config import ClusterConfig, load_cluster
from orchestrator.events import Connected, ConnectFailed
from orchestrator.sandbox import Sandbox
from orchestrator.ssh.fanout import run_on_hosts
from orchestrator.ssh.sshconfig import ConfigRoute, config_route, sshd_key
from orchestrator.ssh.transport import SSHPool

# -- tests ---------------------------------------------------------------------


def test_throttled_sshd_serves_a_50_way_fan_out_thanks_to_retries(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # Fifty names for node1's address: fifty clients handshake with one sshd
    # that drops every unauthenticated connection beyond three.
    address = sandbox.host("node1").address
    path = cluster_variant(
        sandbox,
        tmp_path,
        hosts=[{"name": f"alias{i:02d}", "address": address} for i in range(50)],
        concurrency={"handshakes": 50},
        # Fifty clients on one sshd is far harsher than a fleet of throttled
        # hosts: give the backoff room so the test pins "retries help", not
        # "the default budget happens to suffice on a loaded CI box".
        ssh={"connect_retries": 12},
    )
    with sshd_option(sandbox, "node1", "MaxStartups", "3:100:3"):
        results, sink = run_once(load_cluster(path), "true")
    assert {r.status for r in results.values()} == {"ok"}, [
        (r.host, r.error) for r in results.values() if not r.ok
    ]
    attempts = [e.attempts for e in sink.of(Connected)]
    assert len(attempts) == 50
    assert max(attempts) > 1, "sshd never refused a handshake: the throttle did not bite"


def test_wrong_key_fails_fast_as_auth_without_retries(sandbox: Sandbox, tmp_path: Path) -> None:
    key = keygen(tmp_path / "id_stranger")
    path = cluster_variant(sandbox, tmp_path, ssh={"identity_files": [str(key)]})
    started = time.monotonic()
    results, sink = run_once(load_cluster(path), "true", hosts=["node1"])
    elapsed = time.monotonic() - started
    assert results["node1"].status == "auth"
    assert "authentication failed" in (results["node1"].error or "")
    [failed] = sink.of(ConnectFailed)
    assert failed.attempts == 1
    # One attempt (counted above); a single handshake takes ~0.1 s idle, and a
    # loaded machine gets a 5x margin over what it measured (issue 30).
    assert elapsed < 5.0


def test_changed_host_key_fails_as_host_key_under_strict(sandbox: Sandbox, tmp_path: Path) -> None:
    known = foreign_known_hosts(sandbox, "node1", tmp_path / "known_hosts")
    path = cluster_variant(
        sandbox, tmp_path, ssh={"known_hosts": str(known), "host_key_policy": "strict"}
    )
    results, sink = run_once(load_cluster(path), "true", hosts=["node1"])
    assert results["node1"].status == "host_key"
    assert [e.attempts for e in sink.of(ConnectFailed)] == [1]


def test_accept_new_trusts_an_unknown_host_and_records_its_key(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = cluster_variant(
        sandbox, tmp_path, ssh={"known_hosts": str(known), "host_key_policy": "accept-new"}
    )
    results, _ = run_once(load_cluster(path), "true", hosts=["node1"])
    assert results["node1"].status == "ok", results["node1"].error
    recorded = known.read_text().splitlines()
    expected = known_hosts_line(sandbox, "node1").split()
    assert [line.split()[:3] for line in recorded] == [expected[:3]]


def test_accept_new_still_refuses_a_changed_host_key(sandbox: Sandbox, tmp_path: Path) -> None:
    known = foreign_known_hosts(sandbox, "node1", tmp_path / "known_hosts")
    before = known.read_text()
    path = cluster_variant(
        sandbox, tmp_path, ssh={"known_hosts": str(known), "host_key_policy": "accept-new"}
    )
    results, sink = run_once(load_cluster(path), "true", hosts=["node1"])
    assert results["node1"].status == "host_key"
    assert [e.attempts for e in sink.of(ConnectFailed)] == [1]
    assert known.read_text() == before


def test_one_connection_per_host_serves_every_command(sandbox: Sandbox) -> None:
    config = load_cluster(sandbox.cluster_file)
    hosts = [h.name for h in config.hosts]

    async def main() -> tuple[int, list[str]]:
        async with SSHPool(config) as pool:
            statuses = []
            for _ in range(3):
                async with anyio.create_task_group() as tg:
                    for host in hosts:

                        async def one(h: str = host) -> None:
                            statuses.append((await pool.run(h, ["true"])).status)

                        tg.start_soon(one)
            return pool.connects, statuses

    connects, statuses = anyio.run(main)
    assert statuses == ["ok"] * 12
    assert connects == len(hosts)


def test_known_hosts_is_parsed_once_for_every_host_under_strict(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncssh, given a path, parses the file again for every handshake.
    parses = []
    original = asyncssh.known_hosts.SSHKnownHosts.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        parses.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(asyncssh.known_hosts.SSHKnownHosts, "__init__", counting)
    config = load_cluster(sandbox.cluster_file)
    assert config.ssh.host_key_policy == "strict"

    async def main() -> tuple[int, list[str]]:
        async with SSHPool(config) as pool:
            results = await run_on_hosts(pool, [h.name for h in config.hosts], ["true"])
            return pool.connects, [r.status for r in results.values()]

    connects, statuses = anyio.run(main)
    assert statuses == ["ok"] * len(config.hosts)
    assert connects == len(config.hosts) > 1
    assert len(parses) == 1


def test_a_host_key_added_during_a_session_is_seen_by_the_next_connection(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_line(sandbox, "node1") + "\n")
    path = cluster_variant(
        sandbox, tmp_path, ssh={"known_hosts": str(known), "host_key_policy": "strict"}
    )

    async def main() -> list[str]:
        async with SSHPool(load_cluster(path)) as pool:
            first = await pool.run("node1", "true")
            # A long session (the pytest plugin's): the user adds node2's key.
            with known.open("a") as f:
                f.write(known_hosts_line(sandbox, "node2") + "\n")
            later = known.stat().st_mtime_ns + 1_000_000_000
            os.utime(known, ns=(later, later))
            second = await pool.run("node2", "true")
            return [first.status, second.status]

    assert anyio.run(main) == ["ok", "ok"]


def max_handshakes_in_flight(
    config: ClusterConfig, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[str]]:
    """Connect every host once; how many handshakes were in flight at most."""
    in_flight, peak = [0], [0]
    original = asyncssh.connect

    async def slow_connect(**opts: Any) -> Any:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        try:
            await anyio.sleep(0.3)  # long enough for every host to be waiting at once
            return await original(**opts)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(asyncssh, "connect", slow_connect)
    results, _ = run_once(config, "true")
    return peak[0], [r.status for r in results.values()]


def test_handshake_cap_is_per_sshd_so_separate_hosts_do_not_queue(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cluster_variant(sandbox, tmp_path, concurrency={"handshakes": 1})
    peak, statuses = max_handshakes_in_flight(load_cluster(path), monkeypatch)
    assert statuses == ["ok"] * 4
    assert peak == 4


def test_host_entries_sharing_one_sshd_share_its_handshake_cap(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = sandbox.host("node1").address
    hosts = [{"name": f"alias{i}", "address": address} for i in range(4)]
    path = cluster_variant(sandbox, tmp_path, hosts=hosts, concurrency={"handshakes": 2})
    peak, statuses = max_handshakes_in_flight(load_cluster(path), monkeypatch)
    assert statuses == ["ok"] * 4
    assert peak == 2


@pytest.mark.parametrize(
    ("host", "route", "key"),
    [
        ("plain", ConfigRoute("plain"), "plain"),  # not in the config: the address itself
        ("alias1", ConfigRoute("10.9.9.9"), "10.9.9.9"),  # an alias: the host it names
        ("behind1", ConfigRoute("behind1", "u@bastion:2222"), "behind1"),  # a ProxyJump
        ("pc", ConfigRoute("pc", None, True), "proxy-command"),  # all ProxyCommands together
    ],
)
def test_the_ssh_config_says_how_a_host_is_reached_and_which_sshd_it_costs(
    tmp_path: Path, host: str, route: ConfigRoute, key: str
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host alias1\n  HostName 10.9.9.9\n"
        "Host behind*\n  ProxyJump u@bastion:2222\n"
        "Host pc\n  ProxyCommand nc %h %p\n"
    )
    assert config_route(host, 22, config=config) == route
    assert sshd_key(host, 22, config=config) == key
    assert config_route(host, 22, config=tmp_path / "missing") == ConfigRoute(host)


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_known_host_connects_under_either_checking_policy(
    sandbox: Sandbox, tmp_path: Path, policy: str
) -> None:
    path = cluster_variant(sandbox, tmp_path, ssh={"host_key_policy": policy})
    before = sandbox.known_hosts.read_text()
    results, sink = run_once(load_cluster(path), "true", hosts=["node1"])
    assert results["node1"].status == "ok", results["node1"].error
    assert [e.attempts for e in sink.of(Connected)] == [1]
    assert sandbox.known_hosts.read_text() == before
