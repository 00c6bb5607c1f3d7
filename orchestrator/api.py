"""The Python API; the CLI and the pytest plugin are thin layers over it.

    async with Cluster.open("cluster.yaml") as cluster:
        await cluster.up()
        results = await cluster.exec(["hostname"])

One `Cluster` holds one SSH connection per host for its whole life.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from orchestrator.config import (
    ClusterConfig,
    GPURequest,
    container_name,
    load_cluster,
    sshd_wanted,
)
from orchestrator.config.hostlist import SelectionError, abbreviate_hosts
from orchestrator.config.hostlist import select_hosts as _select
from orchestrator.containers.copy import Payload, Progress, copy_to_hosts, gather_from_hosts
from orchestrator.containers.docker import normalize_image_id
from orchestrator.containers.exec import NOT_RUNNING_EXIT, container_command
from orchestrator.containers.status import HostStatus, host_status
from orchestrator.errors import CvsError, UsageError
from orchestrator.errors import HostSelectionError as HostSelectionError
from orchestrator.events import EventSink, Message, NullSink
from orchestrator.limits.gpus import guard_visible_devices
from orchestrator.limits.resources import EffectiveResources
from orchestrator.remote.runtime import ContainerRuntime, DockerRuntime
from orchestrator.results import HostResult, exit_code_for
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.transport import SSHPool

if TYPE_CHECKING:
    from orchestrator.containers.lifecycle import Lifecycle, UpReport
    from orchestrator.containers.locks import HostLocks
    from orchestrator.containers.plan import Plan


_IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


def select_hosts(cluster: ClusterConfig, pattern: str | None) -> list[str]:
    """Hosts picked by a comma-separated list of names, hostlists (`node[1-3,7]`),
    globs (only parts with `*` or `?`), `head` and `all`, in cluster order.

    Hostlists are expanded first and matched exactly (`config.hostlist.select_hosts`).
    Raises HostSelectionError (exit 2) naming the part that does not fit.
    """
    names = [h.name for h in cluster.hosts]
    try:
        return _select(names, pattern, head=cluster.head_host.name)
    except SelectionError as exc:
        raise HostSelectionError(
            f"--hosts {pattern!r}: {exc} (hosts: {abbreviate_hosts(names)})"
        ) from None


class UpFailed(CvsError):
    """`up` finished but some host did not reach the ready state.

    Carries the full `UpReport` (`.report`); the message names each failed
    host and the step it failed at. Its exit code is the report's (1, or 3
    when a host was unreachable).
    """

    def __init__(self, report: UpReport) -> None:
        self.report = report
        self.exit_code = report.exit_code
        failed = {h: o for h, o in report.outcomes.items() if not o.ok}
        reasons = "; ".join(
            f"{h}: {(o.error or 'failed').splitlines()[0]}" for h, o in failed.items()
        )
        super().__init__(
            f"up failed on {len(failed)} of {len(report.outcomes)} hosts ({reasons}); "
            "the report is on this error's `.report`"
        )


class ExecFailed(CvsError):
    """`exec(..., raise_on_failure=True)` and the command did not succeed on every host.

    `.results` holds every host's `HostResult`; the exit code is what
    `exit_code_for` says for them (1 failed, 3 unreachable).
    """

    def __init__(self, results: dict[str, HostResult]) -> None:
        self.results = results
        self.exit_code = exit_code_for(list(results.values()))
        failed = {h: r for h, r in results.items() if not r.ok}
        reasons = "; ".join(
            f"{h}: {r.status}"
            + (f" (exit {r.exit_code})" if r.exit_code not in (None, 0) else "")
            + (f": {r.error.splitlines()[0]}" if r.error else "")
            for h, r in failed.items()
        )
        super().__init__(f"command failed on {len(failed)} of {len(results)} hosts: {reasons}")


class Cluster:
    """A loaded cluster file plus its live connections."""

    def __init__(self, config: ClusterConfig, pool: SSHPool, sink: EventSink) -> None:
        self.config = config
        self.pool = pool
        self.sink = sink
        # The per-host locks this Cluster holds: shared from a successful
        # `up` until `down` or close (the containers are in use meanwhile).
        self._locks: HostLocks | None = None
        self._invocation: str | None = None
        # What a waiting invocation is told this one is doing (e.g. "run SUITE").
        self.purpose = "up"

    @classmethod
    @asynccontextmanager
    async def open(
        cls, path: str | Path | ClusterConfig, *, sink: EventSink | None = None
    ) -> AsyncIterator[Cluster]:
        """Load the cluster file (or take a loaded config); close every connection on exit."""
        config = path if isinstance(path, ClusterConfig) else load_cluster(path)
        sink = sink or NullSink()
        async with SSHPool(config, sink) as pool:
            cluster = cls(config, pool, sink)
            try:
                yield cluster
            finally:
                await cluster.release_locks()

    async def release_locks(self) -> None:
        """Let go of the hosts' locks (closing the Cluster does it too)."""
        if self._locks is not None:
            await self._locks.release()

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.config.hosts]

    def _lifecycle(self) -> Lifecycle:
        """The container lifecycle (needs a `container` block)."""
        from orchestrator.containers.lifecycle import Lifecycle, host_locks, new_invocation_id

        if self.config.container is None:
            raise UsageError(
                f"{self.config.source or 'the cluster file'}: no `container` block: "
                "add one (image, lifetime) to manage containers"
            )
        if self._locks is None:
            self._locks = host_locks(self.config, self.pool, self.sink)
            self._invocation = new_invocation_id()
        lifecycle = Lifecycle(
            self.config, self.pool, self.sink, locks=self._locks, invocation=self._invocation
        )
        lifecycle.purpose = self.purpose
        return lifecycle

    async def plan(
        self, *, force: bool = False, reprovision: bool = False, adopt: bool = False
    ) -> Plan:
        """What `up` would do on each host (nothing is changed, nothing locked)."""
        lc = self._lifecycle()
        return lc.decide(await lc.probe_all(), force=force, reprovision=reprovision, adopt=adopt)

    async def up(
        self,
        *,
        force: bool = False,
        reprovision: bool = False,
        check: bool = True,
        adopt: bool = False,
        wait: bool = True,
    ) -> UpReport:
        """Bring containers to the state the lifetime policy asks for.

        Raises `PolicyRefused` (nothing changed on any host) when the policy
        or image identity forbids it, or when another invocation holds a
        host's lock and `wait` is False; and `UpFailed` (carrying the report)
        when some host did not end ready, unless `check=False`: then the
        report comes back either way and the caller inspects `report.ok`.
        `adopt` (persistent): take over running same-named containers cvs did
        not start instead of refusing them.
        Afterwards this Cluster holds every host's lock shared (other runs may
        share the containers, nothing may replace them) until `down()` or close.
        """
        lifecycle = self._lifecycle()
        self._guard_gpu_env(dict(lifecycle.cfg.env))  # warns; run_argv drops them
        report = await lifecycle.up(force=force, reprovision=reprovision, adopt=adopt, wait=wait)
        if check and not report.ok:
            raise UpFailed(report)
        return report

    async def down(
        self, *, force: bool = False, wait: bool = True, own_only: bool = False
    ) -> tuple[Plan, dict[str, HostResult]]:
        """Remove containers per the lifetime (`force` removes persistent ones too).

        `own_only` removes only containers this Cluster's `up` started.
        """
        return await self._lifecycle().down(force=force, wait=wait, own_only=own_only)

    @property
    def docker_runtimes(self) -> Mapping[str, DockerRuntime]:
        """How to reach docker on each host whose container this Cluster's `up`
        left running (probed under the lock it still holds). A host missing
        here is not known: the host decides on each command, by the same rule
        (remote/access.sh) — `docker_runtimes.get(host, DockerRuntime())`."""
        if self._locks is None:
            return MappingProxyType({})
        return MappingProxyType(dict(self._locks.ready))

    @property
    def runtimes(self) -> Mapping[str, ContainerRuntime]:
        """How to reach the runtime on every host: as this Cluster's `up` probed
        it, else the cluster's runtime (container.runtime) for the host to find."""
        cfg = self.config.container
        unprobed = (
            ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
            if cfg is not None
            else ContainerRuntime()
        )
        known = self.docker_runtimes
        return MappingProxyType({h: known.get(h, unprobed) for h in self.hosts})

    async def copy_to(
        self,
        payload: Payload,
        dest: str,
        *,
        hosts: Sequence[str] | None = None,
        host_os: bool = False,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HostResult]:
        """Copy `payload` (a file, or a directory as one tar stream) to `dest` on
        every selected host at once, into the container unless `host_os`; each
        host's copy is checked by sha256 (containers/copy.py)."""
        return await copy_to_hosts(
            self.pool,
            self.config,
            payload,
            dest,
            hosts=list(hosts or self.hosts),
            host_os=host_os,
            timeout=timeout,
            progress=progress,
            runtimes=self.docker_runtimes,
        )

    async def copy_from(
        self,
        src: str,
        dest_dir: Path,
        *,
        hosts: Sequence[str] | None = None,
        host_os: bool = False,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HostResult]:
        """Fetch the file `src` from every selected host into `dest_dir/<host>/`."""
        return await gather_from_hosts(
            self.pool,
            self.config,
            src,
            dest_dir,
            hosts=list(hosts or self.hosts),
            host_os=host_os,
            timeout=timeout,
            progress=progress,
        )

    async def container_image_ids(self) -> dict[str, str]:
        """host -> the image ID its container runs; hosts not read are left out."""
        name = container_name(self.config)
        inspect = ["inspect", "--type", "container", "-f", "{{.Image}}", name]

        async def one(host: str) -> HostResult:
            return await self.pool.run(
                host,
                self.runtimes[host].read(inspect),
                timeout=30,
                stream_output=False,
                label="image",
            )

        results = await fan_out(self.hosts, one, limit=self.config.concurrency.hosts)
        ids = {h: normalize_image_id(r.stdout.strip()) for h, r in results.items() if r.ok}
        return {h: i for h, i in ids.items() if _IMAGE_ID_RE.fullmatch(i)}

    async def status(self) -> list[HostStatus]:
        """One typed record per host: reachability, docker access, container state,
        image and tag IDs, sshd, provisioning, effective limits and drift."""
        lc = self._lifecycle()
        states = await lc.probe_all()
        script_sha256 = lc.script().sha256
        wanted = sshd_wanted(self.config.container, len(self.config.hosts))
        rows = []
        for host, state in states.items():
            resources: EffectiveResources | ValueError
            try:
                resources = lc.resources(host)
            except ValueError as exc:
                resources = exc
            rows.append(
                host_status(
                    state,
                    resources=resources,
                    sshd_wanted=wanted,
                    script_sha256=script_sha256,
                    config_hash=lc.hash,
                )
            )
        return rows

    def _guard_gpu_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` minus visible-devices variables that could widen the GPU subset
        cvs selected (`limits.gpus.guard_visible_devices`); a warning for each."""
        container = self.config.container
        if container is None:
            return env
        request = container.gpus
        count = request.count if isinstance(request, GPURequest) else None
        kept, warnings = guard_visible_devices(env, request, count=count)
        for text in warnings:
            self.sink.emit(Message(level="warning", text=text))
        return kept

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None = None,
        timeout: float | None = None,
        host_os: bool = False,
        env: dict[str, str] | None = None,
        user: str | None = None,
        workdir: str | None = None,
        raise_on_failure: bool = False,
        wait: bool = True,
    ) -> dict[str, HostResult]:
        """Run a command on every selected host: inside the container when the
        cluster has a container block (and `host_os` is not set), else on the
        host. A string is shell text; a list is argv.

        In the container it runs as `user` (default `container.user`, else the
        image's USER) in `workdir` (default: the image's WORKDIR); on the host
        both are refused (the login user runs it in its home).

        Results are per host and never raise for a host's failure, unless
        `raise_on_failure=True`: then `ExecFailed` (carrying every result)
        is raised when any host did not succeed.

        In the containers it holds each host's lock shared for the duration
        (the one `up` left, else its own), so nothing replaces them meanwhile.
        """
        results = await self._exec(
            command,
            hosts=hosts,
            timeout=timeout,
            host_os=host_os,
            env=env,
            user=user,
            workdir=workdir,
            wait=wait,
        )
        if raise_on_failure and not all(r.ok for r in results.values()):
            raise ExecFailed(results)
        return results

    async def _exec(
        self,
        command: str | Sequence[str],
        *,
        hosts: Sequence[str] | None,
        timeout: float | None,
        host_os: bool,
        env: dict[str, str] | None,
        user: str | None,
        workdir: str | None,
        wait: bool = True,
    ) -> dict[str, HostResult]:
        selected = list(hosts or self.hosts)
        on_host = host_os or self.config.container is None
        if on_host and (user is not None or workdir is not None):
            raise UsageError(
                "exec: user and workdir apply inside the container; on the host the "
                "SSH login user runs the command (use `cd DIR && ...` in the command)"
            )
        if on_host:
            return await fan_out(
                selected,
                lambda h: self.pool.run(h, command, timeout=timeout, env=env, label="exec"),
                limit=self.config.concurrency.hosts,
            )
        name = container_name(self.config)
        container_env = self._guard_gpu_env({**self.config.env, **(env or {})})
        container = self.config.container
        as_user = user if user is not None or container is None else container.user
        try:
            container_command(name, "true", user=as_user, workdir=workdir)
        except ValueError as exc:
            raise UsageError(f"exec: {exc}") from None
        lifecycle = self._lifecycle()
        locks = lifecycle.locks
        own_lock = not locks.holds(selected)
        if own_lock:
            await locks.acquire(selected, "shared", wait=wait, purpose="exec")

        async def one(host: str) -> HostResult:
            script, kill, stdin = container_command(
                name,
                command,
                env=container_env,
                user=as_user,
                workdir=workdir,
                # Known running (this Cluster's `up`, under the lock it holds):
                # no separate running check on the host.
                runtime=locks.ready.get(host) or self.runtimes[host],
            )
            result = await self.pool.run(
                host, script, timeout=timeout, input=stdin, label="exec", on_timeout=lambda: kill
            )
            if result.exit_code == NOT_RUNNING_EXIT and result.stderr.startswith("container "):
                return replace(result, error=result.stderr.strip())
            return result

        try:
            return await fan_out(selected, one, limit=self.config.concurrency.hosts)
        finally:
            if own_lock:
                await locks.release(selected)
