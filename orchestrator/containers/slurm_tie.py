"""`up` inside a Slurm job: the containers it starts go with the job
(containers/jobend.py makes the tie; this is which ones, and when).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import Lifetime
from orchestrator.config.slurm import SlurmJob
from orchestrator.containers.jobend import JOB_LIFETIMES, tie_to_job
from orchestrator.containers.plan.model import Plan
from orchestrator.containers.probe import HostState


async def tie_launches(
    job: SlurmJob | None,
    lifetime: Lifetime,
    invocation: str,
    plan: Plan,
    states: Mapping[str, HostState],
) -> None:
    """Inside a Slurm job, the per_run and per_job containers this `up`
    will start are tied to the job before any starts (containers/jobend.py):
    TieError, nothing started, when the tie cannot be made. A persistent
    container never goes with a job."""
    if job is None or lifetime not in JOB_LIFETIMES:
        return
    nodes = [h for h, a in plan.actions.items() if a.launches and states[h].runtime.known]
    prefixes = {h: states[h].runtime.prefix for h in nodes}
    await tie_to_job(job, invocation, nodes, prefixes)
