"""What rootless podman can give a container on a host, from probed facts:
the caps (cgroup facts) and device access (the OCI runtime, below).

Pure. Rootless podman sets a resource cap only through a cgroup controller
delegated to the login user (cgroups v2); on cgroups v1 it applies none and
only warns ("Resource limits are not supported and ignored on cgroups V1
rootless systems"). A cap asked for and silently not applied is a lie, so
`up` refuses such a host before anything starts, naming the caps.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import ContainerConfig
from orchestrator.limits.resources import EffectiveResources

# Which controller each cap needs (shm_size is a tmpfs size: no controller).
_CONTROLLER = {
    "cpus": "cpu",
    "cpu_shares": "cpu",
    "memory": "memory",
    "memory_reservation": "memory",
    "pids": "pids",
}


def requested_caps(eff: EffectiveResources) -> list[str]:
    """The cgroup-backed caps in effect for a container (config key names)."""
    values = {
        "cpus": eff.nano_cpus,
        "cpu_shares": eff.cpu_shares,
        "memory": eff.memory_bytes,
        "memory_reservation": eff.memory_reservation_bytes,
        "pids": eff.pids,
    }
    return [k for k, v in values.items() if v is not None]


def rootless_cap_refusal(
    host: str, eff: EffectiveResources, cgroup: str | None, controllers: tuple[str, ...]
) -> str | None:
    """Why rootless podman on `host` cannot apply the caps, or None.

    `cgroup` None means the probe could not tell: refused too (unknown is
    never read as "fine")."""
    caps = requested_caps(eff)
    if not caps:
        return None
    keys = ", ".join(f"resources.{c}" for c in caps)
    if cgroup == "v1":
        return (
            f"host {host}: rootless podman cannot apply {keys} on cgroups v1 (podman ignores "
            "them); use rootful podman (rootless: false), a host with cgroups v2 and the "
            "controllers delegated to the login user, or drop the caps"
        )
    if cgroup != "v2":
        return f"host {host}: rootless podman: the host's cgroup version is unknown, {keys} refused"
    missing = sorted({_CONTROLLER[c] for c in caps} - set(controllers))
    if missing:
        return (
            f"host {host}: rootless podman cannot apply {keys}: the login user's cgroup has "
            f"no {', '.join(missing)} controller (delegate it: systemd Delegate=yes for "
            "user@.service), or drop the caps"
        )
    return None


# --- device access: `--group-add keep-groups` ------------------------------------------
#
# A rootless container's processes hold none of the login user's supplementary
# groups: the OCI runtime calls setgroups(2) in the user namespace, and the
# user's host groups (video, render: what opens /dev/dri/renderD*, /dev/kfd)
# are not mapped into it. podman's `--group-add keep-groups` asks the runtime
# to skip that call. Only crun implements it (`run.oci.keep_original_groups`);
# runc 1.1 accepts the flag through podman and silently drops the groups
# anyway (measured here: podman 4.3.1, runc 1.1.5, `Groups:` empty with and
# without it). Sending it to runc would claim an access that is not there, so
# it goes only where the probe found crun. podman takes no other --group-add
# next to it.

KEEP_GROUPS_RUNTIMES = frozenset({"crun"})


def wants_devices(cfg: ContainerConfig) -> bool:
    """The container is given device nodes (a GPU request or `devices`)."""
    return cfg.gpus is not None or bool(cfg.devices)


@dataclass(frozen=True)
class GroupAccess:
    """Whether the run argv carries `--group-add keep-groups` (then instead of
    `container.group_add`), and what the plan says about it (None: nothing)."""

    keep_groups: bool
    note: str | None = None


def device_group_access(
    host: str,
    *,
    rootless: bool,
    wants_devices: bool,
    oci_runtime: str | None,
    group_add: tuple[str, ...] = (),
) -> GroupAccess:
    """How a rootless container on `host` reaches its device nodes, from the
    OCI runtime the probe found there (None: unknown, never read as crun)."""
    if not rootless or not wants_devices:
        return GroupAccess(False)
    if oci_runtime in KEEP_GROUPS_RUNTIMES:
        if not group_add:
            return GroupAccess(True)
        return GroupAccess(
            True,
            f"host {host}: rootless podman on {oci_runtime}: `--group-add keep-groups` keeps "
            "the login user's own groups (video/render) for the devices, and podman takes no "
            f"other group next to it: container.group_add ({', '.join(group_add)}) is not sent",
        )
    runtime = (
        f"its OCI runtime is {oci_runtime}, which ignores `--group-add keep-groups` (only "
        "crun implements it)"
        if oci_runtime
        else "its OCI runtime is unknown (the probe could not tell), so `--group-add "
        "keep-groups` (crun only) is not assumed"
    )
    return GroupAccess(
        False,
        f"host {host}: rootless podman: {runtime}; not sent. The container holds none of the "
        "login user's groups, so its device nodes open only if they need no group (mode "
        "0666, or owned by the user); for video/render-group GPUs run crun "
        '(containers.conf `runtime = "crun"`) or rootful podman',
    )
