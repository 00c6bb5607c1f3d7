"""Pure builders for what each container needs so MPI ranks reach their peers.

Every container gets the same client side (user key, known_hosts, ssh config,
hostfile) and its own sshd host key. Peers are reachable by host name and by
their inter-host address (`vpc_address`, else `address`) on the in-container
sshd port, with strict host-key checking.
"""

from __future__ import annotations

from orchestrator.config import ClusterConfig, HostSpec
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


def hostfile_text(cluster: ClusterConfig, slots: int) -> str:
    """MPI hostfile: `name slots=N`, one line per host, in cluster order."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    return "".join(f"{h.name} slots={slots}\n" for h in cluster.hosts)


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
