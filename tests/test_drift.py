"""`status` and `up` agree on drift: one comparison (containers/drift.py) of
what `up` gives a container on a host with what docker reports (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_cluster
from orchestrator.containers.drift import cluster_expectations, container_drift
from orchestrator.containers.inspection import ContainerLimits
from orchestrator.containers.labels import LABEL_CONFIG_HASH
from orchestrator.containers.probe import HostState
from orchestrator.containers.status import host_status
from orchestrator.limits.resources import ResourceError

GiB = 1024**3


def cluster(tmp_path: Path, container: str) -> object:
    path = tmp_path / "c.yaml"
    path.write_text(f"hosts: [n1, n2]\nssh: {{user: u}}\ncontainer:\n  image: i:1\n{container}")
    return load_cluster(path, check_files=False)


def as_docker_started(
    cpus: float | None, shm: int | None, pids: int | None = None
) -> ContainerLimits:
    """What `docker inspect` shows for a container `up` started with these values."""
    return ContainerLimits(
        nano_cpus=None if cpus is None else round(cpus * 10**9), shm_size=shm, pids_limit=pids
    )


@pytest.mark.parametrize(
    ("container", "cpu_count", "started", "drift"),
    [
        # container.shm_size (the documented spelling) is what up passes to docker.
        ("  shm_size: 1G\n", 8, as_docker_started(None, GiB), []),
        # cpus above the host's count: up clamps to the count, which is no drift.
        ("  resources: {cpus: 64}\n", 2, as_docker_started(2, None), []),
        # Unknown capacity: up passes the request as is.
        ("  resources: {cpus: 64}\n", None, as_docker_started(64, None), []),
        # No shm_size asked: docker's 64 MiB default is no drift either.
        ("  resources: {pids: 100}\n", 8, as_docker_started(None, 64 * 1024**2, 100), []),
        # A real difference still shows.
        (
            "  resources: {pids: 100}\n",
            8,
            as_docker_started(None, None, 77),
            ["pids (PidsLimit): the container has 77, the config asks for 100"],
        ),
        (
            "  shm_size: 1G\n",
            8,
            as_docker_started(None, None),
            ["shm_size (ShmSize): the container has 64Mi, the config asks for 1Gi"],
        ),
    ],
)
def test_drift_is_what_up_would_do_against_what_docker_reports(
    tmp_path: Path,
    container: str,
    cpu_count: int | None,
    started: ContainerLimits,
    drift: list[str],
) -> None:
    c = cluster(tmp_path, container)
    states = {
        h: HostState(host=h, container="running", host_config=started, cpu_count=cpu_count)
        for h in ("n1", "n2")
    }
    expected = cluster_expectations(c, states)  # type: ignore[arg-type]
    assert not isinstance(expected, ResourceError)
    for host, state in states.items():
        assert container_drift(expected[host], state, "h") == drift
        row = host_status(
            state, resources=expected[host], sshd_wanted=False, script_sha256="", config_hash="h"
        )
        assert list(row.drift) == drift
        if cpu_count == 2:
            assert row.limits["cpus"] == "2"  # the wide view shows what the container has


def test_another_container_block_shows_as_drift(tmp_path: Path) -> None:
    c = cluster(tmp_path, "")
    state = HostState(host="n1", container="running", labels={LABEL_CONFIG_HASH: "old"})
    expected = cluster_expectations(c, {"n1": state})  # type: ignore[arg-type]
    assert not isinstance(expected, ResourceError)
    assert container_drift(expected["n1"], state, "new") == ["container block changed since start"]
