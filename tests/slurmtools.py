"""Shared helpers of the Slurm sandbox tests (test_slurm_sandbox.py,
test_slurm_jobs_sandbox.py): Slurm clients against the sandbox's controller,
cvs in a job (salloc, sbatch), and the containers a job left on its nodes.
A test module never imports another (tests/test_test_layout.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from sandboxtools import cluster_variant

from orchestrator.sandbox import Sandbox


def containers(sb: Sandbox, host: str, *filters: str) -> list[dict[str, Any]]:
    """`docker inspect` of every container on that host (optionally filtered)."""
    argv = [*sb.docker_argv(host), "ps", "-aq", *(f"--filter={f}" for f in filters)]
    ids = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    if not ids:
        return []
    out = subprocess.run([*sb.docker_argv(host), "inspect", *ids], capture_output=True, text=True)
    return list(json.loads(out.stdout))


def slurm(
    sb: Sandbox, *argv: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A Slurm client command against the sandbox's controller (as slurm.env
    does), plus `env`; none of this process's own SLURM_* or CVS_* variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CVS_"))}
    return subprocess.run(
        list(argv),
        env={**base, **sb.slurm_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


CVS = f"{shlex.quote(sys.executable)} -m orchestrator"


def in_job(
    sb: Sandbox,
    script: str,
    *salloc_args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """`salloc ARGS sh -c SCRIPT` on the sandbox's Slurm: the script runs on this
    machine inside the allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST set), with
    $CVS the cvs under test."""
    return slurm(
        sb, "salloc", *salloc_args, "sh", "-c", f"CVS={shlex.quote(CVS)}\n{script}",
        timeout=timeout, env=env,
    )  # fmt: skip


JOB_LABEL = "io.cvs.slurm-job"


def sbatch(sb: Sandbox, tmp_path: Path, script: str, *args: str) -> str:
    """Submit SCRIPT (with $CVS set) as a batch job on both nodes; its job ID."""
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/sh\nCVS={shlex.quote(CVS)}\n{script}\n")
    proc = slurm(
        sb, "sbatch", "--parsable", "-N2", "-o", str(tmp_path / "job.out"), *args, str(path)
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job_state(sb: Sandbox, job: str) -> str:
    out = slurm(sb, "scontrol", "show", "job", job).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Poll; the seconds it took. Fails naming `what` after `timeout`."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.25)
    return time.monotonic() - started


def job_containers(sb: Sandbox, job: str) -> dict[str, int]:
    return {h.name: len(containers(sb, h.name, f"label={JOB_LABEL}={job}")) for h in sb.nodes}


def up_in_batch(sb: Sandbox, tmp_path: Path, then: str, *args: str, lifetime: str = "") -> str:
    """A batch job that brings the sandbox's containers up, marks it, then runs
    `then`; returns the job ID once its containers run on both nodes."""
    changes: dict[str, Any] = {}
    if lifetime:
        doc = yaml.safe_load(sb.cluster_file.read_text())
        changes["container"] = {**doc["container"], "lifetime": lifetime, "name": "cvs-kept"}
    cluster = cluster_variant(sb, tmp_path / "c", **changes)
    flag = tmp_path / "up.done"
    script = f"$CVS -c {cluster} --hosts-from slurm up || exit 1\ntouch {flag}\n{then}"
    job = sbatch(sb, tmp_path, script, *args)
    wait_until(
        lambda: flag.exists() or job_state(sb, job) not in ("PENDING", "RUNNING"),
        240,
        f"job {job}'s cvs up",
    )
    assert flag.exists(), (tmp_path / "job.out").read_text()
    assert job_containers(sb, job) == {"node1": 1, "node2": 1}
    return job


NONE_LEFT = {"node1": 0, "node2": 0}


class JobEnd:
    """A job followed from outside in a thread of its own, from its submission
    until no container of it is left: when slurmctld first reported it over,
    and how long its containers outlived that. Slurm's shortest time limit is
    a minute, so the time-limit tests (per_run and per_job) share one wait:
    both jobs run at once, each test reads its own (tests/conftest.py)."""

    def __init__(self, sb: Sandbox, job: str) -> None:
        self.sb = sb
        self.job = job
        self.took: float | None = None  # seconds from the job's end to no container
        self.gone_at = 0.0  # time.monotonic() when none was left
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"job {job}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        # The same bounds the tests waited with (150 s to the end, 60 s for removal).
        try:
            started = time.monotonic()
            while job_state(self.sb, self.job) in ("PENDING", "RUNNING"):
                if self._stop.wait(0.25) or time.monotonic() - started > 150:
                    self.error = f"job {self.job} did not end within 150 s"
                    return
            ended = time.monotonic()
            while job_containers(self.sb, self.job) != NONE_LEFT:
                if self._stop.wait(0.25) or time.monotonic() - ended > 60:
                    self.error = f"job {self.job}'s containers were not removed within 60 s"
                    return
            self.gone_at = time.monotonic()
            self.took = self.gone_at - ended
        except Exception as e:  # said by the test that reads it
            self.error = f"following job {self.job}: {e!r}"

    def result(self) -> float:
        """Once followed to the end: the seconds the containers outlived the job."""
        self._thread.join(timeout=300)
        assert not self._thread.is_alive(), f"still following job {self.job}"
        assert self.took is not None, self.error
        return self.took

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
