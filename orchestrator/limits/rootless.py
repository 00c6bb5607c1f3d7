"""Caps rootless podman cannot apply on a host, from probed cgroup facts.

Pure. Rootless podman sets a resource cap only through a cgroup controller
delegated to the login user (cgroups v2); on cgroups v1 it applies none and
only warns ("Resource limits are not supported and ignored on cgroups V1
rootless systems"). A cap asked for and silently not applied is a lie, so
`up` refuses such a host before anything starts, naming the caps.
"""

from __future__ import annotations

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
