"""cvs-orchestrator: keep one named test container per GPU host in the state a run needs.

The public API for test drivers::

    from orchestrator import SyncCluster, load_cluster

    with SyncCluster.open(load_cluster("cluster.yaml")) as cluster:
        cluster.up()
        results = cluster.exec("hostname")

Names are imported on first use, so `import orchestrator` (and `cvs --help`)
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Cluster": "orchestrator.api",
    "HostStatus": "orchestrator.containers.status",
    "HostSelectionError": "orchestrator.api",
    "UpFailed": "orchestrator.api",
    "ExecFailed": "orchestrator.api",
    "select_hosts": "orchestrator.api",
    "SyncCluster": "orchestrator.sync",
    "ExitCode": "orchestrator.errors",
    "CvsError": "orchestrator.errors",
    "UsageError": "orchestrator.errors",
    "PolicyRefused": "orchestrator.errors",
    "HostResult": "orchestrator.results",
    "exit_code_for": "orchestrator.results",
    "ClusterConfig": "orchestrator.config",
    "ConfigError": "orchestrator.config",
    "load_cluster": "orchestrator.config",
    "parse_cluster": "orchestrator.config",
    "Plan": "orchestrator.containers.plan.model",
    "HostAction": "orchestrator.containers.plan.model",
    "UpReport": "orchestrator.containers.outcome",
    "EventSink": "orchestrator.events",
    "PlainSink": "orchestrator.events",
    "JsonLinesSink": "orchestrator.events",
    "NullSink": "orchestrator.events",
}

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ConfigError",
    "CvsError",
    "EventSink",
    "ExecFailed",
    "ExitCode",
    "HostAction",
    "HostResult",
    "HostSelectionError",
    "HostStatus",
    "JsonLinesSink",
    "NullSink",
    "PlainSink",
    "Plan",
    "PolicyRefused",
    "SyncCluster",
    "UpFailed",
    "UpReport",
    "UsageError",
    "__version__",
    "exit_code_for",
    "load_cluster",
    "parse_cluster",
    "select_hosts",
]

if TYPE_CHECKING:
    from orchestrator.api import (
        Cluster,
        ExecFailed,
        HostSelectionError,
        UpFailed,
        select_hosts,
    )
    from orchestrator.config import ClusterConfig, ConfigError, load_cluster, parse_cluster
    from orchestrator.containers.outcome import UpReport
    from orchestrator.containers.plan.model import HostAction, Plan
    from orchestrator.containers.status import HostStatus
    from orchestrator.errors import CvsError, ExitCode, PolicyRefused, UsageError
    from orchestrator.events import EventSink, JsonLinesSink, NullSink, PlainSink
    from orchestrator.results import HostResult, exit_code_for
    from orchestrator.sync import SyncCluster


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
