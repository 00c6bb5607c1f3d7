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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import ClusterConfig, container_name, load_cluster
from orchestrator.containers.docker import LABEL_CONFIG_HASH, container_limits_drift
from orchestrator.containers.exec import NOT_RUNNING_EXIT, container_command
from orchestrator.containers.provision import sshd_wanted
from orchestrator.errors import UsageError
from orchestrator.events import EventSink, NullSink
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.transport import SSHPool

if TYPE_CHECKING:
    from orchestrator.containers.lifecycle import Lifecycle, UpReport
    from orchestrator.containers.plan import Plan


class HostSelectionError(UsageError, ValueError):
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
                    from orchestrator.config.hostlist import expand_hostlist

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

    def lifecycle(self) -> Lifecycle:
        """The container lifecycle (needs a `container` block)."""
        from orchestrator.containers.lifecycle import Lifecycle

        if self.config.container is None:
            raise UsageError(
                f"{self.config.source or 'the cluster file'}: no `container` block: "
                "add one (image, lifetime) to manage containers"
            )
        return Lifecycle(self.config, self.pool, self.sink)

    async def plan(self, *, force: bool = False, reprovision: bool = False) -> Plan:
        """What `up` would do on each host (nothing is changed, nothing locked)."""
        lc = self.lifecycle()
        return lc.decide(await lc.probe_all(), force=force, reprovision=reprovision)

    async def up(self, *, force: bool = False, reprovision: bool = False) -> UpReport:
        """Bring containers to the state the lifetime policy asks for.

        Raises `PolicyRefused` (nothing changed on any host) when the policy
        or image identity forbids it.
        """
        return await self.lifecycle().up(force=force, reprovision=reprovision)

    async def down(self, *, force: bool = False) -> tuple[Plan, dict[str, HostResult]]:
        """Remove containers per the lifetime (`force` removes persistent ones too)."""
        return await self.lifecycle().down(force=force)

    async def status(self) -> list[dict[str, Any]]:
        """One row per host: reachability, docker access, container, image, sshd, drift."""
        lc = self.lifecycle()
        states = await lc.probe_all()
        script = lc.script()
        rows = []
        for host, st in states.items():
            drift: list[str] = []
            limits: dict[str, str] = {}
            try:
                eff = lc.resources(host)
                limits = eff.describe()
                drift += container_limits_drift(eff, st.host_config)
            except ValueError as exc:
                drift.append(str(exc))
            if st.labels.get(LABEL_CONFIG_HASH) not in (None, lc.hash):
                drift.append("container block changed since start")
            stale = (
                st.container_image_id is not None
                and st.tag_image_id is not None
                and st.container_image_id != st.tag_image_id
            )
            rows.append(
                {
                    "host": host,
                    "reachable": st.reachable,
                    "docker": st.docker_access or "?",
                    "state": st.container or "unknown",
                    "image": _short(st.container_image_id),
                    "tag": _short(st.tag_image_id),
                    "stale": stale,
                    "sshd": _sshd_column(st.sshd_listening, wanted=sshd_wanted(self.config)),
                    "provisioned": _provisioned(st.provision_marker, script.sha256),
                    "limits": limits,
                    "drift": drift,
                    "error": st.error,
                }
            )
        return rows

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None = None,
        timeout: float | None = None,
        host_os: bool = False,
        env: dict[str, str] | None = None,
    ) -> dict[str, HostResult]:
        """Run a command on every selected host: inside the container when the
        cluster has a container block (and `host_os` is not set), else on the
        host. A string is shell text; a list is argv."""
        selected = list(hosts or self.hosts)
        if host_os or self.config.container is None:
            return await fan_out(
                selected,
                lambda h: self.pool.run(h, command, timeout=timeout, env=env, label="exec"),
                limit=self.config.concurrency.hosts,
            )
        name = container_name(self.config)
        container_env = {**self.config.env, **(env or {})}

        async def one(host: str) -> HostResult:
            script, kill = container_command(name, command, env=container_env)
            result = await self.pool.run(
                host, script, timeout=timeout, label="exec", on_timeout=lambda: kill
            )
            if result.exit_code == NOT_RUNNING_EXIT and result.stderr.startswith("container "):
                return replace(result, error=result.stderr.strip())
            return result

        return await fan_out(selected, one, limit=self.config.concurrency.hosts)


def _short(image_id: str | None) -> str:
    if not image_id:
        return "-"
    return image_id.removeprefix("sha256:")[:12]


def _sshd_column(listening: bool | None, *, wanted: bool) -> str:
    if listening:
        return "listening"
    if not wanted:
        return "off"
    return "down" if listening is False else "-"


def _provisioned(marker: str | None, wanted: str) -> str:
    if marker is None:
        return "no"
    return "yes" if marker == wanted else f"other script ({marker[:12]})"
