"""The sandbox cluster: N hosts on this machine, each with its own sshd and dockerd.

Layout of one sandbox (index K, directory DIR):

- DIR/sandbox.json     everything `sandbox_down` needs, written before anything
                       is created and updated as daemons start
- DIR/cluster.yaml     the cluster file for node1..nodeN (DIR/cluster-egress.yaml
                       for the optional egress host)
- DIR/ssh/             client key pair, known_hosts
- DIR/hosts/NAME/      sshd_config, host key, logs, dockerd data root
- /run/cvs-sandbox/K/  authorized_keys and per-host docker sockets / exec roots:
                       world-traversable and short (unix socket paths are
                       limited to 108 bytes), unlike a 0700 pytest tmp dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import daemons, images, network, podman, prereqs, procs
from . import slurm as slurm_sb
from .errors import SandboxError
from .registry import (
    REGISTRY_USER,
    SandboxRegistry,
    docker_config,
    netns_registry_dir,
    sandbox_registry,
    start_netns_registry,
    stop_netns_registry,
)
from .users import (
    DOCKER_USER,
    NO_DOCKER_USER,
    SUDO_USER,
    SUDOERS_FILE,
    ensure_podman_sudo,
    ensure_users,
)

Progress = Callable[[str], None]
STATE_FILE = "sandbox.json"
EGRESS_NAME = "egress1"
CONTAINER_NAME = "cvs-sandbox"
SSHD_START_TIMEOUT = 20.0
DOCKERD_START_TIMEOUT = 60.0
# Pushing the cluster's image to the `--registry` (unshaped on the way in;
# node1's dockerd compresses a few hundred MB on a loaded machine).
PUSH_TIMEOUT = 600.0


def _quiet(_: str) -> None:
    pass


@dataclass
class SandboxHost:
    name: str
    address: str
    port: int
    # None for the egress host, which lives in the root namespace.
    netns: str | None
    veth: str | None
    host_dir: Path
    run_dir: Path
    sshd_pid: int | None = None
    dockerd_pid: int | None = None
    # Overrides on top of the generated sshd_config (see `set_sshd_option`).
    sshd_options: dict[str, str] = field(default_factory=dict)
    # The container runtime this host runs: a dockerd of its own, or a podman
    # store of its own (sandbox/podman.py).
    runtime: str = "docker"

    @property
    def egress(self) -> bool:
        return self.netns is None

    @property
    def gpu_root(self) -> Path:
        """Where this host's stand-in GPUs live (`sandbox up --gpus K`)."""
        return self.run_dir / "gpu"

    @property
    def sshd_config(self) -> Path:
        return self.host_dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.host_dir / "ssh_host_ed25519_key"

    @property
    def data_root(self) -> Path:
        return self.host_dir / "docker"

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def docker_socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_socket}"

    @property
    def dockerd_pid_file(self) -> Path:
        return self.run_dir / "docker.pid"

    @property
    def podman_root(self) -> Path:
        return self.host_dir / "podman"

    @property
    def podman_env(self) -> dict[str, str]:
        """CONTAINERS_STORAGE_CONF / CONTAINERS_CONF, registries and auth file of
        this host's podman."""
        return podman.env_for(
            self.host_dir / "storage.conf",
            self.host_dir / "containers.conf",
            self.host_dir / "registries.conf",
            self.run_dir / "podman-auth.json",
        )

    @property
    def rootless_dir(self) -> Path:
        """The docker-group login user's rootless podman on this host: its own
        store and configuration (in the run dir: that user must reach it)."""
        return self.run_dir / "podman-rootless"

    @property
    def rootless_env(self) -> dict[str, str]:
        d = self.rootless_dir
        return {
            **podman.env_for(
                d / "storage.conf", d / "containers.conf", d / "registries.conf", d / "auth.json"
            ),
            "XDG_RUNTIME_DIR": str(d / "xdg"),
            # podman's blob-info cache, otherwise in the user's home and left
            # behind by every sandbox that loads images there.
            "XDG_DATA_HOME": str(d / "data"),
        }

    # Written to sandbox.json for people and tools reading it; recomputed on load.
    DERIVED = ("sshd_config", "data_root", "exec_root", "docker_host")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["host_dir"] = str(self.host_dir)
        data["run_dir"] = str(self.run_dir)
        data.update({key: str(getattr(self, key)) for key in self.DERIVED})
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxHost:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in fields}
        data["host_dir"] = Path(data["host_dir"])
        data["run_dir"] = Path(data["run_dir"])
        return cls(**data)


