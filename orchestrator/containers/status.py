"""PURE: what `cvs status` reports per host, as typed records built from a probe.

`Cluster.status()` returns one `HostStatus` per host; the CLI renders them as a
table (render.print_status_lines, render.live.print_status_table) or, with
`--json`, as `HostStatus.to_dict()`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from orchestrator.containers.drift import container_drift
from orchestrator.containers.inspection import short_id
from orchestrator.containers.probe import HostState
from orchestrator.errors import ExitCode
from orchestrator.limits.resources import EffectiveResources

SshdState = Literal["listening", "down", "off", "unknown"]
Provisioned = Literal["yes", "no", "other"]


@dataclass(frozen=True)
class HostStatus:
    """One host's container as probed, next to what the config asks for."""

    host: str
    reachable: bool
    access: str | None  # how cvs reaches the runtime there: "direct", "sudo"; None: could not tell
    state: str  # the container: running, exited, paused, absent, ...; "unknown" when not probed
    image_id: str | None  # the image the container runs
    tag_image_id: str | None  # what the configured tag resolves to on the host now
    sshd: SshdState  # the in-container sshd; "off" when the config does not want one
    provisioned: Provisioned  # "other": by a different setup script than the config names
    provision_marker: str | None  # sha256 of the setup script that provisioned it
    limits: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    drift: tuple[str, ...] = ()  # where the container differs from the config now
    error: str | None = None  # why the probe could not tell
    # The cluster's runtime: what the table calls the access column.
    runtime: str = "docker"
    # The runtime's init is PID 1, reaping orphans (`run --init`, since issue
    # 42); False: made before, without it; None: no container, or not known.
    init: bool | None = None

    @property
    def docker(self) -> str | None:
        """Deprecated: `access` (the same, for any runtime); kept for one release."""
        warnings.warn("HostStatus.docker is HostStatus.access", DeprecationWarning, 2)
        return self.access

    @property
    def probed(self) -> bool:
        """The container's state is known: the host was reached and docker answered."""
        return self.state != "unknown"

    @property
    def stale(self) -> bool | None:
        """The container runs an image its tag no longer resolves to; None: not known."""
        if not self.probed:
            return None
        return (
            self.image_id is not None
            and self.tag_image_id is not None
            and self.image_id != self.tag_image_id
        )

    def to_dict(self) -> dict[str, object]:
        """The `cvs status --json` row. What could not be probed is null, never a
        guess (`stale: false`, `drift: []` for a host nobody looked at): an
        unreachable host has nulls everywhere but its name, reachability,
        state ("unknown"), error and the limits the config gives it. For a probed host, `image`
        and `tag` are null when there is no container / the tag is not there."""
        probed = self.probed
        provisioned: str | None = self.provisioned
        if not probed:
            provisioned = None
        elif self.provisioned == "other":
            provisioned = f"other script ({short_id(self.provision_marker)})"
        return {
            "host": self.host,
            "reachable": self.reachable,
            "access": self.access,
            "docker": self.access,  # deprecated: "access" (kept for one release)
            "state": self.state,  # "unknown" says it outright (and scripts filter on it)
            "image": short_id(self.image_id) if self.image_id else None,
            "tag": short_id(self.tag_image_id) if self.tag_image_id else None,
            "stale": self.stale,
            "sshd": None if self.sshd == "unknown" or not probed else self.sshd,
            "provisioned": provisioned,
            "limits": dict(self.limits),
            "drift": list(self.drift) if probed else None,
            "error": self.error,
            "init": self.init if probed else None,
        }

    def init_note(self) -> str | None:
        """One line when the container was made without an init (before cvs
        gave it one): its PID 1 reaps no orphans, so zombies accumulate."""
        if self.init is not False or self.state in ("absent", "unknown"):
            return None
        return (
            "its container was made without an init (PID 1 reaps no orphans: zombies "
            "accumulate and count against the pids cap); a container cvs makes now has one"
        )


def host_status(
    state: HostState,
    *,
    resources: EffectiveResources | ValueError,
    sshd_wanted: bool,
    script_sha256: str,
    config_hash: str,
) -> HostStatus:
    """`state` as a status row. `resources` is what `up` gives the container on
    this host (`drift.expected_resources`), or the error computing it raised
    (shown as drift). Drift is `drift.container_drift`, the comparison `up` makes."""
    drift: list[str] = []
    limits: dict[str, str] = {}
    if isinstance(resources, ValueError):
        drift.append(str(resources))
    else:
        limits = resources.describe()
        drift = container_drift(resources, state, config_hash)
    return HostStatus(
        host=state.host,
        reachable=state.reachable,
        access=state.access,
        state=state.container or "unknown",
        image_id=state.container_image_id,
        tag_image_id=state.tag_image_id,
        sshd=_sshd(state.sshd_listening, wanted=sshd_wanted),
        provisioned=_provisioned(state.provision_marker, script_sha256),
        provision_marker=state.provision_marker,
        limits=MappingProxyType(limits),
        drift=tuple(drift),
        error=state.error,
        runtime=state.runtime_name,
        init=state.init if state.container_id else None,
    )


def status_exit_code(rows: Sequence[HostStatus]) -> ExitCode:
    """What `cvs status` exits with, the worst that applies: UNREACHABLE when a host
    was not reached, FAILED when one was reached but the probe could not tell its
    docker state (daemon down, no docker access, docker not installed, unreadable
    output), else OK. A container that is absent or stopped is a state, not a failure."""
    if any(not r.reachable for r in rows):
        return ExitCode.UNREACHABLE
    if any(r.error is not None for r in rows):
        return ExitCode.FAILED
    return ExitCode.OK


def _sshd(listening: bool | None, *, wanted: bool) -> SshdState:
    if listening:
        return "listening"
    if not wanted:
        return "off"
    return "down" if listening is False else "unknown"


def _provisioned(marker: str | None, wanted: str) -> Provisioned:
    if marker is None:
        return "no"
    return "yes" if marker == wanted else "other"
