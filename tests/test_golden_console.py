"""Golden output: what the console says on the common paths (issue 25), so a
wording change shows in review as a diff of tests/golden/*.txt.

Each scenario runs the real `cvs` (CI=1: the plain text a pipe or a CI log
gets) against the sandbox and compares stdout and stderr, normalized (times,
IDs, addresses, the per-test container name and temporary paths), with its
golden file. After a deliberate wording change:

    CVS_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_console.py

rewrites them; review the diff like code.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from clitools import cvs as run_cvs

from orchestrator.sandbox import Sandbox

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
HOSTS = ["node1", "node2", "node3"]


def normalize(text: str, *, name: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "<tmp>").replace(name, "<name>")
    text = re.sub(r"\b(?:sha256:)?[0-9a-f]{64}\b", "<id>", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<id>", text)
    text = re.sub(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", "<addr>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?\s?(?:ms|s)\b", "<time>", text)
    text = re.sub(r"\b\d{8}T\d{6}Z\b", "<stamp>", text)
    # Progress lines (`node2 - provision: started`) come in the order the hosts
    # get there: sorted within each run of them, so only their words count.
    lines, out = text.splitlines(keepends=True), []
    while lines:
        run = []
        while lines and re.match(r"^\S+ - ", lines[0]):
            run.append(lines.pop(0))
        out += sorted(run) if run else [lines.pop(0)]
    return "".join(out)


def check(scenario: str, proc: subprocess.CompletedProcess[str], *, name: str, tmp: Path) -> None:
    got = (
        f"$ {scenario}\nexit {proc.returncode}\n"
        f"--- stdout\n{normalize(proc.stdout, name=name, tmp=tmp)}"
        f"--- stderr\n{normalize(proc.stderr, name=name, tmp=tmp)}"
    )
    path = GOLDEN / f"{scenario.split(':')[0]}.txt"
    if os.environ.get("CVS_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run with CVS_UPDATE_GOLDEN=1"
    want = path.read_text()
    assert got == want, f"{path.name} differs (CVS_UPDATE_GOLDEN=1 rewrites it):\n{got}"


# Wide and plain (CI=1), so the golden text does not wrap or colour.
cvs = partial(run_cvs, env={"COLUMNS": "200"}, cwd=REPO, timeout=600)


def docker(sandbox: Sandbox, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sandbox.docker_argv(host), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A persistent 3-host cluster of this test's own (container name), removed after."""
    name = f"cvs-gold-{uuid.uuid4().hex[:8]}"
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    doc["name"] = name
    doc["state_dir"] = str(tmp_path / "state")
    doc["hosts"] = [h for h in doc["hosts"] if h["name"] in HOSTS]
    doc["container"].update(
        name=name, lifetime="persistent", sshd={"enabled": False}, resources={"pids": 4096}
    )
    doc["limits"] = {"max_cpus": 1, "max_memory": "1Gi"}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield path, name
    for h in sandbox.nodes:
        docker(sandbox, h.name, "rm", "-f", name)


def test_cold_start_then_attach_then_a_failure_on_one_host(
    sandbox: Sandbox, tmp_path: Path, lab: tuple[Path, str]
) -> None:
    path, name = lab
    check("cold_start: cvs up", cvs("up", "-c", str(path)), name=name, tmp=tmp_path)
    check("attach: cvs up", cvs("up", "-c", str(path)), name=name, tmp=tmp_path)
    for host in ("node1", "node3"):
        assert docker(sandbox, host, "exec", name, "touch", "/tmp/flag").returncode == 0
    check(
        "exec_fails_on_one_host: cvs exec -- test -e /tmp/flag",
        cvs("exec", "-c", str(path), "--", "test", "-e", "/tmp/flag"),
        name=name,
        tmp=tmp_path,
    )
    # A suite whose first step fails on one host: the next step is skipped, saying why.
    suite = tmp_path / "check.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "check",
                "steps": [
                    {"name": "flag", "run": "test -e /tmp/flag"},
                    {"name": "after", "run": "true"},
                ],
            }
        )
    )
    check(
        "run_fails_on_one_host: cvs run check",
        cvs("run", "-c", str(path), str(suite), "--run-dir", str(tmp_path / "run")),
        name=name,
        tmp=tmp_path,
    )
    # A persistent set with a hole: refused, naming the host and the ways out.
    assert docker(sandbox, "node2", "rm", "-f", name).returncode == 0
    check("refusal: cvs up", cvs("up", "-c", str(path)), name=name, tmp=tmp_path)


def test_an_unreachable_host(sandbox: Sandbox, tmp_path: Path, lab: tuple[Path, str]) -> None:
    path, name = lab
    doc = yaml.safe_load(path.read_text())
    # Nothing listens on port 9 here: refused at once, the same on every run.
    doc["hosts"].append({"name": "node9", "address": "127.0.0.1", "port": 9})
    doc["ssh"]["connect_retries"] = 0
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    check(
        "unreachable_exec: cvs exec -- true",
        cvs("exec", "-c", str(path), "--host-os", "--", "true"),
        name=name,
        tmp=tmp_path,
    )
    check("unreachable_status: cvs status", cvs("status", "-c", str(path)), name=name, tmp=tmp_path)