@dataclass
class Sandbox:
    directory: Path
    index: int
    bridge: str
    run_dir: Path
    hosts: list[SandboxHost]
    # `--slurm`: munged, slurmctld and one slurmd per node (sandbox/slurm.py),
    # by name ("munged", "slurmctld", "slurmd:node1") -> pid.
    slurm: bool = False
    slurm_pids: dict[str, int] = field(default_factory=dict)
    # Stand-in GPUs per node (`--gpus K`), declared as gres gpu:K with --slurm.
    gpus: int = 0
    # `--registry`: a registry in a namespace of its own on the bridge
    # (network.create_registry_netns), its link shaped to `registry_rate`
    # (None: unshaped), holding the cluster's image as `registry_image`.
    netns_registry: bool = False
    registry_rate: str | None = None
    registry_pid: int | None = None
    registry_image: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # -- paths -----------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def cluster_file(self) -> Path:
        return self.directory / "cluster.yaml"

    @property
    def egress_cluster_file(self) -> Path | None:
        return self.directory / "cluster-egress.yaml" if self.egress else None

    @property
    def slurm_paths(self) -> slurm_sb.SlurmPaths:
        return slurm_sb.paths(self.directory, self.run_dir)

    @property
    def slurm_env_file(self) -> Path:
        """Source it to drive this sandbox's Slurm (`--slurm`)."""
        return self.directory / "slurm.env"

    @property
    def registry_env_file(self) -> Path:
        """REGISTRY, REGISTRY_NETNS, REGISTRY_IF (`--registry`)."""
        return self.directory / "registry.env"

    @property
    def registry_data(self) -> Path:
        """The registry's blobs (`--registry`): big, so not in /run."""
        return self.directory / "registry"

    def slurm_env(self) -> dict[str, str]:
        """The variables slurm.env sets (for a subprocess's environment)."""
        return {"SLURM_CONF": str(self.slurm_paths.conf)}

    @property
    def key_file(self) -> Path:
        return self.directory / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "ssh" / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.run_dir / "authorized_keys"

    @property
    def nodes(self) -> list[SandboxHost]:
        """The hosts in cluster.yaml (everything but the egress host)."""
        return [h for h in self.hosts if not h.egress]

    @property
    def egress(self) -> SandboxHost | None:
        return next((h for h in self.hosts if h.egress), None)

    def host(self, name: str) -> SandboxHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def _h(self, host: str | SandboxHost) -> SandboxHost:
        return host if isinstance(host, SandboxHost) else self.host(host)

    # -- state -----------------------------------------------------------
    def save(self) -> None:
        data = {
            "version": 1,
            "directory": str(self.directory),
            "index": self.index,
            "bridge": self.bridge,
            "run_dir": str(self.run_dir),
            "hosts": [h.to_json() for h in self.hosts],
            "slurm": self.slurm,
            "slurm_pids": dict(self.slurm_pids),
            "gpus": self.gpus,
            "netns_registry": self.netns_registry,
            "registry_rate": self.registry_rate,
            "registry_pid": self.registry_pid,
            "registry_image": self.registry_image,
        }
        with self._lock:
            tmp = self.state_file.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            tmp.replace(self.state_file)

    # -- helpers for tests -----------------------------------------------
    def docker_argv(self, host: str | SandboxHost) -> list[str]:
        """argv prefix running the docker CLI against that host's dockerd from the root ns."""
        return ["docker", "--host", self._h(host).docker_host]

    def runtime_argv(self, host: str | SandboxHost) -> list[str]:
        """argv prefix for that host's runtime CLI: its dockerd's, or podman on
        its store inside its network namespace (where its containers live)."""
        h = self._h(host)
        if h.runtime == "podman":
            return podman.podman_argv(h.podman_env, h.netns)
        return self.docker_argv(h)

    def ssh_argv(self, host: str | SandboxHost, user: str = DOCKER_USER) -> list[str]:
        """argv prefix for OpenSSH's client to that host, strict host-key checking."""
        h = self._h(host)
        return [
            "ssh", "-F", "/dev/null",
            "-i", str(self.key_file), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "ConnectTimeout=10", "-p", str(h.port),
            f"{user}@{h.address}", "--",
        ]  # fmt: skip

    # -- sshd ------------------------------------------------------------
    def _write_sshd_config(self, h: SandboxHost) -> None:
        options = daemons.sshd_base_options(
            address=h.address,
            port=h.port,
            host_key=h.host_key,
            pid_file=h.host_dir / "sshd.pid",
            authorized_keys=self.authorized_keys,
            docker_host=h.docker_host,
        )
        options.update(h.sshd_options)
        text = daemons.render_sshd_config(options)
        if h.runtime == "podman":
            # Per login user (sshd keeps the first SetEnv it reads, so the
            # global one goes): the sudo user's rootful store, the docker
            # group user's rootless store of its own.
            base = options.pop("SetEnv")
            text = daemons.render_sshd_config(options)
            per_user = {
                SUDO_USER: {**h.podman_env},
                DOCKER_USER: {**h.rootless_env},
                NO_DOCKER_USER: {},
            }
            for user, env in per_user.items():
                words = " ".join([base, *(f"{k}={v}" for k, v in env.items())])
                text += f"Match User {user}\n  SetEnv {words}\n"
        h.sshd_config.write_text(text)

    def start_sshd(self, host: str | SandboxHost) -> None:
        h = self._h(host)
        if procs.is_ours(h.sshd_pid, str(h.sshd_config)):
            return
        self._write_sshd_config(h)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        log = h.host_dir / "sshd.log"
        hostname = h.name if h.netns else None  # the egress host shares the machine's
        argv = daemons.sshd_argv(h.sshd_config, h.netns, hostname, keep_sys=h.runtime == "podman")
        h.sshd_pid = procs.spawn(argv, log)
        self.save()
        try:
            procs.wait_for(
                lambda: daemons.sshd_ready(h.address, h.port),
                timeout=SSHD_START_TIMEOUT,
                what=f"sshd on {h.name} ({h.address}:{h.port})",
            )
        except TimeoutError as exc:
            raise SandboxError(f"{exc}; see {log}") from exc

    def stop_sshd(self, host: str | SandboxHost) -> None:
        h = self._h(host)
        if h.sshd_pid and procs.is_ours(h.sshd_pid, str(h.sshd_config)):
            # Open sessions are children of the listener and outlive it. (In a
            # netns host `sandbox_down` also sweeps the whole namespace.)
            sessions = procs.children(h.sshd_pid) if h.egress else []
            procs.stop(h.sshd_pid, str(h.sshd_config))
            for pid in sessions:
                procs.stop(pid, "sshd", timeout=2.0)
        h.sshd_pid = None
        self.save()

    def restart_sshd(self, host: str | SandboxHost) -> None:
        self.stop_sshd(host)
        self.start_sshd(host)

    def set_sshd_option(self, host: str | SandboxHost, key: str, value: str) -> None:
        """Override one sshd_config keyword (e.g. MaxStartups 1:100:1) and restart sshd."""
        h = self._h(host)
        h.sshd_options[key] = str(value)
        self.restart_sshd(h)

    def rotate_host_key(self, host: str | SandboxHost) -> None:
        """New host key, known_hosts left as is: clients see a host-key mismatch."""
        h = self._h(host)
        for path in (h.host_key, h.host_key.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        _keygen(h.host_key, comment=f"{h.name}-rotated")
        self.restart_sshd(h)

    # -- dockerd ---------------------------------------------------------
    def start_dockerd(self, host: str | SandboxHost) -> None:
        h = self._h(host)
        marker = str(h.exec_root)
        if procs.is_ours(h.dockerd_pid, marker):
            return
        h.data_root.mkdir(parents=True, exist_ok=True)
        h.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        config = h.host_dir / "daemon.json"
        daemons.write_dockerd_config(config)
        argv = daemons.dockerd_argv(
            netns=h.netns,
            data_root=h.data_root,
            exec_root=h.exec_root,
            pid_file=h.dockerd_pid_file,
            socket_path=h.docker_socket,
            config_file=config,
            hostname=h.name if h.netns else None,
        )
        log = h.host_dir / "dockerd.log"
        h.dockerd_pid = pid = procs.spawn(argv, log, tmpdir=h.host_dir / "tmp")
        self.save()
        try:
            procs.wait_for(
                lambda: daemons.dockerd_ready(h.docker_socket) or not procs.alive(pid),
                timeout=DOCKERD_START_TIMEOUT,
                what=f"dockerd on {h.name}",
            )
        except TimeoutError as exc:
            raise SandboxError(f"{exc}; see {log}") from exc
        if not procs.alive(h.dockerd_pid):
            raise SandboxError(f"dockerd on {h.name} exited during start-up; see {log}")

    def stop_dockerd(self, host: str | SandboxHost, *, remove_containers: bool = False) -> None:
        h = self._h(host)
        if h.runtime == "podman":
            # No daemon: the containers (and runc's machine-wide state for them) go.
            if remove_containers:
                podman.remove_all_containers(h.podman_env, h.netns)
                podman.remove_all_containers(h.rootless_env, h.netns, user=DOCKER_USER)
            return
        marker = str(h.exec_root)
        if remove_containers and procs.is_ours(h.dockerd_pid, marker):
            _remove_all_containers(self.docker_argv(h))
        if procs.stop(h.dockerd_pid, marker, timeout=20.0) != "terminated":
            # After a crash (or a SIGKILLed dockerd) containerd, shims and
            # containers can outlive it; all of them carry our exec root.
            # (A dockerd that exits on SIGTERM takes them down itself.)
            _kill_runc_containers(h.exec_root)
            for pid in procs.pids_mentioning(marker):
                procs.stop(pid, marker, timeout=5.0)
        h.dockerd_pid = None
        self.save()

    def import_skewed_image(self, host: str | SandboxHost, tag: str) -> str:
        """`docker import` the cached sshd rootfs as `tag` on that host: a new image ID."""
        return _sha256(images.import_rootfs(self.runtime_argv(host), "sshd", tag))

    def image_id(self, host: str | SandboxHost, tag: str) -> str:
        return _sha256(images.image_id(self.runtime_argv(host), tag))

    def registry(self) -> contextlib.AbstractContextManager[SandboxRegistry]:
        """A registry with htpasswd auth on this sandbox's bridge, for as long as
        the block runs (`cvs sandbox down` also stops it)."""
        return sandbox_registry(self.index, self.run_dir)

    def load_image(self, host: str | SandboxHost, tar: Path) -> None:
        """`docker load` a saved image tar on that host (same image ID everywhere)."""
        procs.run([*self.runtime_argv(host), "load", "-q", "-i", str(tar)])


def _sha256(image_id: str) -> str:
    """An image ID as docker prints it (podman leaves out `sha256:`)."""
    image_id = image_id.strip()
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


# -- building -------------------------------------------------------------


def _keygen(path: Path, comment: str) -> None:
    procs.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _remove_all_containers(docker: list[str]) -> None:
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        ids = procs.run([*docker, "ps", "-aq"]).split()
        if ids:
            procs.run([*docker, "rm", "-f", "-v", *ids], check=False)


def _kill_runc_containers(exec_root: Path) -> None:
    state = exec_root / "runtime-runc" / "moby"
    if not state.is_dir():
        return
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        for cid in procs.run(["runc", "--root", str(state), "list", "-q"]).split():
            procs.run(["runc", "--root", str(state), "delete", "--force", cid], check=False)


def _require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            "cvs sandbox needs root: it creates network namespaces, a bridge, login users "
            "and runs sshd/dockerd (run it with sudo)"
        )


