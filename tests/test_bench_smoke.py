"""The fan-out benchmark still runs end to end (4 loopback hosts, one round).

The real figures (240 and 1000 hosts) come from `python bench/fanout.py`; they
are not part of CI's timed path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# Real sshds on the loopback (root): an integration test, with the sandbox's.
@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="the loopback farm starts sshd (root)")
@pytest.mark.skipif(importlib.util.find_spec("pssh") is None, reason="parallel-ssh not installed")
def test_fanout_benchmark_smoke_reports_both_clients_on_every_host() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fanout.py"), "--smoke", "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["hosts"] == 4
    for key in ("fresh", "reused", "wall", "maxrss_kib"):
        assert summary[key]["ours"] > 0 and summary[key]["theirs"] > 0


@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
def test_step_cost_benchmark_smoke_reports_every_path() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "step_cost.py"),
            *("--sandbox-hosts", "2", "--sizes", "2", "--attach-sizes", "2"),
            *("--steps", "3", "--runs", "1", "--json"),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    steps = {r["path"]: r for r in rows if r["what"] == "step"}
    assert set(steps) == {"sshd", "exec", "bare"}
    assert steps["sshd"]["container_connects"] == 2 and not steps["sshd"]["fell_back"]
    assert steps["exec"]["container_channels"] == 0
    assert {r["path"] for r in rows if r["what"] == "attach"} == {"sshd", "exec"}
