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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
            # No wait for a quiet machine: the smoke checks every path reports,
            # not the figures (it was up to 60 s of the test on a busy machine).
            *("--steps", "3", "--runs", "1", "--settle", "0", "--json"),
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


@dataclass(frozen=True)
class FanoutSmoke:
    """One `bench/image_fanout.py --smoke` run over both modes (one sandbox)."""

    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]

    def row(self, mode: str) -> dict[str, Any]:
        (row,) = [r for r in self.report["results"] if r["mode"] == mode]
        return row


@pytest.fixture(scope="module")
def fanout_smoke(tmp_path_factory: pytest.TempPathFactory) -> FanoutSmoke:
    """Both modes in one run: the benchmark builds its registry sandbox once
    (about 20 s each time), and each test reads its own mode's row."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root")
    out = tmp_path_factory.mktemp("image-fanout") / "image_fanout.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "image_fanout.py"),
            *("--smoke", "--modes", "registry", "peers", "--out", str(out)),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    return FanoutSmoke(proc, json.loads(out.read_text()))


@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
def test_image_fanout_benchmark_smoke_times_two_hosts_pulling_from_the_registry(
    fanout_smoke: FanoutSmoke,
) -> None:
    report = fanout_smoke.report
    row = fanout_smoke.row("registry")
    assert (row["hosts"], row["mode"], row["all_have_image"]) == (2, "registry", True)
    # Both hosts pulled the whole image from the registry.
    assert row["registry_bytes"] >= 2 * report["image_bytes"]
    assert set(row["host_sent_bytes"]) == {"node1", "node2"}
    assert row["cpu_s"] > 0 and row["maxrss_mib"] > 0
    assert report["machine"]["nproc"] >= 1
    assert "registry" in fanout_smoke.proc.stdout and "medians" in fanout_smoke.proc.stdout


@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
def test_image_fanout_benchmark_smoke_spreads_one_pull_to_two_hosts(
    fanout_smoke: FanoutSmoke,
) -> None:
    report = fanout_smoke.report
    row = fanout_smoke.row("peers")
    assert (row["hosts"], row["mode"], row["all_have_image"]) == (2, "peers", True)
    # One pull: the registry served the image once, not twice.
    assert report["image_bytes"] <= row["registry_bytes"] < 1.3 * report["image_bytes"]
    # The seed (node1) sent the whole image on (an uncompressed archive: more than S).
    assert row["host_sent_bytes"]["node1"] > report["image_bytes"]
    assert row["loadavg_during"] and report["commit"]
