"""The container runtime on a host: which one, how it is reached, how it is spelled.

One `Runtime` per host, built from what the probe found (`for_state`): the
runtime the cluster names (`container.runtime`), and the access that answered
(`direct`: plain `docker`, root's or the login user's rootless `podman`;
`sudo`: `sudo -n docker|podman`). Every command that reaches the runtime on
a host takes its argv prefix here, and where docker and podman spell an
operation differently, the difference lives here and nowhere else:

| operation | docker | podman |
|---|---|---|
| probe inspect | `inspect NAME IMAGE` | `container inspect`, `image inspect` (*) |
| name filter | `name=^/NAME$` | `name=^NAME$` (no leading slash) |
| ps label column | `{{.Label "k"}}` | `{{index .Labels "k"}}` |
| image IDs | `sha256:HEX` | bare `HEX` (normalised to `sha256:HEX` by the parsers) |
| NVIDIA GPUs | `--gpus device=…` | CDI only (podman 4 has no `--gpus`) |
| CDI | docker 25+ with the `cdi` feature | built in |
| limits unset | PidsLimit null, ShmSize 64 MiB | PidsLimit 2048, ShmSize 62.5 MiB (**) |

(*) one podman template cannot meet a container and an image.
(**) containers.conf's defaults.

Rootful podman needs root: a login user that is not root reaches it through
`sudo -n podman`, never plain `podman`, which would silently be that user's
*rootless* podman with a container set of its own (an "absent" container
that is in fact only elsewhere). Rootless is asked for explicitly
(`container.rootless: true`) and then only plain `podman` is tried.

A cluster runs one runtime on every host. A mixed fleet is refused up front:
image IDs, CLI spellings, GPU flags and the in-container defaults differ, and
one `cvs up` would start two kinds of container under one name. The probe
says when a host lacks the named runtime but has the other one, so the
refusal names it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Literal

from orchestrator.containers.docker import ContainerLimits

RuntimeName = Literal["docker", "podman"]
Access = Literal["direct", "sudo"]
RUNTIMES: tuple[RuntimeName, ...] = ("docker", "podman")

# podman's defaults (containers.conf) for what docker leaves unset: a
# container started without `--pids-limit` / `--shm-size` reports these.
PODMAN_DEFAULT_PIDS_LIMIT = 2048
PODMAN_DEFAULT_SHM_BYTES = 65536000
DOCKER_DEFAULT_SHM_BYTES = 64 * 1024 * 1024

_HEX64 = re.compile(r"[0-9a-f]{64}")


def image_id(value: str | None) -> str | None:
    """An image ID as docker prints it: podman's bare 64 hex digits get `sha256:`."""
    if isinstance(value, str) and _HEX64.fullmatch(value):
        return f"sha256:{value}"
    return value


@dataclass(frozen=True)
class Runtime:
    name: RuntimeName = "docker"
    access: Access = "direct"
    rootless: bool = False

    def __post_init__(self) -> None:
        if self.name not in RUNTIMES:
            raise ValueError(f"unknown container runtime {self.name!r} (docker or podman)")
        if self.rootless and (self.name != "podman" or self.access != "direct"):
            raise ValueError("rootless is the login user's own podman: plain `podman`, no sudo")

    @property
    def binary(self) -> str:
        return self.name

    @property
    def prefix(self) -> list[str]:
        """argv prefix for the runtime's CLI on the host."""
        if self.access == "sudo":
            return ["sudo", "-n", self.binary]
        return [self.binary]

    def describe(self) -> str:
        if self.rootless:
            return "podman (rootless)"
        return " ".join(self.prefix)

    def name_filter(self, name: str) -> str:
        """`ps --filter` value matching exactly the container called `name`."""
        return f"name=^/{name}$" if self.name == "docker" else f"name=^{name}$"

    def label_column(self, key: str) -> str:
        """`ps --format` text printing label `key`."""
        if self.name == "docker":
            return "{{.Label " + json.dumps(key) + "}}"
        return "{{index .Labels " + json.dumps(key) + "}}"

    def normalize_limits(self, limits: ContainerLimits) -> ContainerLimits:
        """Limits as docker would report them for the same request: podman's own
        defaults for what was left unset read as unset (no false drift)."""
        if self.name != "podman":
            return limits
        pids = limits.pids_limit
        shm = limits.shm_size
        return ContainerLimits(
            nano_cpus=limits.nano_cpus,
            memory=limits.memory,
            memory_reservation=limits.memory_reservation,
            cpu_shares=limits.cpu_shares,
            pids_limit=None if pids == PODMAN_DEFAULT_PIDS_LIMIT else pids,
            shm_size=DOCKER_DEFAULT_SHM_BYTES if shm == PODMAN_DEFAULT_SHM_BYTES else shm,
            devices=limits.devices,
        )

    @classmethod
    def for_access(cls, name: str, access: str | None, *, rootless: bool = False) -> Runtime:
        """The runtime a probe found: `access` is what answered (direct or sudo)."""
        if access not in ("direct", "sudo"):
            raise ValueError(f"no runtime access {access!r}: the probe found none")
        return cls(name=name, access=access, rootless=rootless)  # type: ignore[arg-type]


def access_order(name: RuntimeName, rootless: bool) -> str:
    """sh text setting `order` to the accesses to try, first to last.

    docker: the socket's permissions say which first, with no docker process
    spent. Rootful podman: plain `podman` only as root (anyone else would get
    their rootless store), otherwise `sudo -n podman`. Rootless: plain only.
    """
    if name == "docker":
        return "\n".join(
            [
                'order="direct sudo"',
                "case ${DOCKER_HOST:-unix:///var/run/docker.sock} in",
                "  unix://*) sock=${DOCKER_HOST:-unix:///var/run/docker.sock}; sock=${sock#unix://}",
                '    if [ -S "$sock" ] && [ ! -w "$sock" ]; then order="sudo direct"; fi ;;',
                "esac",
            ]
        )
    if rootless:
        return "order=direct"
    return 'if [ "$(id -u)" = 0 ]; then order=direct; else order=sudo; fi'


def candidates(name: RuntimeName, rootless: bool) -> list[tuple[str, list[str]]]:
    """(sh guard, argv prefix) pairs to try in order where no probe has said
    how the runtime is reached (a command in a new invocation). The guard is
    shell text that must succeed before the prefix is tried ("" = none)."""
    if name == "docker":
        return [("", ["docker"]), ("", ["sudo", "-n", "docker"])]
    if rootless:
        return [("", ["podman"])]
    # Rootful podman: plain `podman` only as root (anyone else would reach
    # their own rootless store), else sudo.
    return [('[ "$(id -u)" = 0 ] && ', ["podman"]), ("", ["sudo", "-n", "podman"])]


def first_that_answers(argv_tail: list[str], name: RuntimeName, rootless: bool) -> str:
    """sh text running `RUNTIME ARGV_TAIL` through the first access that works
    (`docker …` else `sudo -n docker …`), stdout as the runtime prints it."""
    tail = shlex.join(argv_tail)
    parts = [
        f"{{ {guard}{shlex.join(prefix)} {tail}; }}" for guard, prefix in candidates(name, rootless)
    ]
    if name == "docker":
        # The text docker hosts have always run.
        return f"docker {tail} 2>/dev/null || sudo -n docker {tail}"
    return " 2>/dev/null || ".join(parts)
