"""Build and cache the two sandbox images.

debootstrap runs once per machine (~30 s each); its rootfs tarballs are
cached. They become images once (`docker import`), which are then
`docker save`d to one cached tar; loading that tar gives the same image IDs
on every daemon (a fresh `docker import` would give a new
ID each time, which is what `import_skewed_image` uses on purpose).

Hosts do not even `docker load`: a throwaway dockerd loads the images once
into a template data root, and each host's data root is seeded from it with
hard-linked layers (same image IDs everywhere, by construction, in well under
a second per host).

The cache is shared between concurrent sandboxes and test runs: every build
step runs under an exclusive flock on CACHE/.lock and publishes its result by
atomic rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import daemons, procs
from .errors import SandboxError
from .procs import run

SSHD_TAG = "cvs-sandbox:sshd"
BASE_TAG = "cvs-sandbox:base"
# The sshd image with an unprivileged USER (most images outside the CUDA/ROCm
# bases set one): provisioning must still run as root in it.
USER_TAG = "cvs-sandbox:user"
# The sshd image plus Debian 12's Open MPI (4.1) and mpi4py: `cvs sandbox up
# --mpi`. Built only when asked for (a separate rootfs and saved tar), so the
# default images stay as small as they are.
MPI_TAG = "cvs-sandbox:mpi"
IMAGE_USER = "cvsuser"
IMAGE_UID = 1000
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"

Progress = Callable[[str], None]
STAMP = ".cvs-template.json"


@dataclass(frozen=True)
class RootfsFlavor:
    name: str  # file stem in the cache
    tag: str
    include: tuple[str, ...]


FLAVORS = (
    RootfsFlavor("sshd", SSHD_TAG, ("openssh-server",)),
    RootfsFlavor("base", BASE_TAG, ()),
)
# Not in FLAVORS: nothing but `--mpi` builds or loads it.
MPI_FLAVOR = RootfsFlavor(
    "mpi", MPI_TAG, ("openssh-server", "openmpi-bin", "python3-mpi4py", "iproute2")
)


def cache_dir() -> Path:
    return Path(os.environ.get("CVS_SANDBOX_CACHE", "/var/cache/cvs-sandbox"))


def rootfs_tar(flavor: str) -> Path:
    return cache_dir() / f"rootfs-{flavor}.tar"


@contextlib.contextmanager
def cache_lock(name: str = ".lock") -> Iterator[Path]:
    """An exclusive flock on CACHE/NAME. The MPI image has a lock of its own
    (`.mpi.lock`): its minutes-long first build does not hold up sandboxes
    that only need the default images."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield cache
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _debootstrap(flavor: RootfsFlavor, cache: Path, progress: Progress) -> None:
    target = rootfs_tar(flavor.name)
    work = Path(tempfile.mkdtemp(prefix=f"rootfs-{flavor.name}-", dir=cache))
    try:
        root = work / "root"
        argv = ["debootstrap", "--variant=minbase"]
        if flavor.include:
            argv.append("--include=" + ",".join(flavor.include))
        argv += [SUITE, str(root), MIRROR]
        took = "a few minutes" if flavor is MPI_FLAVOR else "~30-60 s"
        progress(f"debootstrap {flavor.name} rootfs ({SUITE}, {took})")
        try:
            run(argv)
        except Exception as exc:
            raise SandboxError(f"debootstrap of the {flavor.name} image failed: {exc}") from exc
        # Leave out downloaded packages and the pseudo filesystems' contents:
        # smaller images, and `docker import` must not see device nodes.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / sub).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tmp_tar = work / "rootfs.tar"
        run(
            [
                "tar", "-C", str(root), "--numeric-owner",
                "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
                "-cf", str(tmp_tar), ".",
            ]
        )  # fmt: skip
        tmp_tar.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ensure_rootfs(progress: Progress) -> None:
    """debootstrap whatever rootfs is missing (both in parallel). Call under `cache_lock`."""
    cache = cache_dir()
    missing = [f for f in FLAVORS if not rootfs_tar(f.name).exists()]
    if not missing:
        return
    with ThreadPoolExecutor(max_workers=len(missing)) as pool:
        for future in [pool.submit(_debootstrap, f, cache, progress) for f in missing]:
            future.result()


