"""Provisioning a freshly launched container: the setup script, then its sshd.

Both steps are one `docker exec -i` each, over the host's reused SSH
connection, running a program file of `orchestrator/remote`: `setup.sh`
(receive, check and run the setup script; write the marker only on success)
and `sshd.sh` (install the ssh files; start sshd unless it already runs and
listens). Everything variable (the script, keys, config files) travels
base64-encoded on the channel's standard input; argv holds only the fixed
program and non-secret arguments. So there is no argv size limit (a 1 MiB
script is fine), and no key ever shows up in `ps` or in logs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator import remote
from orchestrator.config import ClusterConfig, ConfigError, ContainerConfig
from orchestrator.config.loader import read_default_setup_script
from orchestrator.config.model import CONTAINER_USER_RE
from orchestrator.containers import mpi
from orchestrator.containers.argv import exec_argv
from orchestrator.remote import records
from orchestrator.results import HostResult
from orchestrator.ssh.keys import ClusterKeys
from orchestrator.ssh.seam import HostRunner

# Provisioning (setup script, marker, sshd) writes /etc, /run, /var/lib and
# runs package managers: it runs as root whatever the image's USER is.
# Commands and steps run as the image's user (or container.user / -u).
ROOT = "0"

# Inside the container: the sha256 of the script that provisioned it.
MARKER_PATH = "/var/lib/cvs/provisioned"

# Exit codes of the in-container programs (remote/setup.sh, remote/sshd.sh
# define them too; tests/test_remote.py compares). A setup script's own exit
# code is passed through; stderr always carries a `cvs:` line saying which.
EXIT_MISSING_TOOL = 90  # base64 / sha256sum missing in the image
EXIT_BAD_PAYLOAD = 91  # payload not decodable, or frames incomplete
EXIT_CHECKSUM = 92  # decoded script's sha256 differs: refused, not run
EXIT_MARKER = 93  # script ran, marker could not be written
EXIT_NO_SSHD = 94  # /usr/sbin/sshd missing
EXIT_SSHD_START = 95  # sshd exited with an error on start
EXIT_SSHD_NOT_LISTENING = 96  # sshd started but does not listen on the port
EXIT_INSTALL = 97  # writing the sshd / ssh files failed

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# --- setup script --------------------------------------------------------


@dataclass(frozen=True)
class SetupScript:
    path: str
    content: bytes
    sha256: str
    is_default: bool

    @classmethod
    def from_bytes(cls, content: bytes, *, path: str = "<memory>") -> SetupScript:
        return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=False)

    @classmethod
    def default(cls) -> SetupScript:
        try:
            path, content = read_default_setup_script()
        except (OSError, ModuleNotFoundError) as exc:
            raise ConfigError(
                f"the packaged default setup script cannot be read ({exc}): "
                "reinstall cvs-orchestrator or set container.setup_script"
            ) from None
        return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=True)

    @classmethod
    def for_config(cls, cfg: ContainerConfig) -> SetupScript:
        """The script read when the cluster file loaded; else (a config built in
        code) the configured file or the packaged default, read now.

        An unreadable script is a ConfigError (exit 2, one line), raised before
        any host is touched when it comes from the loader.
        """
        loaded = cfg.loaded_setup_script
        custom = bool(cfg.setup_script and cfg.setup_script.strip())
        if loaded is not None:
            path, content = loaded
            return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=not custom)
        if not custom:
            return cls.default()
        script_path = Path(str(cfg.setup_script)).expanduser()
        try:
            content = script_path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                "container.setup_script: cannot read setup script "
                f"{script_path}: {exc.strerror or exc}"
            ) from None
        return cls.from_bytes(content, path=str(script_path))


def setup_payload(content: bytes) -> str:
    """The script as it goes on stdin: base64, 76-column lines."""
    return base64.encodebytes(content).decode("ascii")


def setup_argv(
    prefix: Sequence[str], container: str, sha256: str, *, marker_path: str = MARKER_PATH
) -> list[str]:
    """`docker exec -i CONTAINER sh -c DECODER cvs-setup SHA MARKER` (stdin: the payload)."""
    if not _SHA256_RE.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    if not marker_path.startswith("/"):
        raise ValueError(f"marker path must be absolute, got {marker_path!r}")
    return exec_argv(
        prefix,
        container,
        remote.argv("setup", sha256, marker_path),
        interactive=True,
        user=ROOT,
    )


async def run_setup_script(
    pool: HostRunner,
    host: str,
    prefix: list[str],
    container: str,
    script: SetupScript,
    *,
    timeout: float | None = None,
    container_id: str | None = None,
) -> HostResult:
    """Deliver and run `script` in the container; the marker is written only on success.

    With `container_id`, success also leaves the provisioning record on the
    host (`remote.records`), in the same round trip: the
    next probe then knows without a `docker exec`.

    The result carries the script's output (stdout/stderr) for the run log;
    `result.tail()` is what to show for a failing host.
    """
    argv = setup_argv(prefix, container, script.sha256)
    command: str | list[str] = argv
    if container_id is not None:
        record = records.provisioned_argv(container_id, script.sha256)
        command = f"{shlex.join(argv)} && {shlex.join(record)}"
    kill = exec_argv(prefix, container, remote.argv("setup_kill"), user=ROOT)
    result: HostResult = await pool.run(
        host,
        command,
        timeout=timeout,
        input=setup_payload(script.content),
        label="setup",
        on_timeout=lambda: kill,
    )
    return result


# --- in-container sshd ---------------------------------------------------


# The files ensure_sshd sends, by frame name (the installer knows where each goes).
SSHD_FILES = (
    "host_key",
    "user_key",
    "user_key_pub",
    "authorized_keys",
    "known_hosts",
    "ssh_config",
    "sshd_config",
    "hostfile",
)


def sshd_files(
    cluster: ClusterConfig,
    keys: ClusterKeys,
    host: str,
    gpu_counts: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """What one container needs, by SSHD_FILES name (pure). `gpu_counts`: the
    GPUs each container got, for the hostfile's slots when mpi.slots is unset."""
    container = cluster.container
    if container is None:
        raise ValueError("the cluster has no container block")
    port = container.sshd.port
    return {
        "host_key": keys.host_key(host).private,
        "user_key": keys.user.private,
        "user_key_pub": keys.user.public + "\n",
        "authorized_keys": keys.user.public + "\n",
        "known_hosts": mpi.known_hosts_text(cluster, keys, port),
        "ssh_config": mpi.ssh_config_text(cluster, port),
        "sshd_config": mpi.sshd_config_text(port),
        "hostfile": mpi.hostfile_text(cluster, mpi.host_slots(cluster, gpu_counts)),
    }


