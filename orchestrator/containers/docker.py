"""Argv builders and output parsers for the docker CLI.

Builders return argv lists; the caller quotes them once with `shlex.join`
(remote commands are shell text, so quoting happens exactly there). Every
container name and image reference is validated before it reaches an argv,
so a name like `x;rm -rf /` is refused even though quoting would defuse it.

Parsers read `docker inspect` / `docker image inspect` JSON into small frozen
dataclasses; text is never grepped for facts. The only text matching is
`classify_docker_error`, which sorts the CLI's *error messages* (there is no
structured form of those) into the few kinds the planner must tell apart.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from orchestrator import remote
from orchestrator.config import CONTAINER_NAME_RE, IMAGE_REF_RE, ContainerConfig, Registry
from orchestrator.config.model import DEPRECATED_CONTAINER_KEYS
from orchestrator.containers.mpi import RUN_AS_ROOT_ENV, runs_as_root
from orchestrator.limits.cdi import CDIDevice, cdi_run_args
from orchestrator.limits.gpus import GPUSelection, guard_visible_devices
from orchestrator.limits.resources import EffectiveResources, limits_drift
from orchestrator.remote.runtime import ContainerRuntime

ContainerStatus = Literal["running", "exited", "other"]
DockerErrorKind = Literal["not_found", "daemon_down", "permission_denied", "not_installed", "other"]

# Label keys the orchestrator puts on containers it creates. A container is
# "ours" when LABEL_MANAGED carries this cluster's name (see `is_ours`).
LABEL_MANAGED = "io.cvs.managed"
LABEL_CONFIG_HASH = "io.cvs.config-hash"
# The lifetime the container was started under: a per_run cluster never
# owns (so never removes) a container labelled persistent.
LABEL_LIFETIME = "io.cvs.lifetime"
# The invocation that started it: rollback and a run's tear-down remove only
# what their own invocation started.
LABEL_INVOCATION = "io.cvs.invocation"
# The port its in-container sshd listens on: with network host another
# cluster's probe names this container when that port is taken.
LABEL_SSHD_PORT = "io.cvs.sshd-port"
# The Slurm job whose invocation started it (hosts from Slurm): a per_run
# container goes when that job ends (containers/jobend.py, `cvs slurm epilog`).
LABEL_SLURM_JOB = "io.cvs.slurm-job"
# The host's GPU indices it was given ("2,3"): a later job compares them with
# its own allocation before attaching.
LABEL_GPUS = "io.cvs.gpus"
CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")  # a full container ID, as docker prints it

# Docker's zero time: what StartedAt holds for a container never started.
_ZERO_TIME = "0001-01-01T00:00:00Z"


class DockerOutputError(ValueError):
    """Docker printed something that is not the JSON we asked for."""


def short_id(value: str | None) -> str:
    """An image ID or a sha256 as people read it, the way `docker images` shows
    IDs: the first 12 hex digits without the `sha256:` prefix; `?` when unknown."""
    if not value:
        return "?"
    return value.partition(":")[2][:12] if ":" in value else value[:12]


# --- validation ----------------------------------------------------------


def validate_container_name(name: str) -> str:
    """`name` unchanged, or ValueError when docker would not accept it as a name."""
    if not isinstance(name, str) or not CONTAINER_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid container name {name!r} (letters, digits, '_', '.', '-'; "
            "must start with a letter or digit)"
        )
    return name


def validate_image_ref(ref: str) -> str:
    """`ref` unchanged, or ValueError when it is not a plain image reference."""
    if not isinstance(ref, str) or not IMAGE_REF_RE.fullmatch(ref):
        raise ValueError(f"invalid image reference {ref!r}")
    return ref


def _validate_label(key: str, value: str) -> None:
    # Quoting makes any value safe on the command line; these rules are about
    # docker parsing `--label k=v` back into the same key and value.
    if not key or "=" in key or any(c.isspace() for c in key):
        raise ValueError(f"invalid label key {key!r}")
    if "\n" in value or "\0" in value:
        raise ValueError(f"invalid label value for {key!r}: contains a newline or NUL")


# --- builders ------------------------------------------------------------


def config_hash(cfg: ContainerConfig) -> str:
    """Short, stable hash of the container block (label value for drift checks)."""
    data = cfg.model_dump(mode="json")
    # Keys added with the runtime seam count only when set: a docker
    # container started before them keeps its hash (no drift warning).
    for key, default in (("runtime", "docker"), ("rootless", False), ("cdi", "auto")):
        if data.get(key) == default:
            data.pop(key, None)
    # How the image reaches the hosts, not the container.
    data.pop("distribute", None)
    data.pop("spread_transport", None)
    if isinstance(data.get("sshd"), dict):
        # How commands reach the container (sshd.exec), not the container.
        data["sshd"].pop("exec", None)
    # Renamed keys hash under their old names: a rename changes no container's hash.
    for old, new in DEPRECATED_CONTAINER_KEYS.items():
        if new in data:
            data[old] = data.pop(new)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def managed_labels(
    cluster_name: str,
    cfg_hash: str | None = None,
    *,
    our_label: str = LABEL_MANAGED,
    lifetime: str | None = None,
    invocation: str | None = None,
    sshd_port: int | None = None,
    slurm_job: str | None = None,
    gpus: tuple[int, ...] | None = None,
) -> dict[str, str]:
    """The labels `run_argv` should get so `is_ours` recognises the container.

    `cluster_name` is the cluster's identity (`cluster_identity`): its
    explicit name, or the cluster file's path when the name is the default.
    """
    labels = {our_label: cluster_name}
    if cfg_hash is not None:
        labels[LABEL_CONFIG_HASH] = cfg_hash
    if lifetime is not None:
        labels[LABEL_LIFETIME] = lifetime
    if invocation is not None:
        labels[LABEL_INVOCATION] = invocation
    if sshd_port is not None:
        labels[LABEL_SSHD_PORT] = str(int(sshd_port))
    if slurm_job is not None:
        labels[LABEL_SLURM_JOB] = slurm_job
    if gpus:
        labels[LABEL_GPUS] = ",".join(str(int(i)) for i in gpus)
    return labels


def is_ours(
    labels: Mapping[str, str],
    cluster_name: str,
    *,
    our_label: str = LABEL_MANAGED,
    lifetime: str | None = None,
) -> bool:
    """Whether this cluster created the container (another cluster's is foreign).

    With `lifetime`, a container labelled with another lifetime is not ours
    either: the same file switched from persistent to per_run must not treat
    the persistent set as disposable. (Containers from before the lifetime
    label count by identity alone.)
    """
    if labels.get(our_label) != cluster_name:
        return False
    recorded = labels.get(LABEL_LIFETIME)
    return lifetime is None or recorded is None or recorded == lifetime


def rm_id_argv(prefix: Sequence[str], container_id: str) -> list[str]:
    """`docker rm -f ID`: removal by the exact container ID probed or created."""
    if not isinstance(container_id, str) or not CONTAINER_ID_RE.fullmatch(container_id):
        raise ValueError(f"invalid container ID {container_id!r} (64 hex digits)")
    return [*prefix, "rm", "-f", container_id]


def remove_started_by_command(
    prefix: Sequence[str],
    name: str,
    invocation: str,
    *,
    then: str | None = None,
    name_filter: str | None = None,
) -> str:
    """Shell text: remove the containers named `name` that `invocation` started.

    For rollback after an interrupted `docker run`, whose container ID never
    came back: the invocation label finds exactly what this invocation made.
    `then` (shell text, `$ids` set to the removed IDs) runs after a removal.
    `name_filter`: the runtime's spelling of "exactly this name" (docker's
    names start with '/', podman's do not; containers/runtime.py).
    """
    validate_container_name(name)
    if not re.fullmatch(r"[0-9a-f]{8,64}", invocation):
        raise ValueError(f"invalid invocation id {invocation!r}")
    docker = shlex.join(prefix)
    filters = shlex.join(
        [
            "--filter",
            f"label={LABEL_INVOCATION}={invocation}",
            "--filter",
            name_filter or f"name=^/{name}$",
        ]
    )
    return (
        f"ids=$({docker} ps -aq --no-trunc {filters}) || exit 1; "
        f'[ -z "$ids" ] || {docker} rm -f $ids' + (f" && {{ {then}; }}" if then else "")
    )


def run_argv(
    prefix: Sequence[str],
    cfg: ContainerConfig,
    name: str,
    labels: Mapping[str, str],
    *,
    resources: EffectiveResources | None = None,
    gpus: GPUSelection | None = None,
    cdi: Sequence[CDIDevice] | None = None,
    keep_groups: bool = False,
) -> list[str]:
    """`docker run -d …` for a long-lived container that idles on `sleep infinity`,
    under the runtime's init (`--init`: docker-init, podman's catatonit) as
    PID 1, which reaps the orphans commands leave (an `sshd`, `orted` or
    `mpirun` whose parent went first): `sleep` reaps nothing, and zombies
    count against the pids cap.

    The one place a container's run argv is assembled. `cfg.devices` is used
    as given: the caller filters it per host (only the devices present there).
    `resources` are the host's effective caps and `gpus` the host's GPU
    selection (its devices and visible-devices env); `cdi`, when the host's
    GPUs go through CDI, the devices that carry exactly that selection
    (`--device kind=name` instead of the device nodes); `cfg.extra_args` (the
    operator's escape hatch) follows them so it can override. `keep_groups`
    (rootless podman on crun, limits/rootless.py): `--group-add keep-groups`
    instead of `cfg.group_add` (podman takes no other group next to it).
    """
    validate_container_name(name)
    validate_image_ref(cfg.image)
    argv = [*prefix, "run", "-d", "--init", "--name", name]
    for key, value in labels.items():
        _validate_label(key, value)
        argv += ["--label", f"{key}={value}"]
    argv += ["--network", cfg.network]
    if cfg.ipc:
        argv += ["--ipc", cfg.ipc]
    if cfg.privileged:
        argv.append("--privileged")
    for device in cfg.devices:
        argv += ["--device", device]
    for cap in cfg.cap_add:
        argv += ["--cap-add", cap]
    for opt in cfg.security_opt:
        argv += ["--security-opt", opt]
    if keep_groups:
        argv += ["--group-add", "keep-groups"]
    else:
        for group in cfg.group_add:
            argv += ["--group-add", str(group)]
    for key, limit in cfg.ulimits.items():
        argv += ["--ulimit", f"{key}={limit}"]
    for volume in cfg.volumes:
        argv += ["-v", volume]
    if container_env(cfg, gpus):
        # Values from `run_env_file` on stdin: never in an argv (`ps`).
        argv += ["--env-file", "/dev/stdin"]
    if cfg.shm_size:
        argv += ["--shm-size", str(cfg.shm_size)]
    if resources is not None:
        argv += resources.docker_args()
    if gpus is not None:
        argv += cdi_run_args(cdi) if cdi else gpus.docker_args()
        for key, value in gpus.env().items():
            argv += ["-e", f"{key}={value}"]
    argv += list(cfg.extra_args)
    argv += [cfg.image, "sleep", "infinity"]
    return argv


def container_env(cfg: ContainerConfig, gpus: GPUSelection | None = None) -> dict[str, str]:
    """`container.env` as the container gets it: after Open MPI's run-as-root
    variables where commands run as root (`mpi.RUN_AS_ROOT_ENV`; a key in
    container.env wins)."""
    env = {**(RUN_AS_ROOT_ENV if runs_as_root(cfg.user) else {}), **cfg.env}
    if gpus is not None and gpus.gpus:
        # A visible-devices variable in container.env must not widen the subset
        # (the API warns about it; here it is only dropped).
        env, _ = guard_visible_devices(env, cfg.gpus, count=len(gpus.gpus))
    return env


def run_env_file(cfg: ContainerConfig, gpus: GPUSelection | None = None) -> str | None:
    """What `run_argv`'s `--env-file /dev/stdin` reads: `KEY=VALUE` lines, or None."""
    env = container_env(cfg, gpus)
    if not env:
        return None
    lines = []
    for key, value in env.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"container env {key}: a value cannot contain a line break")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def image_inspect_argv(prefix: Sequence[str], ref: str) -> list[str]:
    return [*prefix, "image", "inspect", _image_or_id(ref)]


