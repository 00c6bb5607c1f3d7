"""`cvs down`'s decision (PURE), and what is left after it acted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Literal

from orchestrator.config import ContainerConfig
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.containers.labels import LABEL_LIFETIME, LABEL_OWNER
from orchestrator.containers.plan.model import (
    DOWN_FORCE,
    FORCE,
    FOREIGN,
    HostAction,
    Plan,
    container_label,
    frozen_actions,
)
from orchestrator.containers.plan.ownership import describe, ownership, state_word, unknown_why
from orchestrator.containers.probe import HostState
from orchestrator.errors import Call, Phrase, Text

# Why `down` kept a container it found: the warnings name the hosts of each.
Kept = Literal["persistent", "foreign"]


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
    label = container_label(cfg)
    actions: dict[str, HostAction] = {}
    warnings: list[Text] = []
    unknown = [h for h, s in states.items() if not s.known]
    if unknown:
        warnings.append(
            f"could not tell the state of {label} on {_names(unknown)}; nothing was done there"
        )
    if cfg.lifetime == "no_launch" and force:
        warnings.append(Phrase(FORCE, " has no effect under no_launch: cvs never removes those"))
    kept: dict[Kept, list[str]] = {"persistent": [], "foreign": []}
    owned = ownership(cfg, states, cluster_name=cluster_name, our_label=our_label)
    for host, state in states.items():
        actions[host], why_kept = _host_down(cfg, state, owned[host], force=force)
        if why_kept is not None:
            kept[why_kept].append(host)
    warnings += _kept_warnings(label, cluster_name, kept["persistent"], kept["foreign"])
    plan = Plan(
        cfg.lifetime, frozen_actions(actions), warnings=warnings, unknown_hosts=tuple(unknown)
    )
    return replace(plan, unknown_why={h: unknown_why(states[h]) for h in unknown})


def _host_down(
    cfg: ContainerConfig, state: HostState, ours: bool, *, force: bool
) -> tuple[HostAction, Kept | None]:
    """What `down` does with one host's container, and why it keeps it when a
    warning must say so."""
    if not state.known:
        return HostAction("none", describe(state, ours)), None
    if state.container == "absent":
        return HostAction("none", "absent"), None
    if cfg.lifetime == "no_launch":
        return HostAction("none", "no_launch: cvs never removes containers"), None
    if cfg.lifetime == "persistent" and not force:
        return HostAction("none", Phrase("persistent: kept (", DOWN_FORCE, " removes)")), None
    if cfg.lifetime in ("per_run", "per_job") and state.labels.get(LABEL_LIFETIME) == "persistent":
        why = f"labelled persistent: a {cfg.lifetime} down keeps it"
        return HostAction("none", why), "persistent"
    if ours or force:
        whose = "our" if ours else FOREIGN
        return HostAction(
            "remove", Phrase("remove ", whose, f" {state_word(state)} container")
        ), None
    return HostAction("none", Phrase("not created by cvs: kept (", FORCE, " removes)")), "foreign"


def _kept_warnings(
    label: str, cluster_name: str, kept_persistent: list[str], kept_foreign: list[str]
) -> list[Text]:
    warnings: list[Text] = []
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
    return warnings


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
    label = container_label(cfg)
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
