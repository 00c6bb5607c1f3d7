"""Host facts a plan reads after its lifetime decided (PURE): capacity, GPUs
and CDI, rootless caps and device groups, the image step, sshd port
conflicts. Everything `up` would refuse for that the probe already shows
is listed with the lifetime's refusals, not one `up` attempt at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from orchestrator.config import ContainerConfig, sshd_wanted
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.config.slurm import SlurmJob
from orchestrator.containers.argv import image_registry
from orchestrator.containers.labels import LABEL_GPUS, LABEL_OWNER
from orchestrator.containers.plan.model import (
    FORCE,
    HostAction,
    Plan,
    container_label,
    frozen_actions,
    group,
    refused_plan,
)
from orchestrator.containers.plan.ownership import ownership
from orchestrator.containers.probe import HostState
from orchestrator.errors import Phrase, Refusal, Text, WayOut
from orchestrator.limits.capacity import fit_to_host
from orchestrator.limits.cdi import CDIDevice, SpecFile, parse_specs, use_cdi
from orchestrator.limits.gpus import GPU, GPUError, GPUSelection, Unsatisfiable
from orchestrator.limits.resources import EffectiveResources
from orchestrator.limits.rootless import device_group_access, rootless_cap_refusal, wants_devices
from orchestrator.limits.slurm_gpus import gpu_mismatch, gpu_mismatch_refusal, select_for_host
from orchestrator.remote.runtime import ContainerRuntime


def with_host_facts(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    plan: Plan,
    *,
    cluster_name: str,
    resources: Mapping[str, EffectiveResources] | None,
    slurm: SlurmJob | None,
    our_label: str = LABEL_OWNER,
) -> Plan:
    """A plan whose actions were decided elsewhere (`up --heal` completing a
    persistent set, containers/subset.py) with the launching hosts' details
    and refusals from the facts, as `decide_plan` gives its own."""
    ours = ownership(cfg, states, cluster_name=cluster_name, our_label=our_label)
    sshd = sshd_wanted(cfg, len(states))
    return add_host_facts(
        cfg, states, ours, plan, resources=resources, force=False, sshd=sshd, slurm=slurm
    )


def add_host_facts(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    plan: Plan,
    *,
    resources: Mapping[str, EffectiveResources] | None,
    force: bool,
    sshd: bool,
    slurm: SlurmJob | None,
) -> Plan:
    """`plan` with everything else `up` would refuse for that the probe
    already shows (listed with the lifetime's refusals rather than one `up`
    attempt at a time), and otherwise the launching hosts' details: image
    step, GPUs, CDI devices, keep-groups, fitted resources."""
    if plan.refused:
        launching = _would_launch(cfg, states, force=force)
        starting = launching
    else:
        launching = plan.hosts("cold_start", "replace")
        starting = plan.hosts("cold_start", "replace", "restart")
    more = _sshd_port_conflicts(cfg, states, starting) if sshd else []
    fit_reasons, fit_warnings, fitted = capacity(states, launching, resources)
    more += fit_reasons + _missing_image(cfg, states, launching)
    more += _rootless_caps(states, launching, resources)
    gpu_reasons, choices = _gpu_choices(cfg, states, launching, slurm)
    more += gpu_reasons
    if not plan.refused and slurm is not None:
        plan, mismatch = _slurm_gpu_check(cfg, states, plan, slurm, force=force, sshd=sshd)
        more += mismatch
    group_notes, keep = _device_group_access(cfg, states, launching)
    warnings = [*plan.warnings, *fit_warnings, *group_notes, *_pull_notes(cfg, states, launching)]
    if more or plan.refused:
        reasons = list(dict.fromkeys([*plan.refusals, *more]))
        return refused_plan(cfg, states, ours, reasons, warnings)
    actions = {
        h: _launch_details(cfg, states[h], replace(a, keep_groups=h in keep), choices.get(h))
        for h, a in plan.actions.items()
    }
    return replace(plan, actions=frozen_actions(actions), warnings=warnings, resources=fitted)


def _launch_details(
    cfg: ContainerConfig, state: HostState, action: HostAction, choice: GPUChoice | None
) -> HostAction:
    """A launching host's image step and, when its GPUs were listed, its GPUs."""
    if not action.launches:
        return action
    login, step = _image_step(cfg, state)
    return replace(
        action,
        image_step=step,
        login=login,
        gpus=choice.selection if choice else None,
        cdi=choice.cdi if choice else None,
    )


