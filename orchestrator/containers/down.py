"""`cvs down` acting: the removals the plan (plan/down.py) decided, by the
container ID probed under the exclusive lock, each host's records of the
container going with it. Lifecycle.down holds the locks around it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace

import anyio

from orchestrator.config import ContainerConfig
from orchestrator.containers.argv import rm_id_argv
from orchestrator.containers.labels import LABEL_INVOCATION
from orchestrator.containers.plan.model import HostAction, Plan
from orchestrator.containers.probe import HostState
from orchestrator.containers.timeouts import runtime_gave_up
from orchestrator.events import EventSink, HostStep
from orchestrator.remote import records
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import HostRunner


async def remove_all(
    pool: HostRunner,
    sink: EventSink,
    cfg: ContainerConfig,
    states: Mapping[str, HostState],
    hosts: Sequence[str],
    *,
    forks: int,
) -> dict[str, HostResult]:
    """`docker rm -f ID` on each of `hosts`, `forks` at a time; shielded: once
    begun, the removals run to their end even when the caller is cancelled."""

    async def remove(host: str) -> HostResult:
        prefix = states[host].runtime.prefix
        sink.emit(HostStep(host=host, step="remove", status="started"))
        r = await pool.run(
            host,
            remove_command(prefix, states[host].container_id or ""),
            timeout=cfg.runtime_timeout,
            stream_output=False,
            label="remove",
        )
        if r.status == "timeout":
            r = replace(r, error=runtime_gave_up(cfg, f"{cfg.runtime} rm"))
        said = r.error or ""
        sink.emit(
            HostStep(host=host, step="remove", status="ok" if r.ok else "failed", detail=said)
        )
        return r

    with anyio.CancelScope(shield=True):
        removed = await fan_out(list(hosts), remove, limit=forks)
    return removed


def only_started_by(plan: Plan, states: Mapping[str, HostState], invocation: str) -> Plan:
    """`plan` with removals limited to containers labelled with `invocation`."""
    actions = dict(plan.actions)
    kept: list[str] = []
    for host, action in plan.actions.items():
        if action.kind == "remove" and states[host].labels.get(LABEL_INVOCATION) != invocation:
            actions[host] = HostAction("none", "started by another invocation: left alone")
            kept.append(host)
    warnings = list(plan.warnings)
    if kept:
        warnings.append(
            f"the container on {', '.join(kept)} was started by another cvs invocation "
            "since this one started it: left alone"
        )
    return replace(plan, actions=actions, warnings=warnings)


def remove_command(prefix: Sequence[str], container_id: str) -> str:
    """`docker rm -f ID`, then the host's records of that container go too."""
    argv = rm_id_argv(prefix, container_id)
    return f"{shlex.join(argv)} && {shlex.join(records.forget_argv(container_id))}"
