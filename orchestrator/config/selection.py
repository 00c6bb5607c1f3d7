"""The hosts a `--hosts` pattern picks from a cluster file: pure, below the API
(the CLI's `validate` and `exec` choose hosts without importing the API)."""

from __future__ import annotations

from orchestrator.config.hostlist import SelectionError, abbreviate_hosts
from orchestrator.config.hostlist import select_hosts as _select
from orchestrator.config.model import ClusterConfig
from orchestrator.errors import HostSelectionError, Param, Phrase


def select_hosts(cluster: ClusterConfig, pattern: str | None) -> list[str]:
    """Hosts picked by a comma-separated list of names, hostlists (`node[1-3,7]`),
    globs (only parts with `*` or `?`), `head` and `all`, in cluster order.

    Hostlists are expanded first and matched exactly (`config.hostlist.select_hosts`).
    Raises HostSelectionError (exit 2) naming the part that does not fit.
    """
    names = [h.name for h in cluster.hosts]
    try:
        return _select(names, pattern, head=cluster.head_host.name)
    except SelectionError as exc:
        raise HostSelectionError(
            Phrase(Param("hosts"), f" {pattern!r}: {exc} (hosts: {abbreviate_hosts(names)})")
        ) from None
