"""Pure builders for what each container needs so MPI ranks reach their peers.

Every container gets the same client side (user key, known_hosts, ssh config,
hostfile) and its own sshd host key. Peers are reachable by host name and by
their inter-host address (`vpc_address`, else `address`) on the in-container
sshd port, with strict host-key checking.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config import ClusterConfig, HostSpec
from orchestrator.config.model import GPURequest

if TYPE_CHECKING:
    # Types only: importing keys loads asyncssh, which commands that never
    # connect (`validate`, reading container_env) must not pay for.
    from orchestrator.ssh.keys import ClusterKeys

# Where things go inside a container (root's home comes from the container).
SSHD_CONFIG_PATH = "/etc/ssh/cvs_sshd_config"
HOST_KEY_PATH = "/etc/ssh/cvs_ssh_host_ed25519_key"
SSHD_PID_FILE = "/run/cvs-sshd.pid"
USER_KEY_NAME = "cvs_cluster_ed25519"  # in root's ~/.ssh
KNOWN_HOSTS_NAME = "cvs_known_hosts"  # in root's ~/.ssh
# ssh expands `~` in these, so the config does not depend on root's home.
USER_KEY_PATH = f"~/.ssh/{USER_KEY_NAME}"
KNOWN_HOSTS_PATH = f"~/.ssh/{KNOWN_HOSTS_NAME}"


def peer_address(host: HostSpec) -> str:
    """The address peers use for inter-host traffic (the fast network when given)."""
    return host.vpc_address or host.address or host.name


def peer_names(host: HostSpec) -> list[str]:
    """Every name a peer may be called by, host name first, without duplicates."""
    names: list[str] = []
    for n in (host.name, host.vpc_address, host.address):
        if n and n not in names:
            names.append(n)
    return names


def _known_hosts_pattern(name: str, port: int) -> str:
    # OpenSSH writes and matches non-default ports only in the bracket form.
    if port == 22:
        return name
    return f"[{name}]:{port}"


def known_hosts_text(cluster: ClusterConfig, keys: ClusterKeys, port: int) -> str:
    """One known_hosts line per peer: all its names, its container's sshd host key."""
    lines = []
    for host in cluster.hosts:
        patterns = ",".join(_known_hosts_pattern(n, port) for n in peer_names(host))
        lines.append(f"{patterns} {keys.host_key(host.name).public_blob}\n")
    return "".join(lines)


def ssh_config_text(
    cluster: ClusterConfig,
    port: int,
    key_path: str = USER_KEY_PATH,
    *,
    known_hosts_path: str = KNOWN_HOSTS_PATH,
) -> str:
    """~/.ssh/config in the container: each peer (by name and address) -> its
    container's sshd. No `User`: ssh logs in as whoever runs it (root, or the
    image's user), who exists in every container (same image everywhere)."""
    blocks = []
    for host in cluster.hosts:
        blocks.append(
            "\n".join(
                [
                    f"Host {' '.join(peer_names(host))}",
                    f"    HostName {peer_address(host)}",
                    f"    Port {port}",
                    f"    IdentityFile {key_path}",
                    "    IdentitiesOnly yes",
                    "    StrictHostKeyChecking yes",
                    f"    UserKnownHostsFile {known_hosts_path}",
                    # A missing key must fail, not wait for a password prompt.
                    "    BatchMode yes",
                ]
            )
        )
    header = "# Written by cvs-orchestrator: container-to-container ssh for MPI.\n"
    return header + "\n\n".join(blocks) + "\n"


def mpi_order(cluster: ClusterConfig) -> list[str]:
    """The hosts as MPI numbers them: the head first (rank 0 runs where
    `mpirun` does), then the others in cluster order."""
    head = cluster.head_host.name
    return [head, *(h.name for h in cluster.hosts if h.name != head)]


