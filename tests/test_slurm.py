"""Slurm allocations as inventory: the job's nodes, addresses and GPUs, asked of
Slurm (config/slurm.py). Pure logic against scontrol's real output, recorded
from the sandbox's Slurm 22.05; the real thing is in test_slurm_sandbox.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError, load_cluster
from orchestrator.config.slurm import (
    parse_gpu_indices,
    parse_job,
    parse_node_addresses,
    query_job,
    slurm_hosts,
)

SLURM_FILE = "name: alloc\nhosts: {from: slurm}\nssh: {user: cvsuser}\n"
LISTED_FILE = "name: listed\nhosts: [a1, a2]\n"

# `scontrol show job -d 7` inside `salloc -N2 --gres=gpu:2` on the sandbox.
JOB = """JobId=7 JobName=interactive
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=node[1-2]
   BatchHost=node1
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:4
     Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:2-3)
     Nodes=node2 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""
NODES = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 Gres=gpu:4 NodeAddr=10.201.3.1 "
    "NodeHostName=node1 Version=22.05.8\n"
    "NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 Gres=gpu:4 NodeAddr=10.201.3.2 "
    "NodeHostName=node2 Version=22.05.8\n"
)


def fake_scontrol(job: str = JOB, nodes: str = NODES):  # type: ignore[no-untyped-def]
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "job"]:
            return 0, job, ""
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return (
                0,
                "".join(f"{n}\n" for n in slurm_hosts({"SLURM_NODELIST": argv[3]}, where="")),
                "",
            )
        if argv[:3] == ["scontrol", "show", "node"]:
            return 0, nodes, ""
        raise AssertionError(argv)

    run.calls = calls  # type: ignore[attr-defined]
    return run


IN_JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"}


def test_slurm_nodelist_expands_in_slurm_order() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu[01-03,07],login2"}
    assert slurm_hosts(env, where="x") == ["gpu01", "gpu02", "gpu03", "gpu07", "login2"]


def test_job_facts_read_state_nodes_and_per_node_gres() -> None:
    facts = parse_job(JOB)
    assert (facts.job_id, facts.state, facts.nodelist) == ("7", "RUNNING", "node[1-2]")
    assert facts.node_gres == (("node1", "gpu:2(IDX:2-3)"), ("node2", "gpu:2(IDX:0-1)"))


def test_gpu_indices_of_typed_and_listed_gres() -> None:
    assert parse_gpu_indices("gpu:a100:1(IDX:3),gpu:h100:2(IDX:4-5)") == (3, 4, 5)
    assert parse_gpu_indices("gpu:4(IDX:0,2,4-5)") == (0, 2, 4, 5)
    assert parse_gpu_indices("") == ()
    assert parse_gpu_indices("gpu:2") is None


def test_node_addresses_come_from_nodeaddr() -> None:
    assert parse_node_addresses(NODES) == {"node1": "10.201.3.1", "node2": "10.201.3.2"}


def test_cluster_file_hosts_from_slurm_gets_addresses_and_gpus(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE)
    cluster = load_cluster(path, env=IN_JOB, slurm_run=fake_scontrol())
    assert [(h.name, h.address) for h in cluster.hosts] == [
        ("node1", "10.201.3.1"),
        ("node2", "10.201.3.2"),
    ]
    assert cluster.head_host.name == "node1"
    assert cluster.slurm is not None and cluster.slurm.job_id == "7"
    assert [n.gpus for n in cluster.slurm.nodes] == [(2, 3), (0, 1)]


def test_a_host_the_file_lists_keeps_what_the_file_says(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: x\nhosts:\n- {name: node2, address: 192.0.2.9, port: 2222}\n- a1\n")
    cluster = load_cluster(path, hosts_from="slurm", env=IN_JOB, slurm_run=fake_scontrol())
    assert [(h.name, h.address, h.port) for h in cluster.hosts] == [
        ("node1", "10.201.3.1", None),
        ("node2", "192.0.2.9", 2222),
    ]


def test_hosts_from_slurm_outside_an_allocation_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE)
    run = fake_scontrol()
    with pytest.raises(ConfigError, match=r"cluster.yaml:2: hosts.from: .*SLURM_JOB_ID is not set"):
        load_cluster(path, env={}, slurm_run=run)
    assert run.calls == []  # type: ignore[attr-defined]


def test_a_job_that_is_not_running_is_refused() -> None:
    run = fake_scontrol(job=JOB.replace("JobState=RUNNING", "JobState=COMPLETED"))
    with pytest.raises(ConfigError, match=r"^x: job 7 is COMPLETED, not running"):
        query_job(IN_JOB, where="x", run=run)


def test_gres_without_indices_is_refused_naming_the_node() -> None:
    run = fake_scontrol(job=JOB.replace("GRES=gpu:2(IDX:2-3)", "GRES=gpu:2"))
    with pytest.raises(ConfigError, match=r"GPUs on node1 without indices \(GRES=gpu:2\)"):
        query_job(IN_JOB, where="x", run=run)


def test_a_slurmctld_that_does_not_answer_is_named_with_the_bound() -> None:
    def hang(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        raise subprocess.TimeoutExpired(list(argv), timeout)

    with pytest.raises(
        ConfigError, match=r"slurmctld did not answer `scontrol show job -d 7` within 3s"
    ):
        query_job(IN_JOB, where="x", run=hang, timeout=3)


def test_no_scontrol_says_what_to_install() -> None:
    def missing(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        raise FileNotFoundError(argv[0])

    with pytest.raises(ConfigError, match=r"scontrol is not installed .*slurm-client"):
        query_job(IN_JOB, where="x", run=missing)


def test_a_node_without_an_address_is_refused() -> None:
    run = fake_scontrol(nodes=NODES.split("\n")[0] + "\n")
    with pytest.raises(ConfigError, match=r"node 'node2' in job 7 but gives it no usable address"):
        query_job(IN_JOB, where="x", run=run)


def test_unknown_host_source_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: x\nhosts: {from: pbs}\n")
    with pytest.raises(ConfigError, match=r"hosts.from: unknown host source 'pbs'"):
        load_cluster(path, env={})


def test_slurm_key_in_a_cluster_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: x\nhosts: [a]\nslurm: {job_id: '1'}\n")
    with pytest.raises(ConfigError, match=r"slurm: is set by the loader"):
        load_cluster(path, env={})


def _cvs(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return cvs_in_process(*args, base_env=full, env=env, ci=False)


def test_cli_hosts_from_slurm_outside_an_allocation_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(LISTED_FILE)
    proc = _cvs(["validate", "-c", str(path), "--hosts-from", "slurm"], {})
    assert proc.returncode == 2
    assert proc.stderr.startswith("cvs: --hosts-from slurm: hosts come from Slurm")
    assert "Traceback" not in proc.stderr
