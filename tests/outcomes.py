"""A finished run's outcome, made by hand: for the report, the records and
`cvs runs` tests (a helper module, not a test module: tests import it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.suites.records import RunOutcome, StepHostOutcome, StepOutcome

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
HOSTILE = '<script>alert("x")</script> & <img src=http://example.invalid/x.png>'


def host(name: str, status: str, *, code: int | None = 0, tail: str = "") -> StepHostOutcome:
    reason = None if status == "ok" else f"exit {code}, expected 0"
    return StepHostOutcome(
        host=name, status=status, exit_code=code, duration=0.4, tail=tail, reason=reason
    )  # type: ignore[arg-type]


def failing_outcome(**kw: Any) -> RunOutcome:
    steps = [
        StepOutcome(
            name="install",
            hosts=["node1", "node2"],
            started=2.0,
            duration=1.5,
            results={"node1": host("node1", "ok", tail="ok"), "node2": host("node2", "ok")},
        ),
        StepOutcome(
            name="check",
            hosts=["node1", "node2"],
            started=3.6,
            duration=0.9,
            results={
                "node1": host("node1", "ok", tail="fine"),
                "node2": host("node2", "failed", code=3, tail=f"line a\n{HOSTILE}\nboom"),
            },
        ),
        StepOutcome(
            name="after",
            hosts=["node1", "node2"],
            results={
                h: StepHostOutcome(host=h, status="skipped", reason="step 'check' failed")
                for h in ("node1", "node2")
            },
        ),
    ]
    base: dict[str, Any] = {
        "suite": "test_x",
        "suite_file": "/s/test_x.yaml",
        "description": "checks x",
        "cluster": "lab",
        "cluster_file": "/c/cluster.yaml",
        "lifetime": "per_run",
        "started": T0,
        "finished": T0 + timedelta(seconds=6),
        "steps": steps,
        "image": "rocm/cvs:7.0",
        "image_ids": {"node1": "sha256:" + "a" * 64, "node2": "sha256:" + "a" * 64},
    }
    return RunOutcome(**{**base, **kw})
