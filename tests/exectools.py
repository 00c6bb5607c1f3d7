"""Helpers for `cvs exec` tests on the sandbox: the CLI as they run it, the
container block under another name, containers up for one test.

Not a test module (test modules import it, it imports none).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from clitools import REPO
from clitools import cvs as run_cvs

from orchestrator.sandbox import Sandbox

NODES = ["node1", "node2", "node3", "node4"]
CLI_ENV = {**os.environ, "CI": "1"}


cvs = partial(run_cvs, base_env=CLI_ENV, cwd=REPO, timeout=120)


def statuses(summary: dict[str, Any]) -> dict[str, str]:
    return {host: r["status"] for host, r in summary["hosts"].items()}


def yaml_container(sandbox: Sandbox, *, name: str) -> dict[str, Any]:
    """The sandbox's container block under another container name."""
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    return {**doc["container"], "name": name, "lifetime": "per_run"}


@contextlib.contextmanager
def containers_up(cluster_file: Path) -> Iterator[None]:
    """`cvs up` for the test, `cvs down` after it (also when up half-failed)."""
    try:
        up = cvs("up", "-c", str(cluster_file), timeout=300)
        assert up.returncode == 0, up.stderr
        yield
    finally:
        down = cvs("down", "-c", str(cluster_file), timeout=300)
        assert down.returncode == 0, down.stderr
