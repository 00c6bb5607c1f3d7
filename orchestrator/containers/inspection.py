"""What the container runtime prints, read: `inspect` JSON, `run`'s ID, limits.

Parsers read `docker inspect` / `docker image inspect` JSON (podman prints
the same shape; its differences are normalised here) into small frozen
dataclasses; text is never grepped for facts. The limits a container was
started with are compared with the config's here (`container_limits_drift`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from orchestrator.containers.argv import CONTAINER_ID_RE
from orchestrator.limits.resources import EffectiveResources, limits_drift
from orchestrator.remote.runtime import ContainerRuntime

ContainerStatus = Literal["running", "exited", "other"]

# Docker's zero time: what StartedAt holds for a container never started.
_ZERO_TIME = "0001-01-01T00:00:00Z"


class RuntimeOutputError(ValueError):
    """The runtime printed something that is not the JSON we asked for."""


def short_id(value: str | None) -> str:
    """An image ID or a sha256 as people read it, the way `docker images` shows
    IDs: the first 12 hex digits without the `sha256:` prefix; `?` when unknown."""
    if not value:
        return "?"
    return value.partition(":")[2][:12] if ":" in value else value[:12]


def parse_run_id(stdout: str) -> str | None:
    """The container ID `docker run -d` printed (its last line), if it is one."""
    lines = stdout.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    return last if CONTAINER_ID_RE.fullmatch(last) else None


@dataclass(frozen=True)
class DeviceMapping:
    path_on_host: str
    path_in_container: str
    permissions: str


@dataclass(frozen=True)
class ContainerLimits:
    """HostConfig limits as docker reports them; None = docker's "unset" (0 / -1 / null)."""

    nano_cpus: int | None = None
    memory: int | None = None
    memory_reservation: int | None = None
    cpu_shares: int | None = None
    pids_limit: int | None = None
    shm_size: int | None = None
    devices: tuple[DeviceMapping, ...] = ()


def container_limits_drift(
    effective: EffectiveResources, limits: ContainerLimits | None
) -> list[str]:
    """`limits_drift` against the limits a probe parsed from `docker inspect`."""
    if limits is None:
        return []
    return limits_drift(
        effective,
        {
            "NanoCpus": limits.nano_cpus,
            "Memory": limits.memory,
            "PidsLimit": limits.pids_limit,
            "MemoryReservation": limits.memory_reservation,
            "CpuShares": limits.cpu_shares,
            "ShmSize": limits.shm_size,
        },
    )


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    status: str  # docker's own word: created, running, paused, restarting, exited, dead, …
    running: bool
    image_id: str | None  # None when docker did not report one
    image_ref: str | None  # what the container was started from (Config.Image)
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    started_at: str | None = None
    limits: ContainerLimits = field(default_factory=ContainerLimits)
    # The runtime's init is PID 1 (HostConfig.Init: `run --init`); None: not said.
    init: bool | None = None

    @property
    def state(self) -> ContainerStatus:
        """Coarse state for planning.

        `created` (never started) counts as exited: `docker start` brings it
        up with its overlay, exactly as for a stopped container.
        """
        if self.running and self.status == "running":
            return "running"
        # podman's words for the same: "stopped" (stopped, not yet cleaned
        # up) and "configured" (created, never initialised).
        if self.status in ("exited", "created", "stopped", "configured"):
            return "exited"
        return "other"


@dataclass(frozen=True)
class ImageInfo:
    id: str
    repo_digests: tuple[str, ...] = ()
    repo_tags: tuple[str, ...] = ()


