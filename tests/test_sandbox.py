"""The sandbox cluster against real sshd, dockerd and network namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.config import ClusterConfig
from orchestrator.sandbox import (
    BASE_TAG,
    DOCKER_USER,
    NO_DOCKER_USER,
    SSHD_TAG,
    SUDO_USER,
    Sandbox,
    SandboxError,
    core,
    load_sandbox,
    network,
    procs,
    sandbox_down,
    sandbox_up,
)

NODES = ["node1", "node2", "node3", "node4"]
MakeSandbox = Callable[..., Sandbox]


def ssh(
    sb: Sandbox, host: str, command: str, user: str = DOCKER_USER
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*sb.ssh_argv(host, user), command], capture_output=True, text=True, timeout=60
    )


def footprint(sb: Sandbox) -> dict[str, object]:
    """Everything of `sb` that could outlive it, as observed from outside."""
    pids = [p for h in sb.hosts for p in (h.sshd_pid, h.dockerd_pid) if p]
    return {
        "netns": [h.netns for h in sb.hosts if h.netns and network.netns_exists(h.netns)],
        "links": [
            n
            for n in [sb.bridge, *(h.veth for h in sb.hosts if h.veth)]
            if n and network.link_exists(n)
        ],
        "pids": [p for p in pids if procs.alive(p)],
        "processes": procs.pids_mentioning(f"{sb.run_dir}/")
        + procs.pids_mentioning(str(sb.directory)),
        "mounts": procs.mounts_under([sb.directory, sb.run_dir]),
        "paths": [str(p) for p in (sb.directory, sb.run_dir) if p.exists()],
    }


NOTHING = {"netns": [], "links": [], "pids": [], "processes": [], "mounts": [], "paths": []}


# -- the session sandbox (read-only use) ------------------------------------


def test_cluster_file_validates_as_cluster_config(sandbox: Sandbox) -> None:
    config = ClusterConfig.model_validate(yaml.safe_load(sandbox.cluster_file.read_text()))
    assert [h.name for h in config.hosts] == NODES
    assert config.ssh.user == DOCKER_USER
    assert config.ssh.host_key_policy == "strict"
    assert config.ssh.known_hosts == str(sandbox.known_hosts)
    assert config.ssh.identity_files == [str(sandbox.key_file)]
    assert config.container is not None
    assert (config.container.image, config.container.lifetime) == (SSHD_TAG, "per_run")


def test_cluster_file_asks_for_nothing_this_machine_refuses(sandbox: Sandbox) -> None:
    config = ClusterConfig.model_validate(yaml.safe_load(sandbox.cluster_file.read_text()))
    assert config.container is not None
    assert config.container.privileged is False
    assert config.container.ulimits == {}


@pytest.mark.parametrize("host", NODES)
def test_cvs_logs_in_with_strict_host_key_checking(sandbox: Sandbox, host: str) -> None:
    result = ssh(sandbox, host, "id -un; hostname -I 2>/dev/null || true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == DOCKER_USER


@pytest.mark.parametrize("host", NODES)
def test_cvs_runs_docker_without_sudo_against_its_own_dockerd(sandbox: Sandbox, host: str) -> None:
    result = ssh(sandbox, host, "echo $DOCKER_HOST; docker version --format '{{.Server.Version}}'")
    assert result.returncode == 0, result.stderr
    docker_host, server_version = result.stdout.split()
    assert docker_host == sandbox.host(host).docker_host
    assert server_version.startswith("20.10")


def test_cvssudo_runs_docker_through_passwordless_sudo(sandbox: Sandbox) -> None:
    result = ssh(sandbox, "node2", "sudo -n docker info --format '{{.Name}}'", user=SUDO_USER)
    assert result.returncode == 0, result.stderr


def test_cvssudo_cannot_reach_docker_without_sudo(sandbox: Sandbox) -> None:
    result = ssh(sandbox, "node2", "docker version", user=SUDO_USER)
    assert result.returncode != 0
    assert "permission denied" in result.stderr.lower()


def test_cvsnone_has_neither_docker_nor_sudo(sandbox: Sandbox) -> None:
    plain = ssh(sandbox, "node3", "docker version", user=NO_DOCKER_USER)
    sudo = ssh(sandbox, "node3", "sudo -n docker version", user=NO_DOCKER_USER)
    assert plain.returncode != 0 and "permission denied" in plain.stderr.lower()
    assert sudo.returncode != 0 and "password is required" in sudo.stderr


@pytest.mark.parametrize("tag", [SSHD_TAG, BASE_TAG])
def test_image_has_the_same_id_on_every_host(sandbox: Sandbox, tag: str) -> None:
    ids = {h.name: sandbox.image_id(h, tag) for h in sandbox.hosts}
    assert len(set(ids.values())) == 1, ids


def test_sshd_image_has_sshd_and_base_image_does_not(sandbox: Sandbox) -> None:
    docker = sandbox.docker_argv("node1")
    probe = ["run", "--rm", "--network", "host"]
    with_sshd = subprocess.run([*docker, *probe, SSHD_TAG, "test", "-x", "/usr/sbin/sshd"])
    without = subprocess.run([*docker, *probe, BASE_TAG, "test", "-x", "/usr/sbin/sshd"])
    assert (with_sshd.returncode, without.returncode) == (0, 1)


@pytest.mark.parametrize("host", ["node1", "node4"])
def test_host_namespace_has_no_route_off_the_bridge(sandbox: Sandbox, host: str) -> None:
    netns = sandbox.host(host).netns
    assert netns is not None
    routes = subprocess.run(["ip", "-n", netns, "-j", "route"], capture_output=True, text=True)
    destinations = {r["dst"] for r in json.loads(routes.stdout)}
    assert destinations == {f"{network.SUBNET_PREFIX}.{sandbox.index}.0/24"}


def test_a_second_sandbox_gets_its_own_subnet_and_bridge(
    sandbox: Sandbox, make_sandbox: MakeSandbox
) -> None:
    other = make_sandbox(1)
    assert other.index != sandbox.index
    assert other.bridge != sandbox.bridge
    assert ssh(other, "node1", "true").returncode == 0
    assert ssh(sandbox, "node1", "true").returncode == 0


def test_load_sandbox_round_trips_the_state_file(sandbox: Sandbox) -> None:
    loaded = load_sandbox(sandbox.directory)
    assert loaded.hosts == sandbox.hosts
    assert (loaded.index, loaded.bridge, loaded.run_dir) == (
        sandbox.index,
        sandbox.bridge,
        sandbox.run_dir,
    )


def test_containerd_stack_dumps_stay_in_the_sandbox_not_the_machines_tmp(
    sandbox: Sandbox,
) -> None:
    # dockerd signals containerd (SIGUSR1: dump stacks) when it restarts or
    # stops it roughly; the dump goes to TMPDIR, which is the host's own.
    h = sandbox.host("node1")
    marker = str(h.exec_root)
    containerd = [
        pid
        for pid in procs.pids_mentioning(marker)
        if Path(f"/proc/{pid}/comm").read_text().strip() == "containerd"
    ]
    assert len(containerd) == 1, containerd
    pid = containerd[0]
    os.kill(pid, signal.SIGUSR1)
    dump = h.host_dir / "tmp" / f"containerd.{pid}.stacks.log"
    for _ in range(100):
        if dump.exists() and dump.stat().st_size:
            break
        time.sleep(0.05)
    assert dump.exists()
    assert not Path(f"/tmp/containerd.{pid}.stacks.log").exists()


# -- throwaway sandboxes (tests that break things) --------------------------


def test_stopped_sshd_refuses_connections_until_started(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(1)
    sb.stop_sshd("node1")
    assert ssh(sb, "node1", "true").returncode == 255
    sb.start_sshd("node1")
    assert ssh(sb, "node1", "true").returncode == 0


def test_stopped_dockerd_fails_docker_until_started(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(1)
    sb.stop_dockerd("node1")
    assert ssh(sb, "node1", "docker info").returncode != 0
    sb.start_dockerd("node1")
    assert ssh(sb, "node1", "docker image inspect " + SSHD_TAG).returncode == 0


def test_set_sshd_option_rewrites_config_and_restarts_sshd(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(1)
    old_pid = sb.host("node1").sshd_pid
    sb.set_sshd_option("node1", "MaxStartups", "1:100:1")
    h = sb.host("node1")
    assert "MaxStartups 1:100:1" in h.sshd_config.read_text().splitlines()
    assert h.sshd_pid != old_pid
    assert load_sandbox(sb.directory).host("node1").sshd_options == {"MaxStartups": "1:100:1"}
    assert ssh(sb, "node1", "true").returncode == 0


def test_rotated_host_key_fails_strict_checking(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(1)
    sb.rotate_host_key("node1")
    result = ssh(sb, "node1", "true")
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_import_skewed_image_gives_a_new_image_id(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(2)
    skewed = sb.import_skewed_image("node2", SSHD_TAG)
    assert sb.image_id("node2", SSHD_TAG) == skewed
    assert sb.image_id("node1", SSHD_TAG) != skewed


@pytest.mark.sandbox  # builds a sandbox itself (sandbox_up)
def test_down_removes_everything(tmp_path: Path) -> None:
    sb = sandbox_up(tmp_path / "sb", 2)
    ssh(sb, "node1", "docker run -d --name sleeper --network host cvs-sandbox:base sleep 600")
    sandbox_down(sb.directory)
    assert footprint(sb) == NOTHING


@pytest.mark.sandbox  # builds a sandbox itself (sandbox_up)
def test_down_twice_is_a_no_op(tmp_path: Path) -> None:
    sb = sandbox_up(tmp_path / "sb", 1)
    sandbox_down(sb.directory)
    sandbox_down(sb.directory)
    assert footprint(sb) == NOTHING


@pytest.mark.sandbox  # builds a sandbox itself (sandbox_up)
def test_down_after_a_crash_removes_orphaned_containers(tmp_path: Path) -> None:
    sb = sandbox_up(tmp_path / "sb", 1)
    try:
        run = ssh(sb, "node1", "docker run -d --network host cvs-sandbox:base sleep 600")
        assert run.returncode == 0, run.stderr
        h = sb.host("node1")
        assert h.dockerd_pid is not None
        # dockerd dies hard: containerd, the shim and the container live on.
        os.kill(h.dockerd_pid, signal.SIGKILL)
        time.sleep(0.5)
        assert procs.pids_mentioning(str(h.exec_root))
    finally:
        sandbox_down(sb.directory)
    assert footprint(sb) == NOTHING


@pytest.mark.sandbox  # builds a sandbox itself (sandbox_up)
def test_down_leaves_a_process_that_reused_a_recorded_pid_alone(tmp_path: Path) -> None:
    sb = sandbox_up(tmp_path / "sb", 1)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        sb.stop_sshd("node1")
        sb.host("node1").sshd_pid = bystander.pid  # as if the pid had been recycled
        sb.save()
        sandbox_down(sb.directory)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        sandbox_down(sb.directory)


@pytest.mark.sandbox  # builds a sandbox itself (sandbox_up)
def test_failed_up_tears_down_what_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = core._start_host
    created: list[Sandbox] = []

    def start_then_fail_on_node2(sb: Sandbox, h, *args) -> None:  # type: ignore[no-untyped-def]
        created.append(sb)
        real_start(sb, h, *args)
        if h.name == "node2":
            raise RuntimeError("injected failure")

    monkeypatch.setattr(core, "_start_host", start_then_fail_on_node2)
    with pytest.raises(RuntimeError, match="injected failure"):
        sandbox_up(tmp_path / "sb", 2)
    assert footprint(created[0]) == NOTHING


def test_up_refuses_a_directory_that_holds_a_sandbox(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(1)
    with pytest.raises(SandboxError, match="already holds a sandbox"):
        sandbox_up(sb.directory, 1)


# -- egress host --------------------------------------------------------------


def test_egress_host_containers_reach_debian_mirrors(egress_sandbox: Sandbox) -> None:
    assert egress_sandbox.egress_cluster_file is not None
    config = ClusterConfig.model_validate(
        yaml.safe_load(egress_sandbox.egress_cluster_file.read_text())
    )
    assert [h.name for h in config.hosts] == ["egress1"]
    result = ssh(
        egress_sandbox,
        "egress1",
        f"docker run --rm --network host {BASE_TAG} apt-get update -qq && echo APT_OK",
    )
    assert result.returncode == 0, result.stderr
    assert "APT_OK" in result.stdout


# -- no sandbox needed ----------------------------------------------------------


def test_not_root_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match=r"nothing was changed") as info:
        sandbox_up(tmp_path / "sb")
    assert "not root" in str(info.value)
    assert not (tmp_path / "sb").exists()


def test_is_ours_rejects_a_live_pid_running_something_else() -> None:
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            assert procs.is_ours(other.pid, "sleep")
            assert not procs.is_ours(other.pid, "/run/cvs-sandbox/1/node1/exec")
            assert procs.stop(other.pid, "/run/cvs-sandbox/1/node1/exec") == "gone"
            assert other.poll() is None
        finally:
            other.kill()