def frame_files(files: dict[str, str]) -> str:
    """`@@cvs-file NAME` / base64 lines / `@@cvs-end` per file, then `@@cvs-done`.

    Bodies are base64, so no file content can look like a frame line.
    """
    parts = []
    for name, text in files.items():
        if not re.fullmatch(r"[a-z_]+", name):
            raise ValueError(f"invalid frame name {name!r}")
        parts.append(f"@@cvs-file {name}\n")
        parts.append(base64.encodebytes(text.encode()).decode("ascii"))
        parts.append("@@cvs-end\n")
    parts.append("@@cvs-done\n")
    return "".join(parts)


_ADDRESS_RE = re.compile(r"[A-Za-z0-9_.:%-]+")


def ensure_sshd_argv(
    prefix: Sequence[str],
    container: str,
    port: int,
    hostfile: str,
    login: str = "",
    address: str = "",
) -> list[str]:
    """`docker exec -i -u 0 CONTAINER sh -c SSHD cvs-sshd PORT … LOGIN ADDRESS`
    (remote/sshd.sh). ADDRESS: the host's inter-host address, whose interface
    Open MPI is told to use."""
    if not 1 <= port <= 65535:
        raise ValueError(f"invalid sshd port {port}")
    if not hostfile.startswith("/") or "\n" in hostfile:
        raise ValueError(f"MPI hostfile path must be absolute, got {hostfile!r}")
    if login and not CONTAINER_USER_RE.fullmatch(login):
        raise ValueError(f"invalid container user {login!r}")
    if address and not _ADDRESS_RE.fullmatch(address):
        raise ValueError(f"invalid inter-host address {address!r}")
    program = remote.argv(
        "sshd",
        str(port),
        hostfile,
        mpi.SSHD_PID_FILE,
        mpi.SSHD_CONFIG_PATH,
        mpi.HOST_KEY_PATH,
        mpi.USER_KEY_NAME,
        mpi.KNOWN_HOSTS_NAME,
        login,
        address,
    )
    return exec_argv(prefix, container, program, interactive=True, user=ROOT)