def start_argv(prefix: Sequence[str], name: str) -> list[str]:
    return [*prefix, "start", validate_container_name(name)]


def unpause_argv(prefix: Sequence[str], name: str) -> list[str]:
    return [*prefix, "unpause", validate_container_name(name)]


def stop_argv(prefix: Sequence[str], name: str, *, timeout: int | None = None) -> list[str]:
    argv = [*prefix, "stop"]
    if timeout is not None:
        argv += ["-t", str(int(timeout))]
    return [*argv, validate_container_name(name)]


def parse_run_id(stdout: str) -> str | None:
    """The container ID `docker run -d` printed (its last line), if it is one."""
    lines = stdout.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    return last if CONTAINER_ID_RE.fullmatch(last) else None


def pull_argv(prefix: Sequence[str], ref: str) -> list[str]:
    return [*prefix, "pull", validate_image_ref(ref)]


def load_argv(prefix: Sequence[str], tar_path: str) -> list[str]:
    if not tar_path or tar_path.startswith("-"):
        raise ValueError(f"invalid image tar path {tar_path!r}")
    return [*prefix, "load", "-i", tar_path]


def login_argv(prefix: Sequence[str], username: str, server: str | None = None) -> list[str]:
    """`docker login … --password-stdin`: the password never appears in argv."""
    if not username or username.startswith("-"):
        raise ValueError(f"invalid registry username {username!r}")
    argv = [*prefix, "login", "--username", username, "--password-stdin"]
    if server:
        if server.startswith("-"):
            raise ValueError(f"invalid registry server {server!r}")
        argv.append(server)
    return argv


