"""`cvs up`'s decision, per lifetime (PURE): no_launch verifies, per_run starts
fresh, persistent (and per_job) attaches, restarts, cold-starts or refuses
(the table in the package's docstring and docs/design.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from orchestrator.config import ContainerConfig, sshd_wanted
from orchestrator.config.hostlist import MAX_NAMED_HOSTS as _MAX_NAMED_HOSTS
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.config.slurm import SlurmJob
from orchestrator.containers.inspection import short_id as _short
from orchestrator.containers.labels import LABEL_CONFIG_HASH, LABEL_LIFETIME, LABEL_OWNER
from orchestrator.containers.plan.facts import add_host_facts, capacity
from orchestrator.containers.plan.images import image_problems, pre_pull_tag_check
from orchestrator.containers.plan.model import (
    FORCE,
    FOREIGN,
    REBUILD,
    REBUILD_WAY,
    RESUMABLE,
    HostAction,
    Plan,
    container_label,
    frozen_actions,
    group,
    grouped_text,
    refused_plan,
)
from orchestrator.containers.plan.ownership import ownership, state_word
from orchestrator.containers.probe import HostState
from orchestrator.errors import Call, Option, Phrase, Refusal, Text, WayOut
from orchestrator.limits.resources import EffectiveResources
from orchestrator.remote.runtime import ContainerRuntime, daemon_word


def _runtime(cfg: ContainerConfig) -> ContainerRuntime:
    return ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)


def _leave_out(unknown: Mapping[str, HostState], slurm: SlurmJob | None) -> WayOut:
    """How to do without those hosts: the cluster file lists them, or Slurm gave them."""
    if slurm is None:
        return WayOut("remove them from the cluster file")
    nodes = ",".join(list(unknown)[:_MAX_NAMED_HOSTS])
    if len(unknown) > _MAX_NAMED_HOSTS:
        nodes += ",..."
    return WayOut(
        f"leave them out of the allocation: they come from Slurm job {slurm.job_id}, so ask "
        f"for one without them (Slurm's exclude option: `salloc -x {nodes}`, "
        f"`sbatch -x {nodes}`)"
    )


def _unknown_reason(
    cfg: ContainerConfig, states: Mapping[str, HostState], slurm: SlurmJob | None = None
) -> Refusal | None:
    unknown = {h: s for h, s in states.items() if not s.known}
    if not unknown:
        return None
    detail = "; ".join(
        f"{h}: {s.error or 'probe failed'}" for h, s in list(unknown.items())[:_MAX_NAMED_HOSTS]
    )
    more = len(unknown) - _MAX_NAMED_HOSTS
    if more > 0:
        detail += f"; and {more} more"
    return Refusal(
        "unknown_state",
        f"cannot tell the container state on {_names(unknown)} ({detail}); unknown is never "
        "treated as absent, so nothing was changed",
        tuple(unknown),
        (
            WayOut(f"fix those hosts (reachable over SSH, {_runtime(cfg).reach_fix})"),
            _leave_out(unknown, slurm),
        ),
    )


def _provisioning(
    cfg: ContainerConfig,
    kept: Mapping[str, HostState],
    *,
    reprovision: bool,
    script_sha256: str | None,
) -> tuple[dict[str, tuple[bool, str]], list[Text]]:
    """For containers kept (attach/restart): host -> (provision?, why), and warnings."""
    decisions: dict[str, tuple[bool, str]] = {}
    mismatched: list[tuple[str, str]] = []
    for host, state in kept.items():
        marker = state.provision_marker
        if reprovision:
            decisions[host] = (True, "reprovision requested")
        elif marker is None:
            decisions[host] = (True, "no provisioning marker (never provisioned or failed)")
        elif script_sha256 is not None and marker != script_sha256:
            decisions[host] = (False, "provisioned with another script")
            mismatched.append((host, marker))
        else:
            decisions[host] = (False, "provisioned")
    warnings: list[Text] = [
        Phrase(
            f"{container_label(cfg)} on {_names(hosts)} was provisioned with {_short(marker)}, "
            f"config says {_short(script_sha256)} — run ",
            Call("up", (Option("reprovision"),)),
        )
        for marker, hosts in group(mismatched).items()
    ]
    return decisions, warnings


def _drift_warning(
    cfg: ContainerConfig, kept: Mapping[str, HostState], config_hash: str | None
) -> list[Text]:
    if config_hash is None:
        return []
    drifted = [
        h for h, s in kept.items() if s.labels.get(LABEL_CONFIG_HASH) not in (None, config_hash)
    ]
    if not drifted:
        return []
    return [
        Phrase(
            f"config drift: {container_label(cfg)} on {_names(drifted)} was created from a "
            "different container config; to apply the current one: ",
            REBUILD,
        )
    ]


def decide_plan(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    *,
    force: bool = False,
    reprovision: bool = False,
    our_label: str = LABEL_OWNER,
    cluster_name: str = "cvs",
    script_sha256: str | None = None,
    config_hash: str | None = None,
    adopt: bool = False,
    resources: Mapping[str, EffectiveResources] | None = None,
    slurm: SlurmJob | None = None,
) -> Plan:
    """What `cvs up` does on each host, or a refusal (exit 4) with reasons:
    every reason the probed facts already show, at once (`up` refuses while
    acting only for what appears then: a tag that resolves differently after
    a pull or load, GPUs found on the host).

    `resources` (host -> what its container asks for) checks capacity: memory
    beyond a launching host's RAM refuses, cpus beyond its CPUs are clamped
    (a warning).

    `adopt` (persistent only): running same-named containers cvs did not
    start are taken over (after the image-ID check across hosts) instead of
    refused; ownership is then recorded on each host.

    `script_sha256` is the sha256 of the setup script the config asks for
    (compared with each kept container's marker); `config_hash` the value of
    the config-hash label new containers get (compared for drift warnings).

    `slurm`: the running job the hosts came from: a launching host's GPUs are
    chosen among the ones Slurm allocated the job there, and a kept
    persistent container must hold exactly those (limits/slurm_gpus.py).
    """
    ours = ownership(cfg, states, cluster_name=cluster_name, our_label=our_label)
    warnings: list[Text] = []
    if cfg.lifetime == "persistent" and cfg.name is None:
        warnings.append(
            "persistent containers without an explicit `container.name`: the default name "
            "derives from the image, so a tag bump would silently orphan the old containers; "
            "set `container.name`"
        )
    unknown = _unknown_reason(cfg, states, slurm)
    if unknown:
        return refused_plan(cfg, states, ours, [unknown], warnings)
    if cfg.lifetime == "no_launch":
        plan = _plan_no_launch(cfg, states, ours, warnings)
        return plan if plan.refused else replace(plan, resources=capacity(states, [], resources)[2])
    sshd = sshd_wanted(cfg, len(states))
    if cfg.lifetime == "per_run":
        plan = _plan_per_run(
            cfg, states, ours, warnings, force=force, sshd=sshd, cluster_name=cluster_name
        )
    else:
        plan = _plan_persistent(
            cfg,
            states,
            ours,
            warnings,
            force=force,
            sshd=sshd,
            cluster_name=cluster_name,
            reprovision=reprovision,
            script_sha256=script_sha256,
            config_hash=config_hash,
            adopt=adopt,
        )
    return add_host_facts(
        cfg, states, ours, plan, resources=resources, force=force, sshd=sshd, slurm=slurm
    )


def _plan_no_launch(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    warnings: list[Text],
) -> Plan:
    not_running = {h: s for h, s in states.items() if s.container != "running"}
    reasons: list[Refusal] = []
    if not_running:
        groups = group((h, state_word(s)) for h, s in not_running.items())
        reasons.append(
            Refusal(
                "not_running",
                f"lifetime no_launch: {container_label(cfg)} is not running on "
                f"{_names(not_running)} "
                f"({grouped_text(groups)}); no_launch never starts containers",
                tuple(not_running),
                (
                    WayOut("start them on those hosts yourself"),
                    WayOut("set `container.lifetime` to per_run or persistent"),
                ),
            )
        )
    running = {h: s for h, s in states.items() if s.container == "running"}
    image_reasons, image_warnings = image_problems(cfg, running, no_launch=True)
    reasons += image_reasons
    warnings = warnings + image_warnings
    if reasons:
        return refused_plan(cfg, states, ours, reasons, warnings)
    actions = {h: HostAction("verify", "running; no_launch verifies only") for h in states}
    return Plan(cfg.lifetime, frozen_actions(actions), warnings=warnings)


def _foreign_reason(cfg: ContainerConfig, foreign: list[str], cluster_name: str) -> Refusal:
    ways = [
        WayOut("remove or rename it there"),
        WayOut("choose another `container.name`"),
        WayOut("replace it", options=(Option("force"),)),
    ]
    if cfg.lifetime == "persistent":
        ways.append(WayOut("take running ones over as they are", options=(Option("adopt"),)))
    return Refusal(
        "foreign",
        f"{container_label(cfg)} on {_names(foreign)} was not created by cvs for cluster "
        f"{cluster_name!r} (no matching {LABEL_OWNER} label) and is never removed unless "
        "asked to",
        tuple(foreign),
        tuple(ways),
    )


def _persistent_labelled(states: Mapping[str, HostState]) -> list[str]:
    return [
        h
        for h, s in states.items()
        if s.container not in (None, "absent") and s.labels.get(LABEL_LIFETIME) == "persistent"
    ]


def _persistent_reason(cfg: ContainerConfig, hosts: list[str]) -> Refusal:
    return Refusal(
        "persistent_kept",
        f"{container_label(cfg)} on {_names(hosts)} is labelled {LABEL_LIFETIME}=persistent: a "
        "per_run cluster never removes a persistent container, not even when forced",
        tuple(hosts),
        (
            # This per_run file's `down --force` keeps it too: the way out is the
            # persistent file's (or this one set back to persistent).
            WayOut(
                "remove it with a cluster file whose container.lifetime is persistent "
                "(this one set back to persistent will do)",
                calls=(Call("down", (Option("force"),)),),
            ),
            WayOut("choose another `container.name`"),
        ),
    )


def _fresh_actions(
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    *,
    sshd: bool,
    why: Text,
) -> dict[str, HostAction]:
    actions: dict[str, HostAction] = {}
    for host, state in states.items():
        if state.container == "absent":
            actions[host] = HostAction(
                "cold_start", Phrase(why, ": absent, start fresh"), provision=True, start_sshd=sshd
            )
        else:
            whose = "our" if ours[host] else FOREIGN
            actions[host] = HostAction(
                "replace",
                Phrase(why, ": remove ", whose, f" {state_word(state)} container, start fresh"),
                remove_first=True,
                provision=True,
                start_sshd=sshd,
            )
    return actions


def _plan_per_run(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    warnings: list[Text],
    *,
    force: bool,
    sshd: bool,
    cluster_name: str,
) -> Plan:
    kept = _persistent_labelled(states)
    # One refusal per cause: a persistent container is refused as one (never
    # removed, not even forced), not also as foreign (which --force would replace).
    foreign = [
        h for h, s in states.items() if s.container != "absent" and not ours[h] and h not in kept
    ]
    reasons: list[Refusal] = []
    if kept:
        reasons.append(_persistent_reason(cfg, kept))
    if foreign and not force:
        reasons.append(_foreign_reason(cfg, foreign, cluster_name))
    reasons += pre_pull_tag_check(cfg, states)
    if reasons:
        return refused_plan(cfg, states, ours, reasons, warnings)
    if foreign:
        warnings = [
            *warnings,
            Phrase(FORCE, f": replacing foreign containers on {_names(foreign)}"),
        ]
    actions = _fresh_actions(states, ours, sshd=sshd, why="per_run")
    return Plan(cfg.lifetime, frozen_actions(actions), warnings=warnings)


def _heal_way(by_state: Mapping[str, list[str]]) -> tuple[WayOut, ...]:
    """`up --heal` (containers/subset.py): where it is only missing while the
    other hosts have it, running or resumable."""
    if "absent" in by_state and set(by_state) - {"absent"} <= RESUMABLE:
        return (
            WayOut(
                "start it where it is missing, from the image the others run",
                options=(Option("heal"),),
            ),
        )
    return ()


def _plan_persistent(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    warnings: list[Text],
    *,
    force: bool,
    sshd: bool,
    cluster_name: str,
    reprovision: bool,
    script_sha256: str | None,
    config_hash: str | None,
    adopt: bool = False,
) -> Plan:
    label = container_label(cfg)
    by_state = group((h, state_word(s)) for h, s in states.items())
    common = next(iter(by_state)) if len(by_state) == 1 else None
    # Present everywhere and each one running or resumable: a reboot (or a
    # dockerd restart) left some stopped; starting them keeps their overlays.
    resumable = common != "absent" and set(by_state) <= RESUMABLE
    foreign = [h for h, s in states.items() if s.container != "absent" and not ours[h]]
    adopting: list[str] = []
    if adopt and not force:
        # Only running ones: a stopped foreign container is not known to work.
        adopting = [h for h in foreign if states[h].container == "running"]
        foreign = [h for h in foreign if h not in adopting]
    # `force` turns these refusals into "replace everywhere"; nothing else.
    replaceable: list[Refusal] = []
    if foreign:
        replaceable.append(_foreign_reason(cfg, foreign, cluster_name))
    if common != "absent" and not resumable:
        replaceable.append(_not_resumable_reason(cfg, states, by_state))
    if not replaceable and resumable:
        image_reasons, image_warnings = image_problems(cfg, states, no_launch=False)
        replaceable += image_reasons
        warnings = warnings + image_warnings

    if replaceable and not force:
        return refused_plan(cfg, states, ours, replaceable, warnings)
    if replaceable or common == "absent":
        # Everything is launched fresh: the tag must agree across hosts, and
        # force does not waive that.
        tag_reasons = pre_pull_tag_check(cfg, states)
        if tag_reasons:
            return refused_plan(cfg, states, ours, replaceable + tag_reasons, warnings)
    if replaceable:
        present = [h for h, s in states.items() if s.container != "absent"]
        warnings = [
            *warnings,
            Phrase(
                FORCE,
                f": replacing {label} on {_names(present)} instead of refusing "
                "(their overlays are lost)",
            ),
        ]
        actions = _fresh_actions(states, ours, sshd=sshd, why=Phrase("persistent ", FORCE))
        return Plan(cfg.lifetime, frozen_actions(actions), warnings=warnings)
    if common == "absent":
        actions = {
            h: HostAction(
                "cold_start",
                "persistent: absent everywhere, cold start",
                provision=True,
                start_sshd=sshd,
            )
            for h in states
        }
        return Plan(cfg.lifetime, frozen_actions(actions), warnings=warnings)
    decisions, provision_warnings = _provisioning(
        cfg, states, reprovision=reprovision, script_sha256=script_sha256
    )
    warnings = warnings + provision_warnings + _drift_warning(cfg, states, config_hash)
    warnings += _kept_warnings(cfg, states, adopting)
    where = "everywhere" if common is not None else "here"
    actions = _kept_actions(cfg, states, decisions, adopting, sshd=sshd, where=where)
    return Plan(cfg.lifetime, frozen_actions(actions), warnings=warnings)


def _not_resumable_reason(
    cfg: ContainerConfig, states: Mapping[str, HostState], by_state: Mapping[str, list[str]]
) -> Refusal:
    return Refusal(
        "not_resumable",
        f"lifetime persistent: {container_label(cfg)} is not present and resumable on every host "
        f"({'; '.join(f'{w}: {_names(hs)}' for w, hs in by_state.items())}); nothing "
        "was changed",
        tuple(states),
        (
            REBUILD_WAY,
            WayOut("replace it on every host", options=(Option("force"),)),
            *_heal_way(by_state),
            WayOut(
                "bring the other hosts back (restore it where it is missing; "
                f"`{cfg.runtime} rm`/`{cfg.runtime} start {cfg.name or 'NAME'}` where "
                f"{cfg.runtime} cannot resume it), then try again"
            ),
        ),
    )


def _kept_warnings(
    cfg: ContainerConfig, states: Mapping[str, HostState], adopting: list[str]
) -> list[Text]:
    """Kept containers: the ones a restart heals, the ones taken over."""
    label = container_label(cfg)
    warnings: list[Text] = []
    stopped = [h for h, s in states.items() if s.container != "running"]
    if stopped and len(stopped) < len(states):
        groups = group((h, state_word(states[h])) for h in stopped)
        warnings.append(
            f"healing: {label} is {grouped_text(groups)} (e.g. after a reboot or a "
            f"{daemon_word(cfg.runtime)} restart) while the others run: resuming it there, "
            "overlay kept"
        )
    if adopting:
        warnings.append(
            Phrase(
                Option("adopt"),
                f": taking over {label} on {_names(adopting)} (not started by cvs); "
                "ownership is recorded on each host, the container is kept as it is",
            )
        )
    return warnings


def _kept_actions(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    decisions: Mapping[str, tuple[bool, str]],
    adopting: list[str],
    *,
    sshd: bool,
    where: str,
) -> dict[str, HostAction]:
    """Present everywhere, each running or resumable: attach, adopt or restart."""
    actions = {}
    for host, state in states.items():
        provision, why = decisions[host]
        if host in adopting:
            actions[host] = HostAction(
                "attach",
                f"persistent: running, not started by cvs: adopt, attach; {why}",
                provision=provision,
                start_sshd=sshd,
                adopt=True,
            )
        elif state.container == "running":
            actions[host] = HostAction(
                "attach",
                f"persistent: running {where}, attach; {why}",
                provision=provision,
                # Provisioning (`up --reprovision`) installs the sshd's files
                # again, host key included, even where an sshd listens.
                start_sshd=sshd and (provision or state.sshd_listening is not True),
            )
        else:
            paused = state_word(state) == "paused"
            how = f"`{cfg.runtime} unpause`" if paused else f"`{cfg.runtime} start`"
            actions[host] = HostAction(
                "restart",
                f"persistent: {state_word(state)} {where}, {how} (keeps the overlay); {why}",
                provision=provision,
                start_sshd=sshd,
                unpause=paused,
            )
    return actions
