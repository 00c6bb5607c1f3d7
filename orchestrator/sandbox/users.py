"""The three login users every sandbox host shares (created once, idempotent).

- cvs: in group docker, the no-sudo path; the cluster file logs in as cvs.
- cvssudo: not in docker; `sudo -n docker` works without a password.
- cvsnone: neither, for "no docker access" errors.

Accounts get an empty home (no skeleton rc files: every SSH exec would pay for
them) and the non-locked password field '*': key-only login with `UsePAM no`
refuses locked accounts ('!').
"""

from __future__ import annotations

import pwd
import tempfile
from pathlib import Path

from .procs import run

DOCKER_USER = "cvs"
SUDO_USER = "cvssudo"
NO_DOCKER_USER = "cvsnone"
LOGIN_USERS = (DOCKER_USER, SUDO_USER, NO_DOCKER_USER)

SUDOERS_FILE = Path("/etc/sudoers.d/cvs-sandbox")
# DOCKER_HOST comes from sshd's SetEnv and must survive sudo's env_reset, or
# `sudo docker` would talk to the default socket instead of this host's dockerd.
SUDOERS_TEXT = f"""\
# Written by cvs sandbox (orchestrator/sandbox/users.py).
Defaults:{SUDO_USER} env_keep += "DOCKER_HOST DOCKER_API_VERSION"
Defaults:{SUDO_USER} !lecture
{SUDO_USER} ALL=(root) NOPASSWD: /usr/local/bin/docker, /usr/bin/docker
"""


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def ensure_users() -> None:
    """Create the users and sudoers entry if missing. Call under `global_lock`."""
    run(["groupadd", "-f", "docker"])
    with tempfile.TemporaryDirectory() as empty_skel:
        for user in LOGIN_USERS:
            if not _exists(user):
                run(["useradd", "-m", "-k", empty_skel, "-s", "/bin/bash", user])
            run(["usermod", "-p", "*", "-s", "/bin/bash", user])
    run(["usermod", "-aG", "docker", DOCKER_USER])
    if SUDOERS_FILE.exists() and SUDOERS_FILE.read_text() == SUDOERS_TEXT:
        return
    tmp = SUDOERS_FILE.with_suffix(".tmp")
    tmp.write_text(SUDOERS_TEXT)
    tmp.chmod(0o440)
    run(["visudo", "-cf", str(tmp)])
    tmp.rename(SUDOERS_FILE)


PODMAN_SUDOERS_FILE = Path("/etc/sudoers.d/cvs-sandbox-podman")
# Rootful podman for the sudo user: podman has no daemon, so the host's store
# and configuration travel in the environment (sshd's SetEnv) and must
# survive sudo's env_reset. A file of its own: sandboxes of other versions
# rewrite the docker one.
PODMAN_SUDOERS_TEXT = f"""\
# Written by cvs sandbox (orchestrator/sandbox/users.py).
Defaults:{SUDO_USER} env_keep += "CONTAINERS_CONF CONTAINERS_STORAGE_CONF"
{SUDO_USER} ALL=(root) NOPASSWD: /usr/bin/podman
"""
# The registry settings (sandbox/podman.py) in a file of their own: a
# sandbox of an older version rewrites the file above to its own text, and
# must not take these away from a sandbox running next to it.
PODMAN_REGISTRY_SUDOERS_FILE = Path("/etc/sudoers.d/cvs-sandbox-podman-registry")
PODMAN_REGISTRY_SUDOERS_TEXT = f"""\
# Written by cvs sandbox (orchestrator/sandbox/users.py).
Defaults:{SUDO_USER} env_keep += "CONTAINERS_REGISTRIES_CONF REGISTRY_AUTH_FILE"
"""
# A sandbox host's name (its sshd's UTS namespace: node1, ...) resolves
# nowhere, and sudo (built --with-fqdn) looks it up on every call, printing
# "sudo: unable to resolve host node1" into the output of every command that
# goes through `sudo -n podman`, which CVS-shaped results (stdout and stderr
# as one string) then carry. Sandbox configuration only.
PODMAN_FQDN_SUDOERS_FILE = Path("/etc/sudoers.d/cvs-sandbox-podman-fqdn")
PODMAN_FQDN_SUDOERS_TEXT = f"""\
# Written by cvs sandbox (orchestrator/sandbox/users.py).
Defaults:{SUDO_USER} !fqdn
"""


def ensure_podman_sudo() -> None:
    """The podman sudoers entries, if missing. Call under `global_lock`."""
    _ensure_sudoers(PODMAN_SUDOERS_FILE, PODMAN_SUDOERS_TEXT)
    _ensure_sudoers(PODMAN_REGISTRY_SUDOERS_FILE, PODMAN_REGISTRY_SUDOERS_TEXT)
    _ensure_sudoers(PODMAN_FQDN_SUDOERS_FILE, PODMAN_FQDN_SUDOERS_TEXT)


def _ensure_sudoers(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o440)
    run(["visudo", "-cf", str(tmp)])
    tmp.rename(path)
