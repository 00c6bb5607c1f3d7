"""`up`'s barrier: the one place all launching hosts must agree before any
container starts. After the prepare step, the tag resolves to one image
everywhere and every GPU request fits, or `up` refuses (PolicyRefused)
saying what the prepare step did change; otherwise each launching host's
GPUs, and per host the count the MPI hostfile's slots take.

    choices = barrier(steps, launching, prepared, states, outcomes)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from orchestrator.config import ClusterConfig, ContainerConfig
from orchestrator.containers.outcome import HostOutcome, changed_so_far
from orchestrator.containers.plan.facts import GPUChoice, choose_gpus
from orchestrator.containers.plan.images import check_tag_identity
from orchestrator.containers.plan.model import HostAction
from orchestrator.containers.prepare import Prepared
from orchestrator.containers.probe import HostState
from orchestrator.containers.steps import Steps
from orchestrator.errors import PolicyRefused, Refusal
from orchestrator.events import Message
from orchestrator.limits.cdi import describe_devices
from orchestrator.limits.gpus import GPUSelection


def barrier(
    steps: Steps,
    launching: list[str],
    prepared: Mapping[str, Prepared],
    states: Mapping[str, HostState],
    outcomes: Mapping[str, HostOutcome],
) -> dict[str, GPUChoice]:
    """Refuse before any container starts if the tag or the GPU requests
    disagree; otherwise the GPUs each launching host gives its container.

    These are the refusals the plan cannot make: they depend on what the
    prepare step found (a tag after a pull or load, GPUs the probe had not
    listed), each with its kind. The refusal says what the prepare step
    did change (an image pulled or loaded, a registry login): not
    "nothing"."""
    if not launching:
        return {}
    cfg = steps.cfg
    after_pull = {
        h: replace(
            states[h],
            tag_image_id=prepared[h].tag_image_id,
            tag_repo_digests=prepared[h].tag_repo_digests,
        )
        for h in launching
    }
    reasons = check_tag_identity(after_pull, image=cfg.image)
    choices: dict[str, GPUChoice] = {}
    for host in launching:
        choice = gpu_choice(steps.cluster, cfg, host, outcomes[host].action, prepared[host])
        if isinstance(choice, Refusal):
            reasons.append(choice)
        elif choice is not None:
            choices[host] = choice
    if reasons:
        raise PolicyRefused(reasons, changed=changed_so_far(cfg.image, launching, outcomes))
    for host, choice in choices.items():
        if choice.cdi is not None:
            text = f"GPUs through CDI: {describe_devices(choice.cdi)}"
            steps.sink.emit(Message(level="info", host=host, text=text))
    return choices


def gpu_choice(
    cluster: ClusterConfig, cfg: ContainerConfig, host: str, action: HostAction, prepared: Prepared
) -> GPUChoice | Refusal | None:
    """The plan's choice of GPUs, or (GPUs not listed by the probe) the same
    decision from what the prepare step listed; None: no GPU request."""
    if action.gpus is not None:
        return GPUChoice(action.gpus, action.cdi)
    if cfg.gpus is None or prepared.gpus is None:
        return None
    return choose_gpus(
        cfg,
        host,
        prepared.gpus,
        prepared.cdi_specs,
        prepared.runtime_version,
        slurm=cluster.slurm,
    )


def gpu_counts(
    selections: Mapping[str, GPUSelection], states: Mapping[str, HostState]
) -> dict[str, int]:
    """GPUs per host for the MPI hostfile's slots: what a launching host's
    container gets, else (pass `states` for `gpus: all` only) what the probe
    listed on the host."""
    counts = {h: len(s.gpus) for h, s in selections.items()}
    for host, state in states.items():
        if host not in counts and state.gpus is not None:
            counts[host] = len(state.gpus)
    return counts
