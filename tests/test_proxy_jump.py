"""`ssh.proxy_jump` against the real sandbox sshd: node1 is the bastion, the
other nodes are the targets.

The targets stay reachable from here too (one bridge), so every test that
claims "through the bastion" checks where the target saw its client come
from: `SSH_CONNECTION` names the bastion's address, not this machine's.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from clitools import REPO, json_lines
from clitools import cvs as run_cvs
from exectools import CLI_ENV, cvs, statuses
from sandboxtools import cluster_variant, run_once, sshd_option

from orchestrator.config import load_cluster
from orchestrator.sandbox import Sandbox
from orchestrator.sandbox.network import gateway_address
from orchestrator.ssh.transport import SSHPool

BASTION = "node1"
TARGETS = ["node2", "node3", "node4"]
# The address the target's sshd saw the connection come from.
CLIENT_ADDRESS = 'echo "${SSH_CONNECTION%% *}"'


def jump_cluster(sandbox: Sandbox, directory: Path, jump: str, **changes: Any) -> Path:
    """The sandbox cluster with only `TARGETS` as hosts, reached via `jump`."""
    targets = [{"name": n, "address": sandbox.host(n).address} for n in TARGETS]
    ssh = {"proxy_jump": jump, **changes.pop("ssh", {})}
    return cluster_variant(sandbox, directory, hosts=targets, ssh=ssh, **changes)


def accepted_logins(log: Path, since: int) -> list[str]:
    return [
        line
        for line in log.read_text(errors="replace")[since:].splitlines()
        if "Accepted publickey" in line
    ]


def test_every_target_sees_the_bastion_as_its_ssh_client(sandbox: Sandbox, tmp_path: Path) -> None:
    path = jump_cluster(sandbox, tmp_path, sandbox.host(BASTION).address)
    proc = cvs("exec", "-c", str(path), "--json", "--host-os", "--", "sh", "-c", CLIENT_ADDRESS)
    assert proc.returncode == 0, proc.stderr
    _, summary = json_lines(proc.stdout)
    assert statuses(summary) == dict.fromkeys(TARGETS, "ok")
    seen = {host: r["stdout"].strip() for host, r in summary["hosts"].items()}
    assert seen == dict.fromkeys(TARGETS, sandbox.host(BASTION).address)


def test_bastion_gets_one_connection_for_the_whole_fan_out(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    path = jump_cluster(sandbox, tmp_path, sandbox.host(BASTION).address)
    log = sandbox.host(BASTION).host_dir / "sshd.log"
    with sshd_option(sandbox, BASTION, "LogLevel", "INFO"):
        since = len(log.read_text(errors="replace"))
        results, _ = run_once(load_cluster(path), "true")
        logins = accepted_logins(log, since)
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "ok")
    assert len(logins) == 1, logins
    assert f"from {gateway_address(sandbox.index)} " in logins[0]


def test_hop_user_wins_over_ssh_user_on_the_bastion(sandbox: Sandbox, tmp_path: Path) -> None:
    bastion = sandbox.host(BASTION).address
    path = jump_cluster(sandbox, tmp_path, f"cvsnone@{bastion}")
    log = sandbox.host(BASTION).host_dir / "sshd.log"
    with sshd_option(sandbox, BASTION, "LogLevel", "INFO"):
        since = len(log.read_text(errors="replace"))
        results, _ = run_once(load_cluster(path), "true", hosts=["node2"])
        logins = accepted_logins(log, since)
    assert results["node2"].status == "ok", results["node2"].error
    assert [line.split(" for ")[1].split()[0] for line in logins] == ["cvsnone"]


def test_two_hop_chain_reaches_the_targets_from_its_last_hop(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    first, last = sandbox.host("node1").address, sandbox.host("node2").address
    targets = [{"name": n, "address": sandbox.host(n).address} for n in ("node3", "node4")]
    path = cluster_variant(sandbox, tmp_path, hosts=targets, ssh={"proxy_jump": f"{first},{last}"})

    async def main() -> tuple[dict[str, str], int]:
        async with SSHPool(load_cluster(path)) as pool:
            seen = {}
            for host in ("node3", "node4"):
                result = await pool.run(host, CLIENT_ADDRESS)
                assert result.ok, result.error
                seen[host] = result.stdout.strip()
            return seen, pool.jump_connects

    seen, jump_connects = anyio.run(main)
    assert seen == {"node3": last, "node4": last}
    assert jump_connects == 2


def test_jump_uses_the_clusters_identity_file_not_the_users_default_keys(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A home whose known_hosts trusts the bastion but which holds no key: a
    # jump made with asyncssh's defaults gets past the host key and is then
    # refused. Only the cluster's identity file gets in.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sandbox.known_hosts, home / ".ssh" / "known_hosts")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    path = jump_cluster(sandbox, tmp_path / "cluster", sandbox.host(BASTION).address)
    results, _ = run_once(load_cluster(path), CLIENT_ADDRESS, hosts=["node2"])
    assert results["node2"].status == "ok", results["node2"].error
    assert results["node2"].stdout.strip() == sandbox.host(BASTION).address


def test_bastion_missing_from_known_hosts_fails_every_target_naming_it(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    bastion = sandbox.host(BASTION).address
    known = tmp_path / "known_hosts"
    lines = sandbox.known_hosts.read_text().splitlines()
    known.write_text("".join(line + "\n" for line in lines if line.split()[0] != bastion))
    path = jump_cluster(sandbox, tmp_path / "cluster", bastion, ssh={"known_hosts": str(known)})
    started = time.monotonic()
    results, _ = run_once(load_cluster(path), "true")
    assert time.monotonic() - started < 10
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "host_key")
    for result in results.values():
        assert (result.error or "").startswith(f"via jump host {bastion}: host key not verifiable")


def test_unreachable_jump_host_fails_every_target_naming_it(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    closed_port = f"{sandbox.host(BASTION).address}:2"
    path = jump_cluster(sandbox, tmp_path, closed_port, ssh={"connect_retries": 1})
    results, _ = run_once(load_cluster(path), "true")
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "unreachable")
    for result in results.values():
        assert (result.error or "").startswith(f"via jump host {closed_port}: connection refused")


def test_a_closed_jump_connection_is_reopened_for_the_next_host(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    path = jump_cluster(sandbox, tmp_path, sandbox.host(BASTION).address)

    async def main() -> tuple[bool, bool, int]:
        async with SSHPool(load_cluster(path)) as pool:
            first = await pool.run("node2", ["true"])
            assert pool._cluster_jump is not None
            pool._cluster_jump.conns[-1].close()
            await pool._cluster_jump.conns[-1].wait_closed()
            second = await pool.run("node3", ["true"])
            return first.ok, second.ok, pool.jump_connects

    assert anyio.run(main) == (True, True, 2)


def test_closing_the_pool_closes_the_jump_connection(sandbox: Sandbox, tmp_path: Path) -> None:
    path = jump_cluster(sandbox, tmp_path, sandbox.host(BASTION).address)

    async def main() -> bool:
        async with SSHPool(load_cluster(path)) as pool:
            assert (await pool.run("node2", ["true"])).ok
            assert pool._cluster_jump is not None
            jump = pool._cluster_jump.conns[-1]
        return jump.is_closed()

    assert anyio.run(main)


@pytest.mark.parametrize("use_ssh_config", [False, True])
def test_cvs_shell_jumps_with_the_clusters_identity_and_known_hosts(
    sandbox: Sandbox, tmp_path: Path, use_ssh_config: bool
) -> None:
    # OpenSSH gives the jump's ssh only -F, not -i or -o: without the config
    # file the bastion is checked against the user's own known_hosts (OpenSSH
    # reads the passwd entry's ~/.ssh, not $HOME's), which cannot know this
    # sandbox's fresh host keys, and offered the user's keys, which it does
    # not accept. HOME only keeps the state dir in tmp_path. The cluster's
    # files sit under a path with a space, which the config file quotes.
    home = tmp_path / "home"
    home.mkdir()
    files = tmp_path / "cluster files"
    files.mkdir()
    key = shutil.copy2(sandbox.key_file, files / "id key")
    known = shutil.copy(sandbox.known_hosts, files / "known hosts")
    ssh = {"identity_files": [str(key)], "known_hosts": str(known)}
    path = jump_cluster(
        sandbox,
        tmp_path / "cluster",
        sandbox.host(BASTION).address,
        ssh={**ssh, "use_ssh_config": use_ssh_config},
    )
    env = {k: v for k, v in CLI_ENV.items() if k != "SSH_AUTH_SOCK"}
    proc = run_cvs(
        "shell", "-c", str(path), "--host-os", "node2",
        input=CLIENT_ADDRESS + "\nexit 7\n",
        base_env={**env, "HOME": str(home), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == sandbox.host(BASTION).address


def behind_config_jump(
    sandbox: Sandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str,
    **ssh: Any,
) -> Path:
    """A cluster of `TARGETS` whose ~/.ssh/config (a fresh HOME, no agent) says
    `ProxyJump` for them: `config` is the rest of that file."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    targets = " ".join(sandbox.host(n).address for n in TARGETS)
    (home / ".ssh" / "config").write_text(f"Host {targets}\n{config}")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    hosts = [{"name": n, "address": sandbox.host(n).address} for n in TARGETS]
    return cluster_variant(
        sandbox, tmp_path / "cluster", hosts=hosts, ssh={"use_ssh_config": True, **ssh}
    )


