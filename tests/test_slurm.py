"""Slurm allocations as inventory: the job's nodes, addresses and GPUs, asked of
Slurm (config/slurm.py). Pure logic against scontrol's real output, recorded
from the sandbox's Slurm 22.05; the real thing is in test_slurm_sandbox.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from clitools import cvs_in_process
from plan_states import CLUSTER, cfg, host, kinds, states

from orchestrator import remote
from orchestrator.config import ConfigError, GPURequest, container_name, load_cluster
from orchestrator.config.slurm import (
    GONE,
    SlurmError,
    SlurmJob,
    SlurmNode,
    expand_nodes,
    job_sshd_port,
    job_state,
    parse_gpu_indices,
    parse_job,
    parse_node_addresses,
    query_job,
)
from orchestrator.config.views import job_container_name
from orchestrator.containers.jobend import holder_argv, holder_env, ready_nodes
from orchestrator.containers.jobleft import (
    JobContainer,
    decide,
    listing_argv,
    parse_listing,
    remove_argv,
)
from orchestrator.containers.labels import LABEL_GPUS, managed_labels
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.probe import HostState
from orchestrator.limits.gpus import GPU, GPUSelection, Unsatisfiable
from orchestrator.limits.slurm_gpus import select_in_job

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
                "".join(f"{n}\n" for n in expand_nodes(argv[3], what="")),
                "",
            )
        if argv[:3] == ["scontrol", "show", "node"]:
            return 0, nodes, ""
        raise AssertionError(argv)

    run.calls = calls  # type: ignore[attr-defined]
    return run


IN_JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"}


def test_a_nodelist_expands_in_slurm_order() -> None:
    expanded = expand_nodes("gpu[01-03,07],login2", what="x")
    assert expanded == ["gpu01", "gpu02", "gpu03", "gpu07", "login2"]


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


def _cvs_file(tmp_path: Path, nodes: list[str], lifetime: str = "per_run") -> Path:
    doc = {
        "orchestrator": "container", "username": "cvs", "priv_key_file": "/dev/null",
        "node_dict": {n: {"bmc_ip": "NA", "vpc_ip": n} for n in nodes}, "hosts_from": "slurm",
        "container": {"image": "img:1", "name": "rvs", "lifetime": lifetime},
    }  # fmt: skip
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_cvs_file_with_hosts_from_slurm_keeps_node_dict_at_slurms_addresses(
    tmp_path: Path,
) -> None:
    path = _cvs_file(tmp_path, ["node2"])
    cluster = load_cluster(path, env=IN_JOB, slurm_run=fake_scontrol(), check_files=False)
    assert [(h.name, h.address) for h in cluster.hosts] == [("node2", "10.201.3.2")]
    assert cluster.slurm is not None and cluster.slurm.job_id == "7"


def test_hosts_from_on_the_command_line_and_in_a_cvs_file_agree(tmp_path: Path) -> None:
    path = _cvs_file(tmp_path, ["node1"])
    run = fake_scontrol()
    cluster = load_cluster(path, hosts_from="slurm", env=IN_JOB, slurm_run=run, check_files=False)
    assert [h.name for h in cluster.hosts] == ["node1"] and cluster.slurm is not None


def test_a_cvs_node_dict_naming_a_node_outside_the_job_is_one_line(tmp_path: Path) -> None:
    path = _cvs_file(tmp_path, ["node1", "node9"])
    with pytest.raises(ConfigError, match=r"node_dict lists 'node9', which is not a node of "
                       r"Slurm job 7 \(node1, node2\)"):  # fmt: skip
        load_cluster(path, env=IN_JOB, slurm_run=fake_scontrol(), check_files=False)


def test_inside_a_job_a_per_run_container_is_named_for_the_job(tmp_path: Path) -> None:
    run = fake_scontrol()
    per_run = load_cluster(_cvs_file(tmp_path, ["node1"]), env=IN_JOB, slurm_run=run,
                           check_files=False)  # fmt: skip
    assert container_name(per_run) == "rvs-j7"
    kept = _cvs_file(tmp_path, ["node1"], lifetime="persistent")
    assert container_name(load_cluster(kept, env=IN_JOB, slurm_run=run, check_files=False)) == (
        "rvs"
    )
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE + "container: {image: rocm/pytorch:7.0}\n")
    derived = load_cluster(path, env=IN_JOB, slurm_run=run)
    assert container_name(derived) == "cvs-cvsuser-pytorch-j7"
    # Outside a job, hosts from the file: the name as before.
    assert container_name(load_cluster(_plain(tmp_path))) == "rvs"


def test_a_cvs_suite_asking_the_container_name_gets_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging
    from types import SimpleNamespace

    from orchestrator.compat.cvs import CvsOrchestrator
    from orchestrator.config import loader

    monkeypatch.setattr(
        loader, "query_job", lambda env, *, where, run, over_ok=False: job(node1=())
    )
    cluster = _cvs_file(tmp_path, ["node1"])
    keys = json.loads(cluster.read_text())
    keys.update(priv_key_file=str(cluster), password=None, head_node_dict=None)
    cvs_keys = {k: keys[k] for k in ("orchestrator", "node_dict", "username", "priv_key_file",
                                     "password", "head_node_dict", "container")}  # fmt: skip
    orch = CvsOrchestrator(logging.getLogger("t"), SimpleNamespace(**cvs_keys),
                           cluster_file=str(cluster))  # fmt: skip
    # CVS's own rule (megatron_single asks it), over the container config it is given.
    assert orch.get_container_name(orch.container_config, "img:1") == "rvs-j7"
    assert orch.hosts == ["node1"]


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.yaml"
    path.write_text("name: p\nhosts: [a1]\ncontainer: {image: img:1, name: rvs}\n")
    return path


def test_a_job_scoped_name_stays_a_valid_container_name() -> None:
    assert job_container_name("x" * 128, "123456789012") == "x" * 114 + "-j123456789012"
    for bad in ("12;rm", "", "1" * 13):
        with pytest.raises(ConfigError, match=r"a job ID is digits"):
            job_container_name("rvs", bad)


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
    proc = _cvs(["plan", "-c", str(path), "--hosts-from", "slurm"], {})
    assert proc.returncode == 2
    assert proc.stderr.startswith("cvs: --hosts-from slurm: hosts come from Slurm")
    assert "Traceback" not in proc.stderr


def test_validate_outside_a_job_checks_the_rest_and_says_hosts_come_from_the_job(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SLURM_FILE + "container: {image: img:1, lifetime: per_job}\n")
    proc = _cvs(["validate", "-c", str(path)], {})
    assert proc.returncode == 0, proc.stderr
    assert "hosts come from the running Slurm job at run time" in proc.stderr
    assert proc.stderr.endswith("ok, hosts from the Slurm job\n")
    assert "hosts:\n  from: slurm\n" in proc.stdout and "slurm-node" not in proc.stdout
    # ...and the rest is still checked.
    path.write_text(SLURM_FILE + "container: {image: img:1, lifetime: bogus}\n")
    proc = _cvs(["validate", "-c", str(path)], {})
    assert proc.returncode == 2 and "container.lifetime: invalid value" in proc.stderr


def test_slurm_epilog_json_is_one_result_line_with_the_script() -> None:
    proc = _cvs(["slurm", "epilog", "--json"], {})
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    doc = json.loads(line)
    assert doc["ok"] is True and doc["epilog"] == remote.source("slurm_epilog")


def test_a_slurmctld_that_does_not_answer_is_exit_3_not_a_usage_error() -> None:
    def stalled(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        raise subprocess.TimeoutExpired(list(argv), timeout)

    with pytest.raises(SlurmError) as caught:
        query_job(IN_JOB, where="x", run=stalled)
    assert caught.value.exit_code == 3 and "did not answer" in str(caught.value)


# ------------------------------------------------------- GPUs from the allocation

AMD4 = tuple(GPU("amd", i, render_node=f"/dev/dri/renderD{128 + i}") for i in range(4))


def job(**gpus: tuple[int, ...]) -> SlurmJob:
    return SlurmJob(
        "7", tuple(SlurmNode(n, f"10.0.0.{k}", g) for k, (n, g) in enumerate(gpus.items()))
    )


def test_inside_a_job_the_container_gets_the_allocated_gpus_not_the_lowest() -> None:
    picked = select_in_job(AMD4, GPURequest(count=2), (2, 3), "7")
    assert isinstance(picked, GPUSelection)
    assert [g.index for g in picked.gpus] == [2, 3]
    assert picked.env() == {"ROCR_VISIBLE_DEVICES": "0,1"}  # its own numbering


def test_all_inside_a_job_is_all_the_job_holds_there() -> None:
    picked = select_in_job(AMD4, "all", (1, 3), "7")
    assert isinstance(picked, GPUSelection) and [g.index for g in picked.gpus] == [1, 3]


def test_asking_more_than_the_allocation_names_both() -> None:
    picked = select_in_job(AMD4, GPURequest(count=4), (2, 3), "7")
    assert isinstance(picked, Unsatisfiable)
    text = picked.message("node1")
    assert "needs 4" in text and "2 GPU(s) Slurm allocated job 7 here (IDX 2-3)" in text


def test_a_job_without_gpus_on_the_node_is_refused_when_gpus_are_asked() -> None:
    picked = select_in_job(AMD4, GPURequest(count=1), (), "7")
    assert isinstance(picked, Unsatisfiable) and "no GPUs on this node" in picked.reason


def test_outside_a_job_selection_is_as_before() -> None:
    picked = select_in_job(AMD4, GPURequest(count=2), None)
    assert isinstance(picked, GPUSelection) and [g.index for g in picked.gpus] == [0, 1]


def test_plan_refuses_a_count_beyond_the_allocation() -> None:
    st = states(host("node1", "absent"))
    st = {h: replace(s, gpus=AMD4) for h, s in st.items()}
    plan = decide_plan(cfg("per_run", gpus={"count": 4}), st, slurm=job(node1=(2, 3)))
    assert plan.refused and [r.kind for r in plan.refusals] == ["gpus"]


def _kept(name: str, gpus: str) -> HostState:
    labels = managed_labels(CLUSTER, lifetime="persistent", gpus=None) | {LABEL_GPUS: gpus}
    return host(name, "running", labels=labels)


def test_persistent_container_with_other_gpus_than_the_job_is_refused_per_node() -> None:
    st = states(_kept("node1", "0,1"), _kept("node2", "2,3"))
    c = cfg("persistent", gpus={"count": 2})
    plan = decide_plan(c, st, slurm=job(node1=(2, 3), node2=(2, 3)))
    assert plan.refused and plan.exit_code == 4
    (refusal,) = plan.refusals
    assert refusal.kind == "slurm_gpus" and refusal.hosts == ("node1",)
    assert "node1: container has GPUs 0-1, job 7 was allocated 2-3" in refusal.reason
    assert "force" in refusal.render()


def test_persistent_container_with_the_jobs_gpus_attaches() -> None:
    st = states(_kept("node1", "2,3"))
    plan = decide_plan(cfg("persistent", gpus={"count": 2}), st, slurm=job(node1=(2, 3)))
    assert not plan.refused and kinds(plan) == {"node1": "attach"}


def test_force_recreates_a_persistent_container_with_the_wrong_gpus() -> None:
    st = states(_kept("node1", "0,1"))
    c = cfg("persistent", gpus={"count": 2})
    plan = decide_plan(c, st, slurm=job(node1=(2, 3)), force=True)
    assert not plan.refused and kinds(plan) == {"node1": "replace"}
    assert plan.actions["node1"].remove_first


def test_an_unreachable_node_of_the_job_is_told_to_leave_the_allocation_not_the_file() -> None:
    st = states(host("node1", "absent"), host("node2", None))
    plan = decide_plan(cfg("per_run"), st, slurm=job(node1=(), node2=()))
    (refusal,) = plan.refusals
    ways = [w.text for w in refusal.ways_out]
    assert refusal.kind == "unknown_state" and refusal.hosts == ("node2",)
    assert any("`salloc -x node2`" in w and "`sbatch -x node2`" in w for w in ways)
    assert any("job 7" in w for w in ways) and not any("cluster file" in w for w in ways)


def test_an_unreachable_host_of_the_file_is_still_told_to_remove_it_from_the_file() -> None:
    plan = decide_plan(cfg("per_run"), states(host("node1", "absent"), host("node2", None)))
    ways = [w.text for r in plan.refusals for w in r.ways_out]
    assert "remove them from the cluster file" in ways and not any("salloc" in w for w in ways)


# ------------------------------------------------------- the holder and the epilog (sh)

CID = "c" * 64


INV = "0123456789abcdef"


def quick_sleep_path(tmp_path: Path) -> str:
    """PATH with a `sleep` that pauses 20 ms whatever it is asked: the holder's
    second between sweeps is `sleep 1` found on PATH, and what these tests read
    (the sweeps' count and order, the exit) does not depend on its length."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "sleep"
    shim.write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 0.02\n")
    shim.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def fake_runtime(tmp_path: Path, *listed: str) -> list[str]:
    """A runtime argv that logs each call and answers `ps` with `listed`, a line each."""
    log = tmp_path / "runtime.log"
    body = f'echo "$@" >> {log}; case $1 in ps) printf "%s\\n" {" ".join(listed)} ;; esac'
    return ["sh", "-c", body, "runtime"]


@pytest.mark.parametrize("shell", ["dash", "sh"])
def test_the_holder_removes_its_jobs_and_invocations_containers_by_id_on_sigterm(
    shell: str, tmp_path: Path
) -> None:
    runtime = fake_runtime(tmp_path, CID, "not-an-id")
    argv = remote.argv("slurm_holder", "42", INV, "--", *runtime)
    env = {"PATH": quick_sleep_path(tmp_path), "SLURMD_NODENAME": "node1"}
    proc = subprocess.Popen([shell, *argv[1:]], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == f"ready node1 42 {INV}\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == f"removed node1 {CID}\n"
    proc.kill()  # Slurm's SIGKILL after KillWait ends the sweeps
    proc.communicate(timeout=30)
    calls = (tmp_path / "runtime.log").read_text().splitlines()
    assert calls[0] == (
        f"ps -aq --no-trunc --filter label=io.cvs.slurm-job=42 "
        f"--filter label=io.cvs.invocation={INV}"
    )
    assert calls[1] == f"rm -f -v {CID}"  # by ID; the line that is no ID is skipped
    assert all(c.startswith(("ps ", f"rm -f -v {CID}")) for c in calls)


def test_a_holder_sweeps_ten_times_after_sigterm_then_exits(tmp_path: Path) -> None:
    argv = remote.argv("slurm_holder", "42", INV, "--", *fake_runtime(tmp_path))
    env = {"PATH": quick_sleep_path(tmp_path), "SLURMD_NODENAME": "node1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert (tmp_path / "runtime.log").read_text().count("ps -aq") == 10


@pytest.mark.parametrize("job, inv", [("4x", INV), ("42", "XYZ"), ("", INV)])
def test_a_holder_with_a_bad_job_or_invocation_refuses_at_once(job: str, inv: str) -> None:
    argv = remote.argv("slurm_holder", job, inv, "--", "docker")
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "node1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "cvs-holder: bad" in proc.stderr


def test_the_holder_step_is_one_overlapping_task_per_node_of_the_job() -> None:
    job = SlurmJob("42", (SlurmNode("n1", "a"), SlurmNode("n2", "b"), SlurmNode("n3", "c")))
    argv = holder_argv(job, ["n3", "n1"], INV, ["sudo", "-n", "docker"])
    assert argv[:8] == [
        "srun", "--jobid=42", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=n1,n3", "--job-name=cvs-holder",
    ]  # fmt: skip
    assert argv[-7:] == ["cvs-slurm_holder", "42", INV, "--", "sudo", "-n", "docker"]


def test_ready_nodes_are_read_from_the_holders_lines() -> None:
    text = f"ready n1 42 {INV}\nsrun: error: n2: task 1: Exited\nready n3 42 {INV}\n"
    assert ready_nodes(text) == {"n1", "n3"}


def test_the_epilog_exits_0_outside_a_job_and_without_a_runtime(tmp_path: Path) -> None:
    script = tmp_path / "epilog.sh"
    script.write_text(remote.source("slurm_epilog"))
    for env in ({}, {"SLURM_JOB_ID": "12"}, {"SLURM_JOB_ID": "12; rm -rf /"}):
        proc = subprocess.run(
            [shutil.which("dash") or "/bin/sh", str(script)],
            env={"PATH": str(tmp_path), **env},
            capture_output=True,
        )
        assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------- per_job, a port per job


def _job_file(tmp_path: Path, container: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nhosts: {{from: slurm}}\ncontainer: {container}\n")
    return path


def test_per_job_outside_a_job_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "listed.yaml"
    path.write_text("name: p\nhosts: [a1, a2]\ncontainer: {image: img:1, lifetime: per_job}\n")
    with pytest.raises(ConfigError) as caught:
        load_cluster(path, env={})
    said = str(caught.value)
    assert "\n" not in said and said.startswith(f"{path}:3: container.lifetime: per_job ")
    assert "inside an allocation" in said and "per_run or persistent" in said


def test_per_job_inside_a_job_is_named_for_the_job(tmp_path: Path) -> None:
    path = _job_file(tmp_path, "{image: img:1, name: rvs, lifetime: per_job}")
    cluster = load_cluster(path, env=IN_JOB, slurm_run=fake_scontrol(), check_files=False)
    assert container_name(cluster) == "rvs-j7"


def test_the_sshd_port_inside_a_job_is_the_jobs_unless_the_file_sets_one(
    tmp_path: Path,
) -> None:
    run = fake_scontrol()
    for lifetime in ("per_run", "per_job"):
        path = _job_file(tmp_path, f"{{image: img:1, name: rvs, lifetime: {lifetime}}}")
        cluster = load_cluster(path, env=IN_JOB, slurm_run=run, check_files=False)
        assert cluster.container is not None and cluster.container.sshd.port == 20007
    fixed = _job_file(tmp_path, "{image: img:1, name: rvs, sshd: {port: 2300}}")
    cluster = load_cluster(fixed, env=IN_JOB, slurm_run=run, check_files=False)
    assert cluster.container is not None and cluster.container.sshd.port == 2300
    kept = _job_file(tmp_path, "{image: img:1, name: rvs, lifetime: persistent}")
    cluster = load_cluster(kept, env=IN_JOB, slurm_run=run, check_files=False)
    assert cluster.container is not None and cluster.container.sshd.port == 2224


def test_job_ports_stay_in_their_documented_range() -> None:
    assert job_sshd_port("7") == 20007
    assert job_sshd_port("123456789012") == 29012
    assert {job_sshd_port(str(j)) for j in range(500, 10500)} == set(range(20000, 30000))


# ------------------------------------------------------- containers of jobs, from outside


def _listed(job: str, lifetime: str = "per_run", state: str = "running") -> JobContainer:
    return JobContainer("node1", CID, f"rvs-j{job}", state, job, lifetime)


def test_a_job_container_listing_is_read_strictly() -> None:
    text = (
        f"{CID} /rvs-j42 running 42 per_run\n"
        f"{CID} /rvs-j43 exited 43; per_run\n"  # not a job ID
        "garbage\n"
        f"{'z' * 64} /x running 44 per_run\n"  # not an ID
    )
    assert parse_listing("node1", text) == [_listed("42")]


def test_only_containers_of_jobs_that_are_over_are_removed_from_outside() -> None:
    found = [_listed("1"), _listed("2"), _listed("3"), _listed("4"), _listed("5", "persistent")]
    states = {
        "1": ("CANCELLED", ""), "2": (GONE, ""), "3": ("RUNNING", ""),
        "4": (None, "slurmctld did not answer within 20s"), "5": ("COMPLETED", ""),
    }  # fmt: skip
    verdicts = {v.container.job: v for v in decide(found, states)}
    assert {j for j, v in verdicts.items() if v.remove} == {"1", "2"}
    assert "job 2 is over (no longer known to Slurm)" in verdicts["2"].why
    assert verdicts["3"].why.startswith("job 3 is RUNNING: its end removes it")
    assert "could not ask Slurm whether job 4 is over" in verdicts["4"].why
    assert "persistent" in verdicts["5"].why


def test_a_job_slurmctld_no_longer_knows_is_gone_and_a_stalled_one_unknown() -> None:
    def purged(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        return 1, "", "slurm_load_jobs error: Invalid job id specified\n"

    def stalled(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        raise subprocess.TimeoutExpired(list(argv), timeout)

    assert job_state("42", run=purged) == (GONE, "")
    state, why = job_state("42", run=stalled)
    assert state is None and "did not answer" in why
    running = fake_scontrol()
    assert job_state("7", run=running) == ("RUNNING", "")


def test_a_job_that_is_over_gives_its_nodes_to_down_and_status_only() -> None:
    over = fake_scontrol(job=JOB.replace("JobState=RUNNING", "JobState=CANCELLED"))
    with pytest.raises(ConfigError, match=r"not running: .*`status\(\)` and `down\(\)`"):
        query_job(IN_JOB, where="x", run=over)
    got = query_job(IN_JOB, where="x", run=over, over_ok=True)
    assert [n.name for n in got.nodes] == ["node1", "node2"]
    pending = fake_scontrol(job=JOB.replace("JobState=RUNNING", "JobState=PENDING"))
    with pytest.raises(ConfigError, match=r"job 7 is PENDING, not running: run cvs inside a "
                       r"running allocation$"):  # fmt: skip
        query_job(IN_JOB, where="x", run=pending, over_ok=True)


def test_the_holders_srun_leaves_the_jobs_own_srun_inputs_out() -> None:
    env = {"SLURM_CONF": "/etc/slurm.conf", "SLURM_MPI_TYPE": "pmix", "SLURM_JOB_ID": "7",
           "SRUN_CPUS_PER_TASK": "4", "PMIX_RANK": "0", "PATH": "/bin"}  # fmt: skip
    assert holder_env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}
    job = SlurmJob("42", (SlurmNode("n1", "a"),))
    assert "--mpi=none" in holder_argv(job, ["n1"], INV, ["docker"])


def test_the_job_container_listing_asks_by_label_and_inspects_what_it_found(
    tmp_path: Path,
) -> None:
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\n'
        f'case $1 in ps) echo {CID} ;; inspect) echo "{CID} /rvs-j42 exited 42 per_job" ;; esac\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "DOCKER_HOST": "unix:///nonexistent"}
    argv = listing_argv([], "my cluster")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert parse_listing("n1", proc.stdout) == [
        JobContainer("n1", CID, "rvs-j42", "exited", "42", "per_job")
    ]
    calls = log.read_text().splitlines()
    assert calls[0] == (
        "ps -aq --no-trunc --filter label=io.cvs.managed=my cluster --filter label=io.cvs.slurm-job"
    )
    removed = subprocess.run(remove_argv([], [CID]), env=env, capture_output=True, timeout=30)
    assert removed.returncode == 0
    assert log.read_text().splitlines()[-1] == f"rm -f -v {CID}"
    with pytest.raises(ValueError):
        remove_argv([], ["42; rm -rf /"])
