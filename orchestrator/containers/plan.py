"""PURE: (container config, {host: HostState}) -> Plan.

No IO here: every decision about attaching, cold-starting, restarting,
replacing or refusing is a function of probed facts, so it is tested table-
driven and with hypothesis (tests/test_plan.py). The lifetime rules are the
table in docs/design.md:

- no_launch: verify running everywhere; never start or remove anything.
- per_run: start fresh everywhere; replace a same-named container only if it
  carries our label (`--force` replaces a foreign one too).
- per_job (inside a Slurm job; the name carries the job ID): up as
  persistent, down as per_run; the job's end removes them (jobend.py).
- persistent: all running -> attach; none present -> cold start; present
  everywhere, stopped (exited, created) or paused on some or all hosts ->
  restart those (`docker start` / `docker unpause`: keeps the overlay, so a
  node reboot heals by itself) and attach the rest; missing on some hosts, a
  state nothing safely resumes (restarting, dead, removing) -> refuse, naming
  the hosts in each state and both ways out. `--force` replaces instead of
  refusing; it is the only way a plan removes a persistent container.

Any host whose state is unknown (unreachable, docker daemon down, no docker
access, garbled probe) refuses the plan: unknown is never treated as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from orchestrator.config import ContainerConfig, Lifetime, sshd_wanted
from orchestrator.config.hostlist import MAX_NAMED_HOSTS as _MAX_NAMED_HOSTS
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.config.slurm import SlurmJob
from orchestrator.containers.argv import image_registry
from orchestrator.containers.inspection import short_id as _short
from orchestrator.containers.labels import (
    LABEL_CONFIG_HASH,
    LABEL_GPUS,
    LABEL_LIFETIME,
    LABEL_OWNER,
    is_ours,
)
from orchestrator.containers.probe import HostState
from orchestrator.containers.spread_plan import SpreadPlan
from orchestrator.errors import Call, ExitCode, Option, Phrase, Refusal, Text, WayOut
from orchestrator.limits.capacity import fit_to_host
from orchestrator.limits.cdi import CDIDevice, SpecFile, parse_specs, use_cdi
from orchestrator.limits.gpus import GPU, GPUError, GPUSelection, Unsatisfiable
from orchestrator.limits.resources import EffectiveResources
from orchestrator.limits.rootless import (
    device_group_access,
    rootless_cap_refusal,
    wants_devices,
)
from orchestrator.limits.slurm_gpus import gpu_mismatch, gpu_mismatch_refusal, select_for_host
from orchestrator.remote.runtime import ContainerRuntime, daemon_word

# What `docker start` / `docker unpause` brings back with its overlay intact
# (`_state_word`: created counts as exited).
RESUMABLE = frozenset({"running", "exited", "paused"})

ActionKind = Literal["attach", "cold_start", "restart", "replace", "verify", "remove", "none"]

# Remove it everywhere, then start again: the way out of what only a fresh
# start fixes. Refusals and warnings name it as data (errors.Call, in an
# errors.Phrase); the CLI shows it as `cvs down --force && cvs up`, the API as
# calls.
FORCE = Option("force")
REBUILD = (Call("down", (FORCE,)), Call("up"))
REBUILD_WAY = WayOut("remove it everywhere and start again", calls=REBUILD)
DOWN_FORCE = Call("down", (FORCE,))
# A container cvs did not start, which only `force` removes.
FOREIGN = Phrase("foreign (", FORCE, ")")


@dataclass(frozen=True)
class HostAction:
    kind: ActionKind
    reason: Text
    remove_first: bool = False  # `docker rm -f` the same-named container before `docker run`
    provision: bool = False  # run the setup script after this action
    start_sshd: bool = False  # (re)start the in-container sshd after this action
    unpause: bool = False  # restart = `docker unpause` (paused) instead of `docker start`
    adopt: bool = False  # attach to a container cvs did not start, recording ownership first
    # Rootless podman on crun, with devices: `--group-add keep-groups` in the
    # run argv instead of container.group_add (limits/rootless.py).
    keep_groups: bool = False
    # A launch: how the image gets onto the host first (None: the tag is
    # there and `pull` is not `always`), after a registry login when `login`.
    image_step: Literal["pull", "load"] | None = None
    login: bool = False
    # A launch with a GPU request whose GPUs the probe listed: the GPUs the
    # container gets, and the CDI devices they go through (None: their device
    # nodes). A launch whose GPUs were not listed has neither: `up` finds
    # them while acting and decides with the same `choose_gpus`.
    gpus: GPUSelection | None = None
    cdi: tuple[CDIDevice, ...] | None = None

    @property
    def launches(self) -> bool:
        """Needs the image on the host and a `docker run`."""
        return self.kind in ("cold_start", "replace")

    @property
    def removes(self) -> bool:
        return self.remove_first or self.kind == "remove"


@dataclass(frozen=True)
class Plan:
    lifetime: Lifetime
    actions: Mapping[str, HostAction]
    refused: bool = False
    refusals: list[Refusal] = field(default_factory=list)  # the reasons, as data
    warnings: list[Text] = field(default_factory=list)
    unknown_hosts: tuple[str, ...] = ()  # hosts whose state could not be determined
    # host -> why its state is unknown (the probe's error), as data: `down`
    # names it without taking the action's reason apart.
    unknown_why: Mapping[str, str] = field(default_factory=dict)
    # host -> what its container asks for, fitted to the host's capacity (cpus
    # clamped to its CPU count): what `up` runs it with. Empty when refused or
    # when no resources were given.
    resources: Mapping[str, EffectiveResources] = field(default_factory=dict)
    # How the launching hosts lacking the image get it (containers/spread_plan.py):
    # set by Lifecycle.decide_for, so `plan` shows what `up` then does.
    spread: SpreadPlan | None = None

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.REFUSED if self.refused else ExitCode.OK

    @property
    def reasons(self) -> list[str]:
        """The refusals, one line each, as an API caller reads them (the CLI
        renders `refusals` with its flags)."""
        return [r.render() for r in self.refusals]

    @property
    def changes(self) -> bool:
        """Whether acting on it starts, replaces, removes, restarts, adopts, provisions or
        starts sshd anywhere: what needs the hosts' locks exclusively."""
        return any(
            a.kind not in ("attach", "verify", "none") or a.provision or a.start_sshd or a.adopt
            for a in self.actions.values()
        )

    def hosts(self, *kinds: ActionKind) -> list[str]:
        return [h for h, a in self.actions.items() if a.kind in kinds]