def image_registry(image: str) -> str | None:
    """The registry an image reference names (`reg.example:5000/team/img:1` ->
    `reg.example:5000`), None for Docker Hub (`rocm/cvs:7.0`, `ubuntu`)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def login_command(prefix: Sequence[str], registry: Registry, image: str | None = None) -> str:
    """Shell text for a host: `docker login` reading the password file on that host.

    The password stays on the host: it goes from `registry.password_file`
    into docker's stdin and never crosses SSH, argv or logs. Without
    `registry.server`, the login goes to the registry `image` names (what a
    user means), not to Docker Hub.
    """
    server = registry.server or (image_registry(image) if image else None)
    argv = login_argv(prefix, registry.username, server)
    return f"{shlex.join(argv)} < {shlex.quote(registry.password_file)}"


def bounded_argv(command: str | Sequence[str]) -> list[str]:
    """`command` (an argv, or shell text built from quoted pieces) run by
    remote/bounded.sh: a timeout's TERM then stops all of it, the docker CLI
    included (a plain `docker login` outlived its timeout)."""
    inner = ["sh", "-c", command] if isinstance(command, str) else list(command)
    return remote.argv("bounded", *inner)


def exec_argv(
    prefix: Sequence[str],
    name: str,
    argv: Sequence[str],
    *,
    interactive: bool = False,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
) -> list[str]:
    """`docker exec [-i] [-u user] [-w dir] [-e K=V] NAME argv…`."""
    if not argv:
        raise ValueError("exec needs a command")
    out = [*prefix, "exec"]
    if interactive:
        out.append("-i")
    if user is not None:
        if not user or user.startswith("-"):
            raise ValueError(f"invalid user {user!r}")
        out += ["-u", user]
    if workdir is not None:
        out += ["-w", workdir]
    for key, value in (env or {}).items():
        if not key or "=" in key or key.startswith("-"):
            raise ValueError(f"invalid environment variable name {key!r}")
        out += ["-e", f"{key}={value}"]
    return [*out, validate_container_name(name), *argv]


def _image_or_id(ref: str) -> str:
    # Image inspect also takes an image ID ("sha256:…"), which the reference
    # grammar does not cover.
    if ref.startswith("sha256:") and all(c in "0123456789abcdef" for c in ref[7:]) and ref[7:]:
        return ref
    return validate_image_ref(ref)


# --- parsers -------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMapping:
    path_on_host: str
    path_in_container: str
    permissions: str


@dataclass(frozen=True)
class ContainerLimits:
    """HostConfig limits as docker reports them; None = docker's "unset" (0 / -1 / null)."""

    nano_cpus: int | None = None
    memory: int | None = None
    memory_reservation: int | None = None
    cpu_shares: int | None = None
    pids_limit: int | None = None
    shm_size: int | None = None
    devices: tuple[DeviceMapping, ...] = ()


