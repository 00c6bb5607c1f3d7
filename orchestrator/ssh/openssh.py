"""OpenSSH client argv for what needs a real terminal (`cvs shell`).

The cluster's SSH settings mapped onto `ssh` options: user, port, identity
files, known_hosts and the host-key policy (strict -> StrictHostKeyChecking=yes,
accept-new -> accept-new, off -> no with no known_hosts written), proxy_jump
(-J), use_ssh_config false (-F /dev/null), connect_timeout. Every value that
reaches the argv is checked with a full-match pattern first: none may start
with `-` (it would be read as an option).
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.config import ClusterConfig
from orchestrator.errors import UsageError

_ADDRESS_RE = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*")
_USER_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")
_JUMP_RE = re.compile(r"[A-Za-z0-9_.@\[\]][A-Za-z0-9_.@:,\[\]-]*")

HOST_KEY_OPTIONS = {
    "strict": "StrictHostKeyChecking=yes",
    "accept-new": "StrictHostKeyChecking=accept-new",
    "off": "StrictHostKeyChecking=no",
}


def _checked(pattern: re.Pattern[str], value: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise UsageError(f"{what} {value!r} cannot be passed to ssh (unexpected characters)")
    return value


def openssh_argv(cluster: ClusterConfig, host: str, remote: str, *, tty: bool) -> list[str]:
    """`ssh ... HOST -- REMOTE` for one host of `cluster`, with its SSH settings."""
    spec = cluster.host(host)
    ssh = cluster.ssh
    address = _checked(_ADDRESS_RE, spec.address or spec.name, f"host {host}: address")
    argv = ["ssh", "-t" if tty else "-T"]
    if not ssh.use_ssh_config:
        argv += ["-F", "/dev/null"]
    for identity in ssh.identity_files:
        argv += ["-i", str(Path(identity).expanduser())]
    if ssh.identity_files:
        argv += ["-o", "IdentitiesOnly=yes"]
    argv += ["-o", HOST_KEY_OPTIONS[ssh.host_key_policy]]
    if ssh.host_key_policy == "off":
        argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    elif ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={Path(ssh.known_hosts).expanduser()}"]
    argv += ["-o", f"ConnectTimeout={max(1, round(ssh.connect_timeout))}"]
    if ssh.keepalive:
        argv += ["-o", f"ServerAliveInterval={max(1, round(ssh.keepalive))}"]
    if ssh.proxy_jump:
        argv += ["-J", _checked(_JUMP_RE, ssh.proxy_jump, "ssh.proxy_jump")]
    argv += ["-p", str(spec.port or ssh.port)]
    user = spec.user or ssh.user
    if user:
        argv += ["-l", _checked(_USER_RE, user, f"host {host}: user")]
    return [*argv, address, "--", remote]