def _image_step(
    cfg: ContainerConfig, state: HostState
) -> tuple[bool, Literal["pull", "load"] | None]:
    """(registry login first?, how the image gets onto a launching host).

    Nothing when the tag is there and `pull` is not `always`; a load of
    `image_tar` where the tag is missing; else a pull (after a login to
    `registry` unless the image comes from a tar). `pull: never` fetches
    nothing: the plan refused a host without the image (`_missing_image`)."""
    if state.tag_image_id is not None and cfg.pull != "always":
        return False, None
    if cfg.image_tar is not None:
        return False, "load" if state.tag_image_id is None else "pull"
    if cfg.pull == "never":
        return False, None
    return cfg.registry is not None, "pull"


def _would_launch(
    cfg: ContainerConfig, states: Mapping[str, HostState], *, force: bool
) -> list[str]:
    """The hosts a refused plan would launch on once its refusal is dealt with:
    every host for per_run (and for persistent with force), else where the
    container is absent."""
    if cfg.lifetime == "no_launch":
        return []
    if cfg.lifetime == "per_run" or force:
        return list(states)
    return [h for h, s in states.items() if s.container == "absent"]


def capacity(
    states: Mapping[str, HostState],
    launching: list[str],
    resources: Mapping[str, EffectiveResources] | None,
) -> tuple[list[Refusal], list[Text], dict[str, EffectiveResources]]:
    """(refusals, warnings, resources fitted to each host): memory beyond a
    launching host's RAM is refused, cpus beyond a host's CPU count clamped
    (limits/capacity.py)."""
    if resources is None:
        return [], [], {}
    reasons: list[Refusal] = []
    warnings: list[Text] = []
    fitted = dict(resources)
    for host, state in states.items():
        if host not in resources:
            continue
        fit = fit_to_host(host, resources[host], state.cpu_count, state.memory_total)
        fitted[host] = fit.resources
        if fit.refusal and host in launching:
            reasons.append(Refusal("capacity", fit.refusal, (host,)))
        warnings += [fit.warning] if fit.warning else []
    return reasons, warnings, fitted


def _rootless_caps(
    states: Mapping[str, HostState],
    launching: list[str],
    resources: Mapping[str, EffectiveResources] | None,
) -> list[Refusal]:
    """Rootless podman: caps a launching host cannot apply (limits/rootless.py),
    from the cgroup facts its probe reported."""
    out: list[Refusal] = []
    for host in launching:
        state = states[host]
        if not state.rootless or resources is None or host not in resources:
            continue
        why = rootless_cap_refusal(host, resources[host], state.cgroup, state.cgroup_controllers)
        if why is not None:
            out.append(Refusal("rootless_caps", why, (host,)))
    return out


def _device_group_access(
    cfg: ContainerConfig, states: Mapping[str, HostState], launching: list[str]
) -> tuple[list[str], set[str]]:
    """Rootless podman launching with devices: how the container reaches them
    (`--group-add keep-groups` on crun; on runc, or unknown, what it relies
    on). (notes, the hosts whose run gets keep-groups)."""
    notes: list[str] = []
    keep: set[str] = set()
    for host in launching:
        state = states[host]
        access = device_group_access(
            host,
            rootless=state.rootless,
            wants_devices=wants_devices(cfg),
            oci_runtime=state.oci_runtime,
            group_add=tuple(str(g) for g in cfg.group_add),
        )
        if access.note is not None:
            notes.append(access.note)
        if access.keep_groups:
            keep.add(host)
    return notes, keep


def _slurm_gpu_check(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    plan: Plan,
    slurm: SlurmJob,
    *,
    force: bool,
    sshd: bool,
) -> tuple[Plan, list[Refusal]]:
    """Kept containers (attach, restart) whose GPUs are not the job's: a
    refusal, or with `force` a replacement there."""
    kept = plan.hosts("attach", "restart")
    found = [
        m
        for h in kept
        if (m := gpu_mismatch(h, states[h].labels, cfg.gpus, slurm, LABEL_GPUS)) is not None
    ]
    if not found:
        return plan, []
    if not force:
        return plan, [gpu_mismatch_refusal(found, slurm.job_id, container_label(cfg))]
    actions = dict(plan.actions)
    for m in found:
        actions[m.host] = HostAction(
            "replace",
            Phrase(FORCE, f": its GPUs are not job {slurm.job_id}'s, start fresh"),
            remove_first=True,
            provision=True,
            start_sshd=sshd,
        )
    return replace(plan, actions=frozen_actions(actions)), []


@dataclass(frozen=True)
class GPUChoice:
    """The GPUs a launching host's container gets, and the CDI devices they go
    through (None: their device nodes)."""

    selection: GPUSelection
    cdi: tuple[CDIDevice, ...] | None = None