def container_limits_drift(
    effective: EffectiveResources, limits: ContainerLimits | None
) -> list[str]:
    """`limits_drift` against the limits a probe parsed from `docker inspect`."""
    if limits is None:
        return []
    return limits_drift(
        effective,
        {
            "NanoCpus": limits.nano_cpus,
            "Memory": limits.memory,
            "PidsLimit": limits.pids_limit,
            "MemoryReservation": limits.memory_reservation,
            "CpuShares": limits.cpu_shares,
            "ShmSize": limits.shm_size,
        },
    )


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    status: str  # docker's own word: created, running, paused, restarting, exited, dead, …
    running: bool
    image_id: str | None  # None when docker did not report one
    image_ref: str | None  # what the container was started from (Config.Image)
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    started_at: str | None = None
    limits: ContainerLimits = field(default_factory=ContainerLimits)
    # The runtime's init is PID 1 (HostConfig.Init: `run --init`); None: not said.
    init: bool | None = None

    @property
    def state(self) -> ContainerStatus:
        """Coarse state for planning.

        `created` (never started) counts as exited: `docker start` brings it
        up with its overlay, exactly as for a stopped container.
        """
        if self.running and self.status == "running":
            return "running"
        # podman's words for the same: "stopped" (stopped, not yet cleaned
        # up) and "configured" (created, never initialised).
        if self.status in ("exited", "created", "stopped", "configured"):
            return "exited"
        return "other"


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...] = ()
    repo_tags: tuple[str, ...] = ()


