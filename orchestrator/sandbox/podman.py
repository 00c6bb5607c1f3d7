"""Podman hosts in the sandbox: per-host storage and configuration, the image
template, and teardown.

Podman has no daemon: every `podman` call reads its configuration and opens
its storage itself. A sandbox host is therefore a set of files that the
host's sshd points podman at, through the environment (`SetEnv`):

- `CONTAINERS_STORAGE_CONF`: graph root under the host's directory, run root
  under its run directory. One store per host, like one dockerd per host.
- `CONTAINERS_CONF`: `default_ulimits = []` (this machine refuses podman's
  default RLIMIT_NOFILE/NPROC: no CAP_SYS_RESOURCE), `runtime = "runc"` (crun
  1.8 fails here: "cgroups in hybrid mode not supported"), and the per-boot
  directory, locks and event log inside the host's run directory, so no two
  hosts (and nothing else on the machine) share podman state.
- `CONTAINERS_REGISTRIES_CONF`: the sandbox registry's address (the bridge's
  gateway, any port) marked `insecure`: it serves plain HTTP, which podman
  otherwise refuses (dockerd's `insecure-registries` does the same for the
  docker hosts). Sandbox configuration only: cvs sends the same commands.
- `REGISTRY_AUTH_FILE`: where `podman login` keeps credentials. Without it
  rootful podman writes the machine-wide /run/containers/0/auth.json, shared
  by every sandbox host (and everything else on the machine). Podman 4.3's
  pull fails on a named file that does not exist, so it starts as `{}`.

The sshd of a podman host enters the namespace with `nsenter --net`, not
`ip netns exec`: the latter mounts a fresh /sys without the cgroup
hierarchy, and runc then fails with "no cgroup mount found in mountinfo".

Images: a template store loaded once from the cached images tar (same image
IDs as the docker hosts: the config digest is the ID for both); each host's
store is seeded from it with hard-linked layers, like the docker data roots.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from . import images, procs
from .errors import SandboxError
from .procs import run

PODMAN = "/usr/bin/podman"
TEMPLATE_STAMP = ".cvs-podman-template.json"


def storage_conf(graph_root: Path, run_root: Path, *, rootless: bool = False) -> str:
    # A rootless podman ignores `graphroot` and keeps its store in the user's
    # home unless `rootless_storage_path` says otherwise: one store per user,
    # shared by every sandbox host, is what this file exists to prevent.
    rootless_line = f'rootless_storage_path = "{graph_root}"\n' if rootless else ""
    return (
        "# Written by cvs sandbox: this host's own podman store.\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{graph_root}"\n'
        f'runroot = "{run_root}"\n' + rootless_line
    )


def containers_conf(tmp_dir: Path) -> str:
    return (
        "# Written by cvs sandbox (orchestrator/sandbox/podman.py).\n"
        "[containers]\n"
        "# This machine refuses podman's default ulimits (no CAP_SYS_RESOURCE).\n"
        "default_ulimits = []\n"
        "[engine]\n"
        "# crun 1.8 fails here (cgroups in hybrid mode); Debian's runc works.\n"
        'runtime = "runc"\n'
        "# Per-host state: nothing shared with other hosts or the machine.\n"
        f'tmp_dir = "{tmp_dir}"\n'
        'lock_type = "file"\n'
        'events_logger = "file"\n'
    )


def registries_conf(insecure_host: str) -> str:
    # A location without a port matches every port on that address (podman
    # compares prefixes up to ':' or '/'): the registry picks a free port at
    # each start, and tests point at stalling endpoints on other ports.
    return (
        "# Written by cvs sandbox (orchestrator/sandbox/podman.py).\n"
        "unqualified-search-registries = []\n"
        "[[registry]]\n"
        f'location = "{insecure_host}"\n'
        "# The sandbox registry serves plain HTTP.\n"
        "insecure = true\n"
    )


def env_for(
    storage: Path,
    containers: Path,
    registries: Path | None = None,
    auth_file: Path | None = None,
) -> dict[str, str]:
    """What the host's sshd sets for every session (and sudo keeps)."""
    env = {"CONTAINERS_STORAGE_CONF": str(storage), "CONTAINERS_CONF": str(containers)}
    if registries is not None:
        env["CONTAINERS_REGISTRIES_CONF"] = str(registries)
    if auth_file is not None:
        env["REGISTRY_AUTH_FILE"] = str(auth_file)
    return env


def write_registry_files(env: dict[str, str], insecure_host: str, owner: str | None = None) -> None:
    """The registries.conf and the empty auth file `env` names (owned by
    `owner`, a rootless user, who must be able to write its logins)."""
    Path(env["CONTAINERS_REGISTRIES_CONF"]).write_text(registries_conf(insecure_host))
    auth = Path(env["REGISTRY_AUTH_FILE"])
    auth.write_text("{}\n")
    auth.chmod(0o600)
    if owner is not None:
        pw = pwd.getpwnam(owner)
        os.chown(auth, pw.pw_uid, pw.pw_gid)


