"""Derived views of a loaded cluster: the container name, warnings, the normalized dump."""

from __future__ import annotations

import getpass
import os
import re
from typing import Any

import yaml

from orchestrator.config.documents import ConfigError
from orchestrator.config.hostlist import abbreviate_hosts
from orchestrator.config.model import CONTAINER_NAME_RE, ClusterConfig, ContainerConfig, Limits
from orchestrator.config.rootless import rootless_notes
from orchestrator.config.slurm import JOB_ID_RE

# ---- derived views -----------------------------------------------------------


def _image_basename(image: str) -> str:
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def cluster_identity(cluster: ClusterConfig) -> str:
    """Who owns a container, as its labels record it: the explicit `name`, or
    the default name plus the cluster file's path, so two files that both
    leave `name` unset do not own each other's containers."""
    if "name" in cluster.model_fields_set or not cluster.source_file:
        return cluster.name
    return f"{cluster.name}@{cluster.source_file}"


def container_name(cluster: ClusterConfig) -> str:
    """The container's name on every host: explicit, or `cvs-<user>-<image>`.

    The user is the SSH login user when the file sets one (the same on every
    operator's machine), else the local user.
    """
    if cluster.container is None:
        raise ConfigError("the cluster file has no container block")
    if cluster.container.name:
        name = cluster.container.name
    else:
        user = cluster.ssh.user or getpass.getuser()
        raw = f"cvs-{user}-{_image_basename(cluster.container.image)}"
        name = re.sub(r"[^a-zA-Z0-9_.-]+", "-", raw)[:128]
        if not CONTAINER_NAME_RE.fullmatch(name):  # cannot happen: starts with "cvs"
            raise ConfigError(f"cannot derive a container name from {raw!r}; set container.name")
    if cluster.slurm is not None and cluster.container.lifetime in ("per_run", "per_job"):
        return job_container_name(name, cluster.slurm.job_id)
    return name


def job_container_name(name: str, job_id: str) -> str:
    """A per_run (or per_job) container's name inside a Slurm job: `<name>-j<job ID>`, so two
    jobs of one user sharing a node with the same cluster file each keep their
    own (a persistent container keeps its name: later jobs attach to it)."""
    suffix = f"-j{job_id}"
    scoped = name[: 128 - len(suffix)] + suffix
    if not (JOB_ID_RE.fullmatch(job_id) and CONTAINER_NAME_RE.fullmatch(scoped)):
        raise ConfigError(
            f"cannot name the container for Slurm job {job_id!r} ({scoped!r}): a job ID is "
            "digits; check SLURM_JOB_ID"
        )
    return scoped


def sshd_wanted(container: ContainerConfig | None, n_hosts: int) -> bool:
    """Whether containers run an sshd: `sshd.enabled` true/false as configured;
    `auto` starts it only when there is a second host for MPI ranks to reach."""
    enabled = container.sshd.enabled if container is not None else "auto"
    if enabled == "auto":
        return n_hosts > 1
    return bool(enabled)


def uncapped_hosts(cluster: ClusterConfig) -> list[str]:
    """Hosts on which nothing bounds the container: no cpus, memory or pids from
    the request or from a cap (global or per host). `cvs validate` warns."""
    container = cluster.container
    if container is None:
        return []
    r = container.resources
    if r.cpus is not None or r.memory is not None or r.pids is not None:
        return []

    def capped(limits: Limits | None) -> bool:
        return limits is not None and any(
            v is not None for v in (limits.max_cpus, limits.max_memory, limits.max_pids)
        )

    if capped(cluster.limits):
        return []
    return [h.name for h in cluster.hosts if not capped(h.limits)]


def caps_warnings(cluster: ClusterConfig) -> list[str]:
    """The "no caps" warning: emitted by validate, up, run, the API and the pytest fixture."""
    uncapped = uncapped_hosts(cluster)
    if uncapped and len(uncapped) == len(cluster.hosts):
        return ["no resource caps: containers may take the whole host"]
    if uncapped:
        return [
            f"no resource caps on {len(uncapped)} host(s) ({abbreviate_hosts(uncapped)}): "
            "containers there may take the whole host"
        ]
    return []


