"""CvsOrchestrator: CVS's orchestrator surface, on our `Cluster`.

CVS's suites get it from `OrchestratorFactory.create_orchestrator(log,
config)` (our pytest engine swaps the factory; CVS could also load it by
entry point: group `cvs.orchestrators`, name `cvs-orchestrator`) and call it
synchronously. Underneath, one `Cluster` holds one SSH connection per host
for the orchestrator's life, and set-up/tear-down are our lifecycle: the
container block's `lifetime`, image identity, the setup script, the
in-container sshd, per-host locks, ownership labels.

As under CVS, the in-container sshd starts only when the suite calls
`setup_sshd()` (`up` runs with `sshd.enabled: false` unless the cluster file
says otherwise). What is deliberately not CVS's: no private keys are copied
into containers (`setup_sshd` uses the per-cluster key pair), a same-named
container cvs did not start is refused, not `rm -f`'d, host keys are checked.
"""

from __future__ import annotations

import functools
import logging
import math
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.api import Cluster
from orchestrator.config import CONTAINER_NAME_RE, ClusterConfig, container_name
from orchestrator.containers.copy import CopyError, Payload, copy_to_hosts, gather_from_hosts
from orchestrator.errors import CvsError, PolicyRefused
from orchestrator.events import EventSink, NullSink, TeeSink
from orchestrator.results import HostResult

from .config import (
    cluster_from_cvs,
    cvs_container_name,
    keys_from_config,
    native_sections,
    sanitize_image,
)
from .logs import quiet_ssh_library
from .loop import LoopThread
from .records import CvsRunRecord
from .shapes import (
    MPI_HOSTFILE,
    cvs_shape,
    mpi_command_line,
    mpi_hostfile_text,
    mpirun_command,
    not_in_cluster,
)

# CVS's own time limits for these calls.
MPI_TIMEOUT = 600.0
SETUP_ENV_TIMEOUT = 60.0
VERIFY_TIMEOUT = 30.0

_default_log = logging.getLogger("cvs.compat")


def _sshd_on_request(cluster: ClusterConfig) -> ClusterConfig:
    """The cluster with `sshd.enabled: false` where it was left to `auto`."""
    container = cluster.container
    if container is None or container.sshd.enabled != "auto":
        return cluster
    sshd = container.sshd.model_copy(update={"enabled": False})
    return cluster.model_copy(update={"container": container.model_copy(update={"sshd": sshd})})


