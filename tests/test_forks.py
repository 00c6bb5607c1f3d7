"""`concurrency.hosts` (`--forks`) bounds how many hosts `up` and `down` act on
at once, on the real sandbox: with 1, the three hosts' pipelines (run, setup
script, verify) and removals happen one after the other; by default they
overlap. Times come from the events `up`/`down` emit, read in-process."""

from __future__ import annotations

import itertools
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from orchestrator.api import Cluster
from orchestrator.events import Event, HostStep
from orchestrator.sandbox import SSHD_TAG, Sandbox

THREE = ["node1", "node2", "node3"]
SETUP_SECONDS = 1.0


class TimedSink:
    """Every HostStep with the monotonic time it arrived."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, HostStep]] = []

    def emit(self, event: Event) -> None:
        if isinstance(event, HostStep):
            self.steps.append((time.monotonic(), event))

    def close(self) -> None:
        pass

    def spans(self, step: str) -> dict[str, tuple[float, float]]:
        """host -> (started, ended) of `step`."""
        start = {e.host: t for t, e in self.steps if e.step == step and e.status == "started"}
        end = {e.host: t for t, e in self.steps if e.step == step and e.status != "started"}
        return {h: (start[h], end[h]) for h in start if h in end}


def overlapping(spans: dict[str, tuple[float, float]]) -> bool:
    ordered = sorted(spans.values())
    return any(b[0] < a[1] for a, b in itertools.pairwise(ordered))


@pytest.fixture
def name(sandbox: Sandbox) -> Iterator[str]:
    name = f"cvs-forks-{uuid.uuid4().hex[:8]}"
    yield name
    for node in sandbox.nodes:
        subprocess.run(
            [*sandbox.docker_argv(node.name), "rm", "-f", name], capture_output=True, timeout=60
        )


def cluster_file(sandbox: Sandbox, tmp_path: Path, name: str, forks: int | None) -> Path:
    script = tmp_path / "setup.sh"
    script.write_text(f"#!/bin/sh\nsleep {SETUP_SECONDS}\n")
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    doc["hosts"] = [h for h in doc["hosts"] if h["name"] in THREE]
    doc["state_dir"] = str(tmp_path / "state")
    if forks is not None:
        doc["concurrency"] = {**(doc.get("concurrency") or {}), "hosts": forks}
    doc["container"] = {
        "image": SSHD_TAG,
        "name": name,
        "lifetime": "per_run",
        "sshd": {"enabled": False},
        "setup_script": str(script),
    }
    path = tmp_path / f"cluster-{forks}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def up_and_down(path: Path) -> tuple[TimedSink, float]:
    sink = TimedSink()

    async def main() -> Any:
        async with Cluster.open(path, sink=sink) as cluster:
            report = await cluster.up()
            assert report.ok, report.to_dict()
            _, removed = await cluster.down()
            assert all(r.ok for r in removed.values()), removed

    started = time.monotonic()
    anyio.run(main)
    return sink, time.monotonic() - started


def test_forks_one_starts_and_removes_one_host_at_a_time(
    sandbox: Sandbox, tmp_path: Path, name: str
) -> None:
    sink, seconds = up_and_down(cluster_file(sandbox, tmp_path, name, forks=1))
    setups = sink.spans("provision")
    assert sorted(setups) == THREE
    assert not overlapping(setups), setups
    assert not overlapping(sink.spans("run")), sink.spans("run")
    assert not overlapping(sink.spans("remove")), sink.spans("remove")
    assert seconds >= 3 * SETUP_SECONDS


def test_without_a_limit_the_hosts_start_together(
    sandbox: Sandbox, tmp_path: Path, name: str
) -> None:
    sink, _ = up_and_down(cluster_file(sandbox, tmp_path, name, forks=None))
    setups = sink.spans("provision")
    assert sorted(setups) == THREE
    assert overlapping(setups), setups
