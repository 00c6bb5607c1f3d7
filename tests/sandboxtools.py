"""Helpers for tests on the sandbox's hosts: cluster-file variants, processes in
its namespaces, waiting, one SSHPool round, sshd options and host keys.

Not a test module (test modules import it, it imports none).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import yaml

from orchestrator.config import ClusterConfig
from orchestrator.events import CollectingSink
from orchestrator.results import HostResult
from orchestrator.sandbox import Sandbox
from orchestrator.sandbox.network import NETNS_DIR
from orchestrator.sandbox.procs import cmdline
from orchestrator.ssh.transport import SSHPool


def cluster_variant(sandbox: Sandbox, directory: Path, **changes: Any) -> Path:
    """The sandbox's cluster file with top-level keys replaced (`ssh` is merged)."""
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    for key, value in changes.items():
        if key == "ssh":
            doc["ssh"] = {**doc["ssh"], **value}
        elif value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _processes_in(netns_names: list[str]) -> Iterator[int]:
    """Pids of the processes in these network namespaces."""
    namespaces = set()
    for name in netns_names:
        st = os.stat(NETNS_DIR / name)
        namespaces.add((st.st_dev, st.st_ino))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in namespaces:
            yield int(entry)


def _sandbox_processes(sandbox: Sandbox) -> Iterator[int]:
    """Pids of the processes inside this sandbox's hosts (and their
    host-network containers), by network namespace."""
    return _processes_in([str(h.netns) for h in sandbox.nodes])


def pids_in_netns(netns: str, match: Callable[[list[str]], bool]) -> list[int]:
    """Processes in network namespace `netns` whose argv `match` accepts."""
    found = []
    for pid in _processes_in([netns]):
        argv = cmdline(pid, retry=False)
        if argv and match(argv):
            found.append(pid)
    return found


def sandbox_pids(sandbox: Sandbox, argv: list[str]) -> list[int]:
    """Processes running exactly `argv` inside this sandbox's hosts.

    Matched by network namespace, not by user: the login users are shared by
    every sandbox on the machine, and other test sessions may run the same
    commands at the same time. Containers run with --network host, so their
    processes are found too.
    """
    return [pid for pid in _sandbox_processes(sandbox) if cmdline(pid, retry=False) == argv]


def sandbox_pids_holding(sandbox: Sandbox, needle: bytes) -> list[int]:
    """Processes inside this sandbox's hosts whose command line holds `needle`
    (NUL-separated arguments, as /proc gives them)."""
    found = []
    for pid in _sandbox_processes(sandbox):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in line:
            found.append(pid)
    return found


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def run_once(
    config: ClusterConfig, command: str, hosts: list[str] | None = None
) -> tuple[dict[str, HostResult], CollectingSink]:
    sink = CollectingSink()

    async def main() -> dict[str, HostResult]:
        async with SSHPool(config, sink) as pool:
            results: dict[str, HostResult] = {}
            async with anyio.create_task_group() as tg:
                for host in hosts or [h.name for h in config.hosts]:

                    async def one(h: str = host) -> None:
                        results[h] = await pool.run(h, command, timeout=30)

                    tg.start_soon(one)
            return results

    return anyio.run(main), sink


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "stranger", "-f", str(path)],
        check=True,
    )
    return path


def known_hosts_line(sandbox: Sandbox, host: str) -> str:
    address = sandbox.host(host).address
    for line in sandbox.known_hosts.read_text().splitlines():
        if line.split()[0] == address:
            return line
    raise KeyError(host)


def foreign_known_hosts(sandbox: Sandbox, host: str, path: Path) -> Path:
    """A known_hosts file holding some other key for `host`'s address."""
    key = keygen(path.parent / "foreign_host_key")
    key_type, key_b64 = key.with_suffix(".pub").read_text().split()[:2]
    path.write_text(f"{sandbox.host(host).address} {key_type} {key_b64}\n")
    return path


@contextlib.contextmanager
def sshd_option(sandbox: Sandbox, host: str, key: str, value: str) -> Iterator[None]:
    """Run `host`'s sshd with one extra option; restore the shared sandbox after."""
    try:
        sandbox.set_sshd_option(host, key, value)
        yield
    finally:
        sandbox.host(host).sshd_options.pop(key, None)
        sandbox.restart_sshd(host)


@contextlib.contextmanager
def silent_server(address: str) -> Iterator[int]:
    """A TCP server that accepts and never says a word (a stalled registry)."""
    server = socket.socket()
    server.bind((address, 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()