def _cluster_yaml(
    sb: Sandbox,
    hosts: list[SandboxHost],
    name: str,
    image: str,
    *,
    rootless: bool = False,
    login: dict[str, str] | None = None,
) -> str:
    podman_hosts = any(h.runtime == "podman" for h in hosts)
    container: dict[str, Any] = {"image": image, "name": CONTAINER_NAME, "lifetime": "per_run"}
    if login is not None:
        container["registry"] = login
        if podman_hosts:
            # The `--registry` serves plain HTTP: podman is told so per call
            # (`--tls-verify=false`), as a user of a real fleet would, not
            # through the hosts' registries.conf (which names the gateway only).
            container["registry_tls_verify"] = False
    if podman_hosts:
        # Rootful podman: the login user reaches it through `sudo -n podman`.
        container["runtime"] = "podman"
    if rootless:
        # The docker-group user's own podman, no sudo. This machine has no
        # /dev/mqueue, which a rootless `--ipc host` bind-mounts.
        container.update(rootless=True, ipc=None)
    user = DOCKER_USER if rootless or not podman_hosts else SUDO_USER
    doc = {
        "name": name,
        "hosts": [
            {"name": h.name, "address": h.address}
            | ({} if h.port == 22 else {"port": h.port})
            | ({"gpu_device_root": str(h.gpu_root)} if sb.gpus and not h.egress else {})
            for h in hosts
        ],
        "ssh": {
            "user": user,
            "identity_files": [str(sb.key_file)],
            "known_hosts": str(sb.known_hosts),
            "host_key_policy": "strict",
            "use_ssh_config": False,
        },
        # No `privileged`, no memlock ulimit: both fail on this machine.
        "container": container,
    }
    header = (
        "# Sandbox cluster written by `cvs sandbox up`; removed by `cvs sandbox down`.\n"
        f"# Sandbox state: {sb.state_file}\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False)


def _new_sandbox(directory: Path, hosts: int, egress_host: bool, runtime: str) -> Sandbox:
    with network.global_lock():
        ensure_users()
        if runtime == "podman":
            ensure_podman_sudo()
        index = network.claim_index()
    run_dir = network.RUN_ROOT / str(index)
    members = []
    for number in range(1, hosts + 1):
        name = f"node{number}"
        members.append(
            SandboxHost(
                name=name,
                address=network.host_address(index, number),
                port=22,
                netns=network.netns_name(index, name),
                veth=network.veth_name(index, number),
                host_dir=directory / "hosts" / name,
                run_dir=run_dir / name,
                runtime=runtime,
            )
        )
    if egress_host:
        members.append(
            SandboxHost(
                name=EGRESS_NAME,
                # Loopback in the root namespace: unique per sandbox index.
                address=f"127.77.{index}.1",
                port=22,
                netns=None,
                veth=None,
                host_dir=directory / "hosts" / EGRESS_NAME,
                run_dir=run_dir / EGRESS_NAME,
            )
        )
    sb = Sandbox(
        directory=directory,
        index=index,
        bridge=network.bridge_name(index),
        run_dir=run_dir,
        hosts=members,
    )
    sb.save()
    return sb


def _prepare_keys(sb: Sandbox) -> None:
    (sb.directory / "ssh").mkdir(mode=0o700, exist_ok=True)
    _keygen(sb.key_file, comment=f"cvs-sandbox-{sb.index}")
    sb.authorized_keys.write_text(sb.key_file.with_suffix(".pub").read_text())
    sb.authorized_keys.chmod(0o644)
    lines = []
    for h in sb.hosts:
        h.host_dir.mkdir(parents=True, exist_ok=True)
        h.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        _keygen(h.host_key, comment=h.name)
        key_type, key_b64 = h.host_key.with_suffix(".pub").read_text().split()[:2]
        pattern = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        lines.append(f"{pattern} {key_type} {key_b64}\n")
    sb.known_hosts.write_text("".join(lines))


def _start_host(
    sb: Sandbox, h: SandboxHost, template: Path, progress: Progress, podman_template: Path | None
) -> None:
    if h.runtime == "podman":
        assert podman_template is not None
        _prepare_podman(h, podman_template, network.gateway_address(sb.index))
    else:
        images.seed_data_root(template, h.data_root)
    if h.netns is not None:
        number = int(h.name.removeprefix("node"))
        network.create_host_netns(sb.index, h.name, number)
    if h.runtime == "podman":
        sb.start_sshd(h)
        progress(f"{h.name}: sshd at {h.address}:{h.port}, podman store {h.podman_root}")
        return
    sb.start_dockerd(h)
    sb.start_sshd(h)
    progress(f"{h.name}: sshd at {h.address}:{h.port}, dockerd at {h.docker_host}")


def _load_mpi_image(h: SandboxHost, sb: Sandbox, tar: Path, rootless: bool) -> None:
    if rootless:
        podman.load_rootless_images(h.rootless_env, DOCKER_USER, tar)
    else:
        sb.load_image(h, tar)


def _prepare_podman(h: SandboxHost, template: Path, registry_host: str) -> None:
    """The host's podman store (seeded from the template), its configs, and
    the rootful and rootless registry settings (the sandbox registry on
    `registry_host` is plain HTTP)."""
    podman.seed_store(template, h.podman_root)
    h.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    env = h.podman_env
    Path(env["CONTAINERS_STORAGE_CONF"]).write_text(
        podman.storage_conf(h.podman_root, h.run_dir / "podman-run")
    )
    Path(env["CONTAINERS_CONF"]).write_text(podman.containers_conf(h.run_dir / "podman-tmp"))
    podman.write_registry_files(env, registry_host)
    podman.prepare_rootless(h.rootless_dir, DOCKER_USER)
    podman.write_registry_files(h.rootless_env, registry_host, owner=DOCKER_USER)


def _parallel(fn: Callable[[SandboxHost], None], hosts: list[SandboxHost]) -> None:
    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(len(hosts), 16)) as pool:
        futures = [pool.submit(fn, h) for h in hosts]
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err