def host_slots(
    cluster: ClusterConfig, gpu_counts: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Slots per host, in `mpi_order`: `mpi.slots` when set; else the GPUs
    the host's container got (`gpu_counts`, from the launch's selection), else
    the count a `gpus: {count: N}` request guarantees, else 1."""
    container = cluster.container
    fixed = container.mpi.slots if container is not None else None
    request = container.gpus if container is not None else None
    counted = request.count if isinstance(request, GPURequest) else None
    out: dict[str, int] = {}
    for name in mpi_order(cluster):
        if fixed is not None:
            out[name] = fixed
            continue
        got = (gpu_counts or {}).get(name)
        out[name] = got if got else counted or 1
    return out


def hostfile_text(cluster: ClusterConfig, slots: int | Mapping[str, int]) -> str:
    """MPI hostfile: `name slots=N`, one line per host, head first, then cluster order."""
    per_host = slots if isinstance(slots, Mapping) else dict.fromkeys(mpi_order(cluster), slots)
    lines = []
    for name in mpi_order(cluster):
        n = per_host.get(name, 1)
        if n < 1:
            raise ValueError(f"slots must be >= 1, got {n} for {name}")
        lines.append(f"{name} slots={n}\n")
    return "".join(lines)


_HOSTFILE_LINE = re.compile(r"([A-Za-z0-9_.:-]+)\s+slots=([0-9]+)")


@dataclass(frozen=True)
class MPIHosts:
    """What an mpi step's command gets, read back from the head's hostfile."""

    hostfile: str
    slots: tuple[tuple[str, int], ...]

    @property
    def np(self) -> int:
        return sum(n for _, n in self.slots)

    def env(self) -> dict[str, str]:
        hosts = ",".join(n if s == 1 else f"{n}:{s}" for n, s in self.slots)
        return {
            "CVS_MPI_HOSTFILE": self.hostfile,
            "CVS_MPI_HOSTS": hosts,
            "CVS_MPI_NP": str(self.np),
        }


def parse_hostfile(path: str, text: str) -> MPIHosts:
    """The `name slots=N` lines cvs wrote (other lines ignored)."""
    slots = []
    for line in text.splitlines():
        m = _HOSTFILE_LINE.fullmatch(line.strip())
        if m:
            slots.append((m.group(1), int(m.group(2))))
    return MPIHosts(path, tuple(slots))


# Open MPI's run-as-root guard (mpirun refuses uid 0 without
# --allow-run-as-root or both of these): set in a container whose commands
# run as root, so `mpirun` works there with no extra flags.
RUN_AS_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_ROOT_USERS = re.compile(r"(root|0)(:.*)?")


def runs_as_root(user: str | None) -> bool:
    """Whether commands may run as root: container.user unset (the image's
    USER, root in the CUDA/ROCm bases) or root. The variables are inert for
    other users: Open MPI reads them only at uid 0."""
    return user is None or bool(_ROOT_USERS.fullmatch(user))


def sshd_config_text(port: int) -> str:
    """The in-container sshd's own config: key-only root login, ed25519 host key only."""
    if not 1 <= port <= 65535:
        raise ValueError(f"invalid sshd port {port}")
    return "\n".join(
        [
            "# Written by cvs-orchestrator: sshd for container-to-container MPI traffic.",
            f"Port {port}",
            f"HostKey {HOST_KEY_PATH}",
            f"PidFile {SSHD_PID_FILE}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "PasswordAuthentication no",
            # Older sshd lack KbdInteractiveAuthentication; this one is understood by all.
            "ChallengeResponseAuthentication no",
            # No PAM: minimal images often lack its config, and keys are all we use.
            "UsePAM no",
            "X11Forwarding no",
            "PrintMotd no",
            "",
        ]
    )


# ---- can an MPI launch start from the head? (remote/mpi_check.sh) ----------


