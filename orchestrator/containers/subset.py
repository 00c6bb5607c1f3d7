"""`up --hosts`: the plan decided over every host, acted on some (issue 30).

A persistent set lives on every host of the cluster. `--hosts` picks where
`up` acts; it never changes what the rules allow: the plan is decided over
every host's probed state (the same partial-set and image-identity rules as
a plain `up`, the same refusal), then narrowed to the chosen hosts. What a
plain `up` would start on other hosts too is refused here: starting it on the
chosen ones alone would make a partial persistent set. A host this `up` does
start is set up as the whole cluster's member (sshd, keys and hostfile for
every host), since the lifecycle still knows the whole cluster.

Pure: a Plan in, a Plan out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.config import ContainerConfig
from orchestrator.containers.labels import is_ours
from orchestrator.containers.plan.model import RESUMABLE, HostAction, Plan
from orchestrator.containers.probe import HostState
from orchestrator.errors import Call, Option, Param, Phrase, Refusal, WayOut


def _names(hosts: Sequence[str]) -> str:
    return ", ".join(hosts)


def unread(states: Mapping[str, HostState], only: Sequence[str] | None) -> list[str]:
    """The hosts left out of `only` whose state could not be read."""
    chosen = set(only or ())
    return [h for h, s in states.items() if h not in chosen and not s.known]


def deciding(states: Mapping[str, HostState], only: Sequence[str] | None) -> dict[str, HostState]:
    """The hosts a plan for `only` is decided over: every host whose state is
    known, and the chosen ones whatever their state. A host left out whose
    state cannot be read (down, unreachable: often why it was left out) is
    left out of the decision too; a chosen one refuses as it always does."""
    if only is None:
        return dict(states)
    chosen = set(only)
    return {h: s for h, s in states.items() if h in chosen or s.known}


def _whole_ways(plan: Plan) -> Plan:
    """The refusal as a plain `up` gives it, its ways out true for this one:
    "the same call again with --force" would keep `--hosts` (and be refused for
    the partial set it would make), so each becomes the whole `up` it means."""
    refusals = [
        replace(
            r,
            ways_out=tuple(
                WayOut(w.text, calls=(Call("up", w.options),))
                if w.options and w.options != (Option("heal"),)
                else w  # --heal goes with --hosts: the same command again is right
                for w in r.ways_out
            ),
        )
        for r in plan.refusals
    ]
    return replace(plan, refusals=refusals)


def narrowed(plan: Plan, only: Sequence[str], container: str, unknown: Sequence[str] = ()) -> Plan:
    """`plan` (decided over every host, `deciding`) acting on the hosts in
    `only` alone, or refused, with nothing changed anywhere, when acting on
    them alone would leave a partial persistent set. `unknown`: hosts left
    out whose state could not be read (a start next to them is refused: the
    set may be missing there)."""
    chosen = set(only)
    if plan.refused:
        return _whole_ways(plan) if chosen < set(plan.actions) else plan
    if plan.lifetime == "persistent":
        inside = [h for h, a in plan.actions.items() if h in chosen and a.launches]
        outside = [h for h, a in plan.actions.items() if h not in chosen and a.launches]
        launching_outside = set(outside)  # a set: thousands of hosts left out
        outside += [h for h in unknown if h not in chosen and h not in launching_outside]
        if inside and outside:
            refusal = Refusal(
                "partial_set_hosts",
                Phrase(
                    f"lifetime persistent: container {container} would start on "
                    f"{_names(inside)} only (",
                    Param("hosts"),
                    f"), while {_names(outside)} need the same start or cannot be read: a "
                    "persistent set lives on every host",
                ),
                tuple(inside + outside),
                (WayOut("start it on every host at once", calls=(Call("up"),)),),
            )
            return replace(plan, refused=True, refusals=[refusal])
    actions = {h: a for h, a in plan.actions.items() if h in chosen}
    return replace(plan, actions=actions)


__all__ = ["deciding", "healed", "narrowed", "unread"]


def healed(
    plan: Plan,
    states: Mapping[str, HostState],
    only: Sequence[str] | None,
    cfg: ContainerConfig,
    *,
    sshd: bool,
    cluster_name: str,
) -> Plan:
    """`up --heal`: a persistent set missing on some chosen hosts while every
    other host runs it is completed there, and only there, with the image the
    set runs, instead of refused. Anything else the plan refused stays
    refused; a chosen host whose tag is not that image is refused (the way
    out: that image there, or `up --force` everywhere)."""
    if not plan.refused or {r.kind for r in plan.refusals} != {"not_resumable"}:
        return plan
    chosen = set(only) if only is not None else set(states)
    missing = [h for h in states if h in chosen and states[h].container == "absent"]
    absent_here = set(missing)
    present = [h for h in states if h not in absent_here]
    if not missing or not present:
        return plan
    for h in present:
        s = states[h]
        mine = is_ours(s.labels, cluster_name, lifetime=cfg.lifetime)
        if not (s.known and s.container in RESUMABLE and mine):
            return plan  # not a running set with holes: heal does not apply
    images = {states[h].container_image_id for h in present}
    if len(images) != 1 or None in images:
        return plan
    (image,) = images
    skewed = [h for h in missing if states[h].tag_image_id != image]
    if skewed or cfg.pull == "always":
        why = (
            f"the tag resolves to another image, or is not there, on {_names(skewed)}"
            if skewed
            else "container.pull is 'always': a pull could fetch another image"
        )
        refusal = Refusal(
            "heal_image",
            f"lifetime persistent: healing would start container {cfg.name or 'NAME'} on "
            f"{_names(missing)} from {cfg.image}, but the set runs image {str(image)[:19]} "
            f"and {why}",
            tuple(missing),
            (
                WayOut(f"put that image there ({cfg.runtime} load), then heal again"),
                WayOut("replace it on every host", calls=(Call("up", (Option("force"),)),)),
            ),
        )
        return replace(plan, refusals=[refusal])
    actions = {
        h: HostAction(
            "cold_start",
            "persistent: missing here while the others run it: heal, same image",
            provision=True,
            start_sshd=sshd,
        )
        if h in missing
        else HostAction("attach", "persistent: running, attach")
        for h in states
        if h in chosen
    }
    warning = Phrase(
        Option("heal"),
        f": starting container {cfg.name or 'NAME'} on {_names(missing)}, where it is missing "
        "while the other hosts run it (the same image)",
    )
    return replace(
        plan, refused=False, refusals=[], actions=actions, warnings=[*plan.warnings, warning]
    )
