"""What rootless podman can and cannot give a container, said at `validate`.

Pure: from the container block alone. A rootless container lives in the
login user's user namespace: root inside is that user outside. So whatever
needs real privilege on the host is bounded by what the user has. The
probe-time check (limits/rootless.py) refuses the caps a host cannot apply.
"""

from __future__ import annotations

from orchestrator.config.model import ContainerConfig

# Capabilities that reach beyond the user namespace: inside it they are held,
# but the host checks them against the login user, who lacks them.
HOST_CAPS = {"SYS_RESOURCE", "IPC_LOCK", "SYS_NICE", "SYS_TIME", "SYS_MODULE", "SYS_RAWIO"}


def rootless_notes(cfg: ContainerConfig) -> list[str]:
    """One line per configured setting that rootless podman cannot honour as
    rootful would, naming the key and what happens instead."""
    if cfg.runtime != "podman" or not cfg.rootless:
        return []
    out: list[str] = []
    r = cfg.resources
    caps = [
        k
        for k in ("cpus", "memory", "pids", "memory_reservation", "cpu_shares")
        if getattr(r, k) is not None
    ]
    if caps:
        out.append(
            f"rootless: resources.{', resources.'.join(caps)} apply only on cgroups v2 with the "
            "controller delegated to the login user; on cgroups v1 podman ignores them, so "
            "`up` refuses there"
        )
    for key, limit in cfg.ulimits.items():
        if str(limit) == "-1" or key in ("memlock", "rtprio", "nice"):
            out.append(
                f"rootless: ulimits.{key}={limit} cannot rise above the login user's hard "
                "limit on the host"
            )
    host_caps = sorted(c.upper().removeprefix("CAP_") for c in cfg.cap_add)
    beyond = [c for c in host_caps if c in HOST_CAPS]
    if beyond:
        out.append(
            f"rootless: cap_add {', '.join(beyond)} hold only inside the user namespace; "
            "against the host they are the login user's (none)"
        )
    if cfg.privileged:
        out.append(
            "rootless: privileged gives every capability in the user namespace and only "
            "the devices the login user may open"
        )
    if cfg.devices or cfg.gpus is not None:
        out.append(
            "rootless: the container holds none of the login user's groups unless podman "
            "runs crun: there `up` sends `--group-add keep-groups` (the user's video/render "
            "groups open the GPU nodes; it replaces container.group_add, podman takes no other "
            "group next to it); runc ignores that flag, so on runc hosts it is not sent and the "
            "device nodes must open without a group (mode 0666, or owned by the user). `up` "
            "says which per host (the probe asks podman for its OCI runtime)"
        )
    if cfg.ipc == "host":
        out.append("rootless: ipc: host needs /dev/mqueue mounted on the host")
    if cfg.sshd.port < 1024:
        out.append(
            f"rootless: sshd.port {cfg.sshd.port} is below 1024: with network host the user "
            "namespace cannot bind it (unless net.ipv4.ip_unprivileged_port_start allows)"
        )
    return out