def deprecation_warnings(cluster: ClusterConfig) -> list[str]:
    """Renamed keys the file still uses: read for one release, then refused."""
    if cluster.container is None:
        return []
    return [
        f"container.{old} is deprecated: call it container.{new} (the old name is read "
        "until the next release)"
        for old, new in (pair.split(" -> ") for pair in cluster.container.deprecated_keys)
    ]


def cluster_warnings(cluster: ClusterConfig) -> list[str]:
    """Things that load fine but are probably not what the operator wants."""
    out: list[str] = []
    container = cluster.container
    if container is not None and container.lifetime == "persistent" and not container.name:
        out.append(
            "container.lifetime is persistent but container.name is not set: the name is "
            f"derived from the image ({container_name(cluster)}), so a tag bump would "
            "silently orphan the old container; set container.name"
        )
    out += caps_warnings(cluster) + deprecation_warnings(cluster)
    if container is not None:
        out += rootless_notes(container)
    if cluster.ssh.host_key_policy == "off":
        out.append("ssh.host_key_policy is off: host keys are not checked at all")
    workers = cluster.concurrency.workers
    if workers is not None and workers > usable_cores():
        out.append(workers_clamped(workers))
    return out


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS says)."""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13
    if count is not None:
        return int(count() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def workers_clamped(workers: int) -> str:
    """The warning for `concurrency.workers` above this machine's cores."""
    cores = usable_cores()
    return (
        f"concurrency.workers is {workers}, more than this machine's {cores} cores: "
        f"{cores} worker processes are used (set it to {cores} or less, or leave it unset)"
    )


def normalized_cluster(cluster: ClusterConfig) -> dict[str, Any]:
    """A plain dict for `cvs validate`: hosts expanded, defaults filled in.

    Per-host address, port and user show the effective values (the host's
    override, else the ssh block's, else the name), so the output answers
    "what will be contacted" without reading the rules.
    """
    out = cluster.model_dump(mode="json", exclude={"source", "source_file", "cvs_notes"})
    hosts = []
    for h in cluster.hosts:
        entry = h.model_dump(mode="json", exclude_none=True)
        entry["address"] = h.address or h.name
        entry["port"] = h.port or cluster.ssh.port
        user = h.user or cluster.ssh.user
        if user:
            entry["user"] = user
        hosts.append(entry)
    out["hosts"] = hosts
    out["head"] = cluster.head_host.name
    # `env` values are often tokens: cvs never prints or records one.
    out["env"] = masked_env(cluster.env)
    if cluster.container is not None:
        out["container"]["name"] = container_name(cluster)
        out["container"]["env"] = masked_env(cluster.container.env)
    return out


ENV_MASK = "***"


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """Names kept, values hidden: what cvs shows of any `env` block."""
    return dict.fromkeys(env, ENV_MASK)


# CVS defaults that hand the container more than a GPU test usually needs.
_WIDE_CAPS = ("SYS_ADMIN",)


def cvs_import_notes(cluster: ClusterConfig) -> list[str]:
    """For a CVS cluster JSON: which of CVS's rules are in effect, and the
    native YAML container block that tightens them.

    A CVS file can only add to CVS's list defaults, so dropping SYS_ADMIN or
    a device needs the native format; `privileged` is a scalar, so
    `"privileged": false` in runtime.args also works.
    """
    notes = list(cluster.cvs_notes)
    container = cluster.container
    if not notes or container is None:
        return notes
    wide = [c for c in container.cap_add if c in _WIDE_CAPS]
    if not container.privileged and not wide:
        return notes
    tightened = container.model_dump(
        mode="json",
        include={
            "image",
            "name",
            "lifetime",
            "network",
            "ipc",
            "devices",
            "cap_add",
            "security_opt",
            "group_add",
            "ulimits",
        },
    )
    tightened["privileged"] = False
    tightened["cap_add"] = [c for c in container.cap_add if c not in _WIDE_CAPS]
    tightened["security_opt"] = []
    text = yaml.safe_dump({"container": tightened}, sort_keys=False).rstrip()
    what = ", ".join((["privileged"] if container.privileged else []) + wide)
    notes.append(
        f"CVS defaults give this container {what}; in the native format the container "
        "block below drops them (lists in a CVS file can only add to CVS's defaults):\n" + text
    )
    return notes
