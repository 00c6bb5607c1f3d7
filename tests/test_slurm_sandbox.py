"""A real Slurm in the sandbox: munge, slurmctld, one slurmd per host's namespace."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.sandbox import Sandbox, SandboxError, sandbox_down
from orchestrator.sandbox import slurm as slurm_sb
from orchestrator.sandbox.procs import pids_mentioning

MakeSandbox = Callable[..., Sandbox]


def slurm(sb: Sandbox, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """A Slurm client command against the sandbox's controller (as slurm.env does)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    return subprocess.run(
        list(argv),
        env={**env, **sb.slurm_env()},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_slurm_env_file_points_clients_at_the_sandbox_controller(slurm_sandbox: Sandbox) -> None:
    text = slurm_sandbox.slurm_env_file.read_text()
    assert f"export SLURM_CONF={slurm_sandbox.slurm_paths.conf}\n" in text
    proc = subprocess.run(
        ["sh", "-c", '. "$0" && sinfo -h -N -o "%N %t"', str(slurm_sandbox.slurm_env_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == ["node1 idle", "node2 idle"]


def test_srun_runs_a_task_in_each_hosts_namespace_at_its_address(slurm_sandbox: Sandbox) -> None:
    script = "echo \"$SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk '{print $4}')\""
    proc = slurm(slurm_sandbox, "srun", "-N2", "--ntasks-per-node=1", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.split("\n"))[-2:]
    assert lines == [f"node{h} {slurm_sandbox.host(f'node{h}').address}/24" for h in (1, 2)]


def test_each_host_declares_its_stand_in_gpus_as_gres(slurm_sandbox: Sandbox) -> None:
    proc = slurm(slurm_sandbox, "scontrol", "show", "node", "node2")
    assert proc.returncode == 0, proc.stderr
    assert "Gres=gpu:4" in proc.stdout
    assert f"NodeAddr={slurm_sandbox.host('node2').address}" in proc.stdout
    # ...and the cluster file hands cvs the same device root Slurm counts from.
    assert f"gpu_device_root: {slurm_sandbox.host('node2').gpu_root}" in (
        slurm_sandbox.cluster_file.read_text()
    )
    assert (slurm_sandbox.host("node2").gpu_root / "dev" / "dri" / "renderD131").is_char_device()


def test_sandbox_down_stops_every_slurm_daemon_and_removes_its_files(
    make_sandbox: MakeSandbox,
) -> None:
    sb = make_sandbox(hosts=1, slurm=True)
    conf = str(sb.slurm_paths.conf)
    assert len(sb.slurm_pids) == 3  # munged, slurmctld, slurmd:node1
    assert pids_mentioning(conf)
    sandbox_down(sb.directory)
    assert pids_mentioning(conf) == []
    assert pids_mentioning(str(sb.slurm_paths.munge_socket)) == []
    assert not sb.slurm_env_file.exists()
    assert not sb.slurm_paths.directory.exists()


def test_a_slurmd_that_never_registers_fails_up_and_leaves_nothing(
    make_sandbox: MakeSandbox,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(slurm_sb, "SLURMD", "/bin/false")
    monkeypatch.setattr(slurm_sb, "START_TIMEOUT", 5.0)
    with pytest.raises(SandboxError, match=r"every slurmd idle"):
        make_sandbox(hosts=1, slurm=True)
    directory = tmp_path / "sb0"
    assert not (directory / "sandbox.json").exists()
    assert pids_mentioning(str(directory / "slurm")) == []
