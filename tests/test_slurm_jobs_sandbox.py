"""Slurm jobs as people run them (issue 42), on the sandbox's real Slurm:
containers tied to their job before `up` says ready, `lifetime: per_job`,
an sshd port per job."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from sandboxtools import cluster_variant
from slurmtools import (
    CVS,
    JOB_LABEL,
    JobEnd,
    containers,
    in_job,
    job_containers,
    job_state,
    sbatch,
    slurm,
    up_in_batch,
    wait_until,
)

from orchestrator.config.slurm import job_sshd_port
from orchestrator.sandbox import Sandbox
from orchestrator.sandbox.procs import cmdline, pids_mentioning

DOCS = Path(__file__).resolve().parents[1] / "docs" / "slurm.md"
NONE = {"node1": 0, "node2": 0}
HOSTFILE = "/etc/cvs/hostfile"
MakeSandbox = Callable[..., Sandbox]


def variant(sb: Sandbox, directory: Path, **container: Any) -> Path:
    """The sandbox's file (node names, device roots) with container keys changed."""
    doc = yaml.safe_load(sb.cluster_file.read_text())
    return cluster_variant(sb, directory, container={**doc["container"], **container})


def test_scancel_while_up_is_cold_starting_leaves_no_container(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # A setup script that takes its time: `up` is still provisioning when
    # the job is cancelled, the containers already run on every node.
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 300\n")
    cluster = variant(slurm_sandbox, tmp_path / "c", name="cvs-cold", setup_script=str(slow))
    job = sbatch(slurm_sandbox, tmp_path, f"$CVS -c {cluster} --hosts-from slurm up")
    wait_until(
        lambda: (
            job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}
            or job_state(slurm_sandbox, job) not in ("PENDING", "RUNNING")
        ),
        240,
        f"job {job}'s containers",
    )
    assert job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}, (
        tmp_path / "job.out"
    ).read_text()
    assert slurm(slurm_sandbox, "scancel", job).returncode == 0
    took = wait_until(lambda: job_containers(slurm_sandbox, job) == NONE, 60, "removal")
    print(f"cold-starting containers gone {took:.1f}s after scancel")
    time.sleep(5)  # past KillWait: nothing came back (a `docker run` cut short)
    assert job_containers(slurm_sandbox, job) == NONE
    assert took < 30