@dataclass(frozen=True)
class MPICheck:
    """What mpi_check.sh found in the head's container."""

    mpirun: str | None = None  # its path, when asked and found
    mpirun_missing: bool = False
    ssh_missing: bool = False
    peers_ok: tuple[str, ...] = ()
    peers_failed: tuple[tuple[str, str], ...] = ()  # (peer, ssh's last words)
    hostfile: tuple[str, ...] = ()

    def problems(
        self,
        image: str,
        head: str,
        seconds: float,
        network_modes: Mapping[str, str] | None = None,
    ) -> list[str]:
        """One line per reason an MPI launch from `head` would fail or hang.
        `network_modes`: each container's network mode where the inspect
        read it (HostConfig.NetworkMode); one that is not `host` is named as
        the cause, not a stopped sshd."""
        modes = network_modes or {}
        out = []
        if self.mpirun_missing:
            out.append(
                f"image {image} has no Open MPI: `mpirun` is not on the PATH in {head}'s "
                "container, and an mpi step needs it: use an image with Open MPI "
                "(Debian: openmpi-bin; docs/mpi.md)"
            )
        for peer, why in self.peers_failed:
            out.append(f"{peer}: {self.peer_problem(peer, why, head, seconds, modes)}")
        return out

    def peer_problem(
        self,
        peer: str,
        why: str,
        head: str,
        seconds: float,
        network_modes: Mapping[str, str] | None = None,
    ) -> str:
        """Why an MPI launch from `head` would fail on `peer`, whose sshd did
        not answer (`why`: ssh's last words); `problems` says it after the
        peer's name, a host's own outcome without it."""
        modes = network_modes or {}
        off = [(h, modes[h]) for h in dict.fromkeys((head, peer)) if modes.get(h, "host") != "host"]
        if off:
            named = " and ".join(f"{h}'s container is on network {m!r}" for h, m in off)
            return (
                f"its container's sshd did not answer `ssh {peer} true` from "
                f"{head}'s container ({why}): {named}, not the host's: the sshd listen on "
                "the hosts' addresses, which only containers on the host network reach "
                "(an adopted container keeps the network it was created with): replace "
                "it with one on the host network (container.network: host)"
            )
        return (
            f"its container's sshd did not answer `ssh {peer} true` from {head}'s "
            f"container ({why}; each peer gets {seconds:g}s): an MPI launch would fail "
            "there (bringing the containers up again restarts a stopped sshd)"
        )


def parse_mpi_check(stdout: str) -> MPICheck:
    mpirun: str | None = None
    missing = ssh_missing = False
    ok: list[str] = []
    failed: list[tuple[str, str]] = []
    hostfile: list[str] = []
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "mpirun" and rest:
            mpirun = rest
        elif word == "mpirun-missing":
            missing = True
        elif word == "ssh-missing":
            ssh_missing = True
        elif word == "peer-ok" and rest:
            ok.append(rest)
        elif word == "peer-fail" and rest:
            peer, _, why = rest.partition(" ")
            failed.append((peer, why.strip() or "failed"))
        elif word == "hostfile":
            hostfile.append(rest)
    return MPICheck(mpirun, missing, ssh_missing, tuple(ok), tuple(failed), tuple(hostfile))


def slots_warnings(cluster: ClusterConfig, cpu_counts: Mapping[str, int | None]) -> list[str]:
    """`mpi.slots` above a host's CPU count (probed) where `resources.cpus`
    does not cap the container (then `validate` has refused it already).
    Open MPI trusts the hostfile's slots, so the ranks would share cores."""
    container = cluster.container
    if container is None or container.mpi.slots is None or container.resources.cpus is not None:
        return []
    slots = container.mpi.slots
    over = sorted(h for h, n in cpu_counts.items() if n is not None and slots > n)
    if not over:
        return []
    counts = ", ".join(f"{h}: {cpu_counts[h]}" for h in over)
    return [
        f"mpi.slots {slots} is more than the CPUs of {', '.join(over)} ({counts}): a job "
        "filling the hostfile puts busy-polling ranks on shared cores there; lower mpi.slots"
    ]