def test_a_proxyjump_in_the_ssh_config_costs_the_bastion_one_login_for_all_hosts(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Left to asyncssh, every host behind a ProxyJump from ~/.ssh/config opens
    # a bastion connection of its own. The bastion is set up the way users
    # have it: in the ssh config, with its own user, key and known_hosts.
    path = behind_config_jump(
        sandbox,
        tmp_path,
        monkeypatch,
        "  ProxyJump cvs-bastion\n"
        f"Host cvs-bastion\n  HostName {sandbox.host(BASTION).address}\n  User cvsnone\n"
        f"  IdentityFile {sandbox.key_file}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {sandbox.known_hosts}\n",
    )
    log = sandbox.host(BASTION).host_dir / "sshd.log"
    with sshd_option(sandbox, BASTION, "LogLevel", "INFO"):
        since = len(log.read_text(errors="replace"))
        results, _ = run_once(load_cluster(path), CLIENT_ADDRESS)
        logins = accepted_logins(log, since)
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "ok"), results
    assert {r.stdout.strip() for r in results.values()} == {sandbox.host(BASTION).address}
    assert len(logins) == 1, logins
    assert " for cvsnone " in logins[0]


def test_a_dead_bastion_from_the_ssh_config_fails_every_host_behind_it_once(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 1 of the bastion.
    dead = f"  ProxyJump cvs@{sandbox.host(BASTION).address}:1\n"
    path = behind_config_jump(sandbox, tmp_path, monkeypatch, dead, connect_retries=0)

    async def main() -> tuple[dict[str, Any], int]:
        async with SSHPool(load_cluster(path)) as pool:
            results = {h: await pool.run(h, "true") for h in TARGETS}
            return results, pool.connects

    results, connects = anyio.run(main)
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "unreachable")
    assert all("via jump host" in (r.error or "") for r in results.values()), results
    assert connects == 1  # the bastion was tried once, not once per host


def test_a_proxyjump_the_ssh_config_writes_wrong_fails_each_host_with_one_line(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = f"  ProxyJump cvs@{sandbox.host(BASTION).address}:ssh\n"
    path = behind_config_jump(sandbox, tmp_path, monkeypatch, bad)
    results, _ = run_once(load_cluster(path), "true")
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(TARGETS, "unreachable")
    for result in results.values():
        error = result.error or ""
        assert error.startswith("~/.ssh/config ProxyJump: invalid proxy_jump hop"), error
        assert "\n" not in error