def podman_argv(env: dict[str, str], netns: str | None = None) -> list[str]:
    """argv prefix running podman against one store, from the root namespace
    (or inside `netns`, where the host's containers live)."""
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), PODMAN]
    if netns is None:
        return argv
    return ["nsenter", f"--net=/var/run/netns/{netns}", *argv]


def template_root() -> Path:
    return images.cache_dir() / "podman-root"


def ensure_template(progress: images.Progress) -> Path:
    """A podman graph root holding the sandbox images (cached, flock'ed);
    built once per images tar with `podman load`."""
    images.ensure_images(progress)
    with images.cache_lock() as cache:
        key = images._images_key()
        template = template_root()
        stamp = template / TEMPLATE_STAMP
        if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
            return template
        progress("preparing the podman image template (once per rootfs build)")
        work = cache / "podman-build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "storage.conf").write_text(storage_conf(work / "root", work / "runroot"))
        (work / "containers.conf").write_text(containers_conf(work / "tmp"))
        env = env_for(work / "storage.conf", work / "containers.conf")
        try:
            run([*podman_argv(env), "load", "-q", "-i", str(images.images_tar())])
        finally:
            for mount in procs.mounts_under([work]):
                run(["umount", "-l", mount], check=False)
        (work / "root" / TEMPLATE_STAMP).write_text(json.dumps({"key": key}))
        shutil.rmtree(template, ignore_errors=True)
        (work / "root").rename(template)
        shutil.rmtree(work, ignore_errors=True)
        return template


# What of the template a host copies: containers/storage's own directories.
# Not `libpod/` (its database records the paths it was made with) nor locks.
_STORE_PARTS = ("overlay", "overlay-images", "overlay-layers")


def seed_store(template: Path, graph_root: Path) -> None:
    """The host's graph root from the template: layer contents hard-linked
    (never written in place), the stores' JSON and lock files real copies."""
    if graph_root.exists():
        raise SandboxError(f"{graph_root} already exists; not seeding a podman store over it")
    graph_root.mkdir(parents=True)
    same_fs = template.stat().st_dev == graph_root.stat().st_dev
    for part in _STORE_PARTS:
        src = template / part
        if not src.exists():
            continue
        run(["cp", "-a", *(["--link"] if same_fs else []), str(src), str(graph_root / part)])
    if not same_fs:
        return
    for root, dirs, files in os.walk(graph_root):
        rel = Path(root).relative_to(graph_root).parts
        if len(rel) == 2 and rel[0] == "overlay" and "diff" in dirs:
            dirs.remove("diff")
        for name in files:
            path = Path(root, name)
            st = path.lstat()
            if not path.is_symlink() and st.st_nlink > 1:
                tmp = path.with_name(name + ".cvs-copy")
                shutil.copy2(path, tmp)
                tmp.replace(path)


def remove_all_containers(env: dict[str, str], netns: str | None, user: str | None = None) -> None:
    """`podman rm -af` on one host's store: runc's state for them is machine
    wide (/run/runc), so killing the processes alone would leave it behind.
    `user`: a login user's rootless store, as that user."""
    argv = podman_argv(env, netns)
    if user is not None:
        if not Path(env["CONTAINERS_STORAGE_CONF"]).exists():
            return
        argv = [*argv[: argv.index("env")], "runuser", "-u", user, "--", *argv[argv.index("env") :]]
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        run([*argv, "rm", "-a", "-f", "-t", "0"], check=False)


def rootless_argv(env: dict[str, str], user: str) -> list[str]:
    """argv prefix running `user`'s rootless podman on one host's store, from
    the root namespace (as that user, never root: its files belong to the
    user's subordinate IDs)."""
    return ["runuser", "-u", user, "--", *podman_argv(env)]


def load_rootless_images(env: dict[str, str], user: str, tar_path: Path | None = None) -> None:
    """The sandbox images (or the saved image tar `tar_path`) into `user`'s
    rootless store (same image IDs as the rootful stores: `podman load` keeps
    the config digest)."""
    # On stdin: the cache is root's, and the user may not open it.
    argv = [*rootless_argv(env, user), "load", "-q"]
    with open(tar_path or images.images_tar(), "rb") as tar:
        proc = subprocess.run(argv, stdin=tar, capture_output=True, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise procs.CommandError(proc.returncode, argv, proc.stdout, err)


def prepare_rootless(directory: Path, user: str) -> None:
    """A rootless podman for `user`: store, run root and configuration in
    `directory`, owned by that user (its images are loaded by that user:
    a rootless store's files belong to the user's subordinate IDs, so the
    root-owned template cannot be linked in)."""
    pw = pwd.getpwnam(user)
    for sub in ("", "root", "run", "tmp", "xdg", "data"):
        path = directory / sub
        path.mkdir(mode=0o700 if sub else 0o755, parents=True, exist_ok=True)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    (directory / "storage.conf").write_text(
        storage_conf(directory / "root", directory / "run", rootless=True)
    )
    (directory / "containers.conf").write_text(containers_conf(directory / "tmp"))