class HostHandle:
    """CVS's `orch.all` / `orch.head` (its Pssh handles): the hosts' own OS, not the
    containers, over the orchestrator's connections. Same methods, same argument
    order, same result shapes as CVS's Pssh."""

    def __init__(self, orch: CvsOrchestrator, hosts: list[str]) -> None:
        self._orch = orch
        self.host_list = list(hosts)
        # CVS prunes hosts it cannot reach from these; here every call tries every
        # host again (one that comes back is used), and its result says why not.
        self.reachable_hosts = list(hosts)
        self.unreachable_hosts: list[str] = []

    def exec(
        self,
        cmd: str,
        timeout: float | None = None,
        print_console: bool = True,
        detailed: bool = False,
        inactivity_timeout: float | None = None,
    ) -> dict[str, Any]:
        """`cmd` on each host. `inactivity_timeout` (CVS: abort after that many
        seconds without output) runs without a total limit here: see docs/coming-from-cvs.md."""
        if timeout is not None and inactivity_timeout is not None:
            raise ValueError("exec: pass at most one of timeout and inactivity_timeout")
        if inactivity_timeout is not None:
            self._orch._time_limit(inactivity_timeout)  # a bad value is still a ValueError
            timeout = math.inf
        return self._orch.exec_on_host(
            cmd,
            hosts=self.host_list,
            timeout=timeout,
            detailed=detailed,
            print_console=print_console,
        )

    def exec_cmd_list(
        self, cmd_list: Sequence[str], timeout: float | None = None, print_console: bool = True
    ) -> dict[str, Any]:
        return self._orch._cmd_list(cmd_list, self.host_list, timeout, print_console, host_os=True)

    def scp_file(self, local_file: str, remote_file: str, recurse: bool = False) -> None:
        """CVS's older name for upload_file."""
        self.upload_file(local_file, remote_file, recurse=recurse)

    def upload_file(self, local_file: str, remote_file: str, recurse: bool = False) -> None:
        """`local_file` (a directory too) to `remote_file` on every host, checked by
        sha256; IOError naming the hosts where it failed, as CVS raises."""
        results = self._orch._upload(
            "upload_file", {h: (local_file, remote_file) for h in self.host_list}
        )
        failed = [(h, r.error or r.status) for h, r in results.items() if not r.ok]
        if failed:
            raise OSError(
                f"upload_file {local_file!r} -> {remote_file!r} failed on "
                f"{len(failed)}/{len(results)} hosts: {failed}"
            )

    def upload_file_list(self, node_path_map: dict[str, tuple[str, str]]) -> dict[str, str]:
        """{host: (local, remote)} -> {host: "HOST: SUCCESS" | "HOST: FAILED - why"}."""
        plan = {h: node_path_map[h] for h in self.host_list if h in node_path_map}
        if not plan:
            return {}
        results = self._orch._upload("upload_file_list", plan)
        return {
            h: f"{h}: SUCCESS" if r.ok else f"{h}: FAILED - {r.error or r.status}"
            for h, r in results.items()
        }

    def download_file(
        self,
        remote_file: str,
        local_file: str,
        recurse: bool = False,
        suffix_separator: str = "_",
        hosts: Sequence[str] | None = None,
    ) -> dict[str, str]:
        """`remote_file` from each host to `LOCAL_FILE<sep><host>`: {host: that path}."""
        wanted = self.host_list if hosts is None else [h for h in self.host_list if h in hosts]
        if hosts is not None and set(hosts) - set(self.host_list):
            unknown = sorted(set(hosts) - set(self.host_list))
            raise ValueError(f"download_file: host(s) not in this handle: {unknown}")
        if not wanted:
            return {}
        paths = {h: f"{local_file}{suffix_separator}{h}" for h in wanted}
        results = self._orch._download(remote_file, paths)
        failed = [(h, r.error or r.status) for h, r in results.items() if not r.ok]
        if failed:
            raise OSError(
                f"download_file {remote_file!r} -> {local_file!r} failed on "
                f"{len(failed)}/{len(wanted)} hosts: {failed}"
            )
        return paths

    def destroy_clients(self) -> None:
        """Nothing to do: the connections are the orchestrator's, shared by every
        handle and closed by teardown_containers() (or when the session ends)."""


