"""The Python API; the CLI and the pytest plugin are thin layers over it.

    async with Cluster.open("cluster.yaml") as cluster:
        await cluster.up()
        results = await cluster.exec(["hostname"])

One `Cluster` holds one SSH connection per host for its whole life.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

from orchestrator.config import (
    ClusterConfig,
    GPURequest,
    cluster_identity,
    container_name,
    load_cluster,
    sshd_wanted,
)
from orchestrator.config.selection import select_hosts as select_hosts
from orchestrator.config.slurm import job_state
from orchestrator.containers.exec import (
    NOT_RUNNING_EXIT,
    container_command,
    kill_command,
    launches_mpi,
    pidfile_of,
)
from orchestrator.containers.invocation import Invocation
from orchestrator.containers.route import Sshd
from orchestrator.errors import CvsError, Phrase, Text, UsageError, first_line, join_text
from orchestrator.errors import HostSelectionError as HostSelectionError
from orchestrator.events import EventSink, Message, NullSink
from orchestrator.results import HostResult, exit_code_for
from orchestrator.ssh.fanout import fan_out, run_on_hosts
from orchestrator.ssh.keys import ClusterKeys, default_state_dir
from orchestrator.ssh.seam import HostRunner, Request
from orchestrator.ssh.stdin import ExecIO, RawOutput
from orchestrator.ssh.streams import ExecStreams
from orchestrator.ssh.transport import SSHPool

# Lifetimes whose containers inside a job are named for it (config/views.py).
JOB_SCOPED = ("per_run", "per_job")

if TYPE_CHECKING:
    # Imported at the operations that use them (the public methods, and the
    # few private gates tests/test_code_shape.py lists): `cvs exec` needs none
    # of copy, probe, status or drift, and `cvs exec --host-os` none of
    # causes, argv, limits or remote.runtime either (tests/test_startup.py).
    from orchestrator.containers.copy import Payload, Progress
    from orchestrator.containers.jobleft import Verdict
    from orchestrator.containers.lifecycle import Lifecycle
    from orchestrator.containers.locks import HostLocks
    from orchestrator.containers.mpi import MPICheck
    from orchestrator.containers.outcome import UpReport
    from orchestrator.containers.plan.model import Plan
    from orchestrator.containers.probe import HostState
    from orchestrator.containers.sshexec import SSHExec
    from orchestrator.containers.status import HostStatus
    from orchestrator.remote.runtime import ContainerRuntime
    from orchestrator.ssh.workers.runner import WorkerRunner


_IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


class UpFailed(CvsError):
    """`up` finished but some host did not reach the ready state.

    Carries the full `UpReport` (`.report`); the message names each failed
    host and the step it failed at. Its exit code is the report's (1, or 3
    when a host was unreachable).
    """

    def __init__(self, report: UpReport) -> None:
        self.report = report
        self.exit_code = report.exit_code
        not_ready = {h: o for h, o in report.outcomes.items() if not o.ok}
        # Hosts that failed on their own, apart from those only a rollback
        # undid (their containers were removed because another host failed).
        rolled = [h for h, o in not_ready.items() if o.state == "rolled_back"]
        failed = {h: o for h, o in not_ready.items() if h not in rolled}
        reasons = join_text(
            "; ", (Phrase(f"{h}: ", first_line(o.error or "failed")) for h, o in failed.items())
        )
        undone = f"; rolled back on {', '.join(rolled)}" if rolled else ""
        super().__init__(
            Phrase(
                f"up failed on {len(failed)} of {len(report.outcomes)} hosts (",
                reasons,
                f"){undone}; {len(report.ready)}/{len(report.outcomes)} hosts ready; "
                "the report is on this error's `.report`",
            )
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
        reasons = join_text(
            "; ",
            (
                Phrase(
                    f"{h}: {r.status}",
                    f" (exit {r.exit_code})" if r.exit_code not in (None, 0) else "",
                    *((": ", first_line(r.error)) if r.error else ()),
                )
                for h, r in failed.items()
            ),
        )
        super().__init__(
            Phrase(f"command failed on {len(failed)} of {len(results)} hosts: ", reasons)
        )


def not_ready_result(host: str, state: HostState, name: str) -> HostResult:
    """What `exec` reports, without running anything, for a host whose probe
    (under the lock) found no running container or could not tell."""
    if not state.reachable:
        return HostResult(host, "unreachable", error=state.error or "unreachable")
    if not state.known:
        # Docker down, hung, no access: the host is reached, the command not run.
        return HostResult(host, "failed", error=state.error or "the container state is unknown")
    what = state.container_status or state.container or "absent"
    text = f"container {name} is not running on {host} ({what})"
    return HostResult(host, "failed", exit_code=NOT_RUNNING_EXIT, stderr=text + "\n", error=text)


def _runner(config: ClusterConfig, sink: EventSink) -> AbstractAsyncContextManager[HostRunner]:
    """How this invocation reaches its hosts: one `SSHPool` in this process, or,
    past a fleet size where it pays (ssh/workers/parent.py, `planned_workers`), worker
    processes sharing the hosts (ssh/workers/runner.py)."""
    if len(config.hosts) < 2:
        # workers.worker_count: one host is one process whatever is set;
        # `cvs exec` on one host imports no ssh.workers (pickle, the frames:
        # tests/test_startup.py), so they are imported here, past that test.
        return SSHPool(config, sink)
    from orchestrator.ssh.workers.parent import planned_workers

    count = planned_workers(config, len(config.hosts))
    if count < 2:
        return SSHPool(config, sink)
    from orchestrator.ssh.workers.runner import WorkerRunner

    return WorkerRunner(config, sink, workers=count)


class Cluster:
    """A loaded cluster file plus its live connections."""

    def __init__(self, config: ClusterConfig, pool: HostRunner, sink: EventSink) -> None:
        self.config = config
        self.pool = pool
        self.sink = sink
        # The per-host locks this Cluster holds: shared from a successful
        # `up` until `down` or close (the containers are in use meanwhile).
        self._locks: HostLocks | None = None
        # This invocation's id and probed facts (containers/invocation.py).
        self._invocation = Invocation()
        # What a waiting invocation is told this one is doing (e.g. "run SUITE").
        self.purpose = "up"
        # Commands in the containers through their sshd (containers/sshexec.py).
        self._ssh_exec: SSHExec | None = None
        # What this invocation's commands' pidfiles start with: the lock
        # holders' guard ends them all (remote/kill_tree.sh --session).
        self._session = secrets.token_hex(4)

    @classmethod
    @asynccontextmanager
    async def open(
        cls, path: str | Path | ClusterConfig, *, sink: EventSink | None = None
    ) -> AsyncIterator[Cluster]:
        """Load the cluster file (or take a loaded config); close every connection on exit."""
        config = path if isinstance(path, ClusterConfig) else load_cluster(path)
        sink = sink or NullSink()
        async with _runner(config, sink) as pool:
            cluster = cls(config, pool, sink)
            try:
                yield cluster
            finally:
                if cluster._ssh_exec is not None:
                    await cluster._ssh_exec.aclose()
                await cluster.release_locks()

    async def release_locks(self) -> None:
        """Let go of the hosts' locks (closing the Cluster does it too)."""
        if self._locks is not None:
            await self._locks.release()

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.config.hosts]

    def _lifecycle(self) -> Lifecycle:
        """The container lifecycle (needs a `container` block); the first one
        makes the locks this Cluster holds from then on."""
        # The gate of every operation on containers (up, down, plan, status,
        # exec's lock): `cvs exec --host-os` loads no lifecycle, locks or
        # probe (tests/test_startup.py).
        from orchestrator.containers.lifecycle import Lifecycle

        if self.config.container is None:
            raise UsageError(
                f"{self.config.source or 'the cluster file'}: no `container` block: "
                "add one (image, lifetime) to manage containers"
            )
        lifecycle = Lifecycle(
            self.config, self.pool, self.sink, locks=self._locks, invocation=self._invocation
        )
        self._locks = lifecycle.locks
        lifecycle.purpose = self.purpose
        return lifecycle

    async def plan(
        self,
        *,
        force: bool = False,
        reprovision: bool = False,
        adopt: bool = False,
        only: Sequence[str] | None = None,
        heal: bool = False,
    ) -> Plan:
        """What `up` would do on each host, or on the hosts `only` (decided
        over every host, as `up(only=...)` does); nothing is changed, nothing
        locked."""
        lc = self._lifecycle()
        return lc.decide_for(await lc.probe_all(), only, force, reprovision, adopt, heal)

    async def up(
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
        """Bring containers to the state the lifetime policy asks for (on
        every host, or on the hosts `only`: the plan is still decided over
        every host, so a subset never makes what the whole would refuse).
        `heal` (persistent): start the container where it is missing while
        every other host runs it, from the same image, instead of refusing.

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
        # The containers' sshd connections open while the probe runs.
        self.ssh_exec.warm_up(self.hosts)
        report = await lifecycle.up(
            force=force, reprovision=reprovision, adopt=adopt, wait=wait, only=only, heal=heal
        )
        for host, outcome in report.outcomes.items():
            state = self._invocation.states.get(host)
            if outcome.ok and outcome.action.kind == "attach" and state is not None:
                # Attached: the probe's inspect holds what commands through the
                # container's sshd need; no inspect of their own.
                self.ssh_exec.known(host, state.exec_facts)
        if check and not report.ok:
            raise UpFailed(report)
        return report

    async def mpi_check(self, *, need_mpirun: bool = True) -> tuple[MPICheck | None, list[str]]:
        """After `up`: could an MPI launch start from the head's container?
        One exec there (remote/mpi_check.sh): `mpirun` on the PATH (with
        `need_mpirun`), every peer's container sshd answering `ssh PEER true`
        with the expected host key (all at once, each within
        ssh.connect_timeout), and the hostfile cvs wrote. Returns what was
        found and one line per problem (none: go ahead)."""
        from orchestrator.containers import mpi
        from orchestrator.containers.provision import mpi_check_argv, mpi_check_bound

        container = self.config.container
        if container is None:
            return None, ["an mpi step runs in the head's container: the cluster has none"]
        head = self.config.head_host.name
        ready = self._invocation.ready
        if head not in ready:
            return None, [f"{head}: the head's container is not up (up first)"]
        per_peer, bound = mpi_check_bound(self.config)
        # Peers only where cvs runs the containers' sshd: otherwise how ranks
        # reach each other is the image's business.
        wanted = sshd_wanted(container, len(self.config.hosts)) and container.network == "host"
        peers = mpi.mpi_order(self.config)[1:] if wanted else []
        argv = mpi_check_argv(
            ready[head].prefix,
            container_name(self.config),
            per_peer,
            container.mpi.hostfile,
            peers,
            need_mpirun=need_mpirun,
        )
        r = await self.pool.run(head, argv, timeout=bound, stream_output=False, label="mpi-check")
        if not r.ok:
            why = r.error or r.status
            return None, [f"{head}: the MPI check in its container failed within {bound:g}s: {why}"]
        found = mpi.parse_mpi_check(r.stdout)
        return found, found.problems(container.image, head, per_peer)

    async def start_sshd(self) -> dict[str, HostResult]:
        """After `up`: make sure each container's sshd runs and listens, with the
        cluster's key pair and peer config (idempotent: a live sshd is kept).

        For callers that start sshd only when a workload asks for it (CVS's
        `setup_sshd()`), with `container.sshd.enabled: false` at `up`. A host
        this Cluster's `up` did not leave ready fails with that reason.
        """
        from orchestrator.containers.provision import ensure_sshd

        if self.config.container is None:
            raise UsageError("start_sshd: the cluster has no container block")
        lifecycle = self._lifecycle()
        ready = self._invocation.ready
        keys = ClusterKeys.load_or_create(default_state_dir(self.config), self.hosts)
        name = container_name(self.config)

        async def one(host: str) -> HostResult:
            if host not in ready:
                return HostResult(host, "failed", error="the container is not up here (up first)")
            prefix = ready[host].prefix
            return await ensure_sshd(
                self.pool, host, prefix, name, self.config, keys, lifecycle.gpu_counts
            )

        results = await fan_out(self.hosts, one, limit=self.config.concurrency.hosts)
        if len(self.hosts) < 2 or not all(r.ok for r in results.values()):
            return results
        # As `up` does: every peer's sshd answers the head with the expected key.
        found, problems = await self.mpi_check(need_mpirun=False)
        if found is None:
            head = self.config.head_host.name
            results[head] = replace(results[head], status="failed", error="; ".join(problems))
            return results
        for (peer, _), problem in zip(found.peers_failed, problems, strict=True):
            results[peer] = replace(results[peer], status="failed", error=problem)
        return results

    async def down(
        self, *, force: bool = False, wait: bool = True, own_only: bool = False
    ) -> tuple[Plan, dict[str, HostResult]]:
        """Remove containers per the lifetime (`force` removes persistent ones too).

        `own_only` removes only containers this Cluster's `up` started.
        """
        return await self._lifecycle().down(force=force, wait=wait, own_only=own_only)

    @property
    def ssh_exec(self) -> SSHExec:
        """The containers' sshd path of this Cluster's commands (one connection
        per container, opened on first use, in the pool; `.counters` counts)."""
        if self._ssh_exec is None:
            from orchestrator.containers.sshexec import SSHExec

            # The sshd path's targets go through the pool's seam; the pool
            # (SSHPool or WorkerRunner) owns the containers' connections.
            pool = cast("SSHPool | WorkerRunner", self.pool)
            self._ssh_exec = SSHExec(self.config, pool, self.sink, self._invocation)
        return self._ssh_exec

    @property
    def _probed_runtimes(self) -> Mapping[str, ContainerRuntime]:
        """How to reach the runtime on each host whose container this Cluster's
        `up` left running (probed under the lock it still holds). A host
        missing here is not known: the host decides on each command, by the
        same rule (remote/access.sh)."""
        return MappingProxyType(dict(self._invocation.ready))

    @property
    def runtimes(self) -> Mapping[str, ContainerRuntime]:
        """How to reach the runtime on every host: as this Cluster's `up` probed
        it, else the cluster's runtime (container.runtime) for the host to find."""
        from orchestrator.remote.runtime import ContainerRuntime

        cfg = self.config.container
        unprobed = (
            ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
            if cfg is not None
            else ContainerRuntime()
        )
        known = self._probed_runtimes
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
        host's copy is checked by sha256 (containers/copy.py). In the
        containers it goes through their sshd where `exec` would."""
        from orchestrator.containers.copy import copy_to_hosts

        selected = list(hosts or self.hosts)
        if not host_os:
            self.ssh_exec.warm_up(selected)
        return await copy_to_hosts(
            self.pool,
            self.config,
            payload,
            dest,
            hosts=selected,
            host_os=host_os,
            timeout=timeout,
            progress=progress,
            runtimes=self._probed_runtimes,
            ssh_exec=self.ssh_exec,
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
        """Fetch the file `src` from every selected host into `dest_dir/<host>/`
        (from the containers through their sshd where `exec` would)."""
        from orchestrator.containers.copy import gather_from_hosts

        selected = list(hosts or self.hosts)
        if not host_os:
            self.ssh_exec.warm_up(selected)
        return await gather_from_hosts(
            self.pool,
            self.config,
            src,
            dest_dir,
            hosts=selected,
            host_os=host_os,
            timeout=timeout,
            progress=progress,
            ssh_exec=self.ssh_exec,
        )

    async def container_image_ids(self) -> dict[str, str]:
        """host -> the image ID its container runs; hosts not read are left out."""
        from orchestrator.containers.inspection import normalize_image_id

        name = container_name(self.config)
        inspect = ["inspect", "--type", "container", "-f", "{{.Image}}", name]

        async def one(host: str) -> HostResult:
            return await self.pool.run(
                host,
                self.runtimes[host].read(inspect),
                timeout=self.config.container.runtime_timeout if self.config.container else 30,
                stream_output=False,
                label="image",
            )

        results = await fan_out(self.hosts, one, limit=self.config.concurrency.hosts)
        ids = {h: normalize_image_id(r.stdout.strip()) for h, r in results.items() if r.ok}
        return {h: i for h, i in ids.items() if _IMAGE_ID_RE.fullmatch(i)}

    async def job_containers(self, *, remove: bool = False) -> list[Verdict]:
        """Outside a Slurm job: this cluster's containers that invocations inside
        jobs started (named for their job, so `status` and `down` by name miss
        them), each with its verdict; `remove`: those whose job is over are
        removed, by ID (containers/jobleft.py). [] inside a job, and for
        no_launch and persistent (whose names carry no job)."""
        from orchestrator.containers.jobleft import survey
        from orchestrator.remote.runtime import ContainerRuntime

        cfg = self.config.container
        if self.config.slurm is not None or cfg is None or cfg.lifetime not in JOB_SCOPED:
            return []
        flag = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless).flag
        hosts = [h.name for h in self.config.hosts]
        identity = cluster_identity(self.config)
        return await survey(self.pool, hosts, flag, identity, job_state,
                            timeout=cfg.runtime_timeout, remove=remove)  # fmt: skip

    async def status(self) -> list[HostStatus]:
        """One typed record per host: reachability, docker access, container state,
        image and tag IDs, sshd, provisioning, effective limits and drift."""
        from orchestrator.containers.drift import cluster_expectations
        from orchestrator.containers.status import host_status
        from orchestrator.limits.resources import EffectiveResources

        lc = self._lifecycle()
        states = await lc.probe_all()
        script_sha256 = lc.script().sha256
        wanted = sshd_wanted(self.config.container, len(self.config.hosts))
        # What `up` would give each container, compared the way `up` compares.
        expected = cluster_expectations(self.config, states)
        rows = []
        for host, state in states.items():
            resources: EffectiveResources | ValueError
            if isinstance(expected, ValueError):
                resources = expected
            else:
                resources = expected.get(host, EffectiveResources())
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
        # Only a container's environment is guarded (up, exec in a container):
        # `cvs exec --host-os` loads no limits (tests/test_startup.py).
        from orchestrator.limits.gpus import guard_visible_devices

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
        stdin: int | None = None,
        raw_output: RawOutput | None = None,
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

        `stdin`, a file descriptor: its bytes go to every host's command,
        streamed, the same bytes to each (ClusterShell's convention); None:
        the command's stdin is closed. `raw_output(stream, data)` takes the
        output as bytes, as they came, instead of `OutputLine` events (one
        host: `cvs exec -N`); results keep their tails either way, with the
        bytes that were not text counted (`HostResult.stdout_not_text`).
        """
        if raw_output is not None and len(hosts or self.hosts) != 1:
            raise UsageError("exec: output as bytes (raw_output) is for one host")
        io = ExecStreams(stdin, raw_output, self.pool)
        async with io.feeding():
            results = await self._exec(
                command,
                hosts=hosts,
                timeout=timeout,
                host_os=host_os,
                env=env,
                user=user,
                workdir=workdir,
                wait=wait,
                io=io,
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
        io: ExecStreams | None = None,
    ) -> dict[str, HostResult]:
        selected = list(hosts or self.hosts)
        io = io or ExecStreams(None, None, self.pool)
        io.start(selected)
        if host_os or self.config.container is None:
            return await self._exec_on_hosts(selected, command, timeout, env, user, workdir, io)
        name = container_name(self.config)
        container_env = self._guard_gpu_env({**self.config.env, **(env or {})})
        as_user = self._exec_user(name, user, workdir)
        locks = self._lifecycle().locks
        own_lock = not locks.holds(selected)
        ready = dict(self._invocation.ready)
        before: dict[str, HostResult] = {}
        if own_lock:
            before = await self._lock_for_exec(selected, name, ready, wait=wait)

        async def one(host: str) -> HostResult:
            async with io.of(host) as streams:
                return await in_container(host, streams)

        async def in_container(host: str, streams: ExecIO | None) -> HostResult:
            if host in before:
                return before[host]
            runtime = ready.get(host) or self.runtimes[host]
            # This invocation's commands end with its lock on the host, should
            # it go without a word (SIGKILL, a lost laptop): remote/lock.sh.
            locks.guard(host, kill_command(name, self._session, runtime, session=True))
            # The way decided once per host (containers/route.py): its sshd
            # when it runs, else (or when it did not start there) RUNTIME exec.
            token = self._session + secrets.token_hex(6)  # its pidfile: evidence for a diagnosis
            way = await self.ssh_exec.route(host, runtime, as_user, workdir)
            if isinstance(way, Sshd):
                done = await self.ssh_exec.run(
                    way,
                    host,
                    command,
                    runtime=runtime,
                    env=container_env,
                    timeout=timeout,
                    token=token,
                    io=streams,
                )
                if isinstance(done, HostResult):
                    return await self._explain(host, name, done, runtime, pidfile_of(token))
            return await self._via_runtime(
                host,
                command,
                token,
                runtime,
                streams,
                timeout=timeout,
                env=container_env,
                user=as_user,
                workdir=workdir,
            )

        try:
            results = await fan_out(selected, one, limit=self.config.concurrency.hosts)
            return await self._after_mpirun(command, results)
        finally:
            if own_lock:
                await locks.release(selected)

    async def _exec_on_hosts(
        self,
        selected: list[str],
        command: str | Sequence[str],
        timeout: float | None,
        env: dict[str, str] | None,
        user: str | None,
        workdir: str | None,
        io: ExecStreams,
    ) -> dict[str, HostResult]:
        """`command` on the hosts themselves (no container, or `host_os`)."""
        if user is not None or workdir is not None:
            raise UsageError(
                "exec: user and workdir apply inside the container; on the host the "
                "SSH login user runs the command (use `cd DIR && ...` in the command)"
            )
        if io.wanted:
            return await io.on_hosts(selected, command, timeout=timeout, env=env)
        # In worker processes past a fleet size where it pays (ssh/workers/parent.py).
        return await run_on_hosts(
            self.pool, selected, command, timeout=timeout, env=env, label="exec"
        )

    async def _after_mpirun(
        self, command: str | Sequence[str], results: dict[str, HostResult]
    ) -> dict[str, HostResult]:
        """A failed `mpirun` (or mpiexec) names the peers whose container ended."""
        return await self.name_ended_peers(results) if launches_mpi(command) else results

    async def name_ended_peers(self, results: dict[str, HostResult]) -> dict[str, HostResult]:
        """`results` of a failed MPI job, naming the hosts whose container
        exited or disappeared meanwhile, with what their runtime said
        (containers/peers.py: one bounded look per host); as they were when
        none did, or none failed."""
        if self.config.container is None or all(r.ok for r in results.values()):
            return results
        from orchestrator.containers.peers import name_ended_peers

        name = container_name(self.config)
        ready = self._invocation.ready
        runtimes = {h: ready.get(h) or self.runtimes[h] for h in self.hosts}
        return await name_ended_peers(self.pool, self.config, name, runtimes, results)

    async def _via_runtime(
        self,
        host: str,
        command: str | Sequence[str],
        token: str,
        runtime: ContainerRuntime,
        streams: ExecIO | None,
        *,
        timeout: float | None,
        env: dict[str, str],
        user: str | None,
        workdir: str | None,
    ) -> HostResult:
        """`command` in `host`'s container through `RUNTIME exec` (the
        container's sshd is not the way this time): the host's send of the
        same `Request` the sshd's endpoint takes (SSHExec.run)."""
        name = container_name(self.config)
        script, kill, stdin = container_command(
            name,
            command,
            token=token,
            env=env,
            user=user,
            workdir=workdir,
            # Known running (this Cluster's `up`, or the probe above, under
            # the lock held): no separate running check on the host.
            runtime=runtime,
            stdin=streams is not None and streams.stdin is not None,
        )
        request = Request(script, timeout, stdin, label="exec", on_timeout=kill, io=streams)
        result = await self.pool.send(host, request)
        if result.exit_code == NOT_RUNNING_EXIT and result.stderr.startswith("container "):
            # The host's shell says "here"; the reader needs to know where.
            here = result.stderr.strip()
            return replace(result, error=here.replace(" running here", f" running on {host}"))
        return await self._explain(host, name, result, runtime, pidfile_of(token))

    def _exec_user(self, name: str, user: str | None, workdir: str | None) -> str | None:
        """Who runs an exec in the container (the option, else the cluster's
        `container.user`); a user or workdir docker would refuse: UsageError."""
        container = self.config.container
        as_user = user if user is not None or container is None else container.user
        try:
            container_command(name, "true", user=as_user, workdir=workdir)
        except ValueError as exc:
            raise UsageError(f"exec: {exc}") from None
        return as_user

    async def _lock_for_exec(
        self, selected: list[str], name: str, ready: dict[str, ContainerRuntime], *, wait: bool
    ) -> dict[str, HostResult]:
        """Lock and probe in one round trip, as `up` does: the probe's runtime
        call is bounded (container.runtime_timeout), so a frozen daemon is
        named here instead of hanging the command's own inspect. Running
        hosts go into `ready`; the others' results come back (not run)."""
        self.ssh_exec.warm_up(selected)
        states = await self._lifecycle().lock_and_probe(
            "shared", wait=wait, purpose="exec", hosts=selected
        )
        before: dict[str, HostResult] = {}
        for host, state in states.items():
            if state.container == "running" and state.access in ("direct", "sudo"):
                ready[host] = state.runtime  # docker or podman, as probed
                self.ssh_exec.known(host, state.exec_facts)
            else:
                before[host] = not_ready_result(host, state, name)
        return before

    async def _explain(
        self,
        host: str,
        name: str,
        result: HostResult,
        runtime: ContainerRuntime,
        pidfile: str | None = None,
    ) -> HostResult:
        """`result` with its cause named when cvs can tell it (containers/causes.py):
        from the output (out of memory, full disk), else, after what looks like a
        kill, from one more docker call about the container (stopped, restarted,
        removed, runtime gone or hung), bounded by container.runtime_timeout."""
        if result.ok:
            return result
        # Only a failed command in a container is explained: causes brings
        # argv and limits (about 0.2 s here), which `cvs exec --host-os` and
        # every successful command never load (tests/test_startup.py).
        from orchestrator.containers.causes import (
            container_cause,
            diagnosis_command,
            hung_cause,
            output_cause,
            read_diagnosis,
            wants_diagnosis,
            with_cause,
        )

        cause: Text | None = output_cause(result.stdout, result.stderr)
        if cause is None and wants_diagnosis(result) and self.config.container is not None:
            bound = self.config.container.runtime_timeout
            answer = await self.pool.run(
                host,
                diagnosis_command(name, runtime, pidfile),
                timeout=bound,
                stream_output=False,
                label="diagnose",
            )
            if answer.status == "timeout":
                cause = hung_cause(bound, runtime.name)
            elif answer.reached:
                facts = read_diagnosis(answer.stdout, runtime.name)
                cause = container_cause(
                    facts,
                    elapsed=result.duration,
                    runtime=runtime.name,
                    exit_code=result.exit_code,
                )
        return with_cause(result, cause)
