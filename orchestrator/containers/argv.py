"""Argv builders for the container runtime's CLI, and the validators they use.

Builders return argv lists; the caller quotes them once with `shlex.join`
(remote commands are shell text, so quoting happens exactly there). Every
container name and image reference is validated before it reaches an argv,
so a name like `x;rm -rf /` is refused even though quoting would defuse it.
The spellings are docker's; podman takes the same (where a runtime differs,
remote/runtime.py's `ContainerRuntime` says how).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from orchestrator import remote
from orchestrator.config import CONTAINER_NAME_RE, IMAGE_REF_RE, ContainerConfig, Registry
from orchestrator.containers.labels import LABEL_INVOCATION
from orchestrator.containers.mpi import RUN_AS_ROOT_ENV, runs_as_root
from orchestrator.limits.cdi import CDIDevice, cdi_run_args
from orchestrator.limits.gpus import GPUSelection, guard_visible_devices
from orchestrator.limits.resources import EffectiveResources

CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")  # a full container ID, as docker prints it


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


# podman's flag for a registry on plain HTTP (`container.registry_tls_verify:
# false`); docker has none (its daemon's insecure-registries decides).
NO_TLS_VERIFY = "--tls-verify=false"


def pull_argv(prefix: Sequence[str], ref: str, *, tls_verify: bool = True) -> list[str]:
    return [*prefix, "pull", *([] if tls_verify else [NO_TLS_VERIFY]), validate_image_ref(ref)]


def load_argv(prefix: Sequence[str], tar_path: str) -> list[str]:
    if not tar_path or tar_path.startswith("-"):
        raise ValueError(f"invalid image tar path {tar_path!r}")
    return [*prefix, "load", "-i", tar_path]


def login_argv(
    prefix: Sequence[str], username: str, server: str | None = None, *, tls_verify: bool = True
) -> list[str]:
    """`docker login … --password-stdin`: the password never appears in argv."""
    if not username or username.startswith("-"):
        raise ValueError(f"invalid registry username {username!r}")
    argv = [*prefix, "login", *([] if tls_verify else [NO_TLS_VERIFY])]
    argv += ["--username", username, "--password-stdin"]
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


def login_command(
    prefix: Sequence[str], registry: Registry, image: str | None = None, *, tls_verify: bool = True
) -> str:
    """Shell text for a host: `docker login` reading the password file on that host.

    The password stays on the host: it goes from `registry.password_file`
    into docker's stdin and never crosses SSH, argv or logs. Without
    `registry.server`, the login goes to the registry `image` names (what a
    user means), not to Docker Hub.
    """
    server = registry.server or (image_registry(image) if image else None)
    argv = login_argv(prefix, registry.username, server, tls_verify=tls_verify)
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