def test_a_holder_step_that_cannot_start_fails_up_and_starts_nothing(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # node2's slurmd stopped: slurmctld grants the step, node2 never runs its task.
    cluster = variant(slurm_sandbox, tmp_path / "c", name="cvs-untied")
    slurmd = slurm_sandbox.slurm_pids["slurmd:node2"]
    script = f"kill -STOP {slurmd}\n$CVS -c {cluster} --hosts-from slurm up\nrc=$?\n"
    script += f"kill -CONT {slurmd}\nexit $rc"
    try:
        proc = in_job(slurm_sandbox, script, "-N2", timeout=300)
    finally:
        os.kill(slurmd, signal.SIGCONT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "node2: cannot tie containers to Slurm job" in proc.stderr
    assert "nothing was started" in proc.stderr
    for node in ("node1", "node2"):
        assert containers(slurm_sandbox, node, "name=cvs-untied") == []


def docs_example() -> tuple[dict[str, Any], str]:
    """docs/slurm.md's first cluster file and the cvs line of the block after it."""
    text = DOCS.read_text()
    blocks = re.findall(r"```(yaml|sh)\n(.*?)```", text, re.S)
    (i, (_, first)) = next((i, b) for i, b in enumerate(blocks) if b[0] == "yaml")
    line = next(x for x in blocks[i + 1][1].splitlines() if x.startswith("cvs "))
    return yaml.safe_load(first), line


def test_the_docs_install_then_test_example_keeps_per_job_containers_until_scancel(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    doc, line = docs_example()
    assert doc["container"]["lifetime"] == "per_job" and doc["hosts"] == {"from": "slurm"}
    # The example's file, with the sandbox's image and ssh settings.
    cluster = variant(slurm_sandbox, tmp_path / "c", name="cvs-pj", lifetime="per_job")
    body = yaml.safe_load(cluster.read_text())
    cluster.write_text(yaml.safe_dump({**body, "hosts": doc["hosts"]}, sort_keys=False))
    flag = tmp_path / "ran"
    script = f"cd {tmp_path}\n{line.replace('cvs ', '$CVS ')}\necho rc=$? > {flag}\nsleep 600"
    job = sbatch(slurm_sandbox, tmp_path, script.replace("cluster.yaml", str(cluster)))
    wait_until(flag.exists, 300, f"job {job}'s two runs")
    out = (tmp_path / "job.out").read_text()
    assert flag.read_text() == "rc=0\n", out
    # Between and after the runs the same container stayed on each node.
    assert job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}, out
    (info,) = containers(slurm_sandbox, "node1", f"label={JOB_LABEL}={job}")
    assert info["Config"]["Labels"]["io.cvs.lifetime"] == "per_job"
    assert info["Name"] == f"/cvs-pj-j{job}"
    assert slurm(slurm_sandbox, "scancel", job).returncode == 0
    took = wait_until(lambda: job_containers(slurm_sandbox, job) == NONE, 60, "removal")
    print(f"per_job containers gone {took:.1f}s after scancel")
    assert took < 30


def test_two_jobs_on_the_same_nodes_with_one_file_each_get_their_own_sshd_port(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster = variant(slurm_sandbox, tmp_path / "c", name="cvs-ports")
    procs: list[subprocess.Popen[str]] = []
    script = (
        f"$CVS -c {cluster} --hosts-from slurm up > /dev/null || exit 1\n"
        'echo "job=$SLURM_JOB_ID" > {out}/ready-{n}\n'
        f"$CVS -c {cluster} --hosts-from slurm exec --hosts head -- "
        "sh -c 'ssh node2 echo reached-node2 && grep Port ~/.ssh/config' > {out}/ssh-{n}\n"
        "rc=$?\n"
        f"while [ ! -e {tmp_path}/release ]; do sleep 0.2; done\n"
        f"$CVS -c {cluster} --hosts-from slurm down > /dev/null; exit $rc"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    env.update(slurm_sandbox.slurm_env())
    try:
        for n in ("a", "b"):
            text = script.replace("{out}", str(tmp_path)).replace("{n}", n)
            argv = ["salloc", "-N2", "sh", "-c", f"CVS={shlex.quote(CVS)}\n{text}"]
            pipe = subprocess.PIPE
            procs.append(subprocess.Popen(argv, env=env, text=True, stdout=pipe, stderr=pipe))
            deadline = time.monotonic() + 240
            while not (tmp_path / f"ready-{n}").exists():
                assert procs[-1].poll() is None, procs[-1].communicate()
                assert time.monotonic() < deadline, f"job {n} did not come up"
                time.sleep(0.5)
        running = {
            c["Name"].lstrip("/"): c["Config"]["Labels"]["io.cvs.sshd-port"]
            for c in containers(slurm_sandbox, "node1", "name=cvs-ports")
        }
    finally:
        (tmp_path / "release").touch()
        outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    jobs = {n: (tmp_path / f"ready-{n}").read_text().strip().split("=")[1] for n in ("a", "b")}
    ports = {n: job_sshd_port(jobs[n]) for n in ("a", "b")}
    assert ports["a"] != ports["b"]
    # Both jobs' containers run side by side on node1, each with its job's port...
    assert running == {f"cvs-ports-j{jobs[n]}": str(ports[n]) for n in ("a", "b")}
    for n in ("a", "b"):
        said = (tmp_path / f"ssh-{n}").read_text()
        # ...and each head's ssh reaches its own job's node2 through its config.
        assert "reached-node2" in said, said
        assert f"Port {ports[n]}" in said, said
    assert containers(slurm_sandbox, "node1", "name=cvs-ports") == []


def left_behind(sb: Sandbox, tmp_path: Path, name: str) -> tuple[Path, str]:
    """A job whose holder was SIGKILLed (as a failed node's would be) and no
    epilog: its containers outlive it, under their job's name. (file, job)"""
    cluster = variant(sb, tmp_path / "c", name=name)
    ready, killed = tmp_path / "ready", tmp_path / "killed"
    script = (
        f"$CVS -c {cluster} --hosts-from slurm up > /dev/null || exit 1\n"
        f'echo "$SLURM_JOB_ID" > {ready}\n'
        f"while [ ! -e {killed} ]; do sleep 0.2; done"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    env.update(sb.slurm_env())
    argv = ["salloc", "-N2", "sh", "-c", f"CVS={shlex.quote(CVS)}\n{script}"]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, env=env, text=True, stdout=pipe, stderr=pipe)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 240, "the job's up")
        assert ready.exists(), proc.communicate()
        job = ready.read_text().strip()
        holders = [p for p in pids_mentioning("cvs-slurm_holder") if job in cmdline(p)]
        assert holders
        for pid in holders:
            os.kill(pid, signal.SIGKILL)
    finally:
        killed.touch()
        proc.communicate(timeout=120)
    wait_until(lambda: job_state(sb, job) not in ("RUNNING", "COMPLETING"), 60, "the job's end")
    assert job_containers(sb, job) == {"node1": 1, "node2": 1}
    return cluster, job


def test_outside_a_job_status_shows_and_down_removes_containers_whose_job_is_over(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster, job = left_behind(slurm_sandbox, tmp_path, "cvs-left")
    outside = [*CVS.split(" "), "-c", str(cluster)]
    status = slurm(slurm_sandbox, *outside, "status", timeout=120)
    name = f"cvs-left-j{job}"
    for node in ("node1", "node2"):
        assert f"{node}: {name} (running): job {job} is over" in status.stdout, status
    down = slurm(slurm_sandbox, *outside, "down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"node1: job container {name} (running): job {job} is over" in down.stdout
    assert job_containers(slurm_sandbox, job) == NONE


def test_hosts_from_slurm_down_after_the_job_is_over_removes_what_it_left(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    cluster, job = left_behind(slurm_sandbox, tmp_path, "cvs-over")
    env = {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "node[1-2]"}
    argv = [*CVS.split(" "), "-c", str(cluster), "--hosts-from", "slurm"]
    refused = slurm(slurm_sandbox, *argv, "exec", "--", "true", env=env, timeout=120)
    assert refused.returncode == 2 and "`cvs status` and `cvs down`" in refused.stderr
    down = slurm(slurm_sandbox, *argv, "down", env=env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert job_containers(slurm_sandbox, job) == NONE


def test_sigterm_during_a_cold_starting_up_removes_its_containers_and_exits_130(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # What Slurm sends the job's cvs on scancel, without the holder's help:
    # hosts from the file, no job at all.
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 300\n")
    cluster = variant(slurm_sandbox, tmp_path / "c", name="cvs-term", setup_script=str(slow))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    argv = [*CVS.split(" "), "-c", str(cluster), "up"]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, env=env, text=True, stdout=pipe, stderr=pipe)
    try:

        def started() -> bool:
            assert proc.poll() is None, proc.communicate()
            return all(containers(slurm_sandbox, n, "name=cvs-term") for n in ("node1", "node2"))

        wait_until(started, 240, "the containers")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    for node in ("node1", "node2"):
        assert containers(slurm_sandbox, node, "name=cvs-term") == []


def test_two_mpi_jobs_on_the_same_nodes_with_one_file_both_run_mpirun(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    # The MPI image (Open MPI): both jobs' heads run mpirun over their own
    # job's sshd port, side by side on the same two nodes, with no port option.
    sb = make_sandbox(hosts=2, slurm=True, mpi=True)
    cluster = variant(sb, tmp_path / "c", name="cvs-mpi")
    mpirun = (
        f"mpirun -np 2 --allow-run-as-root --hostfile {HOSTFILE} "
        "sh -c 'echo rank-$OMPI_COMM_WORLD_RANK'"
    )
    script = (
        f"$CVS -c {cluster} --hosts-from slurm up > /dev/null || exit 1\n"
        "touch {out}/ready-{n}\n"
        "while [ ! -e {out}/go ]; do sleep 0.2; done\n"
        f"$CVS -c {cluster} --hosts-from slurm exec --hosts head -- {shlex.quote(mpirun)} "
        "> {out}/mpi-{n}\nrc=$?\n"
        f"$CVS -c {cluster} --hosts-from slurm down > /dev/null; exit $rc"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    env.update(sb.slurm_env())
    procs: list[subprocess.Popen[str]] = []
    try:
        for n in ("a", "b"):
            text = script.replace("{out}", str(tmp_path)).replace("{n}", n)
            argv = ["salloc", "-N2", "sh", "-c", f"CVS={shlex.quote(CVS)}\n{text}"]
            pipe = subprocess.PIPE
            procs.append(subprocess.Popen(argv, env=env, text=True, stdout=pipe, stderr=pipe))
            ready = tmp_path / f"ready-{n}"
            wait_until(
                lambda r=ready: r.exists() or procs[-1].poll() is not None,  # type: ignore[misc]
                300,
                f"job {n}",
            )
            assert ready.exists(), procs[-1].communicate()
    finally:
        (tmp_path / "go").touch()  # both up at once: now both run MPI
        outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for n in ("a", "b"):
        said = (tmp_path / f"mpi-{n}").read_text()
        assert "rank-0" in said and "rank-1" in said, said


# ------------------------------------------- per_job: every way a job ends, one test each


def gone_after_the_job(sb: Sandbox, job: str) -> float:
    """Seconds from the job's end (as slurmctld reports it) to no container of
    it on any node; the job's end is waited for first (up to 150 s)."""
    wait_until(lambda: job_state(sb, job) not in ("PENDING", "RUNNING"), 150, f"job {job}'s end")
    took = wait_until(lambda: job_containers(sb, job) == NONE, 60, "removal")
    time.sleep(5)  # past KillWait: nothing came back
    assert job_containers(sb, job) == NONE
    return took


def kill_cvs(marker: str, command: str) -> None:
    """SIGKILL the job's cvs running `command` on the file `marker` (by pid:
    the processes this test's job started)."""

    def running() -> list[int]:
        return [p for p in pids_mentioning(marker) if command in cmdline(p)]

    wait_until(running, 60, f"the job's cvs {command}")
    for pid in running():
        os.kill(pid, signal.SIGKILL)


def test_per_job_containers_go_within_30s_of_the_time_limit(
    slurm_sandbox: Sandbox, time_limited_jobs: dict[str, JobEnd]
) -> None:
    # The job ran from the fixture on, next to test_slurm_sandbox's per_run one.
    end = time_limited_jobs["per_job"]
    job = end.job
    took = end.result()
    print(f"per_job containers gone {took:.1f}s after the time limit")
    assert took < 30
    time.sleep(max(0.0, end.gone_at + 5 - time.monotonic()))  # past KillWait: nothing came back
    assert job_containers(slurm_sandbox, job) == NONE
    wait_until(lambda: job_state(slurm_sandbox, job) != "COMPLETING", 60, "the job's end")
    assert job_state(slurm_sandbox, job) == "TIMEOUT"


def test_per_job_containers_go_within_30s_of_the_jobs_normal_end(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # The script ends on its own; the containers stayed until then.
    job = up_in_batch(slurm_sandbox, tmp_path, "sleep 15", lifetime="per_job")
    took = gone_after_the_job(slurm_sandbox, job)
    print(f"per_job containers gone {took:.1f}s after the job's normal end")
    assert took < 30
    wait_until(lambda: job_state(slurm_sandbox, job) != "COMPLETING", 60, "the job's end")
    assert job_state(slurm_sandbox, job) == "COMPLETED"


def test_per_job_containers_go_with_the_job_when_its_cvs_is_sigkilled_mid_up(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    # A setup script that takes its time: up is provisioning, the containers
    # already run, when cvs dies without a word; the job goes on and ends.
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 300\n")
    cluster = variant(
        slurm_sandbox, tmp_path / "c", name="cvs-pjk", lifetime="per_job", setup_script=str(slow)
    )
    script = f"$CVS -c {cluster} --hosts-from slurm up\necho up=$?\nsleep 5"
    job = sbatch(slurm_sandbox, tmp_path, script)
    wait_until(
        lambda: (
            job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}
            or job_state(slurm_sandbox, job) not in ("PENDING", "RUNNING")
        ),
        240,
        f"job {job}'s containers",
    )
    assert job_containers(slurm_sandbox, job) == {"node1": 1, "node2": 1}, (
        tmp_path / "job.out"
    ).read_text()
    kill_cvs(str(cluster), "up")
    took = gone_after_the_job(slurm_sandbox, job)
    print(f"per_job containers gone {took:.1f}s after the job's end (cvs up SIGKILLed)")
    assert took < 30
    assert "up=137" in (tmp_path / "job.out").read_text()


def test_per_job_containers_go_with_the_job_when_its_cvs_is_sigkilled_mid_exec(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    marker = str(tmp_path / "c" / "cluster.yaml")
    then = f"$CVS -c {marker} --hosts-from slurm exec -- sleep 600\necho exec=$?\nsleep 5"
    job = up_in_batch(slurm_sandbox, tmp_path, then, lifetime="per_job")
    kill_cvs(marker, "exec")
    took = gone_after_the_job(slurm_sandbox, job)
    print(f"per_job containers gone {took:.1f}s after the job's end (cvs exec SIGKILLed)")
    assert took < 30
    assert "exec=137" in (tmp_path / "job.out").read_text()


def test_per_job_containers_go_with_the_job_when_its_cvs_is_sigkilled_mid_run(
    slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    suite = tmp_path / "long.yaml"
    suite.write_text("name: long\nsteps:\n  - name: wait\n    run: sleep 600\n    timeout: 900\n")
    marker = str(tmp_path / "c" / "cluster.yaml")
    run = f"$CVS -c {marker} --hosts-from slurm run --run-dir {tmp_path / 'run'} {suite}"
    job = up_in_batch(slurm_sandbox, tmp_path, f"{run}\necho run=$?\nsleep 5", lifetime="per_job")
    top = [*slurm_sandbox.docker_argv("node1"), "top", f"cvs-kept-j{job}"]

    def the_step() -> bool:
        out = subprocess.run(top, capture_output=True, text=True).stdout
        return "sleep 600" in out

    wait_until(the_step, 120, "the run's step in node1's container")
    kill_cvs(marker, "run")
    took = gone_after_the_job(slurm_sandbox, job)
    print(f"per_job containers gone {took:.1f}s after the job's end (cvs run SIGKILLed)")
    assert took < 30
    assert "run=137" in (tmp_path / "job.out").read_text()
