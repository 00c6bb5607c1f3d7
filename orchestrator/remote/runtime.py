"""How to reach the container runtime on one host: the one place that knows.

The probe finds it (plain `docker` when the socket lets the login user in,
else `sudo -n docker`; remote/probe.sh) and every command on that host then
uses it: `up`'s steps, `exec`, `cp`, the suites, the CVS adapter. Where no
probe ran in this invocation, the host finds it itself with the same rule
(remote/docker.sh, lib access.sh), in the same round trip as the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator import remote

Access = Literal["direct", "sudo"]

# Shell text that goes before docker CLI calls on the hot paths (remote/access.sh
# sets the same for the programs). Go's runtime sizes itself to the host's
# cores: on a 128-core node a one-shot docker CLI sets up that many Ps (and GC
# workers) for one API call. One is plenty, and measurably cheaper under load
# (docs/design.md, "What an attach costs"). Exported to the docker CLI only:
# `docker exec` passes no host variable into the container.
DOCKER_CLI_ENV = "GOMAXPROCS=1; export GOMAXPROCS"

_PREFIX: dict[Access, tuple[str, ...]] = {
    "direct": ("docker",),
    "sudo": ("sudo", "-n", "docker"),
}


@dataclass(frozen=True)
class DockerRuntime:
    """`access` None: not probed here; the host decides on each command."""

    access: Access | None = None

    @property
    def known(self) -> bool:
        return self.access is not None

    @property
    def prefix(self) -> list[str]:
        """`docker` or `sudo -n docker` (ValueError when not known)."""
        if self.access is None:
            raise ValueError("the docker access on this host is not known (no probe)")
        return list(_PREFIX[self.access])

    def argv(self, args: Sequence[str]) -> list[str]:
        """`docker ARGS` as this host runs it (known access only)."""
        return [*self.prefix, *args]

    def read(self, args: Sequence[str]) -> list[str]:
        """`docker ARGS`, a read (inspect, ps): the probed access, else each
        access in turn on the host until one answers."""
        if self.access is not None:
            return self.argv(args)
        return remote.argv("docker", "read", *args)

    def when_running(self, name: str, args: Sequence[str], not_running: str) -> list[str]:
        """`docker ARGS` once container `name` runs; else `not_running` on
        stderr and exit 125. With a known access the check is the caller's
        (an `up` of this invocation probed the container under its lock)."""
        if self.access is not None:
            return self.argv(args)
        return remote.argv("docker", "running", name, not_running, *args)
