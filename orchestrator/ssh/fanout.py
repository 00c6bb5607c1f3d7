"""Run one coroutine per host under a task group; collect per-host outcomes.

Each host's work runs as its own pipeline: a slow host delays only itself.
The only fleet-wide wait is the final join.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from orchestrator.results import HostResult
from orchestrator.ssh.seam import Command, HostRunner

T = TypeVar("T")


async def fan_out(
    hosts: Sequence[str],
    work: Callable[[str], Awaitable[T]],
    *,
    limit: int | None = None,
) -> dict[str, T]:
    """`work(host)` for every host, at most `limit` at once; results by host, in host order.

    An exception in one host's work cancels the others (structured
    concurrency): per-host failures that should not stop the fleet must be
    returned as values, as `SSHPool.run` does.
    """
    limiter = anyio.CapacityLimiter(limit or max(1, len(hosts)))
    results: dict[str, T] = {}

    async def one(host: str) -> None:
        async with limiter:
            results[host] = await work(host)

    async with anyio.create_task_group() as tg:
        for host in hosts:
            tg.start_soon(one, host)
    return {h: results[h] for h in hosts}


async def run_on_hosts(
    pool: HostRunner,
    hosts: Sequence[str],
    command: Command | Callable[[str], Command],
    *,
    timeout: float | None = None,
    input: str | None = None,
    env: dict[str, str] | None = None,
    label: str | None = None,
    limit: int | None = None,
) -> dict[str, HostResult]:
    """The same command (or one built per host) on every host, concurrently,
    through the runner's `run_many`: at most `limit` at once (by default the
    runner's bound: an SSHPool's `concurrency.hosts`; worker processes each
    their share of it). Results in host order."""
    commands = {h: command(h) if callable(command) else command for h in hosts}
    return await pool.run_many(
        commands, timeout=timeout, input=input, env=env, label=label, limit=limit
    )