def _first_object(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeOutputError(f"{what}: not JSON ({exc.msg} at char {exc.pos})") from None
    if isinstance(data, list):
        if not data:
            raise RuntimeOutputError(f"{what}: empty result")
        data = data[0]
    if not isinstance(data, dict):
        raise RuntimeOutputError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _opt_int(value: Any, *, unset: tuple[int, ...] = (0,)) -> int | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    return None if value in unset else value


def _str_map(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        return MappingProxyType({})
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def _limits(host_config: Any) -> ContainerLimits:
    if not isinstance(host_config, dict):
        return ContainerLimits()
    devices = tuple(
        DeviceMapping(
            path_on_host=str(d.get("PathOnHost", "")),
            path_in_container=str(d.get("PathInContainer", "")),
            permissions=str(d.get("CgroupPermissions", "")),
        )
        for d in host_config.get("Devices") or ()
        if isinstance(d, dict)
    )
    return ContainerLimits(
        nano_cpus=_opt_int(host_config.get("NanoCpus")),
        memory=_opt_int(host_config.get("Memory")),
        memory_reservation=_opt_int(host_config.get("MemoryReservation")),
        cpu_shares=_opt_int(host_config.get("CpuShares")),
        # 20.10 reports null or 0 for "no limit", newer engines -1.
        pids_limit=_opt_int(host_config.get("PidsLimit"), unset=(0, -1)),
        shm_size=_opt_int(host_config.get("ShmSize")),
        devices=devices,
    )


def _sha256_id(value: Any) -> Any:
    """An image ID as docker prints it: podman prints the 64 hex digits alone."""
    if isinstance(value, str) and CONTAINER_ID_RE.fullmatch(value):
        return f"sha256:{value}"
    return value


# podman's defaults (containers.conf) for what docker leaves unset: a
# container started without `--pids-limit` / `--shm-size` reports its own
# (ContainerRuntime.unset_limits).
DOCKER_DEFAULT_SHM_BYTES = ContainerRuntime().unset_limits[1]  # as limits.resources says


def runtime_limits(runtime: str, limits: ContainerLimits) -> ContainerLimits:
    """Limits as docker reports them for the same request: a runtime's own
    defaults for what was left unset read as unset (no false drift on an
    attach)."""
    unset_pids, unset_shm = ContainerRuntime.unprobed(runtime).unset_limits
    pids, shm = limits.pids_limit, limits.shm_size
    return replace(
        limits,
        pids_limit=None if pids == unset_pids else pids,
        shm_size=DOCKER_DEFAULT_SHM_BYTES if shm == unset_shm else shm,
    )


def normalize_image_id(value: str) -> str:
    """An image ID as docker prints it: podman prints the 64 hex digits alone."""
    return _sha256_id(value)  # type: ignore[no-any-return]


def parse_container_inspect(text: str) -> ContainerInfo:
    """`docker inspect --type container NAME` output -> ContainerInfo."""
    obj = _first_object(text, "docker inspect")
    state = obj.get("State")
    cid = obj.get("Id")
    if not isinstance(state, dict) or not isinstance(cid, str) or not cid:
        raise RuntimeOutputError("docker inspect: no container Id/State in the output")
    config: dict[str, Any] = obj["Config"] if isinstance(obj.get("Config"), dict) else {}
    image_id = _sha256_id(obj.get("Image"))
    started = state.get("StartedAt")
    return ContainerInfo(
        id=cid,
        name=str(obj.get("Name", "")).lstrip("/"),
        status=str(state.get("Status", "")),
        running=state.get("Running") is True,
        image_id=image_id if isinstance(image_id, str) and image_id else None,
        image_ref=config.get("Image") if isinstance(config.get("Image"), str) else None,
        labels=_str_map(config.get("Labels")),
        started_at=started if isinstance(started, str) and started != _ZERO_TIME else None,
        limits=_limits(obj.get("HostConfig")),
        init=_init(obj.get("HostConfig")),
    )


def _init(host_config: Any) -> bool | None:
    """HostConfig.Init: true with `--init`; docker says null, podman false,
    without it; None when there is no HostConfig to read."""
    if not isinstance(host_config, dict):
        return None
    return host_config.get("Init") is True


def parse_image_inspect(text: str) -> ImageInfo:
    """`docker image inspect REF` output -> ImageInfo."""
    obj = _first_object(text, "docker image inspect")
    iid = _sha256_id(obj.get("Id"))
    if not isinstance(iid, str) or not iid:
        raise RuntimeOutputError("docker image inspect: no image Id in the output")
    return ImageInfo(
        id=iid,
        repo_digests=tuple(str(d) for d in obj.get("RepoDigests") or ()),
        repo_tags=tuple(str(t) for t in obj.get("RepoTags") or ()),
    )