def _first_object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DockerOutputError(f"{what}: not JSON ({exc.msg} at char {exc.pos})") from None
    if isinstance(data, list):
        if not data:
            raise DockerOutputError(f"{what}: empty result")
        data = data[0]
    if not isinstance(data, dict):
        raise DockerOutputError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _opt_int(value: Any, *, unset: tuple[int, ...] = (0,)) -> int | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    return None if value in unset else value


def _str_map(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        return MappingProxyType({})
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def _limits(host_config: Any) -> ContainerLimits:
    if not isinstance(host_config, dict):
        return ContainerLimits()
    devices = tuple(
        DeviceMapping(
            path_on_host=str(d.get("PathOnHost", "")),
            path_in_container=str(d.get("PathInContainer", "")),
            permissions=str(d.get("CgroupPermissions", "")),
        )
        for d in host_config.get("Devices") or ()
        if isinstance(d, dict)
    )
    return ContainerLimits(
        nano_cpus=_opt_int(host_config.get("NanoCpus")),
        memory=_opt_int(host_config.get("Memory")),
        memory_reservation=_opt_int(host_config.get("MemoryReservation")),
        cpu_shares=_opt_int(host_config.get("CpuShares")),
        # 20.10 reports null or 0 for "no limit", newer engines -1.
        pids_limit=_opt_int(host_config.get("PidsLimit"), unset=(0, -1)),
        shm_size=_opt_int(host_config.get("ShmSize")),
        devices=devices,
    )


def _sha256_id(value: Any) -> Any:
    """An image ID as docker prints it: podman prints the 64 hex digits alone."""
    if isinstance(value, str) and CONTAINER_ID_RE.fullmatch(value):
        return f"sha256:{value}"
    return value


# podman's defaults (containers.conf) for what docker leaves unset: a
# container started without `--pids-limit` / `--shm-size` reports its own
# (ContainerRuntime.unset_limits).
DOCKER_DEFAULT_SHM_BYTES = ContainerRuntime().unset_limits[1]  # as limits.resources says


def runtime_limits(runtime: str, limits: ContainerLimits) -> ContainerLimits:
    """Limits as docker reports them for the same request: a runtime's own
    defaults for what was left unset read as unset (no false drift on an
    attach)."""
    unset_pids, unset_shm = ContainerRuntime.unprobed(runtime).unset_limits
    pids, shm = limits.pids_limit, limits.shm_size
    return replace(
        limits,
        pids_limit=None if pids == unset_pids else pids,
        shm_size=DOCKER_DEFAULT_SHM_BYTES if shm == unset_shm else shm,
    )


def normalize_image_id(value: str) -> str:
    """An image ID as docker prints it: podman prints the 64 hex digits alone."""
    return _sha256_id(value)  # type: ignore[no-any-return]


def parse_container_inspect(text: str) -> ContainerInfo:
    """`docker inspect --type container NAME` output -> ContainerInfo."""
    obj = _first_object(text, "docker inspect")
    state = obj.get("State")
    cid = obj.get("Id")
    if not isinstance(state, dict) or not isinstance(cid, str) or not cid:
        raise DockerOutputError("docker inspect: no container Id/State in the output")
    config: dict[str, Any] = obj["Config"] if isinstance(obj.get("Config"), dict) else {}
    image_id = _sha256_id(obj.get("Image"))
    started = state.get("StartedAt")
    return ContainerInfo(
        id=cid,
        name=str(obj.get("Name", "")).lstrip("/"),
        status=str(state.get("Status", "")),
        running=state.get("Running") is True,
        image_id=image_id if isinstance(image_id, str) and image_id else None,
        image_ref=config.get("Image") if isinstance(config.get("Image"), str) else None,
        labels=_str_map(config.get("Labels")),
        started_at=started if isinstance(started, str) and started != _ZERO_TIME else None,
        limits=_limits(obj.get("HostConfig")),
        init=_init(obj.get("HostConfig")),
    )


def _init(host_config: Any) -> bool | None:
    """HostConfig.Init: true with `--init`; docker says null, podman false,
    without it; None when there is no HostConfig to read."""
    if not isinstance(host_config, dict):
        return None
    return host_config.get("Init") is True


def parse_image_inspect(text: str) -> ImageInfo:
    """`docker image inspect REF` output -> ImageInfo."""
    obj = _first_object(text, "docker image inspect")
    iid = _sha256_id(obj.get("Id"))
    if not isinstance(iid, str) or not iid:
        raise DockerOutputError("docker image inspect: no image Id in the output")
    return ImageInfo(
        id=iid,
        repo_digests=tuple(str(d) for d in obj.get("RepoDigests") or ()),
        repo_tags=tuple(str(t) for t in obj.get("RepoTags") or ()),
    )


def classify_docker_error(stderr: str, exit_status: int | None = None) -> DockerErrorKind:
    """Sort a failed docker CLI call by its message (docker has no structured errors)."""
    low = stderr.lower()
    if "no such object" in low or "no such container" in low or "no such image" in low:
        return "not_found"
    if "permission denied" in low and "docker" in low:
        return "permission_denied"
    if "cannot connect to the docker daemon" in low or "is the docker daemon running" in low:
        return "daemon_down"
    if "error during connect" in low or "connection refused" in low:
        return "daemon_down"
    if exit_status == 127 or "command not found" in low or "docker: not found" in low:
        return "not_installed"
    return "other"
