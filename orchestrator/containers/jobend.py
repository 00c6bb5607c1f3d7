"""Containers that end with their Slurm job, with no site changes.

A container started by `docker run -d` belongs to dockerd, not to the job:
when the job ends (completed, scancel, time limit, a SIGKILLed cvs) it
would keep running, holding GPUs Slurm has given to the next job. So inside
a job, before `up` starts any `per_run` or `per_job` container, cvs adds one
step to the job (`srun --jobid=J --overlap`, one task per node): a holder
(remote/slurm_holder.sh) that says it is ready and waits. Only when every
node's holder is ready does `up` start containers; a holder that is not
ready within `READY_TIMEOUT` fails `up` before anything starts (TieError).
Slurm ends every step of a job when the job ends, with SIGTERM (then SIGKILL
after KillWait, 30 s by default): the holder then removes its node's
containers labelled with this job and this invocation, by ID, and sweeps
again for a few seconds (an `up` cut short by the same scancel may still be
creating one). The srun runs in a session of its own, so it outlives the
cvs that started it (a later `cvs exec`, or a killed cvs).

For a node that fails or a slurmd that cannot run steps, sites can also
install `cvs slurm epilog` (remote/slurm_epilog.sh).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from orchestrator import remote
from orchestrator.config.slurm import SlurmJob
from orchestrator.errors import CvsError, ExitCode

# How long the holder step may take to be ready on every node (srun asks
# slurmctld, then each slurmd starts its task): seconds under load.
READY_TIMEOUT = 30.0
# The lifetimes whose containers go with the job.
JOB_LIFETIMES = ("per_run", "per_job")


class TieError(CvsError):
    """The containers could not be tied to the job: `up` fails, nothing started."""

    exit_code = ExitCode.FAILED


def holder_argv(
    job: SlurmJob, nodes: Sequence[str], invocation: str, runtime: Sequence[str]
) -> list[str]:
    """`srun` adding the holder step on `nodes` (in the job's order)."""
    chosen = [n.name for n in job.nodes if n.name in set(nodes)]
    return [
        "srun",
        f"--jobid={job.job_id}",
        "--overlap",
        f"--nodes={len(chosen)}",
        f"--ntasks={len(chosen)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(chosen)}",
        "--job-name=cvs-holder",
        "--kill-on-bad-exit=0",
        "--mpi=none",  # the holder is no MPI program, whatever the job's MPI type
        "--unbuffered",
        *remote.argv("slurm_holder", job.job_id, invocation, "--", *runtime),
    ]


def holder_env(env: Mapping[str, str]) -> dict[str, str]:
    """The holder's srun environment: the job's own srun inputs left out
    (SLURM_MPI_TYPE=pmix, SLURM_CPUS_PER_TASK, SLURM_MEM_PER_CPU... set for
    the user's steps would bend or fail this one; the argv says all it
    needs, the job ID included), PMI and PMIx variables too; SLURM_CONF
    kept (which controller)."""
    return {
        k: v
        for k, v in env.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "PMI_", "PMIX_"))
    }


def ready_nodes(text: str) -> set[str]:
    """The nodes whose holder printed its ready line (`ready NODE JOB INV`)."""
    return {
        words[1]
        for words in (line.split() for line in text.splitlines())
        if len(words) >= 2 and words[0] == "ready"
    }


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")
    return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the srun we started (its own session: its process group)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


async def start_holder(
    job: SlurmJob,
    nodes: Sequence[str],
    invocation: str,
    runtime: Sequence[str],
    *,
    timeout: float = READY_TIMEOUT,
) -> None:
    """Start the holder step on `nodes` and wait until each node's holder is
    ready; TieError (the srun stopped) otherwise."""
    if not nodes:
        return
    fd, name = tempfile.mkstemp(prefix="cvs-holder-", suffix=".log")
    path = Path(name)
    proc: subprocess.Popen[bytes] | None = None
    ok = False
    try:
        with os.fdopen(fd, "w") as out:
            argv = holder_argv(job, nodes, invocation, runtime)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives this cvs; Slurm ends it with the job
                    env=holder_env(os.environ),
                )
            except OSError as exc:
                raise TieError(_tie_failed(job, nodes, f"srun: {exc.strerror or exc}")) from None
        deadline = time.monotonic() + timeout
        while not set(nodes) <= ready_nodes(_read(path)):
            if proc.poll() is not None or time.monotonic() > deadline:
                lines = [line for line in _read(path).splitlines() if not line.startswith("ready ")]
                said = lines[-1].strip()[:200] if lines else "no output"
                missing = sorted(set(nodes) - ready_nodes(_read(path)))
                state = (
                    f"exited {proc.returncode}"
                    if proc.returncode is not None
                    else f"not ready within {timeout:.0f}s"
                )
                raise TieError(_tie_failed(job, missing, f"{state}: {said}"))
            await anyio.sleep(0.1)
        ok = True
    finally:
        if proc is not None and not ok:
            _stop(proc)  # not tied: nothing is started, and the step goes too
        path.unlink(missing_ok=True)


def _tie_failed(job: SlurmJob, nodes: Sequence[str], why: str) -> str:
    return (
        f"{', '.join(nodes)}: cannot tie containers to Slurm job {job.job_id}: its holder step "
        f"(srun --jobid={job.job_id} --overlap) {why}; nothing was started (without the tie "
        "they would outlive the job): check `scontrol ping` and the job's state"
    )


async def tie_to_job(
    job: SlurmJob, invocation: str, nodes: Sequence[str], prefixes: Mapping[str, Sequence[str]]
) -> None:
    """One holder step per runtime prefix (hosts reach their runtime the same
    way, normally one), each ready before this returns (TieError otherwise)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for host in nodes:
        groups.setdefault(tuple(prefixes[host]), []).append(host)
    for prefix, members in groups.items():
        await start_holder(job, members, invocation, prefix)
