"""What `up` and `down` ask of a host in the probe, from the cluster file:
the GPUs where a container will launch, the OCI runtime where rootless
podman passes devices, the runtime's version where CDI depends on it, the
sshd port where the container's sshd binds in the host's network.

    argv = probe_request(cluster, cfg, name, host)  # probe.py's probe_argv
"""

from __future__ import annotations

from typing import Literal

from orchestrator.config import ClusterConfig, ContainerConfig, sshd_wanted
from orchestrator.containers.probe import probe_argv
from orchestrator.containers.provision import MARKER_PATH
from orchestrator.limits.rootless import wants_devices
from orchestrator.remote.runtime import ContainerRuntime


def probe_request(cluster: ClusterConfig, cfg: ContainerConfig, name: str, host: str) -> list[str]:
    """The probe of `host` for container `name` as the cluster file asks it."""
    # The GPUs are listed where a container will launch, so the plan can
    # select them: every host for per_run, else where none runs (never on
    # the attach path: it stays one docker process and nothing else).
    gpus: Literal["always", "stopped"] | None = None
    when: Literal["always", "stopped"] = "always" if cfg.lifetime == "per_run" else "stopped"
    if cfg.gpus is not None and cfg.lifetime != "no_launch":
        gpus = when
    # Rootless podman launching with devices: crun or runc decides whether
    # `--group-add keep-groups` can give them (limits/rootless.py).
    oci = when if cfg.rootless and wants_devices(cfg) and cfg.lifetime != "no_launch" else None
    runtime = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
    # GPUs through CDI on a runtime whose CDI depends on its version: ask it.
    version = gpus if cfg.cdi == "always" and runtime.cdi_since is not None else None
    return probe_argv(
        cfg,
        name,
        sshd_port=cfg.sshd.port,
        marker_path=MARKER_PATH,
        port_check=sshd_on_host_network(cluster, cfg),
        gpus=gpus,
        gpu_root=cluster.host(host).gpu_device_root or "/",
        runtime=runtime,
        oci=oci,
        version=version,
    )


def sshd_on_host_network(cluster: ClusterConfig, cfg: ContainerConfig) -> bool:
    """The in-container sshd binds in the host's network namespace."""
    return sshd_wanted(cfg, len(cluster.hosts)) and cfg.network == "host"
