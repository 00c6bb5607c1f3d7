"""What a plan is: the per-host actions, the plan that holds them, and the
ways out refusals name (PURE, no IO). The decisions that make plans live
beside it: lifetimes.py (`up`), facts.py (what else the probe shows), down.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from orchestrator.config import ContainerConfig, Lifetime
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.containers.plan.ownership import describe
from orchestrator.containers.probe import HostState
from orchestrator.containers.spread_plan import SpreadPlan
from orchestrator.errors import Call, ExitCode, Option, Phrase, Refusal, Text, WayOut
from orchestrator.limits.cdi import CDIDevice
from orchestrator.limits.gpus import GPUSelection
from orchestrator.limits.resources import EffectiveResources

# What `docker start` / `docker unpause` brings back with its overlay intact
# (ownership.state_word: created counts as exited).
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


def group(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """value -> hosts, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for host, value in pairs:
        groups.setdefault(value, []).append(host)
    return groups


def grouped_text(groups: Mapping[str, list[str]], fmt: Callable[[str], str] = str) -> str:
    return "; ".join(f"{fmt(value)} on {_names(hosts)}" for value, hosts in groups.items())


def container_label(cfg: ContainerConfig) -> str:
    return f"container {cfg.name}" if cfg.name else "the container"


def frozen_actions(actions: dict[str, HostAction]) -> Mapping[str, HostAction]:
    return MappingProxyType(dict(actions))


def refused_plan(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    ours: Mapping[str, bool],
    reasons: list[Refusal],
    warnings: list[Text],
) -> Plan:
    actions = {h: HostAction("none", describe(s, ours[h])) for h, s in states.items()}
    return Plan(
        lifetime=cfg.lifetime,
        actions=frozen_actions(actions),
        refused=True,
        refusals=list(dict.fromkeys(reasons)),
        warnings=warnings,
        unknown_hosts=tuple(h for h, s in states.items() if not s.known),
    )