def _check_options(
    runtime: str,
    *,
    rootless: bool,
    egress_host: bool,
    slurm: bool,
    gpus: int,
    registry: bool = False,
    registry_rate: str | None = None,
) -> None:
    """The combinations `sandbox_up` builds (SandboxError for the others)."""
    if runtime not in ("docker", "podman"):
        raise SandboxError(f"runtime must be docker or podman, got {runtime!r}")
    if rootless and runtime != "podman":
        raise SandboxError("rootless is podman's: use runtime podman with rootless")
    if runtime == "podman" and egress_host:
        raise SandboxError("the egress host runs docker only; leave out egress_host for podman")
    if not 0 <= gpus <= 16:
        raise SandboxError(f"--gpus must be between 0 and 16, got {gpus}")
    if slurm and egress_host:
        raise SandboxError("the egress host is not a Slurm node; leave out egress_host for slurm")
    if registry_rate is not None:
        if not registry:
            raise SandboxError("--registry-rate shapes the --registry; add --registry")
        network.check_rate(registry_rate)
    if registry and rootless:
        raise SandboxError("--registry is built for rootful hosts only; leave out --rootless")


def sandbox_up(
    directory: Path,
    hosts: int = 4,
    *,
    egress_host: bool = False,
    progress: Progress | None = None,
    runtime: str = "docker",
    rootless: bool = False,
    mpi: bool = False,
    slurm: bool = False,
    gpus: int = 0,
    registry: bool = False,
    registry_rate: str | None = None,
) -> Sandbox:
    """Build the sandbox in `directory` (created; must not hold a live sandbox).

    `runtime` "podman": every node runs a podman store of its own instead of
    a dockerd (rootful, reached by the sudo login user; sandbox/podman.py).
    `rootless` (podman only): the cluster file logs in as the docker-group
    user and drives that user's own rootless podman, whose store on every
    node gets the sandbox images (a `podman load` per node, as that user).
    `mpi`: the cluster file's image is `images.MPI_TAG` (Open MPI, mpi4py),
    built once and cached, loaded on every node.
    `slurm`: a real Slurm over the nodes (sandbox/slurm.py), driven with
    the variables in DIR/slurm.env. `gpus`: that many stand-in GPUs per node
    (a device root the cluster file names; gres gpu:K with `slurm`).
    `registry`: the image only in a registry shaped to `registry_rate` (`_start_registry`).
    On any failure (also Ctrl-C) everything created so far is torn down again.
    """
    _check_options(
        runtime,
        rootless=rootless,
        egress_host=egress_host,
        slurm=slurm,
        gpus=gpus,
        registry=registry,
        registry_rate=registry_rate,
    )
    directory = Path(directory).absolute()
    # Before anything changes: root, every command, every place written.
    prereqs.require(
        directory,
        [network.RUN_ROOT, network.NETNS_DIR, images.cache_dir(), SUDOERS_FILE.parent],
        _commands(runtime, rootless=rootless, slurm=slurm, registry=registry),
    )
    say = progress or _quiet
    if hosts < (0 if egress_host else 1) or hosts > 250:
        raise SandboxError(f"--hosts must be between 1 and 250, got {hosts}")
    if (directory / STATE_FILE).exists():
        raise SandboxError(
            f"{directory} already holds a sandbox; run `cvs sandbox down --dir {directory}` first"
        )
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    sb = _new_sandbox(directory, hosts, egress_host, runtime)
    sb.slurm, sb.gpus, sb.netns_registry, sb.registry_rate = slurm, gpus, registry, registry_rate
    sb.save()
    try:
        say(f"sandbox {sb.index}: bridge {sb.bridge}, {network.SUBNET_PREFIX}.{sb.index}.0/24")
        _prepare_keys(sb)
        network.create_bridge(sb.index)
        template = images.ensure_images(say)
        podman_template = podman.ensure_template(say) if runtime == "podman" else None
        mpi_tar = images.ensure_mpi_image(say) if mpi else None
        _parallel(lambda h: _start_host(sb, h, template, say, podman_template), sb.hosts)
        _load_images(sb, mpi_tar, rootless=rootless, say=say)
        for h in sb.nodes if gpus else []:
            slurm_sb.make_gpu_root(h.gpu_root, gpus)
        if slurm:
            _start_slurm(sb, say)
        _write_cluster_files(sb, mpi=mpi, rootless=rootless)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            say("sandbox up failed; tearing down what was created")
        sandbox_down(directory)
        if isinstance(exc, procs.CommandError | TimeoutError):
            raise SandboxError(f"sandbox up failed: {exc}") from exc
        raise
    say(f"sandbox ready in {time.monotonic() - started:.1f}s: {sb.cluster_file}")
    return sb


