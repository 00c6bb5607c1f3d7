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
