"""PURE: the one comparison of a container with what the config asks for now.

`cvs up` (attaching to kept containers) and `cvs status` both ask "does this
container differ from the config?". They used to answer it from two
computations of "what the config asks for" and disagreed right after a fresh
`up`: status left out `container.shm_size` (the documented spelling of
`resources.shm_size`) and the clamp of `cpus` to the host's CPU count, so a
container started exactly as asked showed drift. Here is the only place that
computes the expectation for a host, the way `up` starts containers:

- the request, clamped by the operator's caps, with `container.shm_size`
  folded in (`limits.cluster_effective_resources`);
- then fitted to the host's probed capacity (`limits.fit_to_host`: cpus above
  the host's count become the count, as `up` passes them to docker);

and compares it with `docker inspect` the way docker normalizes values (unset
and 0 are one thing, ShmSize unset is 64 MiB, PidsLimit unset is null, 0 or
-1 across versions: `limits.resources.limits_drift`).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import ClusterConfig
from orchestrator.containers.inspection import container_limits_drift
from orchestrator.containers.labels import LABEL_CONFIG_HASH
from orchestrator.containers.probe import HostState
from orchestrator.limits.capacity import fit_to_host
from orchestrator.limits.resources import (
    EffectiveResources,
    ResourceError,
    cluster_effective_resources,
)

CONFIG_CHANGED = "container block changed since start"


def expected_resources(
    requested: Mapping[str, EffectiveResources], states: Mapping[str, HostState]
) -> dict[str, EffectiveResources]:
    """Per host, what `up` gives a container it starts there: `requested`
    (`cluster_effective_resources`) fitted to the host's probed capacity.
    A host whose capacity is unknown keeps the request."""
    out = dict(requested)
    for host, eff in requested.items():
        state = states.get(host)
        if state is not None:
            out[host] = fit_to_host(host, eff, state.cpu_count, state.memory_total).resources
    return out


def cluster_expectations(
    cluster: ClusterConfig, states: Mapping[str, HostState]
) -> dict[str, EffectiveResources] | ResourceError:
    """`expected_resources` for every host of `cluster`, or the ResourceError
    (naming the key) a bad value raises."""
    try:
        requested = cluster_effective_resources(cluster)
    except ResourceError as exc:
        return exc
    return expected_resources(requested, states)


def limits_drift(expected: EffectiveResources, state: HostState) -> list[str]:
    """Where the probed container's limits differ from `expected` (one line each)."""
    return container_limits_drift(expected, state.host_config)


def container_drift(expected: EffectiveResources, state: HostState, config_hash: str) -> list[str]:
    """`limits_drift`, plus a line when the container was started from another
    container block (its config-hash label): what `cvs status` shows."""
    drift = limits_drift(expected, state)
    if state.labels.get(LABEL_CONFIG_HASH) not in (None, config_hash):
        drift.append(CONFIG_CHANGED)
    return drift