def _commands(runtime: str, *, rootless: bool, slurm: bool, registry: bool) -> dict[str, str]:
    """What this sandbox runs beyond prereqs.REQUIRED_COMMANDS."""
    return {
        **(prereqs.PODMAN_COMMANDS if runtime == "podman" else {}),
        **(prereqs.ROOTLESS_COMMANDS if rootless else {}),
        **(slurm_sb.COMMANDS if slurm else {}),
        **(prereqs.REGISTRY_COMMANDS if registry else {}),
    }


def _load_images(sb: Sandbox, mpi_tar: Path | None, *, rootless: bool, say: Progress) -> None:
    """The images beyond the seeded ones: rootless stores, the MPI image,
    and with `--registry` the cluster's image moved into the registry."""
    if rootless:
        say(f"loading the images into {DOCKER_USER}'s rootless podman on each node")
        _parallel(lambda h: podman.load_rootless_images(h.rootless_env, DOCKER_USER), sb.nodes)
    # With a registry only node1, which pushes it, needs the MPI image.
    loaders = sb.nodes[:1] if sb.netns_registry else sb.nodes
    if mpi_tar is not None:
        say(f"loading {images.MPI_TAG} on {'node1' if sb.netns_registry else 'each node'}")
        _parallel(lambda h: _load_mpi_image(h, sb, mpi_tar, rootless), loaders)
    if sb.netns_registry:
        # The MPI image is on node1 only (above); the sshd image on every node.
        if mpi_tar is not None:
            _start_registry(sb, images.MPI_TAG, loaders, say)
        else:
            _start_registry(sb, images.SSHD_TAG, sb.nodes, say)