# --- helpers -------------------------------------------------------------


def _group(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """value -> hosts, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for host, value in pairs:
        groups.setdefault(value, []).append(host)
    return groups


def _grouped_text(groups: Mapping[str, list[str]], fmt: Callable[[str], str] = str) -> str:
    return "; ".join(f"{fmt(value)} on {_names(hosts)}" for value, hosts in groups.items())


def _state_word(state: HostState) -> str:
    if state.container == "other":
        return state.container_status or "other"
    return state.container or "unknown"


def _unknown_why(state: HostState) -> str:
    return state.error or "probe failed"


def _describe(state: HostState, ours: bool) -> str:
    if not state.known:
        return f"state unknown: {_unknown_why(state)}"
    if state.container == "absent":
        return "absent"
    return f"{_state_word(state)} ({'ours' if ours else _whose(state)})"


def _whose(state: HostState) -> str:
    """Who made a container that is not this cluster's for this lifetime, as
    its labels say (`not created by cvs` only when none says cvs did)."""
    owner = state.labels.get(LABEL_OWNER)
    if not owner:
        return "not created by cvs"
    lifetime = state.labels.get(LABEL_LIFETIME)
    return f"created by cvs for cluster {owner!r}" + (f", lifetime {lifetime}" if lifetime else "")


def _label(cfg: ContainerConfig) -> str:
    return f"container {cfg.name}" if cfg.name else "the container"


def _frozen(actions: dict[str, HostAction]) -> Mapping[str, HostAction]:
    return MappingProxyType(dict(actions))


def _refusal(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    reasons: list[Refusal],
    warnings: list[Text],
) -> Plan:
    actions = {h: HostAction("none", _describe(s, ours[h])) for h, s in states.items()}
    return Plan(
        lifetime=cfg.lifetime,
        actions=_frozen(actions),
        refused=True,
        refusals=list(dict.fromkeys(reasons)),
        warnings=warnings,
        unknown_hosts=tuple(h for h, s in states.items() if not s.known),
    )


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


def _image_problems(
    cfg: ContainerConfig, present: Mapping[str, HostState], *, no_launch: bool
) -> tuple[list[Refusal], list[Text]]:
    """(refusals, warnings) about the images of existing containers."""
    reasons: list[Refusal] = []
    warnings: list[Text] = []
    label = _label(cfg)
    unreadable = [h for h, s in present.items() if not s.container_image_readable]
    if unreadable:
        reasons.append(
            Refusal(
                "image_unreadable",
                f"cannot read the image of {label} on {_names(unreadable)}",
                tuple(unreadable),
                (WayOut(f"check it with `{cfg.runtime} inspect` on those hosts"), REBUILD_WAY),
            )
        )
    readable = {h: s for h, s in present.items() if s.container_image_readable}
    groups = _group((h, s.container_image_id or "?") for h, s in readable.items())
    if len(groups) > 1:
        reasons.append(
            Refusal(
                "image_skew",
                f"image skew: {label} runs different images across hosts: "
                f"{_grouped_text(groups, _short)}; every host must run the same image",
                tuple(readable),
                (REBUILD_WAY,),
            )
        )
    stale = _group(
        (h, s.tag_image_id)
        for h, s in readable.items()
        if s.tag_image_id is not None and s.tag_image_id != s.container_image_id
    )
    for tag_id, hosts in stale.items():
        running = {_short(present[h].container_image_id) for h in hosts}
        fix = (
            "recreate those containers to pick it up (no_launch: cvs does not)"
            if no_launch
            else Phrase("to rebuild: ", REBUILD)
        )
        warnings.append(
            Phrase(
                f"stale: {label} on {_names(hosts)} runs {', '.join(sorted(running))} but "
                f"{cfg.image} now resolves to {_short(tag_id)}; ",
                fix,
            )
        )
    return reasons, warnings


def check_tag_identity(
    states: Mapping[str, HostState], *, image: str | None = None
) -> list[Refusal]:
    """Refusal reasons unless the tag resolves to the same image on every host.

    Call it with the states probed after the pull/load step, for the hosts
    about to cold-start. Equal image IDs agree; so do differing IDs that share
    a repo digest (the same registry manifest can get different local IDs).
    """
    what = image or "the image"
    # The runtime the hosts were probed with (one per cluster): its verbs in the fix.
    rt = next((s.runtime_name for s in states.values()), "docker")
    reasons: list[Refusal] = []
    unknown = [h for h, s in states.items() if not s.known and s.tag_image_id is None]
    errors = [h for h, s in states.items() if s.tag_error and h not in unknown]
    missing = [
        h
        for h, s in states.items()
        if s.tag_image_id is None and h not in unknown and h not in errors
    ]
    if unknown:
        reasons.append(
            Refusal(
                "tag_unknown",
                f"cannot tell what {what} resolves to on {_names(unknown)} (probe failed)",
                tuple(unknown),
            )
        )
    if errors:
        detail = "; ".join(f"{h}: {states[h].tag_error}" for h in errors[:_MAX_NAMED_HOSTS])
        reasons.append(
            Refusal("tag_unreadable", f"cannot read {what} on {_names(errors)} ({detail})")
        )
    if missing:
        reasons.append(
            Refusal(
                "tag_missing",
                f"{what} is not present on {_names(missing)} after the pull step",
                tuple(missing),
                (
                    WayOut(
                        "pull or load it there (check `pull`, `image_tar` and `registry` in "
                        "the cluster file)"
                    ),
                ),
            )
        )
    have = {h: s for h, s in states.items() if s.tag_image_id is not None}
    groups = _group((h, s.tag_image_id or "") for h, s in have.items())
    if len(groups) > 1:
        shared = set.intersection(*(set(s.tag_repo_digests) for s in have.values()))
        if not shared:
            reasons.append(
                Refusal(
                    "tag_identity",
                    f"{what} resolves to different images across hosts: "
                    f"{_grouped_text(groups, _short)}",
                    tuple(have),
                    (
                        WayOut(
                            "make every host hold the same image (pull it from one registry, "
                            f"or `{rt} save` once and `{rt} load` on each host), then retry"
                        ),
                    ),
                )
            )
    return reasons


def _pre_pull_tag_check(cfg: ContainerConfig, launching: Mapping[str, HostState]) -> list[Refusal]:
    # When the pull step cannot change anything (never pulls, or pulls only what
    # is missing and nothing is), the tag check can run now, before touching
    # any host. Otherwise the caller runs check_tag_identity after pulling.
    if not launching or cfg.pull == "always":
        return []
    if any(s.tag_image_id is None for s in launching.values()):
        return []
    return check_tag_identity(launching, image=cfg.image)


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
            f"{_label(cfg)} on {_names(hosts)} was provisioned with {_short(marker)}, config "
            f"says {_short(script_sha256)} — run ",
            Call("up", (Option("reprovision"),)),
        )
        for marker, hosts in _group(mismatched).items()
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
            f"config drift: {_label(cfg)} on {_names(drifted)} was created from a different "
            "container config; to apply the current one: ",
            REBUILD,
        )
    ]


# --- cvs up --------------------------------------------------------------


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
    ours = {
        h: s.container not in (None, "absent")
        and is_ours(s.labels, cluster_name, our_label=our_label, lifetime=cfg.lifetime)
        for h, s in states.items()
    }
    warnings: list[Text] = []
    if cfg.lifetime == "persistent" and cfg.name is None:
        warnings.append(
            "persistent containers without an explicit `container.name`: the default name "
            "derives from the image, so a tag bump would silently orphan the old containers; "
            "set `container.name`"
        )
    unknown = _unknown_reason(cfg, states, slurm)
    if unknown:
        return _refusal(cfg, states, ours, [unknown], warnings)
    if cfg.lifetime == "no_launch":
        plan = _plan_no_launch(cfg, states, ours, warnings)
        return (
            plan if plan.refused else replace(plan, resources=_capacity(states, [], resources)[2])
        )
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
    return _with_host_facts(
        cfg, states, ours, plan, resources=resources, force=force, sshd=sshd, slurm=slurm
    )


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
    ours = {
        h: s.container not in (None, "absent")
        and is_ours(s.labels, cluster_name, our_label=our_label, lifetime=cfg.lifetime)
        for h, s in states.items()
    }
    sshd = sshd_wanted(cfg, len(states))
    return _with_host_facts(
        cfg, states, ours, plan, resources=resources, force=False, sshd=sshd, slurm=slurm
    )


def _with_host_facts(
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
    fit_reasons, fit_warnings, fitted = _capacity(states, launching, resources)
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
        return _refusal(cfg, states, ours, reasons, warnings)
    actions = {
        h: _launch_details(cfg, states[h], replace(a, keep_groups=h in keep), choices.get(h))
        for h, a in plan.actions.items()
    }
    return replace(plan, actions=_frozen(actions), warnings=warnings, resources=fitted)


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


def _capacity(
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
        return plan, [gpu_mismatch_refusal(found, slurm.job_id, _label(cfg))]
    actions = dict(plan.actions)
    for m in found:
        actions[m.host] = HostAction(
            "replace",
            Phrase(FORCE, f": its GPUs are not job {slurm.job_id}'s, start fresh"),
            remove_first=True,
            provision=True,
            start_sshd=sshd,
        )
    return replace(plan, actions=_frozen(actions)), []


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
    by_holder = _group(
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


def _plan_no_launch(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    warnings: list[Text],
) -> Plan:
    not_running = {h: s for h, s in states.items() if s.container != "running"}
    reasons: list[Refusal] = []
    if not_running:
        groups = _group((h, _state_word(s)) for h, s in not_running.items())
        reasons.append(
            Refusal(
                "not_running",
                f"lifetime no_launch: {_label(cfg)} is not running on {_names(not_running)} "
                f"({_grouped_text(groups)}); no_launch never starts containers",
                tuple(not_running),
                (
                    WayOut("start them on those hosts yourself"),
                    WayOut("set `container.lifetime` to per_run or persistent"),
                ),
            )
        )
    running = {h: s for h, s in states.items() if s.container == "running"}
    image_reasons, image_warnings = _image_problems(cfg, running, no_launch=True)
    reasons += image_reasons
    warnings = warnings + image_warnings
    if reasons:
        return _refusal(cfg, states, ours, reasons, warnings)
    actions = {h: HostAction("verify", "running; no_launch verifies only") for h in states}
    return Plan(cfg.lifetime, _frozen(actions), warnings=warnings)


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
        f"{_label(cfg)} on {_names(foreign)} was not created by cvs for cluster "
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
        f"{_label(cfg)} on {_names(hosts)} is labelled {LABEL_LIFETIME}=persistent: a per_run "
        "cluster never removes a persistent container, not even when forced",
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
                Phrase(why, ": remove ", whose, f" {_state_word(state)} container, start fresh"),
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
    reasons += _pre_pull_tag_check(cfg, states)
    if reasons:
        return _refusal(cfg, states, ours, reasons, warnings)
    if foreign:
        warnings = [
            *warnings,
            Phrase(FORCE, f": replacing foreign containers on {_names(foreign)}"),
        ]
    actions = _fresh_actions(states, ours, sshd=sshd, why="per_run")
    return Plan(cfg.lifetime, _frozen(actions), warnings=warnings)


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
    label = _label(cfg)
    by_state = _group((h, _state_word(s)) for h, s in states.items())
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
        image_reasons, image_warnings = _image_problems(cfg, states, no_launch=False)
        replaceable += image_reasons
        warnings = warnings + image_warnings

    if replaceable and not force:
        return _refusal(cfg, states, ours, replaceable, warnings)
    if replaceable or common == "absent":
        # Everything is launched fresh: the tag must agree across hosts, and
        # force does not waive that.
        tag_reasons = _pre_pull_tag_check(cfg, states)
        if tag_reasons:
            return _refusal(cfg, states, ours, replaceable + tag_reasons, warnings)
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
        return Plan(cfg.lifetime, _frozen(actions), warnings=warnings)
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
        return Plan(cfg.lifetime, _frozen(actions), warnings=warnings)
    decisions, provision_warnings = _provisioning(
        cfg, states, reprovision=reprovision, script_sha256=script_sha256
    )
    warnings = warnings + provision_warnings + _drift_warning(cfg, states, config_hash)
    warnings += _kept_warnings(cfg, states, adopting)
    where = "everywhere" if common is not None else "here"
    actions = _kept_actions(cfg, states, decisions, adopting, sshd=sshd, where=where)
    return Plan(cfg.lifetime, _frozen(actions), warnings=warnings)


def _not_resumable_reason(
    cfg: ContainerConfig, states: Mapping[str, HostState], by_state: Mapping[str, list[str]]
) -> Refusal:
    return Refusal(
        "not_resumable",
        f"lifetime persistent: {_label(cfg)} is not present and resumable on every host "
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
    label = _label(cfg)
    warnings: list[Text] = []
    stopped = [h for h, s in states.items() if s.container != "running"]
    if stopped and len(stopped) < len(states):
        groups = _group((h, _state_word(states[h])) for h in stopped)
        warnings.append(
            f"healing: {label} is {_grouped_text(groups)} (e.g. after a reboot or a "
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
            paused = _state_word(state) == "paused"
            how = f"`{cfg.runtime} unpause`" if paused else f"`{cfg.runtime} start`"
            actions[host] = HostAction(
                "restart",
                f"persistent: {_state_word(state)} {where}, {how} (keeps the overlay); {why}",
                provision=provision,
                start_sshd=sshd,
                unpause=paused,
            )
    return actions


# --- cvs down ------------------------------------------------------------


def decide_down(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    *,
    force: bool = False,
    our_label: str = LABEL_OWNER,
    cluster_name: str = "cvs",
) -> Plan:
    """What `cvs down` removes on each host. Never refuses: it does what it safely can.

    per_run removes our containers; persistent keeps them unless `force`;
    no_launch never removes anything (cvs did not start those containers).
    A foreign same-named container is removed only with `force`. Hosts whose
    state is unknown get no action and a warning (listed in `unknown_hosts`).
    """
    label = _label(cfg)
    actions: dict[str, HostAction] = {}
    warnings: list[Text] = []
    unknown = [h for h, s in states.items() if not s.known]
    if unknown:
        warnings.append(
            f"could not tell the state of {label} on {_names(unknown)}; nothing was done there"
        )
    if cfg.lifetime == "no_launch" and force:
        warnings.append(Phrase(FORCE, " has no effect under no_launch: cvs never removes those"))
    kept_foreign: list[str] = []
    kept_persistent: list[str] = []
    for host, state in states.items():
        ours = state.container not in (None, "absent") and is_ours(
            state.labels, cluster_name, our_label=our_label, lifetime=cfg.lifetime
        )
        if not state.known:
            actions[host] = HostAction("none", _describe(state, ours))
        elif state.container == "absent":
            actions[host] = HostAction("none", "absent")
        elif cfg.lifetime == "no_launch":
            actions[host] = HostAction("none", "no_launch: cvs never removes containers")
        elif cfg.lifetime == "persistent" and not force:
            actions[host] = HostAction(
                "none", Phrase("persistent: kept (", DOWN_FORCE, " removes)")
            )
        elif (
            cfg.lifetime in ("per_run", "per_job")
            and state.labels.get(LABEL_LIFETIME) == "persistent"
        ):
            actions[host] = HostAction(
                "none", f"labelled persistent: a {cfg.lifetime} down keeps it"
            )
            kept_persistent.append(host)
        elif ours or force:
            whose = "our" if ours else FOREIGN
            actions[host] = HostAction(
                "remove", Phrase("remove ", whose, f" {_state_word(state)} container")
            )
        else:
            actions[host] = HostAction(
                "none", Phrase("not created by cvs: kept (", FORCE, " removes)")
            )
            kept_foreign.append(host)
    if kept_persistent:
        warnings.append(
            Phrase(
                f"{label} on {_names(kept_persistent)} is labelled {LABEL_LIFETIME}=persistent: "
                "a per_run cluster never removes a persistent container, not even with ",
                FORCE,
                "; remove it with the persistent cluster's ",
                DOWN_FORCE,
            )
        )
    if kept_foreign:
        warnings.append(
            Phrase(
                f"{label} on {_names(kept_foreign)} was not created by cvs for cluster "
                f"{cluster_name!r}: kept; ",
                DOWN_FORCE,
                " removes it",
            )
        )
    plan = Plan(cfg.lifetime, _frozen(actions), warnings=warnings, unknown_hosts=tuple(unknown))
    return replace(plan, unknown_why={h: _unknown_why(states[h]) for h in unknown})


def down_leftovers(
    cfg: ContainerConfig,
    plan: Plan,
    removed: Mapping[str, tuple[bool, str | None]],
    *,
    force: bool,
) -> dict[str, Text]:
    """After `cvs down`: host -> what is left there and how to finish, for every
    host where a container may remain. `removed` is host -> (ok, error) for the
    hosts a removal ran on. Empty when nothing is left anywhere.

    A host whose state could not be told (unreachable, dockerd down) may still
    hold the container: it is named with the reason, and rerunning the same
    `cvs down` (nothing else changes in between) finishes the job there.
    """
    label = _label(cfg)
    again = DOWN_FORCE if force else Call("down")
    left: dict[str, Text] = {}
    unknown = set(plan.unknown_hosts)
    for host, action in plan.actions.items():
        if host in unknown:
            why = plan.unknown_why.get(host, "probe failed")
            left[host] = Phrase(
                f"{label} may still be there (state unknown: ",
                why,
                "); nothing was done there: rerun ",
                again,
                " once the host is reachable",
            )
        elif action.kind == "remove":
            ok, error = removed.get(host, (False, "not attempted"))
            if not ok:
                left[host] = Phrase(
                    f"{label} is still there: removing it failed (",
                    error or "failed",
                    "); rerun ",
                    again,
                )
        elif action.kind == "none" and action.reason != "absent":
            left[host] = Phrase(f"{label} kept: ", action.reason)
    return left
