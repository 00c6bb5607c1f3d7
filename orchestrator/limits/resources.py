"""Container resource limits: the request, clamped by the operator's caps.

Pure functions only. The container block asks (`resources`), the operator caps
(`limits`, globally and per host), and each effective value is
min(request, tightest cap):

- request above the cap: clamped to the cap, with a warning naming the key, the
  request and the cap;
- no request but a cap: the cap (a cap is a promise the container stays inside);
- neither: unbounded (None), and `cvs validate` warns (config.uncapped_hosts).

Only cpus, memory and pids have caps (`max_cpus`, `max_memory`, `max_pids`);
shm_size, memory_reservation and cpu_shares pass through. `memory` and `cpus` are
hard limits (the kernel enforces them); `memory_reservation` and `cpu_shares`
are soft (they only matter under contention).

A memory_reservation above the effective memory limit is clamped down to the
limit with a warning rather than refused: docker itself rejects such a pair
("Minimum memory limit can not be less than memory reservation limit"), and the
usual way to get there is a cap that lowered `memory` under a reservation that
was fine without it, so clamping keeps the operator's cap authoritative.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config import Limits, Resources
from orchestrator.config.hostlist import abbreviate_hosts
from orchestrator.config.units import format_size, parse_size
from orchestrator.errors import ResourceError as ResourceError

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

NANO = 10**9
# What docker reports for ShmSize when --shm-size was not given.
DOCKER_DEFAULT_SHM_BYTES = 64 * 1024**2
# Docker refuses --cpus below 0.01 and --memory below 6 MiB; say so by key
# instead of letting `docker run` fail on some host with its own wording.
MIN_NANO_CPUS = NANO // 100
MIN_MEMORY_BYTES = 6 * 1024**2


@dataclass(frozen=True)
class EffectiveResources:
    """What the container gets. None means unbounded / docker's default."""

    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    shm_size_bytes: int | None = None
    memory_reservation_bytes: int | None = None
    cpu_shares: int | None = None
    warnings: tuple[str, ...] = ()

    @property
    def nano_cpus(self) -> int | None:
        return None if self.cpus is None else round(self.cpus * NANO)

    @property
    def unbounded(self) -> tuple[str, ...]:
        """The hard keys nothing bounds (neither requested nor capped)."""
        values = {"cpus": self.cpus, "memory": self.memory_bytes, "pids": self.pids}
        return tuple(key for key, value in values.items() if value is None)

    def docker_args(self) -> list[str]:
        """`docker run` flags; sizes as plain byte counts, cpus as an exact decimal."""
        args: list[str] = []
        if self.nano_cpus is not None:
            args += ["--cpus", _format_nano_cpus(self.nano_cpus)]
        if self.memory_bytes is not None:
            args += ["--memory", str(self.memory_bytes)]
        if self.pids is not None:
            args += ["--pids-limit", str(self.pids)]
        if self.shm_size_bytes is not None:
            args += ["--shm-size", str(self.shm_size_bytes)]
        if self.memory_reservation_bytes is not None:
            args += ["--memory-reservation", str(self.memory_reservation_bytes)]
        if self.cpu_shares is not None:
            args += ["--cpu-shares", str(self.cpu_shares)]
        return args

    def as_inspect(self) -> dict[str, int | None]:
        """The values `docker inspect` shows under HostConfig for a container run
        with `docker_args()`: 0 means unlimited, PidsLimit is null when unset
        and ShmSize falls back to docker's 64 MiB."""
        return {
            "NanoCpus": self.nano_cpus or 0,
            "Memory": self.memory_bytes or 0,
            "PidsLimit": self.pids,
            "MemoryReservation": self.memory_reservation_bytes or 0,
            "CpuShares": self.cpu_shares or 0,
            "ShmSize": self.shm_size_bytes or DOCKER_DEFAULT_SHM_BYTES,
        }

    def describe(self) -> dict[str, str]:
        """Human values for `cvs status`, keyed by the config's names."""
        return {
            "cpus": "unlimited" if self.nano_cpus is None else _format_nano_cpus(self.nano_cpus),
            "memory": _human_bytes(self.memory_bytes),
            "pids": "unlimited" if self.pids is None else str(self.pids),
            "shm_size": _human_bytes(self.shm_size_bytes, unset="docker default"),
            "memory_reservation": _human_bytes(self.memory_reservation_bytes, unset="none"),
            "cpu_shares": "default" if self.cpu_shares is None else str(self.cpu_shares),
        }