def _write_cluster_files(sb: Sandbox, *, mpi: bool, rootless: bool) -> None:
    """The nodes' cluster file, and the egress host's when there is one."""
    if sb.nodes:
        image = sb.registry_image or (images.MPI_TAG if mpi else images.SSHD_TAG)
        login = None
        if sb.registry_image is not None:
            password_file = netns_registry_dir(sb.run_dir) / "password"
            login = {"username": REGISTRY_USER, "password_file": str(password_file)}
        text = _cluster_yaml(sb, sb.nodes, "sandbox", image, rootless=rootless, login=login)
        sb.cluster_file.write_text(text)
    if sb.egress is not None:
        assert sb.egress_cluster_file is not None
        # The base image: the default setup script apt-installs openssh-server here.
        text = _cluster_yaml(sb, [sb.egress], "sandbox-egress", images.BASE_TAG)
        sb.egress_cluster_file.write_text(text)


def _start_registry(sb: Sandbox, source: str, holders: list[SandboxHost], say: Progress) -> None:
    """The `--registry`: its namespace (shaped), the registry in it, `source`
    pushed to it from node1 under a name no node has, `source` removed from
    the nodes holding it (`holders`: then its layers must come from the
    registry), registry.env."""
    network.create_registry_netns(sb.index, sb.registry_rate)
    reg = start_netns_registry(sb.index, sb.run_dir, sb.registry_data)
    sb.registry_pid = reg.pid
    sb.save()
    ref = reg.ref("cvs/" + source.rsplit(":", 1)[-1], "pushed")
    shaped = f"shaped to {sb.registry_rate}" if sb.registry_rate else "unshaped"
    say(f"registry at {reg.address} ({shaped}): pushing {source} as {ref}")
    _push(sb, reg, source, ref)

    def forget(h: SandboxHost) -> None:
        procs.run([*sb.runtime_argv(h), "rmi", source])

    _parallel(forget, holders)
    sb.registry_image = ref
    sb.save()
    text = (
        "# Written by `cvs sandbox up --registry`; removed by `cvs sandbox down`.\n"
        "# What the registry served: the tx_bytes of REGISTRY_IF inside REGISTRY_NETNS,\n"
        "# ip netns exec $REGISTRY_NETNS cat /sys/class/net/$REGISTRY_IF/statistics/tx_bytes\n"
        f"export REGISTRY={reg.address}\n"
        f"export REGISTRY_NETNS={network.registry_netns_name(sb.index)}\n"
        f"export REGISTRY_IF={network.REGISTRY_INTERFACE}\n"
        f"export REGISTRY_IMAGE={ref}\n"
        f"export REGISTRY_RATE={sb.registry_rate or ''}\n"
    )
    tmp = sb.registry_env_file.with_name("registry.env.tmp")
    tmp.write_text(text)
    tmp.replace(sb.registry_env_file)


