"""OpenSSH client argv for what needs a real terminal (`cvs shell`).

The cluster's SSH settings mapped onto `ssh` options: user, port, identity
files, known_hosts and the host-key policy (strict -> StrictHostKeyChecking=yes,
accept-new -> accept-new, off -> no with no known_hosts written), use_ssh_config
false (-F /dev/null), connect_timeout, keepalive. Every value that reaches the
argv is checked with a full-match pattern first: none may start with `-` (it
would be read as an option). A known_hosts path with a space is quoted, since
-o UserKnownHostsFile splits on spaces.

proxy_jump is passed as -J, but OpenSSH hands the jump's own `ssh` only -F
(and -v, -l, -p of the hop), never -i or -o: with the argv alone the bastion
would be checked against ~/.ssh/known_hosts and offered the default keys. So
with a jump the same settings are also written to an ssh_config file
(`jump_config`), passed with -F, which applies to every hop: a `Host *` block
first, then, with use_ssh_config, Include of the user's and the system's files,
whose values come after ours and so never replace them (ssh keeps the first
value it reads). The file lives in the cluster's state dir, mode 0600,
rewritten on each call: `cvs shell` execs ssh, so no one is left to remove a
temporary file. Its values pass full-match patterns too, so the cluster file
cannot add a line of its own.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from orchestrator.config import ClusterConfig
from orchestrator.errors import UsageError
from orchestrator.ssh.keys import default_state_dir

_ADDRESS_RE = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*")
_USER_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")
_JUMP_RE = re.compile(r"[A-Za-z0-9_.@\[\]][A-Za-z0-9_.@:,\[\]-]*")
# A path in ssh_config goes in double quotes, which take no escapes; `%` and
# `$` are ssh's token and ${ENV} expansion, so they are refused rather than
# escaped, and so is anything that could end the line or the quotes.
_CONFIG_PATH_RE = re.compile(r"/[A-Za-z0-9_./@+,:=~ -]*")

STRICT_HOST_KEY_CHECKING = {"strict": "yes", "accept-new": "accept-new", "off": "no"}
JUMP_CONFIG_NAME = "openssh_jump.conf"
# What ssh reads without -F, in its order; included only with use_ssh_config.
SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")


def _checked(pattern: re.Pattern[str], value: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise UsageError(f"{what} {value!r} cannot be passed to ssh (unexpected characters)")
    return value


def _local_path(path: str) -> str:
    # Absolute, so the file names what -i would (relative to the cwd), not
    # something relative to wherever ssh resolves config paths.
    return os.path.abspath(Path(path).expanduser())


def _config_path(path: str, what: str) -> str:
    return '"' + _checked(_CONFIG_PATH_RE, _local_path(path), what) + '"'


def _options(cluster: ClusterConfig) -> list[tuple[str, str]]:
    """(keyword, value) of the cluster's SSH settings other than user and identity files."""
    ssh = cluster.ssh
    options: list[tuple[str, str]] = []
    if ssh.identity_files:
        options.append(("IdentitiesOnly", "yes"))
    options.append(("StrictHostKeyChecking", STRICT_HOST_KEY_CHECKING[ssh.host_key_policy]))
    if ssh.host_key_policy == "off":
        options += [("UserKnownHostsFile", "/dev/null"), ("LogLevel", "ERROR")]
    elif ssh.known_hosts:
        options.append(("UserKnownHostsFile", str(Path(ssh.known_hosts).expanduser())))
    options.append(("ConnectTimeout", str(max(1, round(ssh.connect_timeout)))))
    if ssh.keepalive:
        options.append(("ServerAliveInterval", str(max(1, round(ssh.keepalive)))))
        options.append(("ServerAliveCountMax", str(ssh.keepalive_count)))
    return options


def jump_config(cluster: ClusterConfig) -> str:
    """The ssh_config text that carries the cluster's settings to every hop."""
    ssh = cluster.ssh
    lines = ["Host *"]
    if ssh.user:
        # A hop without `user@` logs in as ssh.user, like the asyncssh transport.
        lines.append(f"  User {_checked(_USER_RE, ssh.user, 'ssh.user')}")
    for identity in ssh.identity_files:
        lines.append(f"  IdentityFile {_config_path(identity, 'ssh.identity_files:')}")
    for keyword, value in _options(cluster):
        if keyword == "UserKnownHostsFile" and value != "/dev/null":
            value = _config_path(value, "ssh.known_hosts:")
        lines.append(f"  {keyword} {value}")
    if ssh.use_ssh_config:
        lines += [f"  Include {path}" for path in SSH_CONFIG_FILES]
    return "\n".join(lines) + "\n"


def write_jump_config(cluster: ClusterConfig, state_dir: Path | None = None) -> Path:
    """jump_config(cluster) in `state_dir` (default: the cluster's), mode 0600."""
    text = jump_config(cluster)
    directory = state_dir if state_dir is not None else default_state_dir(cluster)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory.absolute() / JUMP_CONFIG_NAME
    # Written aside and renamed: another `cvs shell` may be reading it.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{JUMP_CONFIG_NAME}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def openssh_argv(
    cluster: ClusterConfig,
    host: str,
    remote: str,
    *,
    tty: bool,
    state_dir: Path | None = None,
) -> list[str]:
    """`ssh ... HOST -- REMOTE` for one host of `cluster`, with its SSH settings.

    With ssh.proxy_jump this writes the jump's config file (write_jump_config).
    """
    spec = cluster.host(host)
    ssh = cluster.ssh
    address = _checked(_ADDRESS_RE, spec.address or spec.name, f"host {host}: address")
    argv = ["ssh", "-t" if tty else "-T"]
    if ssh.proxy_jump:
        jump = _checked(_JUMP_RE, ssh.proxy_jump, "ssh.proxy_jump")
        argv += ["-F", str(write_jump_config(cluster, state_dir))]
    elif not ssh.use_ssh_config:
        argv += ["-F", "/dev/null"]
    for identity in ssh.identity_files:
        argv += ["-i", str(Path(identity).expanduser())]
    for keyword, value in _options(cluster):
        if keyword == "UserKnownHostsFile" and " " in value:
            # -o splits this option's value on spaces (it takes several files).
            value = _config_path(value, "ssh.known_hosts:")
        argv += ["-o", f"{keyword}={value}"]
    if ssh.proxy_jump:
        argv += ["-J", jump]
    argv += ["-p", str(spec.port or ssh.port)]
    user = spec.user or ssh.user
    if user:
        argv += ["-l", _checked(_USER_RE, user, f"host {host}: user")]
    return [*argv, address, "--", remote]
