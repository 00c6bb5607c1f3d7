"""Helpers for container-lifecycle tests on the sandbox: the CLI as they run
it, docker on a sandbox host, and `Lab` (cluster-file variants with their own
container name, and the cleanup of what they leave).

Not a test module (test modules import it, it imports none).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import yaml
from clitools import cvs_on, explain

from orchestrator.sandbox import SSHD_TAG, Sandbox

THREE = ["node1", "node2", "node3"]
CLI_TIMEOUT = 180
# What the sandbox's own container block says about its hosts' runtime (podman,
# rootless): every variant keeps it, or a podman sandbox's file would ask for docker.
RUNTIME_KEYS = ("runtime", "rootless", "ipc")
__all__ = [
    "CLI_TIMEOUT",
    "THREE",
    "Lab",
    "cvs",
    "docker",
    "explain",
    "inspect",
    "wait_for_holders",
]


# The real CLI the way CI runs it (plain output, no TTY).
cvs = partial(cvs_on, timeout=CLI_TIMEOUT)


def docker(sandbox: Sandbox, host: str, *args: str, check: bool = True) -> str:
    """The host's container runtime CLI (its dockerd's, or its podman) run with `args`."""
    proc = subprocess.run(
        [*sandbox.runtime_argv(host), *args], capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} on {host}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def inspect(sandbox: Sandbox, host: str, name: str) -> dict[str, Any] | None:
    """The container's inspect document on that host (docker or podman), None when absent."""
    proc = subprocess.run(
        [*sandbox.runtime_argv(host), "container", "inspect", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        assert "no such" in proc.stderr.lower(), proc.stderr
        return None
    return json.loads(proc.stdout)[0]


def wait_for_holders(name: str, hosts: list[str], count: int = 1, timeout: float = 120) -> None:
    """Until `count` invocations hold the lock on every host (their holder lines
    in the lock directories: the sandbox's hosts share this machine's /tmp)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = [len(list(Path(f"/tmp/cvs-{name}-{h}.lock").glob("h.*"))) for h in hosts]
        if all(n >= count for n in held):
            return
        time.sleep(0.2)
    raise AssertionError(f"nobody took the locks on {hosts} within {timeout}s")


@dataclass
class Lab:
    """Cluster-file variants over a sandbox, and what to clean up."""

    sandbox: Sandbox
    directory: Path
    name: str = ""  # default: the prefix and a random suffix
    tags: list[str] = field(default_factory=list)
    _count: int = 0
    prefix: str = "cvs-lc"
    # Container keys every `container_file` sets (a test module's defaults).
    base: dict[str, Any] = field(default_factory=dict)
    # Top-level keys every file sets (`concurrency`, ...).
    top: dict[str, Any] = field(default_factory=dict)
    # The state directory (keys) of every file, under `directory`.
    state: str = "state"

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.prefix}-{uuid.uuid4().hex[:8]}"

    @property
    def sb(self) -> Sandbox:
        return self.sandbox

    @property
    def runtime(self) -> str:
        """The sandbox hosts' container runtime (docker or podman)."""
        return self.sandbox.nodes[0].runtime

    def _document(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The sandbox's cluster file with our state directory and `top`, and
        the runtime keys of its container block."""
        doc = yaml.safe_load(self.sandbox.cluster_file.read_text())
        doc["state_dir"] = str(self.directory / self.state)
        doc.update(self.top)
        runtime = {k: v for k, v in doc["container"].items() if k in RUNTIME_KEYS}
        return doc, runtime

    def cluster(
        self,
        *,
        lifetime: str,
        hosts: list[str] | None = None,
        image: str = SSHD_TAG,
        user: str | None = None,
        sshd_port: int | None = None,
        host_extra: dict[str, dict[str, Any]] | None = None,
        **container: Any,
    ) -> Path:
        """A cluster file: the sandbox's, with our container name and the given
        changes (`host_extra`: keys added to the named hosts' entries)."""
        doc, runtime = self._document()
        wanted = hosts or THREE
        extra = host_extra or {}
        doc["hosts"] = [
            {**h, **extra.get(h["name"], {})} for h in doc["hosts"] if h["name"] in wanted
        ]
        if user is not None:
            doc["ssh"]["user"] = user
        block: dict[str, Any] = {**runtime, "image": image, "name": self.name, "lifetime": lifetime}
        block["sshd"] = {"enabled": False} if sshd_port is None else {"port": sshd_port}
        block.update(container)
        doc["container"] = block
        self._count += 1
        path = self.directory / f"cluster{self._count}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def container_file(self, lifetime: str = "persistent", **container: Any) -> Path:
        """The sandbox's cluster file as it is (all its hosts, its ssh user, its
        runtime), with a container block of our name, the lifetime, `base` and
        the given keys (nothing else: no sshd block unless given)."""
        doc, runtime = self._document()
        block = {**runtime, "image": SSHD_TAG, "name": self.name, "lifetime": lifetime}
        doc["container"] = {**block, **self.base, **container}
        path = self.directory / f"cluster-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    @cached_property
    def shared_file(self) -> Path:
        """`container_file()`, written once: the file of a module's shared
        persistent container (its sshd on, so commands go through it)."""
        return self.container_file()

    def lock_dir(self, host: str) -> Path:
        """The lock directory of our container on `host` (the sandbox's hosts
        share this machine's /tmp)."""
        return Path(f"/tmp/cvs-{self.name}-{host}.lock")

    def holders(self, hosts: list[str]) -> list[int]:
        """Lock holder files on each host (one per live holder)."""
        return [len(list(self.lock_dir(h).glob("h.*"))) for h in hosts]

    def tag(self, host: str, source: str, tag: str) -> None:
        docker(self.sandbox, host, "tag", source, tag)
        self.tags.append(tag)

    def clean(self) -> None:
        for node in self.sandbox.nodes:
            # podman waits out a stop timeout even under -f unless told not to.
            now = ["-t", "0"] if node.runtime == "podman" else []
            docker(self.sandbox, node.name, "rm", "-f", "-v", *now, self.name, check=False)
            for tag in set(self.tags):
                docker(self.sandbox, node.name, "rmi", tag, check=False)

    def clean_locks(self) -> None:
        """What a killed holder left of our lock directories."""
        for lock in Path("/tmp").glob(f"cvs-{self.name}-*.lock"):
            subprocess.run(["rm", "-rf", str(lock)], check=False)
