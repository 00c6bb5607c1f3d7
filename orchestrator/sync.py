"""A blocking facade over the async `Cluster`, for pytest and plain scripts.

The async `Cluster` lives on an event loop in a helper thread (an anyio
blocking portal), so its connections stay open across calls. Every public
method of `Cluster` has a blocking twin here with the same signature
(tests/test_layout.py compares them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from anyio.from_thread import BlockingPortal, start_blocking_portal

from orchestrator.api import Cluster
from orchestrator.config import ClusterConfig
from orchestrator.containers.copy import Payload, Progress
from orchestrator.containers.status import HostStatus
from orchestrator.events import EventSink
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.stdin import RawOutput

if TYPE_CHECKING:
    from orchestrator.containers.jobleft import Verdict
    from orchestrator.containers.mpi import MPICheck
    from orchestrator.containers.outcome import UpReport
    from orchestrator.containers.plan.model import Plan
    from orchestrator.containers.sshexec import SSHExec


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
        """Load the cluster file (or take a loaded config); close every connection on exit."""
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

    def plan(
        self,
        *,
        force: bool = False,
        reprovision: bool = False,
        adopt: bool = False,
        only: Sequence[str] | None = None,
        heal: bool = False,
    ) -> Plan:
        """What `up` would do on each host, or on the hosts `only` (nothing is
        changed, nothing locked)."""
        return self._portal.call(
            lambda: self._cluster.plan(
                force=force, reprovision=reprovision, adopt=adopt, only=only, heal=heal
            )
        )

    def up(
        self,
        *,
        force: bool = False,
        reprovision: bool = False,
        check: bool = True,
        adopt: bool = False,
        wait: bool = True,
        only: Sequence[str] | None = None,
        heal: bool = False,
    ) -> UpReport:
        """Bring containers to the state the lifetime policy asks for (see `Cluster.up`:
        raises `UpFailed` when a host did not end ready, unless `check=False`; `only`:
        act on these hosts, decided over every host)."""
        return self._portal.call(
            lambda: self._cluster.up(
                force=force,
                reprovision=reprovision,
                check=check,
                adopt=adopt,
                wait=wait,
                only=only,
                heal=heal,
            )
        )

    def down(
        self, *, force: bool = False, wait: bool = True, own_only: bool = False
    ) -> tuple[Plan, dict[str, HostResult]]:
        """Remove containers per the lifetime (`force` removes persistent ones too)."""
        return self._portal.call(
            lambda: self._cluster.down(force=force, wait=wait, own_only=own_only)
        )

    def start_sshd(self) -> dict[str, HostResult]:
        """After `up`: make sure each container's sshd runs (see `Cluster.start_sshd`)."""
        return self._portal.call(self._cluster.start_sshd)

    def mpi_check(self, *, need_mpirun: bool = True) -> tuple[MPICheck | None, list[str]]:
        """After `up`: could an MPI launch start from the head? (`Cluster.mpi_check`)."""
        return self._portal.call(lambda: self._cluster.mpi_check(need_mpirun=need_mpirun))

    def release_locks(self) -> None:
        """Let go of the hosts' locks (closing the cluster does it too)."""
        self._portal.call(self._cluster.release_locks)

    def job_containers(self, *, remove: bool = False) -> list[Verdict]:
        """Outside a Slurm job, this cluster's containers of jobs (see
        `Cluster.job_containers`)."""
        return self._portal.call(lambda: self._cluster.job_containers(remove=remove))

    def name_ended_peers(self, results: dict[str, HostResult]) -> dict[str, HostResult]:
        """`results` of a failed MPI job, naming the hosts whose container ended
        meanwhile (see `Cluster.name_ended_peers`)."""
        return self._portal.call(lambda: self._cluster.name_ended_peers(results))

    def status(self) -> list[HostStatus]:
        """One typed record per host (see `Cluster.status`)."""
        return self._portal.call(self._cluster.status)

    @property
    def runtimes(self) -> Mapping[str, ContainerRuntime]:
        """How to reach the runtime on every host (see `Cluster.runtimes`)."""
        return self._cluster.runtimes

    @property
    def ssh_exec(self) -> SSHExec:
        """The containers' sshd path of this Cluster's commands (see
        `Cluster.ssh_exec`; read its counters, call nothing on it from here)."""
        return self._cluster.ssh_exec

    def copy_to(
        self,
        payload: Payload,
        dest: str,
        *,
        hosts: Sequence[str] | None = None,
        host_os: bool = False,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HostResult]:
        """Copy `payload` to `dest` on every selected host (see `Cluster.copy_to`)."""
        return self._portal.call(
            lambda: self._cluster.copy_to(
                payload, dest, hosts=hosts, host_os=host_os, timeout=timeout, progress=progress
            )
        )

    def copy_from(
        self,
        src: str,
        dest_dir: Path,
        *,
        hosts: Sequence[str] | None = None,
        host_os: bool = False,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> dict[str, HostResult]:
        """Fetch `src` from every selected host (see `Cluster.copy_from`)."""
        return self._portal.call(
            lambda: self._cluster.copy_from(
                src, dest_dir, hosts=hosts, host_os=host_os, timeout=timeout, progress=progress
            )
        )

    def container_image_ids(self) -> dict[str, str]:
        """host -> the image ID its container runs (see `Cluster.container_image_ids`)."""
        return self._portal.call(self._cluster.container_image_ids)

    def exec(
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
        stdin: int | None = None,
        raw_output: RawOutput | None = None,
    ) -> dict[str, HostResult]:
        """Run a command on every selected host (see `Cluster.exec`; `raise_on_failure`
        raises `ExecFailed` when any host did not succeed; `stdin`, a file
        descriptor, streamed to every host; `raw_output` takes one host's output
        as bytes)."""
        return self._portal.call(
            lambda: self._cluster.exec(
                command,
                hosts=hosts,
                timeout=timeout,
                host_os=host_os,
                env=env,
                user=user,
                workdir=workdir,
                raise_on_failure=raise_on_failure,
                wait=wait,
                stdin=stdin,
                raw_output=raw_output,
            )
        )
