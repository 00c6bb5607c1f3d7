"""Hosts from a Slurm allocation: `SLURM_JOB_NODELIST` in hostlist syntax.

Inside `salloc` or an `sbatch` script Slurm exports the allocated nodes as
one compressed hostlist, e.g. `gpu[01-04,07],login2`. A cluster file that says
`hosts: {from: slurm}` (or `cvs --hosts-from slurm`) takes its hosts from
there; everything else (ssh, container, limits) still comes from the file.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config.documents import ConfigError
from orchestrator.config.hostlist import HostlistError, expand_hostlist, split_patterns
from orchestrator.errors import Phrase, Text

# SLURM_NODELIST is the older name; both are set inside allocations today.
NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
HOST_SOURCES = ("slurm",)


def slurm_nodelist(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable name, value) of the allocation's node list, or None outside one."""
    for name in NODELIST_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def slurm_hosts(env: Mapping[str, str], *, where: Text) -> list[str]:
    """The allocation's host names, in Slurm's order. ConfigError (exit 2) outside one.

    `where` names what asked for them (`cluster.yaml: hosts` or `--hosts-from slurm`).
    """
    found = slurm_nodelist(env)
    if found is None:
        raise ConfigError(
            Phrase(
                where,
                ": hosts come from Slurm, but SLURM_JOB_NODELIST is not set: run cvs "
                "inside an allocation (salloc -N2 cvs ..., or in an sbatch script), or list "
                "hosts in the cluster file",
            )
        )
    variable, value = found
    names: list[str] = []
    try:
        for part in split_patterns(value):
            names.extend(expand_hostlist(part))
    except HostlistError as exc:
        raise ConfigError(
            Phrase(where, f": {variable}={value!r} is not a hostlist: {exc}")
        ) from None
    return list(dict.fromkeys(names))  # a node named twice is one host