class CvsOrchestrator:
    """A drop-in for CVS's BaremetalOrchestrator / ContainerOrchestrator."""

    def __init__(
        self,
        log: Any,
        config: Any,
        stop_on_errors: bool = False,
        *,
        cluster_file: str | None = None,
        sink: EventSink | None = None,
        record: CvsRunRecord | None = None,
    ) -> None:
        self.log = log or _default_log
        self.config = config
        self.stop_on_errors = stop_on_errors
        keys = keys_from_config(config)
        base_dir = Path(cluster_file).resolve().parent if cluster_file else None
        native = native_sections(cluster_file)
        quiet_ssh_library()
        loaded = cluster_from_cvs(
            keys,
            native,
            source=cluster_file or "CVS OrchestratorConfig",
            base_dir=base_dir,
        )
        # Under CVS a container runs an sshd only once the suite calls setup_sshd()
        # (vllm never does): `up` starts none, setup_sshd() starts it. A cluster
        # file that sets container.sshd.enabled itself gets what it says.
        self.cluster_config: ClusterConfig = _sshd_on_request(loaded)
        # auto: on setup_sshd(); true: at setup_containers(); false: never.
        self._sshd_mode = loaded.container.sshd.enabled if loaded.container else False
        self._sshd_ok: bool | None = None
        # CVS's timeout=None is "no limit". A cluster file that sets its own
        # ssh.command_timeout asked for a cap, and gets it.
        capped = "command_timeout" in (native.get("ssh") or {})
        self._none_timeout: float = self.cluster_config.ssh.command_timeout if capped else math.inf
        self.orchestrator_type = "container" if self.cluster_config.container else "baremetal"
        self.ssh_port = (
            self.cluster_config.container.sshd.port if self.cluster_config.container else 22
        )
        self.hosts: list[str] = [h.name for h in self.cluster_config.hosts]
        self.head_node: str = self.hosts[0]
        self.user: str | None = self.cluster_config.ssh.user
        self.pkey: str | None = keys.get("priv_key_file")
        self.password = None
        self.container_config: dict[str, Any] = dict(keys.get("container") or {})
        if self.cluster_config.container is not None:
            # Inside a Slurm job a per_run container's name carries the job ID: a
            # suite's get_container_name(orch.container_config, ...) returns it too.
            running = container_name(self.cluster_config)
            if running != self.cluster_config.container.name:
                self.container_config["name"] = running
        self.container_enabled = self.orchestrator_type == "container"
        self.container_id: str | None = None
        self.all = HostHandle(self, self.hosts)
        self.head = HostHandle(self, [self.head_node])
        self._record = record
        sinks: list[EventSink] = [s for s in (sink, record.sink if record else None) if s]
        self._sink: EventSink = TeeSink(*sinks) if sinks else NullSink()
        self._loop: LoopThread | None = None
        self._cluster: Cluster | None = None
        self._exit: Any = None
        self._up_ok: bool | None = None
        if record is not None:
            record.set_cluster(self.cluster_config)
        for note in self.cluster_config.cvs_notes:
            self.log.info(f"cvs-orchestrator: {note}")

    # ---- connections: opened on first use, for the orchestrator's life ------------

    def _fleet(self) -> tuple[LoopThread, Cluster]:
        if self._loop is None or self._cluster is None:
            loop = LoopThread()
            try:
                cluster, exit_handle = loop.enter(
                    Cluster.open(self.cluster_config, sink=self._sink)
                )
            except BaseException:
                loop.close()
                raise
            # What another invocation waiting for these hosts' locks is told.
            suite = self._record.outcome.suite if self._record is not None else None
            cluster.purpose = f"CVS suite {suite}" if suite else "CVS suite"
            self._loop, self._cluster, self._exit = loop, cluster, exit_handle
        return self._loop, self._cluster

    def close(self) -> None:
        """Close every connection and stop the loop (reopened if used again)."""
        if self._loop is None:
            return
        try:
            if self._exit is not None:
                self._exit.__exit__(None, None, None)
        finally:
            self._loop.close()
            self._loop, self._cluster, self._exit = None, None, None

    # ---- running commands ------------------------------------------------------------

    def _run(
        self,
        call: str,
        plan: dict[str, str],
        timeout: float | None,
        *,
        host_os: bool,
    ) -> dict[str, HostResult]:
        """Run plan[host] on each host at once; hosts outside the cluster get a result too."""
        limit = self._time_limit(timeout)
        loop, cluster = self._fleet()
        known = {h: c for h, c in plan.items() if h in self.hosts}

        def argv(cmd: str) -> str | list[str]:
            # bash, as CVS's `docker exec ... bash -c`; a login shell on the host OS.
            return cmd if host_os else ["bash", "-c", cmd]

        async def run_all() -> dict[str, HostResult]:
            if not known:
                return {}
            commands = set(known.values())
            if len(commands) == 1:  # one fan-out, under the cluster's concurrency limit
                return await cluster.exec(
                    argv(commands.pop()), hosts=list(known), timeout=limit, host_os=host_os
                )
            out: dict[str, HostResult] = {}
            slots = anyio.CapacityLimiter(self.cluster_config.concurrency.hosts)

            async def one(host: str, cmd: str) -> None:
                async with slots:
                    got = await cluster.exec(
                        argv(cmd), hosts=[host], timeout=limit, host_os=host_os
                    )
                out[host] = got[host]

            async with anyio.create_task_group() as tg:
                for host, cmd in known.items():
                    tg.start_soon(one, host, cmd)
            return out

        started = time.monotonic()
        got = loop.call(run_all)
        results = {h: got[h] if h in got else not_in_cluster(h) for h in plan}
        if self._record is not None:
            on = "host" if host_os or not self.container_enabled else "container"
            self._record.add_call(call, results, on=on, duration=time.monotonic() - started)
        return results

    def _time_limit(self, timeout: float | None) -> float:
        """Seconds the transport gives each command; `math.inf` is no deadline at all."""
        if timeout is None:
            return self._none_timeout
        # bool is an int: timeout=True is a mistake, not one second.
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout: a positive number of seconds or None, got {timeout!r}")
        return float(timeout)

    def _hosts_arg(self, hosts: Sequence[str] | str | None) -> list[str]:
        if hosts is None:
            return list(self.hosts)
        return [hosts] if isinstance(hosts, str) else list(hosts)

    def _shape(
        self, results: dict[str, HostResult], detailed: bool, print_console: bool, cmd: str
    ) -> dict[str, Any]:
        shaped = cvs_shape(results, detailed=detailed)
        if print_console:
            for host, value in shaped.items():
                text = value["output"] if detailed else value
                print(f"#---- {host} ---- {cmd}\n{text}", end="" if text.endswith("\n") else "\n")
        return shaped

    def exec(
        self,
        cmd: str,
        hosts: Sequence[str] | str | None = None,
        timeout: float | None = None,
        detailed: bool = False,
        print_console: bool = True,
    ) -> dict[str, Any]:
        """`cmd` on every host (or `hosts`): in the containers for the container backend."""
        selected = self._hosts_arg(hosts)
        results = self._run("exec", dict.fromkeys(selected, cmd), timeout, host_os=False)
        return self._shape(results, detailed, print_console, cmd)

    def exec_on_head(
        self,
        cmd: str,
        timeout: float | None = None,
        detailed: bool = False,
        print_console: bool = True,
    ) -> dict[str, Any]:
        results = self._run("exec_on_head", {self.head_node: cmd}, timeout, host_os=False)
        return self._shape(results, detailed, print_console, cmd)

    def exec_on_host(
        self,
        cmd: str,
        hosts: Sequence[str] | str | None = None,
        timeout: float | None = None,
        detailed: bool = False,
        print_console: bool = True,
    ) -> dict[str, Any]:
        """`cmd` on the hosts' own OS, also for the container backend."""
        selected = self._hosts_arg(hosts)
        results = self._run("exec_on_host", dict.fromkeys(selected, cmd), timeout, host_os=True)
        return self._shape(results, detailed, print_console, cmd)

    def exec_cmd_list(
        self, cmd_list: Sequence[str], timeout: float | None = None, print_console: bool = True
    ) -> dict[str, Any]:
        """`cmd_list[i]` on `hosts[i]`, all at once."""
        return self._cmd_list(cmd_list, self.hosts, timeout, print_console, host_os=False)

    def _cmd_list(
        self,
        cmd_list: Sequence[str],
        hosts: list[str],
        timeout: float | None,
        print_console: bool,
        *,
        host_os: bool,
    ) -> dict[str, Any]:
        if isinstance(cmd_list, str) or len(cmd_list) != len(hosts):
            raise ValueError(
                f"exec_cmd_list: one command per host: got {len(cmd_list)} command(s) "
                f"for {len(hosts)} host(s)"
            )
        plan = dict(zip(hosts, cmd_list, strict=True))
        results = self._run("exec_cmd_list", plan, timeout, host_os=host_os)
        return self._shape(results, False, print_console, "<command list>")

    @property
    def host_all(self) -> HostHandle:
        return self.all

    @property
    def host_head(self) -> HostHandle:
        return self.head

    # ---- the container lifecycle ---------------------------------------------------

    @staticmethod
    def get_container_name(container_config: dict[str, Any], image: str) -> str:
        """CVS's rule (`name`, else `<user>_<image>`); it is also the name we run."""
        return cvs_container_name(container_config, image)

    @staticmethod
    def sanitize_container_name(image_name: str) -> str:
        return sanitize_image(image_name)

    def _up(self) -> bool:
        loop, cluster = self._fleet()
        try:
            report = loop.call(functools.partial(cluster.up, check=False))
        except PolicyRefused as exc:
            self.log.error(f"cvs-orchestrator refused to set up the containers: {exc}")
            if self._record is not None:
                self._record.add_refusal(str(exc))
            self._up_ok = False
            return False
        except CvsError as exc:
            self.log.error(f"cvs-orchestrator could not set up the containers: {exc}")
            if self._record is not None:
                self._record.add_setup_error(str(exc))
            self._up_ok = False
            return False
        if self._record is not None:
            self._record.add_up(report)
        for warning in report.plan.warnings:
            self.log.warning(warning)
        for host, outcome in report.outcomes.items():
            # A few lines per host on CVS's console; the commands are in the run record.
            if outcome.ok:
                self.log.info(f"cvs-orchestrator: {host}: {outcome.action.kind}: ready")
            else:
                self.log.error(f"{host}: {outcome.action.kind} failed: {outcome.error!s}")
        self._up_ok = report.ok
        if report.ok:
            self.container_id = container_name(self.cluster_config)
        return report.ok

    def setup_containers(
        self,
        volumes: Any = None,
        devices: Any = None,
        capabilities: Any = None,
        security_opts: Any = None,
        environment: Any = None,
        groups: Any = None,
        ulimits: Any = None,
    ) -> bool:
        """Bring the containers to what the lifetime asks (attach / cold start / restart /
        refuse) and provision them; their sshd waits for setup_sshd(). False when any
        host is not ready. CVS's per-call overrides are ignored (the cluster file decides)."""
        if not self.container_enabled:
            return True
        overrides = {
            "volumes": volumes,
            "devices": devices,
            "capabilities": capabilities,
            "security_opts": security_opts,
            "environment": environment,
            "groups": groups,
            "ulimits": ulimits,
        }
        ignored = sorted(k for k, v in overrides.items() if v is not None)
        if ignored:
            self.log.warning(
                "setup_containers: %s ignored: the cluster file's container block decides",
                ", ".join(ignored),
            )
        self._sshd_ok = None
        return self._up()

    def setup_sshd(self) -> bool:
        """Start the sshd in every container (CVS: for MPI between containers), with
        the per-cluster key pair (no private keys are copied in). As under CVS: a
        RuntimeError before setup_containers(), a no-op on a single-host cluster."""
        if not self.container_enabled:
            return True
        if not self.container_id:
            raise RuntimeError("No containers running. Call setup_containers() first.")
        if len(self.hosts) <= 1:
            self.log.info("Single-node run: skipping in-container sshd setup")
            return True
        if self._sshd_mode is not True and self._sshd_mode != "auto":
            self.log.info("container.sshd.enabled is false in the cluster file: no sshd")
            return True
        if self._sshd_ok is not None:
            return self._sshd_ok
        if self._sshd_mode is True:  # started by setup_containers already
            self._sshd_ok = bool(self._up_ok)
            return self._sshd_ok
        loop, cluster = self._fleet()
        started = time.monotonic()
        try:
            results = loop.call(cluster.start_sshd)
        except CvsError as exc:
            self.log.error(f"setup_sshd: {exc}")
            if self._record is not None:
                self._record.add_setup_error(f"setup_sshd: {exc}")
            self._sshd_ok = False
            return False
        if self._record is not None:
            self._record.add_call(
                "setup_sshd", results, on="container", duration=time.monotonic() - started
            )
        for host, r in results.items():
            if r.ok:
                self.log.info(f"cvs-orchestrator: {host}: sshd on port {self.ssh_port}: ready")
            else:
                self.log.error(f"SSH daemon setup failed on {host}: {r.error or r.status}")
        self._sshd_ok = all(r.ok for r in results.values())
        return self._sshd_ok

    def verify_containers_running(self, container_name: str) -> bool:
        """Whether a container of that name runs on every host."""
        if not CONTAINER_NAME_RE.fullmatch(container_name or ""):
            self.log.error(f"verify_containers_running: invalid container name {container_name!r}")
            return False
        inspect = ["inspect", "--type", "container", "-f", "{{.State.Running}}", container_name]
        # Docker as the probe found it on each host, else the host's own rule:
        # the adapter does not decide it.
        _, cluster = self._fleet()
        commands = {h: shlex.join(cluster.runtimes[h].read(inspect)) for h in self.hosts}
        results = self._run(
            "verify_containers_running",
            commands,
            VERIFY_TIMEOUT,
            host_os=True,
        )
        bad = [h for h, r in results.items() if not (r.ok and r.stdout.strip() == "true")]
        if bad:
            self.log.error(f"container {container_name!r} is not running on: {', '.join(bad)}")
            return False
        self.container_id = container_name
        return True

    def teardown_containers(self) -> bool:
        """Per the lifetime: per_run removes our containers, persistent and no_launch keep
        them. Closes the connections (they reopen if the orchestrator is used again)."""
        if not self.container_enabled:
            self.close()
            return True
        ok = True
        if self._up_ok is not None:
            loop, cluster = self._fleet()
            try:
                _, removed = loop.call(cluster.down)
            except CvsError as exc:
                self.log.error(f"teardown_containers: {exc}")
                ok = False
            else:
                for host, r in removed.items():
                    if not r.ok:
                        self.log.error(f"{host}: could not remove the container: {r.error!s}")
                        ok = False
        self._up_ok = None
        self._sshd_ok = None
        self.container_id = None
        self.close()
        return ok

    def prepare(self) -> bool:
        return self.setup_containers() and self.setup_sshd()

    def dispose(self) -> bool:
        return self.teardown_containers()

    # ---- CVS's container accessors: what our containers get -------------------------

    def _container(self) -> Any:
        container = self.cluster_config.container
        if container is None:
            raise RuntimeError("this cluster has no container block (orchestrator: baremetal)")
        return container

    def get_volumes(self) -> list[str]:
        """The bind mounts the containers get. Unlike CVS, no `~/.ssh:/host_ssh`:
        your keys never enter a container."""
        return list(self._container().volumes)

    def get_devices(self) -> list[str]:
        return list(self._container().devices)

    def get_capabilities(self) -> list[str]:
        return list(self._container().cap_add)

    def get_security_opts(self) -> list[str]:
        return list(self._container().security_opt)

    def get_groups(self) -> list[str]:
        return list(self._container().group_add)

    def get_ulimits(self) -> list[str]:
        """CVS's NAME=VALUE strings."""
        return [f"{k}={v}" for k, v in self._container().ulimits.items()]

    def get_environment(self) -> dict[str, str]:
        return dict(self._container().env)

    def get_network_mode(self) -> str:
        return str(self._container().network)

    def get_ipc_mode(self) -> str | None:
        ipc: str | None = self._container().ipc
        return ipc

    def is_privileged(self) -> bool:
        return bool(self._container().privileged)

    def get_mpi_command(
        self,
        rank_cmd: str,
        mpi_runner_args: Sequence[str],
        env_vars: dict[str, Any] | None,
        mpi_install_dir: str,
    ) -> str:
        """CVS's mpirun line for these arguments (without its host-key opt-outs)."""
        return mpi_command_line(rank_cmd, mpi_runner_args, env_vars, mpi_install_dir)

    # ---- files to and from the hosts' own OS (orch.all / orch.head) -----------------

    def _upload(self, call: str, plan: dict[str, tuple[str, str]]) -> dict[str, HostResult]:
        loop, cluster = self._fleet()
        started = time.monotonic()
        by_pair: dict[tuple[str, str], list[str]] = {}
        for host, pair in plan.items():
            by_pair.setdefault((str(pair[0]), str(pair[1])), []).append(host)
        results: dict[str, HostResult] = {}
        for (local, remote), hosts in by_pair.items():
            try:
                payload = Payload.from_path(Path(local))
            except (CopyError, OSError) as exc:
                for h in hosts:
                    results[h] = HostResult(h, "failed", error=f"{local}: {exc}")
                continue
            known = [h for h in hosts if h in self.hosts]
            for h in set(hosts) - set(known):
                results[h] = not_in_cluster(h)
            got = loop.call(
                functools.partial(
                    copy_to_hosts, cluster.pool, cluster.config, payload, remote,
                    hosts=known, host_os=True,
                )
            )  # fmt: skip
            results.update(got)
        if self._record is not None:
            self._record.add_call(call, results, on="host", duration=time.monotonic() - started)
        return results

    def _download(self, remote: str, paths: dict[str, str]) -> dict[str, HostResult]:
        loop, cluster = self._fleet()
        started = time.monotonic()
        known = [h for h in paths if h in self.hosts]
        results = {h: not_in_cluster(h) for h in paths if h not in known}
        with tempfile.TemporaryDirectory(prefix="cvs-download-") as tmp:
            got = loop.call(
                functools.partial(
                    gather_from_hosts, cluster.pool, cluster.config, remote, Path(tmp),
                    hosts=known, host_os=True,
                )
            )  # fmt: skip
            name = Path(remote.rstrip("/")).name
            for host, r in got.items():
                if r.ok:
                    target = Path(paths[host])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(Path(tmp) / host / name), target)
                results[host] = r
        if self._record is not None:
            self._record.add_call(
                "download_file", results, on="host", duration=time.monotonic() - started
            )
        return results

    # ---- the rest of CVS's surface -----------------------------------------------------

    def setup_env(self, hosts: Sequence[str], env_script: str | None = None) -> bool:
        """`bash ENV_SCRIPT` where the suite's commands run; True when it passed everywhere."""
        if not env_script:
            return True
        cmd = f"bash {shlex.quote(env_script)}"
        selected = self._hosts_arg(hosts)
        results = self._run(
            "setup_env", dict.fromkeys(selected, cmd), SETUP_ENV_TIMEOUT, host_os=False
        )
        failed = [h for h, r in results.items() if not r.ok]
        if failed:
            self.log.error(f"setup_env failed on: {', '.join(failed)}")
        return not failed

    def cleanup(self, hosts: Sequence[str]) -> bool:
        """CVS's cleanup tears the containers down: here, per the lifetime."""
        if self.container_enabled and self._up_ok is not None:
            return self.teardown_containers()
        return True

    def sudo_prefix(self) -> str:
        """What to put before a command that needs root where `exec` runs it."""
        if self.container_enabled or self.user == "root":
            return ""
        return "sudo -n "

    def privileged_prefix(self) -> str:
        return self.sudo_prefix()

    def build_mpi_cmd(
        self,
        rank_cmd: str,
        mpi_hosts: Sequence[str],
        ranks_per_host: int,
        env_vars: dict[str, Any] | None,
        mpi_install_dir: str,
        mpi_extra_args: Sequence[str] | None = None,
        no_of_global_ranks: int | None = None,
    ) -> str:
        """Write the hostfile on the head (in its container) and return the mpirun line."""
        text = mpi_hostfile_text(list(mpi_hosts), ranks_per_host)
        ranks = no_of_global_ranks or len(mpi_hosts) * ranks_per_host
        write = f"printf %s {shlex.quote(text)} > {shlex.quote(MPI_HOSTFILE)}"
        results = self._run("mpi_hostfile", {self.head_node: write}, VERIFY_TIMEOUT, host_os=False)
        head = results[self.head_node]
        if not head.ok:
            raise RuntimeError(
                f"could not write {MPI_HOSTFILE} on {self.head_node}: "
                f"{head.error or head.stderr.strip()}"
            )
        return mpirun_command(
            rank_cmd,
            ranks=ranks,
            env_vars=env_vars,
            mpi_install_dir=mpi_install_dir,
            mpi_extra_args=mpi_extra_args,
        )

    def distribute_using_mpi(
        self,
        rank_cmd: str,
        mpi_hosts: Sequence[str],
        ranks_per_host: int,
        env_vars: dict[str, Any] | None,
        mpi_install_dir: str,
        mpi_extra_args: Sequence[str] | None = None,
        no_of_global_ranks: int | None = None,
    ) -> dict[str, Any]:
        """One mpirun over `mpi_hosts`, `ranks_per_host` each, run on the head."""
        full = self.build_mpi_cmd(
            rank_cmd,
            mpi_hosts,
            ranks_per_host,
            env_vars,
            mpi_install_dir,
            mpi_extra_args,
            no_of_global_ranks,
        )
        self.log.info(f"MPI command: {full}")
        return self.exec_on_head(full, timeout=MPI_TIMEOUT)
