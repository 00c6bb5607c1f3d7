"""sshd and dockerd for one sandbox host: configs, argv, readiness checks."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

from . import network
from .users import LOGIN_USERS

SSHD = "/usr/sbin/sshd"
DOCKERD = "/usr/sbin/dockerd"


def sshd_base_options(
    *, address: str, port: int, host_key: Path, pid_file: Path, authorized_keys: Path,
    docker_host: str,
) -> dict[str, str]:  # fmt: skip
    return {
        "Port": str(port),
        "ListenAddress": address,
        "HostKey": str(host_key),
        "PidFile": str(pid_file),
        # Key auth only; without PAM a useradd'ed account needs a '*' password field.
        "UsePAM": "no",
        "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no",
        "PubkeyAuthentication": "yes",
        # The keys file sits in /run (readable by the login users, which sshd
        # switches to while reading it); the sandbox dir may be a 0700 tmp dir.
        # ~/.ssh/authorized_keys too: a direct image spread adds its key there.
        "AuthorizedKeysFile": f"{authorized_keys} .ssh/authorized_keys",
        "StrictModes": "no",
        "AllowUsers": " ".join(LOGIN_USERS),
        "PermitRootLogin": "no",
        "UseDNS": "no",
        "PrintMotd": "no",
        "PrintLastLog": "no",
        "X11Forwarding": "no",
        "LogLevel": "ERROR",
        "SetEnv": f"DOCKER_HOST={docker_host}",
        "Subsystem": "sftp internal-sftp",
    }


def render_sshd_config(options: dict[str, str]) -> str:
    lines = ["# Written by cvs sandbox; regenerated on every (re)start."]
    lines += [f"{key} {value}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def in_own_uts(hostname: str, argv: list[str]) -> list[str]:
    """`argv` in a new UTS namespace whose host name is `hostname`.

    Each sandbox host then answers `hostname` with its own name, and so do its
    containers (with --network host, docker gives them the daemon's name).
    Every step execs, so the pid spawned is the daemon's.
    """
    return ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]


def sshd_argv(
    config: Path, netns: str | None, hostname: str | None = None, *, keep_sys: bool = False
) -> list[str]:
    """`keep_sys`: enter the namespace with nsenter, keeping the machine's /sys
    (podman hosts: each podman call runs runc itself, and `ip netns exec`'s
    fresh /sys has no cgroup mounts, "no cgroup mount found in mountinfo")."""
    # -D keeps sshd in the foreground so the pid we spawn is the listener's.
    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if hostname is not None:
        argv = in_own_uts(hostname, argv)
    if netns is None:
        return argv
    if keep_sys:
        return ["nsenter", f"--net=/var/run/netns/{netns}", *argv]
    return ["ip", "netns", "exec", netns, *argv]


def dockerd_argv(
    *, netns: str | None, data_root: Path, exec_root: Path, pid_file: Path, socket_path: Path,
    config_file: Path, hostname: str | None = None,
) -> list[str]:  # fmt: skip
    argv = [
        DOCKERD,
        "--bridge=none", "--iptables=false", "--ip-masq=false",
        "--data-root", str(data_root),
        "--exec-root", str(exec_root),
        "--pidfile", str(pid_file),
        "-H", f"unix://{socket_path}",
        "--group", "docker",
        # Our own (empty) daemon.json: never pick up the machine's /etc/docker one.
        "--config-file", str(config_file),
        "--shutdown-timeout", "5",
        "--log-level", "warn",
    ]  # fmt: skip
    if hostname is not None:
        argv = in_own_uts(hostname, argv)
    if netns is None:
        return argv
    # nsenter, not `ip netns exec`: the latter remounts /sys and dockerd then
    # dies with "Devices cgroup isn't mounted".
    return ["nsenter", f"--net=/var/run/netns/{netns}", *argv]


def write_dockerd_config(path: Path) -> None:
    # The sandbox registry (registry.py) serves plain HTTP on a bridge address.
    config = {"insecure-registries": [f"{network.SUBNET_PREFIX}.0.0/16"]}
    path.write_text(json.dumps(config) + "\n")


def sshd_ready(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0) as sock:
            sock.settimeout(1.0)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def dockerd_ready(socket_path: Path) -> bool:
    """GET /_ping on the daemon socket (cheaper than a docker CLI call)."""
    if not socket_path.exists():
        return False
    with (
        contextlib.suppress(OSError),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.settimeout(2.0)
        sock.connect(str(socket_path))
        sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data.startswith(b"HTTP/1.") and b" 200 " in data.split(b"\r\n", 1)[0]
    return False
