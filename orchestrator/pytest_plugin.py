"""pytest plugin: `--cvs-orchestrator-cluster` and a session-scoped `cluster` fixture.

    def test_gpus_visible(cluster):
        results = cluster.exec(["rocm-smi"])
        assert all(r.ok for r in results.values())

The fixture brings the containers up per the cluster's lifetime policy at the
start of the session and down at its end (`per_run` removes them,
`persistent` leaves them running, `no_launch` touches nothing). Tests that
use it are skipped when no cluster file is given.

Inert until asked: every pytest in the environment loads this module (entry
point `pytest11`), CVS's runs included, so it imports nothing but pytest at
load time (the engine and its SSH stack come in only when a test uses the
fixture or the CVS engine is opted into), and its options are namespaced
(`--cvs-orchestrator-*`, internal names `cvs_orchestrator_*`): pytest 9.2
refuses a second option with the same internal name, so `--cluster-file`
here would have taken CVS's `--cluster_file` away.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.compat import pytest_engine

if TYPE_CHECKING:
    from orchestrator.sync import SyncCluster

CLUSTER_OPTION = "--cvs-orchestrator-cluster"
CLUSTER_DEST = "cvs_orchestrator_cluster"
CLUSTER_ENV = "CVS_CLUSTER"


class CvsWarning(UserWarning):
    """A cvs warning (no resource caps, clamped request, drift...) seen by the fixture."""


class _WarningsSink:
    """Turns the cluster's warning events into Python warnings, which pytest
    lists in its summary (the session has no terminal view of its own)."""

    def emit(self, event: Any) -> None:
        from orchestrator.events import Message

        if isinstance(event, Message) and event.level == "warning":
            where = f"{event.host}: " if event.host else ""
            warnings.warn(f"cvs: {where}{event.text}", CvsWarning, stacklevel=2)

    def close(self) -> None:
        pass


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cvs-orchestrator", "cvs-orchestrator")
    group.addoption(
        CLUSTER_OPTION,
        action="store",
        dest=CLUSTER_DEST,
        default=None,
        metavar="FILE",
        help=f"cvs cluster file for the `cluster` fixture (default: ${CLUSTER_ENV})",
    )
    pytest_engine.add_engine_option(group)


def pytest_configure(config: pytest.Config) -> None:
    # Opt-in only: CVS's factory returns our orchestrator (compat/pytest_engine.py).
    pytest_engine.configure(config)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[SyncCluster]:
    """The fleet, up for the whole session; commands run in the containers."""
    path = request.config.getoption(CLUSTER_DEST) or os.environ.get(CLUSTER_ENV)
    if not path:
        pytest.skip(f"no cluster: pass {CLUSTER_OPTION} FILE or set {CLUSTER_ENV}")
    from orchestrator.api import UpFailed
    from orchestrator.errors import PolicyRefused
    from orchestrator.sync import SyncCluster

    with SyncCluster.open(path, sink=_WarningsSink()) as fleet:
        try:
            fleet.up()
        except (UpFailed, PolicyRefused) as exc:
            # Every test that uses the fleet fails with the per-host reasons
            # (pytest caches this for the session: `up` is tried once).
            pytest.fail(_up_failure_text(exc), pytrace=False)
        try:
            yield fleet
        finally:
            fleet.down()


def _up_failure_text(exc: Any) -> str:
    from orchestrator.errors import PolicyRefused

    if isinstance(exc, PolicyRefused):
        return "cvs: up refused, nothing changed:\n" + "\n".join(f"  {r}" for r in exc.reasons)
    lines = [f"cvs: up failed (exit {int(exc.exit_code)}):"]
    for host, outcome in exc.report.outcomes.items():
        if not outcome.ok:
            lines.append(f"  {host}: {outcome.action.kind} failed at {outcome.error!s}")
    return "\n".join(lines)
