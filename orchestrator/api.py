"""The Python API; the CLI and the pytest plugin are thin layers over it.

    async with Cluster.open("cluster.yaml") as cluster:
        await cluster.up()
        results = await cluster.exec(["hostname"])

One `Cluster` holds one SSH connection per host for its whole life.
"""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from .config import ClusterConfig, load_cluster
from .events import EventSink, NullSink
from .fanout import run_on_hosts
from .results import HostResult
from .transport import SSHPool


class HostSelectionError(ValueError):
    """A `--hosts` pattern matched no host of the cluster."""


def select_hosts(cluster: ClusterConfig, pattern: str | None) -> list[str]:
    """Hosts matching a comma-separated list of names or glob patterns (`node[12]`, `gpu*`).

    `head` names the head host. None or `all` selects every host.
    """
    names = [h.name for h in cluster.hosts]
    if pattern is None or pattern in ("", "all"):
        return names
    chosen: list[str] = []
    for part in pattern.split(","):
        part = part.strip()
        if part == "head":
            matched = [cluster.head_host.name]
        else:
            matched = [n for n in names if n == part or fnmatch.fnmatchcase(n, part)]
            if not matched:
                try:
                    from .hostlist import expand_hostlist

                    expanded = set(expand_hostlist(part))
                    matched = [n for n in names if n in expanded]
                except Exception:
                    matched = []
        if not matched:
            raise HostSelectionError(
                f"--hosts {pattern!r}: {part!r} matches no host (hosts: {', '.join(names[:8])}"
                f"{', ...' if len(names) > 8 else ''})"
            )
        chosen.extend(n for n in matched if n not in chosen)
    return [n for n in names if n in chosen]


class Cluster:
    """A loaded cluster file plus its live connections."""

    def __init__(self, config: ClusterConfig, pool: SSHPool, sink: EventSink) -> None:
        self.config = config
        self.pool = pool
        self.sink = sink

    @classmethod
    @asynccontextmanager
    async def open(
        cls, path: str | Path | ClusterConfig, *, sink: EventSink | None = None
    ) -> AsyncIterator[Cluster]:
        """Load the cluster file (or take a loaded config); close every connection on exit."""
        config = path if isinstance(path, ClusterConfig) else load_cluster(path)
        sink = sink or NullSink()
        async with SSHPool(config, sink) as pool:
            yield cls(config, pool, sink)

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.config.hosts]

    async def exec_host_os(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, HostResult]:
        """Run a command on the hosts' own OS (not in the container)."""
        return await run_on_hosts(
            self.pool, list(hosts or self.hosts), command, timeout=timeout, label="exec"
        )

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None = None,
        timeout: float | None = None,
        host_os: bool = False,
    ) -> dict[str, HostResult]:
        """Run a command on every selected host (container support: see `exec_in_container`)."""
        return await self.exec_host_os(command, hosts=hosts, timeout=timeout)
