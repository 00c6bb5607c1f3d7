"""PURE: a host's capacity (from the probe) against what its container asks for.

`docker run --memory` above the host's RAM starts a container the kernel
will squeeze; `--cpus` above the host's CPU count fails inside `docker run`
(exit 1, rollback). Both are known after the probe, before anything starts:
memory beyond the host is refused (exit 4, naming the host); cpus are
clamped to the host's count with a warning (clamping to the operator's caps
happens earlier, in resources.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.config.units import format_size
from orchestrator.limits.resources import EffectiveResources


@dataclass(frozen=True)
class Fit:
    resources: EffectiveResources
    warning: str | None = None
    refusal: str | None = None


def fit_to_host(
    host: str, eff: EffectiveResources, cpu_count: int | None, memory_total: int | None
) -> Fit:
    """The resources adjusted to the host; unknown capacity (None) changes nothing."""
    refusal = None
    if memory_total and eff.memory_bytes is not None and eff.memory_bytes > memory_total:
        refusal = (
            f"{host}: memory {format_size(eff.memory_bytes)} is more than the host has "
            f"({format_size(memory_total)}); lower container.resources.memory or set "
            "limits.max_memory for this host"
        )
    if cpu_count and eff.cpus is not None and eff.cpus > cpu_count:
        # No host in the text: the event carries it (the sinks prefix it once).
        warning = (
            f"cpus {eff.cpus:g} is more than the host's {cpu_count} CPUs: clamped to {cpu_count}"
        )
        return Fit(replace(eff, cpus=float(cpu_count)), warning, refusal)
    return Fit(eff, None, refusal)