def choose_gpus(
    cfg: ContainerConfig,
    host: str,
    inventory: Sequence[GPU],
    specs: Sequence[SpecFile],
    runtime_version: str | None,
    *,
    slurm: SlurmJob | None = None,
) -> GPUChoice | Refusal:
    """PURE: the GPUs and the CDI devices for `host` from its GPUs, its CDI
    spec files and (where CDI depends on it) its runtime's version; or why
    not (kind `gpus`: the request; kind `cdi`: how they would reach the
    container). Inside a Slurm job (`slurm`) only the job's GPUs on the host
    are chosen from (limits/slurm_gpus.py). The plan calls it where the probe
    listed the GPUs; `up` where it had to list them itself."""
    assert cfg.gpus is not None
    try:
        picked = select_for_host(list(inventory), cfg.gpus, host, slurm)
    except GPUError as exc:
        return Refusal("gpus", f"{host}: {exc}", (host,))
    if isinstance(picked, Unsatisfiable):
        return Refusal("gpus", picked.message(host), (host,))
    devices, problems = parse_specs(specs)
    decision = use_cdi(cfg.cdi, cfg.runtime, runtime_version, picked, devices)
    if isinstance(decision, str):
        unreadable = f" (unreadable CDI specs: {'; '.join(problems)})" if problems else ""
        return Refusal("cdi", f"{host}: {decision}{unreadable}", (host,))
    runtime = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
    if decision is None and picked.gpus and picked.vendor not in runtime.gpu_vendors_without_cdi:
        return Refusal(
            "cdi",
            f"{host}: NVIDIA GPUs reach a {cfg.runtime} container only through CDI "
            f"({cfg.runtime} has no GPU flag of docker's kind); publish CDI specs on the host "
            "(nvidia-ctk cdi generate) so that one CDI device adds each GPU",
            (host,),
        )
    return GPUChoice(picked, decision)


def _gpu_choices(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    launching: list[str],
    slurm: SlurmJob | None = None,
) -> tuple[list[Refusal], dict[str, GPUChoice]]:
    """The GPUs of each launching host whose GPUs the probe listed, or the
    refusals of a request such a host cannot meet (a host whose GPUs were
    not listed is left to `up`)."""
    if cfg.gpus is None:
        return [], {}
    refusals: list[Refusal] = []
    choices: dict[str, GPUChoice] = {}
    for host in launching:
        state = states[host]
        if state.gpus is None:
            continue
        choice = choose_gpus(
            cfg, host, state.gpus, state.cdi_specs, state.runtime_version, slurm=slurm
        )
        if isinstance(choice, Refusal):
            refusals.append(choice)
        else:
            choices[host] = choice
    return refusals, choices


def _missing_image(
    cfg: ContainerConfig, states: Mapping[str, HostState], launching: list[str]
) -> list[Refusal]:
    """`pull: never` without `image_tar`: a launching host that lacks the image."""
    if cfg.pull != "never" or cfg.image_tar is not None:
        return []
    missing = [
        h for h in launching if states[h].tag_image_id is None and states[h].tag_error is None
    ]
    if not missing:
        return []
    return [
        Refusal(
            "image_missing",
            f"image {cfg.image} not found on {_names(missing)} and container.pull is 'never'",
            tuple(missing),
            (
                WayOut(f"load it there ({cfg.runtime} load)"),
                WayOut("set container.image_tar"),
                WayOut("allow pulling (container.pull)"),
            ),
        )
    ]


def _pull_notes(
    cfg: ContainerConfig, states: Mapping[str, HostState], launching: list[str]
) -> list[str]:
    """The tag on no launching host: `up` pulls it, from the registry it names
    (a tag that does not exist there fails the pull, named `not found`)."""
    if cfg.pull == "never" or cfg.image_tar is not None or not launching:
        return []
    if any(states[h].tag_image_id is not None or states[h].tag_error for h in launching):
        return []
    registry = image_registry(cfg.image) or "docker.io"
    return [f"image {cfg.image} is on none of {_names(launching)}: up pulls it from {registry}"]


def _sshd_port_conflicts(
    cfg: ContainerConfig, states: Mapping[str, HostState], starting: list[str]
) -> list[Refusal]:
    """Hosts where the container would start its sshd on a port already taken
    (network host: another cluster's sshd, say), found by the probe before
    anything starts."""
    taken = {h: states[h] for h in starting if states[h].sshd_port_busy}
    by_holder = group(
        (h, ", ".join(s.sshd_port_holders) or "a process that is not a cvs container")
        for h, s in taken.items()
    )
    return [
        Refusal(
            "sshd_port",
            f"sshd port {cfg.sshd.port} is already in use on {_names(hosts)} by {holder}: with "
            "`network: host` two clusters on one host need different ports",
            tuple(hosts),
            (
                WayOut("set another `container.sshd.port` in this cluster file"),
                WayOut("bring the other one down first"),
            ),
        )
        for holder, hosts in by_holder.items()
    ]
