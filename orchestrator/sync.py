"""A blocking facade over the async `Cluster`, for pytest and plain scripts.

The async `Cluster` lives on an event loop in a helper thread (an anyio
blocking portal), so its connections stay open across calls.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from orchestrator.api import Cluster
from orchestrator.config import ClusterConfig
from orchestrator.events import EventSink
from orchestrator.results import HostResult


class SyncCluster:
    """Same methods as `Cluster`, blocking."""

    def __init__(self, portal: BlockingPortal, cluster: Cluster) -> None:
        self._portal = portal
        self._cluster = cluster

    @classmethod
    @contextmanager
    def open(
        cls, path: str | Path | ClusterConfig, *, sink: EventSink | None = None
    ) -> Iterator[SyncCluster]:
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(Cluster.open(path, sink=sink)) as cluster,
        ):
            yield cls(portal, cluster)

    @property
    def config(self) -> ClusterConfig:
        return self._cluster.config

    @property
    def hosts(self) -> list[str]:
        return self._cluster.hosts

    def exec(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None = None,
        timeout: float | None = None,
        host_os: bool = False,
        env: dict[str, str] | None = None,
    ) -> dict[str, HostResult]:
        return self._portal.call(
            lambda: self._cluster.exec(
                command, hosts=hosts, timeout=timeout, host_os=host_os, env=env
            )
        )

    def up(self, **kwargs: Any) -> Any:
        return self._portal.call(lambda: self._cluster.up(**kwargs))

    def down(self, **kwargs: Any) -> Any:
        return self._portal.call(lambda: self._cluster.down(**kwargs))

    def status(self) -> Any:
        return self._portal.call(self._cluster.status)
