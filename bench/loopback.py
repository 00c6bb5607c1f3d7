"""Many SSH endpoints on loopback: 127.0.1.x addresses served by several sshd.

OpenSSH accepts at most 16 ListenAddress lines per sshd, so N endpoints need
ceil(N / 16) sshd processes. A dedicated login user keeps shell start-up
cheap (root's rc files on these machines are slow).

Several farms may run at once (engineers sharing a machine, a test beside a
benchmark): each listens on a port of its own, and adds its key to the
shared user's authorized_keys (under a lock) and removes only that line
after, so one farm never locks another's clients out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USER = "cvsbench"
PORT = 2222  # the first port tried; a farm takes the first one free from here
PER_SSHD = 16


@dataclass
class LoopbackFarm:
    directory: Path
    addresses: list[str]
    key_file: Path
    known_hosts: Path
    pids: list[int]
    user: str = USER
    port: int = PORT

    def sshd_cpu(self) -> float:
        """CPU seconds (user + system) the farm's sshds spent serving connections:
        each connection's sshd (and the shell it ran) is a child the listener
        reaps, so its CPU lands in the listener's cutime/cstime."""
        ticks = 0
        for pid in self.pids:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def cluster_yaml(self, name: str = "loopback", **ssh_extra: object) -> Path:
        import yaml

        ssh = {
            "user": self.user,
            "port": self.port,
            "identity_files": [str(self.key_file)],
            "known_hosts": str(self.known_hosts),
            "host_key_policy": "strict",
            "use_ssh_config": False,
            **ssh_extra,
        }
        doc = {
            "name": name,
            "hosts": [{"name": f"lo{i + 1}", "address": a} for i, a in enumerate(self.addresses)],
            "ssh": ssh,
            "concurrency": {"handshakes": 32},
        }
        path = self.directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


def _free_port(address: str) -> int:
    """A port nothing listens on at `address` (the farm's first address)."""
    candidates = [PORT, *random.sample(range(20000, 60000), 200)]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port on {address} for the loopback farm")


@contextmanager
def _authorized(home: Path, line: str) -> Iterator[None]:
    """`line` in the user's authorized_keys while the farm runs; other lines kept."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.chown(ssh_dir, USER, USER)
    keys = ssh_dir / "authorized_keys"

    def edit(change: str) -> None:
        with (ssh_dir / ".cvs-farm.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lines = keys.read_text().splitlines() if keys.exists() else []
            lines = [x for x in lines if x != line]
            if change == "add":
                lines.append(line)
            keys.write_text("".join(x + "\n" for x in lines))
            shutil.chown(keys, USER, USER)

    edit("add")
    try:
        yield
    finally:
        edit("remove")


def _ensure_user() -> None:
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
        subprocess.run(["usermod", "-p", "*", USER], check=True)


@contextmanager
def loopback_farm(count: int, *, max_startups: str = "200:30:400") -> Iterator[LoopbackFarm]:
    """Start ceil(count/16) sshd serving `count` loopback addresses; stop them after."""
    if os.geteuid() != 0:
        raise SystemExit("the loopback farm needs root (it starts sshd and adds a user)")
    _ensure_user()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    directory = Path(tempfile.mkdtemp(prefix="cvs-loopback-"))
    os.chmod(directory, 0o755)
    pids: list[int] = []
    stack = contextlib.ExitStack()
    try:
        host_key = directory / "host_ed25519"
        key = directory / "id_ed25519"
        for k in (host_key, key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True
            )
        home = Path(f"~{USER}").expanduser()
        client_pub = (directory / "id_ed25519.pub").read_text().split()
        stack.enter_context(
            _authorized(home, f"{client_pub[0]} {client_pub[1]} cvs-farm:{directory.name}")
        )
        addresses = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]
        port = _free_port(addresses[0])
        pub = (directory / "host_ed25519.pub").read_text().split()
        known = directory / "known_hosts"
        # One line per host, as a real cluster's known_hosts has (the farm's
        # sshds share one host key, but the file is as long as the fleet).
        known.write_text("".join(f"[{a}]:{port} {pub[0]} {pub[1]}\n" for a in addresses))
        for n in range(0, count, PER_SSHD):
            chunk = addresses[n : n + PER_SSHD]
            conf = directory / f"sshd_{n}.conf"
            pidfile = directory / f"sshd_{n}.pid"
            conf.write_text(
                "\n".join(
                    [f"ListenAddress {a}:{port}" for a in chunk]
                    + [
                        f"HostKey {host_key}",
                        f"PidFile {pidfile}",
                        "UsePAM no",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PubkeyAuthentication yes",
                        f"AllowUsers {USER}",
                        f"MaxStartups {max_startups}",
                        "MaxSessions 32",
                        "UseDNS no",
                        "PrintMotd no",
                        "LogLevel ERROR",
                    ]
                )
                + "\n"
            )
            subprocess.run(["/usr/sbin/sshd", "-f", str(conf)], check=True)
            for _ in range(500):  # a loaded machine may take seconds
                if pidfile.exists() and pidfile.read_text().strip():
                    break
                time.sleep(0.02)
            else:
                raise SystemExit(f"sshd for {chunk[0]}..:{port} did not start (see {conf})")
            pids.append(int(pidfile.read_text()))
        yield LoopbackFarm(directory, addresses, key, known, pids, port=port)
    finally:
        stack.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(directory, ignore_errors=True)
