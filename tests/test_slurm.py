"""Slurm allocations as inventory: hosts from SLURM_JOB_NODELIST."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError, load_cluster
from orchestrator.config.slurm import slurm_hosts

SLURM_FILE = "name: alloc\nhosts: {from: slurm}\nssh: {user: cvsuser}\n"
LISTED_FILE = "name: listed\nhosts: [a1, a2]\n"


def test_slurm_nodelist_expands_in_slurm_order() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu[01-03,07],login2"}
    assert slurm_hosts(env, where="x") == ["gpu01", "gpu02", "gpu03", "gpu07", "login2"]


def test_older_slurm_nodelist_variable_is_accepted() -> None:
    assert slurm_hosts({"SLURM_NODELIST": "n[1-2]"}, where="x") == ["n1", "n2"]


def test_cluster_file_hosts_from_slurm(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE)
    cluster = load_cluster(path, env={"SLURM_JOB_NODELIST": "node[01-12,14]"})
    assert [h.name for h in cluster.hosts][:2] == ["node01", "node02"]
    assert len(cluster.hosts) == 13
    assert cluster.head_host.name == "node01"


def test_hosts_from_slurm_outside_an_allocation_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE)
    with pytest.raises(ConfigError, match=r"cluster.yaml:2: hosts.from: .*SLURM_JOB_NODELIST"):
        load_cluster(path, env={})


def test_override_replaces_listed_hosts(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(LISTED_FILE)
    cluster = load_cluster(path, hosts_from="slurm", env={"SLURM_JOB_NODELIST": "b[1-3]"})
    assert [h.name for h in cluster.hosts] == ["b1", "b2", "b3"]


def test_unknown_host_source_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: x\nhosts: {from: pbs}\n")
    with pytest.raises(ConfigError, match=r"hosts.from: unknown host source 'pbs'"):
        load_cluster(path, env={})


def test_bad_nodelist_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE)
    with pytest.raises(ConfigError, match=r"SLURM_JOB_NODELIST='gpu\[3-1\]' is not a hostlist"):
        load_cluster(path, env={"SLURM_JOB_NODELIST": "gpu[3-1]"})


def _cvs(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return cvs_in_process(*args, base_env=full, env=env, ci=False)


def test_cli_hosts_from_slurm_inside_an_allocation(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(LISTED_FILE)
    args = ["validate", "-c", str(path), "--hosts-from", "slurm", "--json"]
    proc = _cvs(args, {"SLURM_JOB_NODELIST": "gpu[1-2]"})
    assert proc.returncode == 0, proc.stderr
    assert '"gpu1"' in proc.stdout and '"a1"' not in proc.stdout


def test_cli_hosts_from_slurm_outside_an_allocation_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(LISTED_FILE)
    proc = _cvs(["validate", "-c", str(path), "--hosts-from", "slurm"], {})
    assert proc.returncode == 2
    assert proc.stderr.startswith("cvs: --hosts-from slurm: hosts come from Slurm")
    assert "Traceback" not in proc.stderr
