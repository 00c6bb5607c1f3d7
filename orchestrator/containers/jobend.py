"""Containers that end with their Slurm job, with no site changes.

A `per_run` container started by `docker run -d` belongs to dockerd, not to
the job: when the job ends (completed, scancel, time limit, a SIGKILLed
cvs) it would keep running, holding GPUs Slurm has given to the next job.
So after `up` starts per_run containers inside a job, cvs adds one step to
the job (`srun --jobid=J --overlap`, one task per node): a holder
(remote/slurm_holder.sh) that waits. Slurm ends every step of a job when the
job ends, with SIGTERM (then SIGKILL after KillWait, 30 s by default): the
holder then removes its node's container by the ID `up` got from
`docker run`, nothing else. The srun runs in a session of its own, so it
outlives the cvs that started it (a later `cvs exec`, or a killed cvs).

For a node that fails or a slurmd that cannot run steps, sites can also
install `cvs slurm epilog` (remote/slurm_epilog.sh).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from orchestrator import remote
from orchestrator.config.slurm import SlurmJob
from orchestrator.errors import Call, Phrase, Text

READY_TIMEOUT = 30.0


def holder_argv(job: SlurmJob, ids: Mapping[str, str], runtime: Sequence[str]) -> list[str]:
    """`srun` adding the holder step on the nodes of `ids` (node -> container ID)."""
    nodes = [n.name for n in job.nodes if n.name in ids]
    return [
        "srun",
        f"--jobid={job.job_id}",
        "--overlap",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--job-name=cvs-holder",
        "--kill-on-bad-exit=0",
        "--unbuffered",
        *remote.argv("slurm_holder", *(f"{n}={ids[n]}" for n in nodes), "--", *runtime),
    ]


def _ready_count(path: Path) -> int:
    with contextlib.suppress(OSError):
        return sum(1 for line in path.read_text().splitlines() if line.startswith("ready "))
    return 0


async def start_holder(
    job: SlurmJob, ids: Mapping[str, str], runtime: Sequence[str], *, timeout: float = READY_TIMEOUT
) -> Text | None:
    """Start the holder step and wait until every node's holder is ready.
    None when they are; otherwise a warning (the containers then stay until
    `cvs down`, or the site's epilog)."""
    if not ids:
        return None
    fd, name = tempfile.mkstemp(prefix="cvs-holder-", suffix=".log")
    path = Path(name)
    try:
        with os.fdopen(fd, "w") as out:
            proc = subprocess.Popen(
                holder_argv(job, ids, runtime),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this cvs; Slurm ends it with the job
            )
        deadline = time.monotonic() + timeout
        while _ready_count(path) < len(ids):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                state = f"exited {proc.returncode}" if proc.returncode is not None else "not ready"
                nodes = ", ".join(sorted(ids))
                return Phrase(
                    f"the per_run containers on {nodes} are not tied to Slurm job {job.job_id}: "
                    f"its holder step ({state} after {timeout:.0f}s at most: {why[0][:200]}) did "
                    "not start; they stay until ",
                    Call("down"),
                    " (or until the epilog cvs ships for Slurm sites, if installed)",
                )
            await anyio.sleep(0.1)
        return None
    finally:
        path.unlink(missing_ok=True)


async def tie_to_job(
    job: SlurmJob, ids: Mapping[str, str], prefixes: Mapping[str, Sequence[str]]
) -> list[Text]:
    """One holder step per runtime prefix (hosts reach their runtime the same
    way, normally one); the warnings of those that did not start."""
    groups: dict[tuple[str, ...], dict[str, str]] = {}
    for host, cid in ids.items():
        groups.setdefault(tuple(prefixes[host]), {})[host] = cid
    warnings = []
    for prefix, members in groups.items():
        warning = await start_holder(job, members, prefix)
        if warning is not None:
            warnings.append(warning)
    return warnings