def ensure_sshd_command(
    prefix: Sequence[str],
    container: str,
    port: int,
    hostfile: str,
    login: str | None,
    address: str = "",
) -> str:
    """Host shell text for ensure_sshd: the login user is `login` (container.user)
    or, when unset, the image's USER read from the container on the host."""
    if login is not None:
        return shlex.join(ensure_sshd_argv(prefix, container, port, hostfile, login, address))
    argv = ensure_sshd_argv(prefix, container, port, hostfile, "LOGIN", address)
    user_of = [*prefix, "inspect", "--type", "container", "-f", "{{.Config.User}}", container]
    # Docker's USER is free text: pass it on only if it is a plain user spec.
    return (
        f"u=$({shlex.join(user_of)} 2>/dev/null); "
        'case "$u" in *[!A-Za-z0-9_.:-]*) u= ;; esac; '
        f'exec {shlex.join(argv[:-2])} "$u" {shlex.quote(argv[-1])}'
    )


async def ensure_sshd(
    pool: HostRunner,
    host: str,
    prefix: list[str],
    container: str,
    cluster: ClusterConfig,
    keys: ClusterKeys,
    gpu_counts: Mapping[str, int] | None = None,
) -> HostResult:
    """Install keys/configs and make sure the container's sshd runs and listens.

    Runs as root in the container; the cluster key and ssh config go to root
    and to the user commands run as (container.user, else the image's USER).
    Idempotent: a live, listening sshd is left as it is (same pid).
    """
    if cluster.container is None:
        raise ValueError("the cluster has no container block")
    command = ensure_sshd_command(
        prefix,
        container,
        cluster.container.sshd.port,
        cluster.container.mpi.hostfile,
        cluster.container.user,
        _interface_address(cluster, host),
    )
    payload = frame_files(sshd_files(cluster, keys, host, gpu_counts))
    # One docker exec that also waits for the listener: twice the bound of a
    # quick docker call (container.runtime_timeout; 60 s by default).
    bound = 2 * cluster.container.runtime_timeout
    result: HostResult = await pool.run(host, command, input=payload, label="sshd", timeout=bound)
    if result.status == "timeout":
        result = replace(
            result,
            error=f"the in-container sshd did not start within {bound:g}s (twice "
            "container.runtime_timeout): the container runtime on this host is slow or hung",
        )
    return result


_PEER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")


def mpi_check_argv(
    prefix: Sequence[str],
    container: str,
    seconds: float,
    hostfile: str,
    peers: Sequence[str],
    *,
    need_mpirun: bool,
) -> list[str]:
    """`docker exec -u 0 CONTAINER sh -c MPI_CHECK …` (remote/mpi_check.sh): from
    the head's container, `ssh PEER true` to every peer at once, each within
    `seconds`; with `need_mpirun`, whether `mpirun` is there."""
    if not hostfile.startswith("/") or "\n" in hostfile:
        raise ValueError(f"MPI hostfile path must be absolute, got {hostfile!r}")
    for peer in peers:
        if not _PEER_RE.fullmatch(peer):
            raise ValueError(f"invalid peer name {peer!r}")
    program = remote.argv(
        "mpi_check", f"{max(1, round(seconds))}", hostfile, "1" if need_mpirun else "0", *peers
    )
    return exec_argv(prefix, container, program, user=ROOT)


def mpi_check_bound(cluster: ClusterConfig) -> tuple[float, float]:
    """(seconds per peer, bound of the whole check): ssh.connect_timeout per
    peer (all at once), plus a docker call's bound for the exec around them."""
    per_peer = cluster.ssh.connect_timeout
    docker = cluster.container.runtime_timeout if cluster.container is not None else 30.0
    return per_peer, per_peer + docker + 5


def _interface_address(cluster: ClusterConfig, host: str) -> str:
    """The address whose interface Open MPI uses on `host`: vpc_address, else
    address; none where the container has a network of its own (not the host's)."""
    if cluster.container is None or cluster.container.network != "host":
        return ""
    spec = cluster.host(host)
    address = spec.vpc_address or spec.address or spec.name
    return address if _ADDRESS_RE.fullmatch(address) else ""
