"""How to reach the container runtime on one host: the one place that knows.

One object per host says which runtime (`container.runtime`: docker or
podman), how it is reached (`direct`: plain `docker`/`podman`; `sudo`: `sudo -n
…`; `rootless`: the login user's own podman, plain and never sudo) and how
the operations that differ between runtimes are spelled. The probe finds it
(remote/probe.sh) and every command on that host then uses it: `up`'s steps,
`exec`, `cp`, the suites, the CVS adapter. Where no probe ran in this
invocation, the host finds it itself with the same rule (remote/runtime.sh,
lib access.sh), in the same round trip as the command.

Rootful podman needs root: a login user that is not root reaches it through
`sudo -n podman`, never plain `podman`, which would silently be that user's
*rootless* podman with a container set of its own (an "absent" container that
is only elsewhere). So rootless is asked for explicitly (`container.rootless`).

| operation | docker | podman |
|---|---|---|
| probe inspect | `inspect NAME IMAGE` | `container inspect`, `image inspect` (*) |
| name filter | `name=^/NAME$` | `name=^NAME$` (no leading slash) |
| ps label column | `{{.Label "k"}}` | `{{index .Labels "k"}}` |
| image IDs | `sha256:HEX` | bare `HEX` (the parsers add `sha256:`) |
| NVIDIA GPUs | `--gpus device=…` | CDI only (podman 4 has no `--gpus`) |
| CDI | docker 25+ with the `cdi` feature | built in |
| limits unset | PidsLimit null, ShmSize 64 MiB | PidsLimit 2048, ShmSize 62.5 MiB (**) |

(*) one podman template cannot meet a container and an image (remote/podman.sh).
(**) containers.conf's defaults; containers/inspection.py reads them as unset.

A cluster runs one runtime on every host: image IDs, CLI spellings, GPU
flags and in-container defaults differ, and one `cvs up` would start two
kinds of container under one name. When a host cannot reach the cluster's
runtime but has the other, the probe says so and the error names both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator import remote

Access = Literal["direct", "sudo"]
RuntimeName = Literal["docker", "podman"]
RUNTIMES: tuple[RuntimeName, ...] = ("docker", "podman")

# Shell text that goes before docker CLI calls on the hot paths (remote/access.sh
# sets the same for the programs). Go's runtime sizes itself to the host's
# cores: on a 128-core node a one-shot docker CLI sets up that many Ps (and GC
# workers) for one API call. One is plenty, and measurably cheaper under load
# (docs/design.md, "What an attach costs"). Exported to the docker CLI only:
# `docker exec` passes no host variable into the container. (podman is Go too.)
DOCKER_CLI_ENV = "GOMAXPROCS=1; export GOMAXPROCS"


@dataclass(frozen=True)
class ContainerRuntime:
    """`access` None: not probed here; the host decides on each command."""

    access: Access | None = None
    name: RuntimeName = "docker"
    rootless: bool = False

    def __post_init__(self) -> None:
        if self.name not in RUNTIMES:
            raise ValueError(f"unknown container runtime {self.name!r} (docker or podman)")
        if self.rootless and (self.name != "podman" or self.access == "sudo"):
            raise ValueError("rootless is the login user's own podman: plain `podman`, no sudo")

    @classmethod
    def unprobed(cls, name: str = "docker", rootless: bool = False) -> ContainerRuntime:
        """The cluster's runtime on a host no probe has seen in this invocation."""
        return cls(None, name, rootless)  # type: ignore[arg-type]

    @property
    def known(self) -> bool:
        return self.access is not None

    @property
    def prefix(self) -> list[str]:
        """`docker`, `sudo -n docker`, `podman` or `sudo -n podman` (ValueError
        when not known)."""
        if self.access is None:
            raise ValueError(f"the {self.name} access on this host is not known (no probe)")
        return ["sudo", "-n", self.name] if self.access == "sudo" else [self.name]

    @property
    def flag(self) -> list[str]:
        """What tells remote/access.sh which runtime to reach ([] for docker:
        docker hosts run the programs exactly as before the seam)."""
        if self.name == "docker":
            return []
        return ["--podman-rootless" if self.rootless else "--podman"]

    @property
    def archive_args(self) -> list[str]:
        """`save` arguments for an archive whose `load` keeps the image ID
        (podman's oci-archive would not: ../shared/DESIGN.md, "Runtimes")."""
        return ["--format", "docker-archive"] if self.name == "podman" else []

    @property
    def drains_a_cut_save(self) -> bool:
        """Whether a spread's `save` cut short runs to its end into /dev/null
        (remote/spread_send.sh, spread_fan.sh): podman (4.x) writes a save to
        stdout through a fifo and a copy of each layer under /var/tmp, and
        removes them only when the save returns; TERMed, or killed by
        SIGPIPE when its reader goes, it leaves an image's size behind. A
        docker save cut short is cleaned up by dockerd."""
        return self.name == "podman"

    @property
    def root_dir_args(self) -> list[str]:
        """`info` arguments printing the directory the runtime unpacks images into."""
        if self.name == "podman":
            return ["info", "-f", "{{.Store.GraphRoot}}"]
        return ["info", "-f", "{{.DockerRootDir}}"]

    @property
    def cdi_since(self) -> tuple[int, int] | None:
        """The first version of this runtime that takes CDI device names
        (`--device vendor/class=name`), when that depends on its version:
        docker's daemon learned CDI in 25 (and the probe then asks its
        version); podman has it in every version cvs runs (None)."""
        return (25, 0) if self.name == "docker" else None

    @property
    def reach_fix(self) -> str:
        """What a host needs for cvs to read its container state, in this
        runtime's words (a refusal's way out)."""
        if self.name == "docker":
            return "dockerd running, docker or passwordless `sudo -n docker` access"
        if self.rootless:
            return f"the login user's own {self.name} working (subuid/subgid ranges)"
        return f"{self.name} installed, root or passwordless `sudo -n {self.name}` access"

    @property
    def unset_limits(self) -> tuple[int | None, int]:
        """(pids limit, /dev/shm bytes) this runtime gives a container started
        without `--pids-limit` / `--shm-size`: podman its own (2048, 62.5 MiB),
        docker none and 64 MiB. An inspect reporting them reads as unset."""
        if self.name == "podman":
            return 2048, 65536000
        return None, 64 * 1024 * 1024

    @property
    def ulimits_implied(self) -> frozenset[str]:
        """The ulimits this runtime raises to their maximum whenever any
        `--ulimit` is given and they are not (podman 4: nofile and nproc)."""
        return frozenset({"nofile", "nproc"}) if self.name == "podman" else frozenset()

    @property
    def exec_sets_path_and_hostname(self) -> bool:
        """`RUNTIME exec` puts its default PATH and the container's HOSTNAME
        before the container's Env (docker); podman keeps those in the Env
        its inspect shows, but for a HOSTNAME its exec does not give."""
        return self.name == "docker"

    @property
    def no_workdir_exit(self) -> int:
        """What `RUNTIME exec -w DIR` exits with when DIR cannot be entered
        (docker 126, podman 127): the container's sshd path exits the same."""
        return 127 if self.name == "podman" else 126

    @property
    def pull_asks_on_a_terminal(self) -> bool:
        """Whether `RUNTIME pull` of a short name (no registry in it) may ask,
        on a terminal, which registry it means (podman's short-name prompt);
        docker takes Docker Hub."""
        return self.name == "podman"

    @property
    def gpu_vendors_without_cdi(self) -> frozenset[str]:
        """The GPU vendors whose GPUs reach this runtime's containers without
        CDI: AMD's device nodes everywhere, NVIDIA's through docker's `--gpus`
        (podman has no `--gpus`: NVIDIA GPUs need CDI there)."""
        return frozenset({"amd", "nvidia"} if self.name == "docker" else {"amd"})

    def describe(self) -> str:
        if self.rootless:
            return "podman (rootless)"
        return " ".join(self.prefix) if self.known else self.name

    def argv(self, args: Sequence[str]) -> list[str]:
        """`RUNTIME ARGS` as this host runs it (known access only)."""
        return [*self.prefix, *args]

    def read(self, args: Sequence[str]) -> list[str]:
        """`RUNTIME ARGS`, a read (inspect, ps): the probed access, else each
        access in turn on the host until one answers."""
        if self.access is not None:
            return self.argv(args)
        return remote.argv("runtime", *self.flag, "read", *args)

    def when_running(self, name: str, args: Sequence[str], not_running: str) -> list[str]:
        """`RUNTIME ARGS` once container `name` runs; else `not_running` on
        stderr and exit 125. With a known access the check is the caller's
        (an `up` of this invocation probed the container under its lock)."""
        if self.access is not None:
            return self.argv(args)
        return remote.argv("runtime", *self.flag, "running", name, not_running, *args)

    def name_filter(self, name: str) -> str:
        """`ps --filter` value matching exactly the container called `name`."""
        return f"name=^/{name}$" if self.name == "docker" else f"name=^{name}$"

    def label_column(self, key: str) -> str:
        """`ps --format` text printing label `key`."""
        if self.name == "docker":
            return "{{.Label " + json.dumps(key) + "}}"
        return "{{index .Labels " + json.dumps(key) + "}}"


# --- what messages call the runtime --------------------------------------------------
#
# Every message about a runtime that failed, hung or has to be asked names the
# cluster's runtime: a podman host told "is dockerd stopped?" is sent to look
# for a daemon it does not have. One place says how each runtime is named.


def daemon_word(name: str) -> str:
    """What runs the containers on the host: `dockerd`, or `podman` (no daemon:
    each `podman` call opens the store itself)."""
    return "dockerd" if name == "docker" else name


def hung_suspect(name: str) -> str:
    """Where to look when the runtime does not answer."""
    if name == "docker":
        return "is dockerd stopped or frozen?"
    return (
        f"{name} has no daemon: is a {name} process stuck holding its storage lock, or its "
        "OCI runtime (runc/crun) or conmon hung?"
    )


def runtime_hung(name: str, seconds: float, what: str) -> str:
    """Why a runtime call was given up on: the runtime, the bound, the call, the suspect."""
    return (
        f"{name} did not answer within container.runtime_timeout ({seconds:g}s) on {what}: "
        f"the container runtime on this host is hung or overloaded ({hung_suspect(name)})"
    )