def effective_resources(request: Resources, *caps: Limits | None) -> EffectiveResources:
    """min(request, tightest cap) per key. `caps` are global then per-host; the
    tighter of them wins whichever it is. Raises ResourceError naming the key for
    a size that does not parse or a value docker would refuse."""
    warnings: list[str] = []
    present = [c for c in caps if c is not None]

    cpu_caps = [c.max_cpus for c in present if c.max_cpus is not None]
    nano_request = None if request.cpus is None else round(request.cpus * NANO)
    nano_cap = min((round(c * NANO) for c in cpu_caps), default=None)
    nano = _clamp("cpus", "max_cpus", nano_request, nano_cap, _format_nano_cpus, warnings)
    if nano is not None and nano < MIN_NANO_CPUS:
        key = "resources.cpus" if nano == nano_request else "limits.max_cpus"
        raise ResourceError(f"{key}: {_format_nano_cpus(nano)} is below docker's minimum of 0.01")

    memory_caps = [_size("limits.max_memory", c.max_memory) for c in present]
    memory_request = _size("resources.memory", request.memory)
    memory_cap = min((m for m in memory_caps if m is not None), default=None)
    memory = _clamp("memory", "max_memory", memory_request, memory_cap, format_size, warnings)
    if memory is not None and memory < MIN_MEMORY_BYTES:
        key = "resources.memory" if memory == memory_request else "limits.max_memory"
        raise ResourceError(
            f"{key}: {format_size(memory)} is below docker's minimum of "
            f"{format_size(MIN_MEMORY_BYTES)}"
        )

    pids = _clamp(
        "pids",
        "max_pids",
        request.pids,
        min((c.max_pids for c in present if c.max_pids is not None), default=None),
        str,
        warnings,
    )

    reservation = _size("resources.memory_reservation", request.memory_reservation)
    if reservation is not None and memory is not None and reservation > memory:
        warnings.append(
            f"resources.memory_reservation {format_size(reservation)} is above the memory "
            f"limit {format_size(memory)}: clamped to {format_size(memory)}"
        )
        reservation = memory

    return EffectiveResources(
        cpus=None if nano is None else nano / NANO,
        memory_bytes=memory,
        pids=pids,
        shm_size_bytes=_size("resources.shm_size", request.shm_size),
        memory_reservation_bytes=reservation,
        cpu_shares=request.cpu_shares,
        warnings=tuple(warnings),
    )


def limits_drift(effective: EffectiveResources, host_config: Mapping[str, Any]) -> list[str]:
    """One message per HostConfig key where a running container differs from what
    the config now asks for (e.g. a persistent container started under older
    limits). Unset and 0 mean the same thing to docker and are not drift."""
    messages = []
    for key, wanted in effective.as_inspect().items():
        have = _normalize(key, host_config.get(key))
        want = _normalize(key, wanted)
        if have != want:
            name, render = _INSPECT_KEYS[key]
            messages.append(
                f"{name} ({key}): the container has {render(have)}, the config asks for "
                f"{render(want)}"
            )
    return messages


def clamp_warnings(per_host: Mapping[str, EffectiveResources]) -> list[str]:
    """Each distinct clamp warning once, naming the hosts it applies to unless it
    applies to all of them (a global cap on 500 hosts is one line, not 500)."""
    hosts_by_text: dict[str, list[str]] = {}
    for host, eff in per_host.items():
        for text in eff.warnings:
            hosts_by_text.setdefault(text, []).append(host)
    out = []
    for text, hosts in hosts_by_text.items():
        if len(hosts) == len(per_host):
            out.append(text)
        else:
            out.append(f"{text} (on {abbreviate_hosts(hosts)})")
    return out


def cluster_effective_resources(cluster: ClusterConfig) -> dict[str, EffectiveResources]:
    """Effective resources per host name; {} without a container block. A bad
    value raises ResourceError naming the key (and the host, for per-host caps)."""
    if cluster.container is None:
        return {}
    request = cluster.container.resources
    legacy_shm = cluster.container.shm_size
    if legacy_shm is not None:
        if request.shm_size is not None and _size("container.shm_size", legacy_shm) != _size(
            "resources.shm_size", request.shm_size
        ):
            raise ResourceError(
                f"container.shm_size ({legacy_shm}) and container.resources.shm_size "
                f"({request.shm_size}) disagree: keep one"
            )
        request = request.model_copy(update={"shm_size": legacy_shm})
    # Check each source alone first so an error names the place it came from.
    effective_resources(Resources(), cluster.limits)
    try:
        effective_resources(request)
    except ResourceError as exc:
        raise ResourceError(f"container.{exc}") from None
    result = {}
    for host in cluster.hosts:
        try:
            effective_resources(Resources(), host.limits)
        except ResourceError as exc:
            raise ResourceError(f"hosts[{host.name}].{exc}") from None
        result[host.name] = effective_resources(request, cluster.limits, host.limits)
    return result


def _clamp(
    key: str,
    cap_key: str,
    request: int | None,
    cap: int | None,
    render: Any,
    warnings: list[str],
) -> int | None:
    if cap is None:
        return request
    if request is None:
        return cap
    if request > cap:
        warnings.append(
            f"resources.{key} {render(request)} exceeds the cap limits.{cap_key} "
            f"{render(cap)}: clamped to {render(cap)}"
        )
        return cap
    return request


def _size(key: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ResourceError(f"{key}: {exc}") from None


def _format_nano_cpus(nano: int) -> str:
    whole, frac = divmod(nano, NANO)
    return str(whole) if frac == 0 else f"{whole}.{frac:09d}".rstrip("0")


def _human_bytes(n: int | None, unset: str = "unlimited") -> str:
    return unset if n is None else format_size(n)


def _normalize(key: str, value: Any) -> int | None:
    if key == "PidsLimit":
        # Docker has shown an unset pids limit as null, 0 and -1 across versions.
        return None if value is None or value <= 0 else int(value)
    if key == "ShmSize":
        return int(value) if value else DOCKER_DEFAULT_SHM_BYTES
    return int(value) if value else 0


def _render_unlimited(render: Any) -> Any:
    return lambda v: "unlimited" if not v else render(v)


_INSPECT_KEYS: dict[str, tuple[str, Any]] = {
    "NanoCpus": ("cpus", _render_unlimited(_format_nano_cpus)),
    "Memory": ("memory", _render_unlimited(format_size)),
    "PidsLimit": ("pids", _render_unlimited(str)),
    "MemoryReservation": ("memory_reservation", _render_unlimited(format_size)),
    "CpuShares": ("cpu_shares", lambda v: "the default" if not v else str(v)),
    "ShmSize": ("shm_size", format_size),
}
