"""Helpers for `cvs run` tests on the sandbox: the CLI as suite tests run it
(no CVS_CLUSTER / CVS_SUITES_PATH from the caller), cluster and suite files,
the containers left on the hosts, a run's results.json checked against its schema.

Not a test module (test modules import it, it imports none).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from clitools import REPO
from clitools import cvs as run_cvs

from orchestrator.sandbox import Sandbox

SCHEMA = json.loads((REPO / "orchestrator" / "schemas" / "results.schema.json").read_text())
NODES = ["node1", "node2", "node3", "node4"]


def suite_env() -> dict[str, str]:
    """This process's environment without what would pick another cluster or suite path."""
    env = {k: v for k, v in os.environ.items() if k not in ("CVS_CLUSTER", "CVS_SUITES_PATH")}
    return {**env, "PYTHONPATH": str(REPO), "CI": "1"}


def cvs(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_cvs(*args, cwd=cwd, timeout=timeout, base_env=suite_env())


def cluster_variant(sb: Sandbox, directory: Path, name: str, lifetime: str) -> Path:
    doc = yaml.safe_load(sb.cluster_file.read_text())
    doc["container"].update({"name": name, "lifetime": lifetime, "sshd": {"enabled": False}})
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def containers(sb: Sandbox, name: str) -> dict[str, str]:
    """host -> container status, for hosts where a container of that name exists."""
    found = {}
    for host in NODES:
        argv = [*sb.docker_argv(host), "ps", "-a", "--filter", f"name=^{name}$"]
        out = subprocess.run(
            [*argv, "--format", "{{.State}}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        if out:
            found[host] = out
    return found


def write_suite(directory: Path, name: str, steps: list[dict[str, Any]]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "steps": steps}))
    return path


def results(run_dir: Path) -> dict[str, Any]:
    doc = json.loads((run_dir / "results.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    return doc
