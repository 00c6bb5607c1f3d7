"""Undoing a start that failed or was interrupted: what this invocation
made on the hosts goes, by its label (never by name alone), and each host's
outcome says so, or what is left and how to remove it.

    await roll_back(steps, invocation, hosts, states, why, outcomes)
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio

from orchestrator.containers.argv import remove_started_by_command
from orchestrator.containers.outcome import HostOutcome
from orchestrator.containers.plan.model import DOWN_FORCE
from orchestrator.containers.probe import HostState
from orchestrator.containers.steps import Steps
from orchestrator.errors import Phrase
from orchestrator.events import Message
from orchestrator.remote import records
from orchestrator.ssh.fanout import fan_out


async def roll_back(
    steps: Steps,
    invocation: str,
    hosts: list[str],
    states: Mapping[str, HostState],
    why: str,
    outcomes: Mapping[str, HostOutcome] | None = None,
) -> None:
    """Remove what this attempt made on `hosts`: by the ID `docker run`
    printed, else (run cut short) only a container with our label; a
    foreign container holding the name is never touched."""
    if not hosts:
        return
    steps.sink.emit(
        Message(
            level="warning",
            text=f"{why}: removing the containers this attempt made on {', '.join(hosts)}",
        )
    )

    async def remove(host: str) -> None:
        # Only what this invocation started (its label), even when the
        # `docker run` was cut short before it told us the container ID.
        runtime = states[host].runtime
        command = remove_started_by_command(
            runtime.prefix,
            steps.name,
            invocation,
            then=records.forget_listed_command(),
            name_filter=runtime.name_filter(steps.name),
        )
        r = await steps.pool.run(
            host,
            command,
            timeout=steps.cfg.runtime_timeout,
            stream_output=False,
            label="rollback",
        )
        outcome = (outcomes or {}).get(host)
        if outcome is None:
            return
        # The report must not call ready what no longer exists.
        outcome.steps.append(("rollback", r))
        if r.ok:
            outcome.roll_back(why)
        else:
            outcome.roll_back(
                Phrase(
                    why,
                    f"; removing its container failed ({r.error or r.status}): ",
                    DOWN_FORCE,
                    " once the host answers",
                )
            )
        steps.step(host, "rollback", "ok" if r.ok else "failed", outcome.rolled_back or "")

    with anyio.CancelScope(shield=True):
        await fan_out(hosts, remove, limit=steps.forks)