def _images_key() -> str:
    # Saved images and the template are valid for exactly the rootfs tarballs
    # they came from.
    parts = []
    for flavor in FLAVORS:
        st = rootfs_tar(flavor.name).stat()
        parts.append(f"{flavor.name}:{st.st_size}:{st.st_mtime_ns}")
    return ",".join(parts)


def images_tar() -> Path:
    return cache_dir() / "images.tar"


def template_root() -> Path:
    return cache_dir() / "dataroot"


def import_rootfs(docker: list[str], flavor: str, tag: str) -> str:
    """`docker import` a cached rootfs under `tag`; returns the new image ID."""
    out = run([*docker, "import", "--change", 'CMD ["/bin/bash"]', str(rootfs_tar(flavor)), tag])
    return out.strip()


def image_id(docker: list[str], tag: str) -> str:
    return run([*docker, "image", "inspect", "--format", "{{.Id}}", tag]).strip()


def _stamp_ok(stamp: Path, key: str) -> bool:
    try:
        stamped: object = json.loads(stamp.read_text()).get("key")
        return stamped == key
    except (OSError, ValueError):
        return False


def ensure_images(progress: Progress) -> Path:
    """Cached rootfs tarballs, images.tar and a template dockerd data root; returns the latter.

    The template is a stopped dockerd's data root holding both images; every
    host's data root is seeded from it (`seed_data_root`), which takes well
    under a second where `docker load` on each host took seconds.
    """
    with cache_lock() as cache:
        _ensure_rootfs(progress)
        key = _images_key()
        template = template_root()
        if _stamp_ok(template / STAMP, key):
            return template
        progress("preparing the image template (once per rootfs build)")
        work = cache / "dataroot.tmp"
        shutil.rmtree(work, ignore_errors=True)
        with _build_dockerd(work) as docker:
            if _stamp_ok(cache / "images.json", key) and images_tar().exists():
                run([*docker, "load", "-q", "-i", str(images_tar())])
            else:
                for flavor in FLAVORS:
                    import_rootfs(docker, flavor.name, flavor.tag)
                tmp = cache / "images.tar.tmp"
                run([*docker, "save", "-o", str(tmp), *(f.tag for f in FLAVORS)])
                tmp.rename(images_tar())
                (cache / "images.json").write_text(json.dumps({"key": key}))
        (work / STAMP).write_text(json.dumps({"key": key}))
        shutil.rmtree(template, ignore_errors=True)
        work.rename(template)
        return template


@contextlib.contextmanager
def _build_dockerd(data_root: Path) -> Iterator[list[str]]:
    """A throwaway dockerd (root namespace, no networking) on `data_root`."""
    exec_root = Path("/run/cvs-sandbox") / f"build-{os.getpid()}"
    exec_root.mkdir(parents=True, exist_ok=True)
    data_root.mkdir(parents=True)
    sock = exec_root / "docker.sock"
    config = exec_root / "daemon.json"
    daemons.write_dockerd_config(config)
    argv = daemons.dockerd_argv(
        netns=None,
        data_root=data_root,
        exec_root=exec_root / "exec",
        pid_file=exec_root / "docker.pid",
        socket_path=sock,
        config_file=config,
    )
    pid = procs.spawn(argv, data_root.parent / "build-dockerd.log", tmpdir=exec_root / "tmp")
    marker = str(exec_root)
    try:
        procs.wait_for(
            lambda: daemons.dockerd_ready(sock) or not procs.alive(pid),
            timeout=60,
            what="the image-building dockerd",
        )
        if not procs.alive(pid):
            raise SandboxError(f"image-building dockerd died; see {data_root.parent}")
        yield ["docker", "--host", f"unix://{sock}"]
    finally:
        procs.stop(pid, marker, timeout=20)
        for mount in procs.mounts_under([data_root, exec_root]):
            run(["umount", "-l", mount], check=False)
        shutil.rmtree(exec_root, ignore_errors=True)