def _push(sb: Sandbox, reg: SandboxRegistry, source: str, ref: str) -> None:
    """`docker push` of `source` as `ref` by node1's dockerd, logged in through
    a DOCKER_CONFIG of our own (removed after); node1 keeps no `ref` tag.
    podman: node1's store pushes, with that file as its `--authfile` (the
    same format) and `--tls-verify=false` (the registry is plain HTTP)."""
    node1 = sb.nodes[0]
    docker = sb.runtime_argv(node1)
    config_dir = reg.directory / "docker-config"
    config_dir.mkdir(mode=0o700)
    try:
        fd = os.open(config_dir / "config.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(docker_config(reg))
        env = {**os.environ, "DOCKER_CONFIG": str(config_dir)}
        push = [*docker, "push", "-q", ref]
        if node1.runtime == "podman":
            auth = ["--authfile", str(config_dir / "config.json"), "--tls-verify=false"]
            push = [*docker, "push", "-q", *auth, ref]
        procs.run([*docker, "tag", source, ref])
        procs.run_env(push, env=env, timeout=PUSH_TIMEOUT)
        procs.run([*docker, "rmi", ref])
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


def _stop_registry(sb: Sandbox) -> None:
    """The `--registry`'s process, namespace and link: by pid, then whatever
    is still in its namespace (ours: nothing else runs there), then the
    namespace. Names follow from the index, so this also runs after a crash
    that left the state without them."""
    stop_netns_registry(sb.registry_pid, sb.run_dir)
    ns = network.registry_netns_name(sb.index)
    if network.netns_exists(ns):
        for pid in procs.run(["ip", "netns", "pids", ns], check=False).split():
            procs.kill_now(int(pid))
        network.delete_netns(ns)
    network.delete_link(network.registry_veth_name(sb.index))
    sb.registry_pid = None


def _start_slurm(sb: Sandbox, say: Progress) -> None:
    nodes = [
        slurm_sb.SlurmNodeSpec(h.name, h.address, h.netns, h.gpu_root if sb.gpus else None)
        for h in sb.nodes
    ]
    p = sb.slurm_paths
    slurm_sb.prepare(p, sb.index, nodes, sb.gpus, sb.slurm_env_file, sb.run_dir)

    def record(name: str, pid: int) -> None:
        sb.slurm_pids[name] = pid
        sb.save()

    slurm_sb.start(p, nodes, record)
    ctld, _ = slurm_sb.ports(sb.index)
    gres = f", gres gpu:{sb.gpus} each" if sb.gpus else ""
    say(f"slurm: slurmctld on port {ctld}, {len(nodes)} node(s) idle{gres}")
    say(f"slurm: source {sb.slurm_env_file} to use sinfo, srun, salloc, sbatch")


def load_sandbox(directory: Path) -> Sandbox:
    state = Path(directory).absolute() / STATE_FILE
    try:
        data = json.loads(state.read_text())
    except FileNotFoundError:
        raise SandboxError(f"no sandbox in {directory} ({state} not found)") from None
    except ValueError as exc:
        raise SandboxError(f"{state}: unreadable sandbox state: {exc}") from None
    return Sandbox(
        directory=Path(data["directory"]),
        index=int(data["index"]),
        bridge=data["bridge"],
        run_dir=Path(data["run_dir"]),
        hosts=[SandboxHost.from_json(h) for h in data["hosts"]],
        slurm=bool(data.get("slurm", False)),
        slurm_pids={str(k): int(v) for k, v in data.get("slurm_pids", {}).items()},
        gpus=int(data.get("gpus", 0)),
        netns_registry=bool(data.get("netns_registry", False)),
        registry_rate=data.get("registry_rate"),
        registry_pid=data.get("registry_pid"),
        registry_image=data.get("registry_image"),
    )


def sandbox_down(directory: Path, progress: Progress | None = None) -> None:
    """Remove everything the sandbox in `directory` created. Idempotent."""
    _require_root()
    say = progress or _quiet
    directory = Path(directory).absolute()
    if not (directory / STATE_FILE).exists():
        say(f"no sandbox in {directory}; nothing to do")
        return
    sb = load_sandbox(directory)
    # Keep going past a failing step so one stuck piece does not strand the
    # rest; report all failures at the end and keep the state file for a rerun.
    errors: list[str] = []

    def attempt(what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            errors.append(f"{what}: {exc}")

    def stop_host(h: SandboxHost) -> None:
        attempt(f"{h.name} dockerd", lambda: sb.stop_dockerd(h, remove_containers=True))
        attempt(f"{h.name} sshd", lambda: sb.stop_sshd(h))
        if h.netns is not None and network.netns_exists(h.netns):
            # Anything still inside a namespace we created was started by us.
            for pid in procs.run(["ip", "netns", "pids", h.netns], check=False).split():
                procs.kill_now(int(pid))
        for mount in procs.mounts_under([h.data_root, h.run_dir, h.podman_root]):
            procs.run(["umount", "-l", mount], check=False)
        # Tens of thousands of layer files per host: delete hosts in parallel.
        # --one-file-system: never descend into a mount that refused to go.
        attempt(
            f"{h.name} files",
            lambda: procs.run(["rm", "-rf", "--one-file-system", str(h.host_dir)]),
        )

    if sb.slurm_pids:
        attempt("slurm", lambda: slurm_sb.stop(sb.slurm_paths, sb.slurm_pids))
    attempt("registry", lambda: _stop_registry(sb))
    say(f"stopping {len(sb.hosts)} host(s)")
    _parallel(stop_host, sb.hosts)
    # A containerd shim can outlive `docker rm` and dockerd by a moment; every
    # process our daemons started names a path under the run dir.
    marker = f"{sb.run_dir}/"
    for pid in procs.pids_mentioning(marker):
        attempt(f"leftover process {pid}", functools.partial(procs.stop, pid, marker, timeout=5.0))
    for mount in procs.mounts_under([sb.run_dir]):
        procs.run(["umount", "-l", mount], check=False)
    for h in sb.hosts:
        if h.netns is not None:
            attempt(f"netns {h.netns}", functools.partial(network.delete_netns, h.netns))
        if h.veth is not None:
            attempt(f"link {h.veth}", functools.partial(network.delete_link, h.veth))
    attempt(f"bridge {sb.bridge}", lambda: network.delete_link(sb.bridge))
    shutil.rmtree(sb.run_dir, ignore_errors=True)
    # Only what `up` created: DIR may be shared with other files.
    for name in ("hosts", "ssh", "slurm"):
        shutil.rmtree(directory / name, ignore_errors=True)
    for name in ("cluster.yaml", "cluster-egress.yaml", "slurm.env", STATE_FILE + ".tmp"):
        (directory / name).unlink(missing_ok=True)
    if sb.netns_registry:
        shutil.rmtree(sb.registry_data, ignore_errors=True)
        for path in (sb.registry_env_file, sb.registry_env_file.with_name("registry.env.tmp")):
            path.unlink(missing_ok=True)
    if errors:
        raise SandboxError(
            f"sandbox down in {directory} is incomplete (rerun it): " + "; ".join(errors)
        )
    # The state file goes last, so an interrupted down can simply be rerun.
    (directory / STATE_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()
    say(f"sandbox {sb.index} removed")
