"""Whose container a host holds, as its labels say, and how to name its state
(PURE). `ownership` is the one answer `up` and `down` both read.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import ContainerConfig
from orchestrator.containers.labels import LABEL_LIFETIME, LABEL_OWNER, is_ours
from orchestrator.containers.probe import HostState


def ownership(
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    *,
    cluster_name: str,
    our_label: str = LABEL_OWNER,
) -> dict[str, bool]:
    """host -> whether its container is this cluster's, for this lifetime, as
    its labels say (an absent one, or one whose state is unknown, is not).
    The one answer `up` (lifetimes.py, facts.py) and `down` (down.py) read."""
    return {
        h: s.container not in (None, "absent")
        and is_ours(s.labels, cluster_name, our_label=our_label, lifetime=cfg.lifetime)
        for h, s in states.items()
    }


def state_word(state: HostState) -> str:
    if state.container == "other":
        return state.container_status or "other"
    return state.container or "unknown"


def unknown_why(state: HostState) -> str:
    return state.error or "probe failed"


def describe(state: HostState, ours: bool) -> str:
    if not state.known:
        return f"state unknown: {unknown_why(state)}"
    if state.container == "absent":
        return "absent"
    return f"{state_word(state)} ({'ours' if ours else whose(state)})"


def whose(state: HostState) -> str:
    """Who made a container that is not this cluster's for this lifetime, as
    its labels say (`not created by cvs` only when none says cvs did)."""
    owner = state.labels.get(LABEL_OWNER)
    if not owner:
        return "not created by cvs"
    lifetime = state.labels.get(LABEL_LIFETIME)
    return f"created by cvs for cluster {owner!r}" + (f", lifetime {lifetime}" if lifetime else "")
