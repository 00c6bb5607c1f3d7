"""A real Slurm in the sandbox: munge, slurmctld, one slurmd per host's namespace."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import last_json
from sandboxtools import cluster_variant
from slurmtools import (
    CVS,
    JOB_LABEL,
    JobEnd,
    containers,
    in_job,
    job_containers,
    job_state,
    slurm,
    up_in_batch,
    wait_until,
)

from orchestrator.config.slurm import SCONTROL_TIMEOUT
from orchestrator.sandbox import Sandbox, SandboxError, sandbox_down
from orchestrator.sandbox import slurm as slurm_sb
from orchestrator.sandbox.procs import cmdline, pids_mentioning

MakeSandbox = Callable[..., Sandbox]


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


# ---------------------------------------------------------------- cvs in a job


def slurm_file(sb: Sandbox, directory: Path, **changes: Any) -> Path:
    """The sandbox's cluster file with `hosts: {from: slurm}` (no addresses)."""
    return cluster_variant(sb, directory, hosts={"from": "slurm"}, **changes)


def test_hosts_from_slurm_are_the_jobs_nodes_at_their_nodeaddr(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = slurm_file(slurm_sandbox, tmp_path)
    proc = in_job(
        slurm_sandbox,
        f'$CVS -c {cluster} exec --host-os --json -- sh -c "hostname; echo \\$SSH_CONNECTION"\n'
        'echo "job=$SLURM_JOB_ID"',
        "-N2",
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.rsplit("job=", 1)[1].strip()
    result = last_json(proc.stdout.rsplit("job=", 1)[0])
    assert result["slurm_job"] == job
    for name in ("node1", "node2"):
        out = result["hosts"][name]["stdout"]
        assert out.split()[0] == name  # its own UTS namespace
        assert slurm_sandbox.host(name).address in out  # reached at Slurm's NodeAddr


def test_outside_a_job_hosts_from_slurm_is_one_line_and_exit_2(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = slurm_file(slurm_sandbox, tmp_path)
    proc = slurm(slurm_sandbox, *CVS.split(" "), "-c", str(cluster), "up")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "SLURM_JOB_ID is not set" in proc.stderr


def test_a_job_that_has_ended_is_refused_and_nothing_starts(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = slurm_file(slurm_sandbox, tmp_path)
    done = in_job(slurm_sandbox, 'echo "job=$SLURM_JOB_ID"', "-N1")
    job = done.stdout.rsplit("job=", 1)[1].strip()
    env = {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "node1"}
    proc = slurm(slurm_sandbox, *CVS.split(" "), "-c", str(cluster), "up", env=env)
    assert proc.returncode == 2, proc.stderr
    assert f"job {job} is " in proc.stderr and "not running" in proc.stderr
    for h in slurm_sandbox.nodes:
        assert containers(slurm_sandbox, h.name) == []


def test_a_slurmctld_that_does_not_answer_is_named_within_the_bound_exit_3(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = slurm_file(slurm_sandbox, tmp_path)
    ctld = slurm_sandbox.slurm_pids["slurmctld"]
    env = {"SLURM_JOB_ID": "999999", "SLURM_JOB_NODELIST": "node1"}
    os.kill(ctld, signal.SIGSTOP)
    try:
        started = time.monotonic()
        proc = slurm(slurm_sandbox, *CVS.split(" "), "-c", str(cluster), "up", env=env)
        took = time.monotonic() - started
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert proc.returncode == 3, proc.stderr  # out of reach, as a host: not a usage error
    assert "slurmctld did not answer `scontrol show job -d 999999`" in proc.stderr
    assert took < 5 * SCONTROL_TIMEOUT


def test_no_slurm_variables_reach_the_containers_unless_the_cluster_env_names_them(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = slurm_file(slurm_sandbox, tmp_path, env={"PMIX_MCA_named": "kept"})
    proc = in_job(
        slurm_sandbox,
        f"$CVS -c {cluster} up >/dev/null || exit 1\n"
        f"$CVS -c {cluster} exec -- env; rc=$?\n"
        f"$CVS -c {cluster} down >/dev/null; exit $rc",
        "-N2",
        env={"PMIX_RANK": "0", "PMI_SIZE": "2", "SLURM_MPI_TYPE": "pmix"},
    )
    assert proc.returncode == 0, proc.stderr
    names = {line.split("|", 1)[-1].strip().split("=", 1)[0] for line in proc.stdout.splitlines()}
    assert "PMIX_MCA_named" in names
    leaked = sorted(n for n in names if n.startswith(("SLURM_", "PMI_", "PMIX_")))
    assert leaked == ["PMIX_MCA_named"]


# ------------------------------------------------------- GPUs from the allocation


def gpu_file(sb: Sandbox, directory: Path, name: str, **container: Any) -> Path:
    """The sandbox's file (node names and device roots) with a GPU request and
    a container name of its own; run with --hosts-from slurm."""
    doc = yaml.safe_load(sb.cluster_file.read_text())
    doc["container"].update({"name": name, "gpus": {"count": 2}, **container})
    return cluster_variant(sb, directory, container=doc["container"])


def devices(sb: Sandbox, host: str, name: str) -> list[str]:
    """The host paths of the render nodes docker handed that container."""
    (info,) = containers(sb, host, f"name=^{name}$")
    return sorted(
        Path(d["PathOnHost"]).name
        for d in info["HostConfig"]["Devices"]
        if "renderD" in d["PathOnHost"]
    )


def test_two_jobs_sharing_a_node_with_one_cluster_file_keep_their_own_containers_and_gpus(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # One file, one container name: inside each job a per_run container is
    # named for its job, so the second `up` does not replace the first's.
    cluster = gpu_file(slurm_sandbox, tmp_path / "c", "cvs-job")
    procs: list[subprocess.Popen[str]] = []
    try:
        for n in ("a", "b"):
            script = (
                f"$CVS -c {cluster} --hosts-from slurm up --json > {tmp_path}/up-{n}.json\n"
                "[ $? = 0 ] || exit 1\n"
                f"echo $SLURM_JOB_ID > {tmp_path}/ready-{n}\n"
                f"while [ ! -e {tmp_path}/release ]; do sleep 0.2; done\n"
                f"$CVS -c {cluster} --hosts-from slurm down"
            )
            argv = ["salloc", "-N1", "-w", "node1", "--gres=gpu:2", "sh", "-c",
                    f"CVS={shlex.quote(CVS)}\n{script}"]  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
            env.update(slurm_sandbox.slurm_env())
            out = subprocess.PIPE
            procs.append(subprocess.Popen(argv, env=env, text=True, stdout=out, stderr=out))
            deadline = time.monotonic() + 240
            while not (tmp_path / f"ready-{n}").exists():
                assert procs[-1].poll() is None, procs[-1].communicate()[0]
                assert time.monotonic() < deadline, f"job {n} did not come up"
                time.sleep(0.5)
        jobs = {n: (tmp_path / f"ready-{n}").read_text().strip() for n in ("a", "b")}
        running = {
            c["Name"].lstrip("/"): c["State"]["Running"]
            for c in containers(slurm_sandbox, "node1", "name=cvs-job")
        }
        got = {
            n: devices(slurm_sandbox, "node1", f"cvs-job-j{jobs[n]}")
            for n in ("a", "b")
            if f"cvs-job-j{jobs[n]}" in running
        }
    finally:
        (tmp_path / "release").touch()
        outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # Both jobs' containers run side by side, each under its job's name.
    assert running == {f"cvs-job-j{jobs['a']}": True, f"cvs-job-j{jobs['b']}": True}
    # Slurm's first job on the node got IDX 0-1, the second 2-3: so do their containers.
    assert got == {"a": ["renderD128", "renderD129"], "b": ["renderD130", "renderD131"]}
    for n in ("a", "b"):
        assert last_json((tmp_path / f"up-{n}.json").read_text())["slurm_job"] == jobs[n]
    # Each job's `down` removed its own container.
    assert containers(slurm_sandbox, "node1", "name=cvs-job") == []


def test_a_gpu_count_beyond_the_allocation_is_refused_and_nothing_starts(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = gpu_file(slurm_sandbox, tmp_path, "cvs-too-many", gpus={"count": 3})
    proc = in_job(
        slurm_sandbox, f"$CVS -c {cluster} --hosts-from slurm up", "-N1", "-w", "node2",
        "--gres=gpu:2",
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "Slurm allocated job" in proc.stdout + proc.stderr
    assert containers(slurm_sandbox, "node2", "name=cvs-too-many") == []


# ------------------------------------------------------- containers that end with the job


def test_per_run_containers_go_within_30s_of_scancel(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    job = up_in_batch(slurm_sandbox, tmp_path, "sleep 600")
    assert slurm(slurm_sandbox, "scancel", job).returncode == 0
    took = wait_until(
        lambda: job_containers(slurm_sandbox, job) == {"node1": 0, "node2": 0}, 30, "removal"
    )
    print(f"containers gone {took:.1f}s after the job's end")
    assert took < 30


def test_per_run_containers_go_within_30s_of_the_time_limit(
    slurm_sandbox: Sandbox, time_limited_jobs: dict[str, JobEnd]
) -> None:
    # The job ran from the fixture on, next to test_slurm_jobs_sandbox's per_job one.
    end = time_limited_jobs["per_run"]
    job = end.job
    took = end.result()
    print(f"containers gone {took:.1f}s after the job's end")
    assert took < 30
    wait_until(lambda: job_state(slurm_sandbox, job) != "COMPLETING", 60, "the job's end")
    assert job_state(slurm_sandbox, job) == "TIMEOUT"


def test_per_run_containers_go_when_the_jobs_cvs_is_sigkilled(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    marker = str(tmp_path / "c" / "cluster.yaml")
    job = up_in_batch(
        slurm_sandbox, tmp_path, f"$CVS -c {marker} --hosts-from slurm exec -- sleep 600"
    )

    def the_exec() -> list[int]:
        return [p for p in pids_mentioning(marker) if "exec" in cmdline(p)]

    wait_until(the_exec, 60, "the job's cvs exec")
    for pid in the_exec():
        os.kill(pid, signal.SIGKILL)
    took = wait_until(
        lambda: job_containers(slurm_sandbox, job) == {"node1": 0, "node2": 0}, 60, "removal"
    )
    print(f"containers gone {took:.1f}s after the job's end")
    assert took < 30
    assert job_state(slurm_sandbox, job) != "RUNNING"


def test_a_persistent_container_outlives_its_job(slurm_sandbox: Sandbox, tmp_path: Path) -> None:
    job = up_in_batch(slurm_sandbox, tmp_path, "true", lifetime="persistent")
    try:
        wait_until(lambda: job_state(slurm_sandbox, job) == "COMPLETED", 60, "the job's end")
        time.sleep(10)  # past KillWait: a holder, were there one, would have acted
        assert job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}
        (info,) = containers(slurm_sandbox, "node1", f"label={JOB_LABEL}={job}")
        assert info["State"]["Running"] is True
        assert info["Config"]["Labels"]["io.cvs.lifetime"] == "persistent"
    finally:
        for h in slurm_sandbox.nodes:
            subprocess.run([*slurm_sandbox.docker_argv(h), "rm", "-f", "cvs-kept"], check=False)


def test_the_epilog_removes_only_that_jobs_per_run_containers_and_never_fails(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    script = tmp_path / "epilog.sh"
    proc = subprocess.run(
        [*CVS.split(" "), "slurm", "epilog", "--install", str(script)], check=False
    )
    assert proc.returncode == 0
    text = script.read_text()
    for word in ("scontrol", "squeue", "srun", "sbatch", "scancel", "sacct"):
        assert word not in text.replace("Slurm command", "")
    h = slurm_sandbox.host("node1")
    docker = slurm_sandbox.docker_argv(h)
    image = "cvs-sandbox:sshd"

    def start(name: str, job: str, lifetime: str) -> None:
        labels = ["--label", f"{JOB_LABEL}={job}", "--label", f"io.cvs.lifetime={lifetime}"]
        argv = [*docker, "run", "-d", "--name", name, *labels, image, "sleep", "600"]
        subprocess.run(argv, check=True, capture_output=True)

    names = {"ep-mine": ("4242", "per_run"), "ep-kept": ("4242", "persistent"),
             "ep-other": ("4243", "per_run")}  # fmt: skip
    try:
        for name, (job, lifetime) in names.items():
            start(name, job, lifetime)
        env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242", "DOCKER_HOST": h.docker_host}
        ns = ["nsenter", f"--net=/var/run/netns/{h.netns}"]
        first = subprocess.run([*ns, "sh", str(script)], env=env, capture_output=True, timeout=60)
        again = subprocess.run([*ns, "sh", str(script)], env=env, capture_output=True, timeout=60)
        left = {c["Name"].lstrip("/") for c in containers(slurm_sandbox, "node1", "name=ep-")}
    finally:
        subprocess.run([*docker, "rm", "-f", *names], check=False, capture_output=True)
    assert (first.returncode, again.returncode) == (0, 0)
    assert left == {"ep-kept", "ep-other"}


# ------------------------------------------------------- a persistent container, a new job's GPUs


def test_a_persistent_container_refuses_a_job_with_other_gpus_and_attaches_with_the_same(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = gpu_file(slurm_sandbox, tmp_path / "c", "cvs-pgpu", lifetime="persistent")
    up = f"$CVS -c {cluster} --hosts-from slurm up --json"
    alloc = ("-N1", "-w", "node1", "--gres=gpu:2")
    blocker: subprocess.Popen[str] | None = None
    try:
        first = in_job(slurm_sandbox, up, *alloc)  # node1 free: IDX 0-1
        assert first.returncode == 0, first.stdout + first.stderr
        # Another job holds 0-1 now: the next one is given 2-3.
        hold = f"touch {tmp_path}/held; while [ ! -e {tmp_path}/release ]; do sleep 0.2; done"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
        env.update(slurm_sandbox.slurm_env())
        quiet = subprocess.DEVNULL
        argv = ["salloc", *alloc, "sh", "-c", hold]
        blocker = subprocess.Popen(argv, env=env, text=True, stdout=quiet, stderr=quiet)
        wait_until((tmp_path / "held").exists, 120, "the blocking job")
        plan = f"$CVS -c {cluster} --hosts-from slurm plan >/dev/null 2>&1; echo plan=$?"
        second = in_job(slurm_sandbox, f"{plan}\n{up}", *alloc)
        (tmp_path / "release").touch()
        blocker.wait(timeout=120)
        third = in_job(slurm_sandbox, up, *alloc)  # 0-1 again
    finally:
        (tmp_path / "release").touch()
        if blocker is not None and blocker.poll() is None:
            blocker.wait(timeout=120)
        for h in slurm_sandbox.nodes:
            subprocess.run([*slurm_sandbox.docker_argv(h), "rm", "-f", "cvs-pgpu"], check=False)
    assert second.returncode == 4, second.stdout + second.stderr
    assert "plan=4\n" in second.stdout  # plan refuses as up does
    result = last_json(second.stdout)
    assert "container has GPUs 0-1, job" in result["error"]
    assert "was allocated 2-3" in result["error"] and "--force" in result["error"]
    assert third.returncode == 0, third.stdout + third.stderr
    assert last_json(third.stdout)["ok"] is True


def test_a_node_of_the_job_cvs_cannot_reach_is_named_and_nothing_starts(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    container = yaml.safe_load(slurm_sandbox.cluster_file.read_text())["container"]
    cluster = slurm_file(slurm_sandbox, tmp_path, container={**container, "name": "cvs-unr"})
    slurm_sandbox.stop_sshd("node2")
    try:
        proc = in_job(slurm_sandbox, f"$CVS -c {cluster} up", "-N2")
    finally:
        slurm_sandbox.start_sshd("node2")
    # A host whose state cannot be told is never taken for empty: refused, exit 4.
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "node2 ! unreachable: connection refused" in proc.stderr
    assert "refused, nothing was changed" in proc.stderr
    assert "salloc -x node2" in proc.stderr  # Slurm gave it: leave it out of the job
    assert containers(slurm_sandbox, "node1", "name=cvs-unr") == []


def test_a_podman_sandbox_runs_slurm_too(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(hosts=1, slurm=True, runtime="podman")
    proc = slurm(sb, "srun", "-N1", "sh", "-c", 'echo "$SLURMD_NODENAME"')
    assert (proc.returncode, proc.stdout) == (0, "node1\n"), proc.stderr


# ------------------------------------------------------- CVS's view of the same job

CVS_TARBALL = Path(__file__).resolve().parents[2] / "shared" / "peers" / "cvs-main-dddd9143.tar.gz"
# CVS's own scheduler module (cvs/core/scheduler.py, no dependencies): what it
# detects, whether it counts as inside a job, and the run ID its RunLayout takes.
CVS_PROBE = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("cvs_scheduler", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
managed = m.is_managed_compute()
run_id = os.environ["SLURM_JOB_ID"] if managed else "local"
print("cvs", m.detect_scheduler().value, managed, run_id)
"""


def test_cvs_and_cvs_orchestrator_name_the_same_job_inside_an_srun_step(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    if not CVS_TARBALL.exists():
        pytest.skip(f"{CVS_TARBALL} is absent (the real CVS: ../shared/peers/README.md)")
    with tarfile.open(CVS_TARBALL) as tar:
        member = tar.getmember("cvs-main-dddd9143/cvs/core/scheduler.py")
        (tmp_path / "scheduler.py").write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    (tmp_path / "probe.py").write_text(CVS_PROBE)
    probe = f"python3 {tmp_path}/probe.py {tmp_path}/scheduler.py"
    cluster = slurm_file(slurm_sandbox, tmp_path / "c")
    ours = f"$CVS -c {cluster} exec --host-os --json -- true"
    both = f'{probe}; {ours} | tail -n 1; echo "job=$SLURM_JOB_ID"'
    # salloc alone: no step, CVS counts itself outside a job; inside `srun`
    # it takes SLURM_JOB_ID as its run ID, the job ID cvs-orchestrator records.
    bare = in_job(slurm_sandbox, both, "-N2")
    step = in_job(slurm_sandbox, f"export CVS; srun -N1 -n1 sh -c {shlex.quote(both)}", "-N2")
    for proc in (bare, step):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for proc, cvs_run_id in ((bare, "local"), (step, None)):
        job = proc.stdout.rsplit("job=", 1)[1].strip()
        lines = proc.stdout.splitlines()
        cvs_line = next(line for line in lines if line.startswith("cvs "))
        assert cvs_line == f"cvs slurm {cvs_run_id is None} {cvs_run_id or job}"
        assert any(line.startswith("{") for line in lines), proc.stdout + proc.stderr
        result = json.loads(next(line for line in lines if line.startswith("{")))
        assert result["slurm_job"] == job