def seed_data_root(template: Path, dest: Path) -> None:
    """Copy the template data root to `dest`, sharing the image layers by hard link.

    Layer contents (overlay2/<id>/diff) are never written in place: overlayfs
    copies a file up before changing it, and removing an image only unlinks.
    Everything else (bolt databases, JSON state) is written in place by
    dockerd, so those files become real copies.
    """
    if dest.exists():
        raise SandboxError(f"{dest} already exists; not seeding a docker data root over it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if template.stat().st_dev != dest.parent.stat().st_dev:
        run(["cp", "-a", str(template), str(dest)])
        return
    run(["cp", "-a", "--link", str(template), str(dest)])
    for root, dirs, files in os.walk(dest):
        rel = Path(root).relative_to(dest).parts
        if len(rel) == 2 and rel[0] == "overlay2" and "diff" in dirs:
            dirs.remove("diff")
        for name in files:
            path = Path(root, name)
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                tmp = path.with_name(name + ".cvs-copy")
                shutil.copy2(path, tmp)
                os.chown(tmp, st.st_uid, st.st_gid)
                tmp.replace(path)


def user_image_tar() -> Path:
    return cache_dir() / "image-user.tar"


def ensure_user_image(progress: Progress) -> Path:
    """A cached `docker save` of USER_TAG: the sshd image plus an unprivileged
    account that is the image's USER (and WORKDIR its home).

    Built once from the cached images (a throwaway dockerd runs `useradd` in a
    network-less container and commits it); kept apart from the template so
    sandboxes that do not need it pay nothing. `docker load` of the tar gives
    the same image ID on every host.
    """
    ensure_images(progress)
    with cache_lock() as cache:
        key = _images_key()
        stamp = cache / "image-user.json"
        if _stamp_ok(stamp, key) and user_image_tar().exists():
            return user_image_tar()
        progress(f"building {USER_TAG} (once per rootfs build)")
        work = Path(tempfile.mkdtemp(prefix="user-image-", dir=cache))
        try:
            with _build_dockerd(work / "root") as docker:
                run([*docker, "load", "-q", "-i", str(images_tar())])
                builder = f"cvs-user-build-{os.getpid()}"
                run(
                    [
                        *docker, "run", "--name", builder, "--network", "none", SSHD_TAG,
                        "useradd", "-m", "-u", str(IMAGE_UID), "-s", "/bin/bash", IMAGE_USER,
                    ]
                )  # fmt: skip
                run(
                    [
                        *docker, "commit",
                        "--change", f"USER {IMAGE_USER}",
                        "--change", f"WORKDIR /home/{IMAGE_USER}",
                        "--change", 'CMD ["/bin/bash"]',
                        builder, USER_TAG,
                    ]
                )  # fmt: skip
                tmp = work / "image-user.tar"
                run([*docker, "save", "-o", str(tmp), USER_TAG])
                tmp.rename(user_image_tar())
            stamp.write_text(json.dumps({"key": key}))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return user_image_tar()


def mpi_image_tar() -> Path:
    return cache_dir() / "image-mpi.tar"


def ensure_mpi_image(progress: Progress) -> Path:
    """A cached `docker save` of MPI_TAG (`cvs sandbox up --mpi`).

    Its rootfs is debootstrapped once (openssh-server, openmpi-bin,
    python3-mpi4py, iproute2) and imported once in a throwaway dockerd; the
    saved tar, loaded on every host, gives the same image ID everywhere.
    Everything happens under `.mpi.lock` and is published by atomic rename,
    like the default images.
    """
    with cache_lock(".mpi.lock") as cache:
        tar = rootfs_tar(MPI_FLAVOR.name)
        if not tar.exists():
            _debootstrap(MPI_FLAVOR, cache, progress)
        st = tar.stat()
        key = f"{MPI_FLAVOR.name}:{st.st_size}:{st.st_mtime_ns}"
        stamp = cache / "image-mpi.json"
        if _stamp_ok(stamp, key) and mpi_image_tar().exists():
            return mpi_image_tar()
        progress(f"building {MPI_TAG} (once per rootfs build)")
        work = Path(tempfile.mkdtemp(prefix="mpi-image-", dir=cache))
        try:
            with _build_dockerd(work / "root") as docker:
                import_rootfs(docker, MPI_FLAVOR.name, MPI_TAG)
                tmp = work / "image-mpi.tar"
                run([*docker, "save", "-o", str(tmp), MPI_TAG])
                tmp.rename(mpi_image_tar())
            stamp.write_text(json.dumps({"key": key}))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return mpi_image_tar()
