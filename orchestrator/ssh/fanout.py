"""Run one coroutine per host under a task group; collect per-host outcomes.

Each host's work runs as its own pipeline: a slow host delays only itself.
The only fleet-wide wait is the final join.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from orchestrator.results import HostResult
from orchestrator.ssh.seam import Command, HostRunner
from orchestrator.ssh.transport import SSHPool

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
    """The same command (or one built per host) on every host, concurrently:
    at most `limit` at once (an SSHPool's default: its cluster's
    `concurrency.hosts`).

    Past a fleet size where it pays, in worker processes, one per core
    (ssh/workers.py): the same events and results, in host order."""
    fleet = None
    # One host never starts workers (workers.worker_count), and a fleet this
    # pool started for an earlier fan-out exists only once ssh.workers is
    # imported: `cvs exec` on one host does not import it (pickle, tempfile).
    if len(hosts) > 1 or "orchestrator.ssh.workers" in sys.modules:
        from orchestrator.ssh.workers import fleet_for

        fleet = await fleet_for(pool, hosts)
    if fleet is not None:
        commands = {h: command(h) if callable(command) else command for h in hosts}
        results = await fleet.run(commands, timeout=timeout, input=input, env=env, label=label)
        return {h: results[h] for h in hosts}
    if limit is None and isinstance(pool, SSHPool):
        limit = pool.cluster.concurrency.hosts

    async def work(host: str) -> HostResult:
        cmd = command(host) if callable(command) else command
        return await pool.run(host, cmd, timeout=timeout, input=input, env=env, label=label)

    return await fan_out(hosts, work, limit=limit)
