"""Probed hosts and container configs made by hand, for the planner's tests
(a helper module, not a test module: tests import it)."""

from __future__ import annotations

from orchestrator.config import ContainerConfig
from orchestrator.containers.labels import managed_labels
from orchestrator.containers.probe import HostState

IMG_A = "sha256:" + "a" * 64
IMG_B = "sha256:" + "b" * 64
SHA = "1" * 64
OTHER_SHA = "2" * 64
CLUSTER = "cvs"


def host(
    name: str,
    container: str | None,
    *,
    ours: bool = True,
    image: str | None = IMG_A,
    tag: str | None = IMG_A,
    marker: str | None = SHA,
    sshd: bool | None = True,
    status: str | None = None,
    digests: tuple[str, ...] = (),
    readable: bool = True,
    labels: dict[str, str] | None = None,
) -> HostState:
    """A probed host. container None = the probe could not tell (daemon down)."""
    if container is None:
        return HostState(host=name, error="docker daemon not reachable", error_kind="daemon_down")
    present = container != "absent"
    return HostState(
        host=name,
        access="direct",
        container=container,  # type: ignore[arg-type]
        container_status=status or (container if present else None),
        container_id=f"id-{name}" if present else None,
        container_image_id=image if present else None,
        container_image_readable=readable,
        labels=(labels or managed_labels(CLUSTER)) if present and ours else {},
        tag_image_id=tag,
        tag_repo_digests=digests,
        sshd_listening=sshd if container == "running" else None,
        provision_marker=marker if present else None,
    )


def cfg(lifetime: str, **kw: object) -> ContainerConfig:
    return ContainerConfig(image="img:1", name="ctr", lifetime=lifetime, **kw)  # type: ignore[arg-type]


def states(*hs: HostState) -> dict[str, HostState]:
    return {h.host: h for h in hs}


def kinds(plan) -> dict[str, str]:
    return {h: a.kind for h, a in plan.actions.items()}
