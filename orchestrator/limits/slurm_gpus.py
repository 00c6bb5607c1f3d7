"""GPUs from a Slurm allocation: which devices a container gets inside a job.

Pure. Slurm tells each job which GPUs of a node are its own, by the node's
indices (`scontrol show job -d`: `GRES=gpu:2(IDX:2-3)`; config/slurm.py reads
them). Inside a job the container gets exactly those (or, for a smaller
`count`, the lowest-indexed of those), never "the lowest-indexed ones of the
host", which another job on the same node may hold. Slurm's index is matched
with the discovery's `GPU.index`: NVIDIA, nvidia-smi's index; AMD, the render
nodes in minor order (gres.conf's `File=` order on a node whose files are
the render nodes in order).

A persistent container records the host's GPU indices it was created with
(label io.cvs.gpus): a later job attaching to it must have been allocated the
same ones (`gpu_mismatch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config import GPURequest
from orchestrator.config.slurm import SlurmJob
from orchestrator.errors import Option, Refusal, WayOut
from orchestrator.limits.gpus import (
    GPU,
    GPURequestSpec,
    GPUSelection,
    Unsatisfiable,
    describe_request,
    select_gpus,
)

FORCE = Option("force")


def describe_indices(indices: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> "0-2,5": Slurm's own way of writing them."""
    ordered = sorted(set(indices))
    if not ordered:
        return "none"
    runs = [[ordered[0], ordered[0]]]
    for i in ordered[1:]:
        if i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def allocated_gpus(job: SlurmJob | None, host: str) -> tuple[int, ...] | None:
    """The GPU indices `job` holds on `host`; None outside a job (or a host
    that is not one of its nodes)."""
    if job is None:
        return None
    node = job.node(host)
    return None if node is None else node.gpus


def select_in_job(
    inventory: list[GPU] | tuple[GPU, ...],
    request: GPURequestSpec,
    allocated: tuple[int, ...] | None,
    job_id: str = "",
) -> GPUSelection | Unsatisfiable:
    """`select_gpus` over the GPUs the job was allocated on this host
    (`allocated` None: not in a job, the host's own GPUs as before)."""
    if allocated is None or request is None:
        return select_gpus(inventory, request)
    job = f"job {job_id}" if job_id else "the job"
    ordered = tuple(sorted(inventory, key=lambda g: g.index))
    if not allocated:
        return Unsatisfiable(
            request,
            ordered,
            f"Slurm allocated {job} no GPUs on this node; ask for them "
            "(salloc/sbatch --gres=gpu:N or --gpus-per-node=N)",
        )
    known = {g.index for g in ordered}
    unknown = [i for i in allocated if i not in known]
    if unknown:
        return Unsatisfiable(
            request,
            ordered,
            f"Slurm allocated {job} GPU index {describe_indices(unknown)} on this node, "
            "which the host does not list (gres.conf and the host disagree)",
        )
    mine = tuple(g for g in ordered if g.index in allocated)
    picked = select_gpus(mine, request)
    if isinstance(picked, Unsatisfiable):
        wanted = describe_request(request)
        return Unsatisfiable(
            request,
            ordered,
            f"{picked.reason} among the {len(mine)} GPU(s) Slurm allocated {job} here "
            f"(IDX {describe_indices(allocated)}); ask Slurm for GPUs that meet {wanted} "
            "(--gres=gpu:N), or lower the request",
        )
    return picked


def select_for_host(
    inventory: list[GPU] | tuple[GPU, ...],
    request: GPURequestSpec,
    host: str,
    job: SlurmJob | None,
) -> GPUSelection | Unsatisfiable:
    """The selection for one host, inside a job or not."""
    return select_in_job(inventory, request, allocated_gpus(job, host), job.job_id if job else "")


@dataclass(frozen=True)
class GPUMismatch:
    host: str
    container: tuple[int, ...]  # from its io.cvs.gpus label
    allocated: tuple[int, ...]


def recorded_gpus(labels: Mapping[str, str], key: str) -> tuple[int, ...] | None:
    """The GPU indices a container's label records; None without the label."""
    value = labels.get(key)
    if value is None:
        return None
    try:
        return tuple(sorted(int(p) for p in value.split(",") if p.strip()))
    except ValueError:
        return None


def gpu_mismatch(
    host: str,
    labels: Mapping[str, str],
    request: GPURequestSpec,
    job: SlurmJob | None,
    key: str,
) -> GPUMismatch | None:
    """A kept (persistent) container whose GPUs are not the ones this job was
    allocated on `host`; None when they agree or nothing is known to compare.

    With a `count` smaller than the allocation, the container's GPUs must be
    among the allocated ones; otherwise they must be exactly them."""
    allocated = allocated_gpus(job, host)
    if allocated is None or request is None:
        return None
    held = recorded_gpus(labels, key) or ()
    if isinstance(request, GPURequest) and request.count is not None:
        ok = len(held) == request.count and set(held) <= set(allocated)
    else:
        ok = set(held) == set(allocated)
    return None if ok else GPUMismatch(host, held, allocated)


def gpu_mismatch_refusal(mismatches: list[GPUMismatch], job_id: str, container: str) -> Refusal:
    """Refusal kind `slurm_gpus` (exit 4): kept containers whose GPUs are not
    the job's, both sets per node, and the ways out."""
    per_node = "; ".join(
        f"{m.host}: container has GPUs "
        f"{describe_indices(m.container) if m.container else 'unknown (no io.cvs.gpus label)'}, "
        f"job {job_id} was allocated {describe_indices(m.allocated)}"
        for m in mismatches
    )
    return Refusal(
        "slurm_gpus",
        f"persistent {container} was created with other GPUs than Slurm allocated "
        f"job {job_id} ({per_node}); attaching would hand this job another job's GPUs",
        tuple(m.host for m in mismatches),
        (
            WayOut(
                "ask Slurm for the same GPUs (e.g. salloc -w NODE --gres=gpu:N while no other "
                "job holds them, or a GPU binding that gives the container's indices)"
            ),
            WayOut("recreate it with this job's GPUs (its overlay is lost)", options=(FORCE,)),
        ),
    )
