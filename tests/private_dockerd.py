"""A private dockerd in the root network namespace, for the docker runtime and
probe tests: real docker output without the whole sandbox.

Started per test module (see the `dockerd` fixture in conftest.py), stopped
by pid, its directories removed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

DOCKERD = "/usr/sbin/dockerd"
BUSYBOX = "/bin/busybox"
TEST_IMAGE = "cvs-test/busybox:1"


def private_dockerd_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run dockerd"
    if not os.path.exists(DOCKERD):
        return f"{DOCKERD} not installed"
    if not shutil.which("docker"):
        return "no docker CLI on PATH"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} missing (apt-get install busybox-static)"
    return None


class PrivateDockerd:
    """A dockerd of our own: its own data/exec root and socket; stopped by pid."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def _tmpdir(self) -> Path:
        path = self.root / "tmp"
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.root / "dockerd.log", "wb")  # noqa: SIM115 - outlives this call
        self.proc = subprocess.Popen(
            [
                DOCKERD,
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "dockerd.pid"),
                "-H",
                self.host,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # containerd's stack dumps land in TMPDIR: keep them with this daemon.
            env={**os.environ, "TMPDIR": str(self._tmpdir())},
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited: {self.log_tail()}")
            if self.sock.exists() and self.docker("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"dockerd did not come up: {self.log_tail()}")

    def log_tail(self) -> str:
        path = self.root / "dockerd.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def docker(
        self, *args: str, input: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", *args],
            env=self.env,
            input=input.decode() if input is not None else None,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def run_argv(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a builder's argv the way the orchestrator will: quoted once, through sh."""
        return subprocess.run(
            ["sh", "-c", shlex.join(argv)],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def import_busybox(self, tag: str = TEST_IMAGE) -> str:
        """Image id of a busybox-only image imported as `tag` (a new id each time)."""
        rootfs = self.root / f"rootfs-{time.monotonic_ns()}"
        (rootfs / "bin").mkdir(parents=True)
        for d in ("proc", "sys", "dev", "etc", "tmp"):
            (rootfs / d).mkdir()
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        applets = subprocess.run(
            [BUSYBOX, "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True)
        shutil.rmtree(rootfs)
        out = subprocess.run(
            ["docker", "import", "-", tag],
            input=tar.stdout,
            env=self.env,
            capture_output=True,
            check=True,
            timeout=120,
        )
        return out.stdout.decode().strip()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self._unmount_leftovers()

    def _unmount_leftovers(self) -> None:
        # dockerd can leave e.g. exec-root/netns/default mounted after it exits.
        prefix = f"{self.root}/"
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
