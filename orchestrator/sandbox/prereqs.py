"""What `cvs sandbox up` needs from this machine, checked before anything changes.

Root, the commands the sandbox runs (found the way it will run them: by name
on PATH, or at the absolute path it execs), and the places it writes. Every
problem is listed at once, with the one apt command that installs what is
missing, so a fresh machine gets one clear answer instead of a traceback
halfway through (issue 10).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .daemons import DOCKERD, SSHD
from .errors import SandboxError

# command (a name looked up on PATH, or an absolute path) -> Debian package.
REQUIRED_COMMANDS: dict[str, str] = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "mount": "mount",
    "umount": "mount",
    DOCKERD: "docker.io",
    "docker": "docker.io",
    "containerd": "containerd",
    "runc": "runc",
    SSHD: "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "sudo": "sudo",
    "visudo": "sudo",
    "debootstrap": "debootstrap",
    "useradd": "passwd",
    "usermod": "passwd",
    "groupadd": "passwd",
    "tar": "tar",
    "cp": "coreutils",
    "rm": "coreutils",
}

# Podman hosts (`--runtime podman`): the CLI, and for `--rootless` the user
# namespace helpers and the user switch that loads each node's images.
PODMAN_COMMANDS: dict[str, str] = {"podman": "podman"}
ROOTLESS_COMMANDS: dict[str, str] = {
    "newuidmap": "uidmap",
    "newgidmap": "uidmap",
    "runuser": "util-linux",
}
# `--registry`: the registry, and tc to shape its link.
REGISTRY_COMMANDS: dict[str, str] = {"docker-registry": "docker-registry", "tc": "iproute2"}


SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"


@dataclass(frozen=True)
class Problems:
    not_root: bool
    missing: dict[str, str]  # command -> package
    unwritable: dict[str, str]  # path -> why
    off_path: tuple[str, ...] = ()  # installed in an sbin directory PATH lacks

    def __bool__(self) -> bool:
        return self.not_root or bool(self.missing) or bool(self.unwritable) or bool(self.off_path)

    def install_command(self) -> str:
        packages = sorted(set(self.missing.values()))
        return f"apt-get install -y {' '.join(packages)}" if packages else ""

    def message(self) -> str:
        lines = ["cannot build a sandbox on this machine (nothing was changed):"]
        if self.not_root:
            lines.append(
                "  - not root: it creates network namespaces, a bridge, login users and runs "
                "sshd/dockerd (run it with sudo)"
            )
        if self.missing:
            shown = ", ".join(f"{cmd} ({pkg})" for cmd, pkg in self.missing.items())
            lines.append(f"  - missing commands: {shown}")
            lines.append(f"    install them with: {self.install_command()}")
        if self.off_path:
            lines.append(
                f"  - installed but not on PATH: {', '.join(self.off_path)} "
                '(add the sbin directories: export PATH="$PATH:/usr/sbin:/sbin")'
            )
        for path, why in self.unwritable.items():
            lines.append(f"  - cannot write {path}: {why}")
        return "\n".join(lines)


def _found(command: str, path_env: str | None) -> bool:
    if os.path.isabs(command):
        return os.access(command, os.X_OK)
    return shutil.which(command, path=path_env) is not None


def _writable_dir(path: Path) -> str | None:
    """None when `path` (or, if it does not exist yet, its nearest existing parent)
    is a directory this process can create files in; else why not."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing parent directory"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable (read-only file system or permissions)"
    return None


def check(
    directory: Path,
    write_paths: Iterable[Path],
    *,
    path_env: str | None = None,
    is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
    commands: Mapping[str, str] | None = None,
) -> Problems:
    """Everything `sandbox up` in `directory` would trip over, found without changing
    anything. `commands`: what this sandbox needs beyond REQUIRED_COMMANDS."""
    env_path = path_env if path_env is not None else os.environ.get("PATH", "")
    needed = {**REQUIRED_COMMANDS, **(commands or {})}
    absent = {cmd: pkg for cmd, pkg in needed.items() if not _found(cmd, env_path)}
    # `su` without `-` leaves root with a user's PATH: installed is not missing.
    off_path = tuple(c for c in absent if _found(c, SBIN_DIRS))
    missing = {c: p for c, p in absent.items() if c not in off_path}
    unwritable: dict[str, str] = {}
    for path in [Path(directory), *write_paths]:
        why = _writable_dir(Path(path))
        if why is not None:
            unwritable[str(path)] = why
    return Problems(not is_root(), missing, unwritable, off_path)


def require(
    directory: Path, write_paths: Iterable[Path], commands: Mapping[str, str] | None = None
) -> None:
    """Raise SandboxError (exit 2) listing every unmet prerequisite."""
    problems = check(directory, write_paths, commands=commands)
    if problems:
        raise SandboxError(problems.message())
