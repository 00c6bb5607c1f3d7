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
import warnings
from collections.abc import Iterator

import pytest

from orchestrator.api import UpFailed
from orchestrator.compat import pytest_engine
from orchestrator.errors import PolicyRefused
from orchestrator.events import Event, Message
from orchestrator.sync import SyncCluster


class CvsWarning(UserWarning):
    """A cvs warning (no resource caps, clamped request, drift...) seen by the fixture."""


class _WarningsSink:
    """Turns the cluster's warning events into Python warnings, which pytest
    lists in its summary (the session has no terminal view of its own)."""

    def emit(self, event: Event) -> None:
        if isinstance(event, Message) and event.level == "warning":
            where = f"{event.host}: " if event.host else ""
            warnings.warn(f"cvs: {where}{event.text}", CvsWarning, stacklevel=2)

    def close(self) -> None:
        pass


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cvs", "cvs-orchestrator")
    group.addoption(
        "--cluster-file",
        action="store",
        default=None,
        metavar="FILE",
        help="cvs cluster file for the `cluster` fixture (default: $CVS_CLUSTER)",
    )
    pytest_engine.add_engine_option(group)


def pytest_configure(config: pytest.Config) -> None:
    # Opt-in only: CVS's factory returns our orchestrator (compat/pytest_engine.py).
    pytest_engine.configure(config)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[SyncCluster]:
    """The fleet, up for the whole session; commands run in the containers."""
    path = request.config.getoption("--cluster-file") or os.environ.get("CVS_CLUSTER")
    if not path:
        pytest.skip("no cluster: pass --cluster-file FILE or set CVS_CLUSTER")
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


def _up_failure_text(exc: UpFailed | PolicyRefused) -> str:
    if isinstance(exc, PolicyRefused):
        return "cvs: up refused, nothing changed:\n" + "\n".join(f"  {r}" for r in exc.reasons)
    lines = [f"cvs: up failed (exit {int(exc.exit_code)}):"]
    for host, outcome in exc.report.outcomes.items():
        if not outcome.ok:
            lines.append(f"  {host}: {outcome.action.kind} failed at {outcome.error}")
    return "\n".join(lines)
