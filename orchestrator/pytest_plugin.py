"""pytest plugin: `--cluster-file` and a session-scoped `cluster` fixture.

    def test_gpus_visible(cluster):
        results = cluster.exec(["rocm-smi"])
        assert all(r.ok for r in results.values())

The fixture brings the containers up per the cluster's lifetime policy at the
start of the session and down at its end (`per_run` removes them,
`persistent` leaves them running, `no_launch` touches nothing). Tests that
use it are skipped when no cluster file is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from orchestrator.sync import SyncCluster


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cvs", "cvs-orchestrator")
    group.addoption(
        "--cluster-file",
        action="store",
        default=None,
        metavar="FILE",
        help="cvs cluster file for the `cluster` fixture (default: $CVS_CLUSTER)",
    )


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[SyncCluster]:
    """The fleet, up for the whole session; commands run in the containers."""
    path = request.config.getoption("--cluster-file") or os.environ.get("CVS_CLUSTER")
    if not path:
        pytest.skip("no cluster: pass --cluster-file FILE or set CVS_CLUSTER")
    with SyncCluster.open(path) as fleet:
        fleet.up()
        try:
            yield fleet
        finally:
            fleet.down()
