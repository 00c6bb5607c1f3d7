"""`cvs up` and provisioning together, on the real sandbox: a setup script
that fails on one host is reported with its output tail, leaves no marker
there, and the next `up` provisions that host again instead of attaching to
a half-built container."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml
from clitools import cvs as run_cvs
from clitools import last_json

from orchestrator.containers.provision import MARKER_PATH
from orchestrator.sandbox import Sandbox

NAME = "cvs-t-prov-retry"
REPO = Path(__file__).resolve().parent.parent


cvs = partial(run_cvs, cwd=REPO, timeout=300)


def docker(sandbox: Sandbox, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sandbox.docker_argv(host), *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def cluster_file(sandbox: Sandbox, tmp_path: Path) -> Iterator[Path]:
    failing = sandbox.host("node2").address
    # Fails only in node2's container (containers share their host's network
    # namespace, so the host's address shows in /proc/net/fib_trie), and only
    # until /root/allow exists there.
    script = tmp_path / "setup.sh"
    script.write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        "echo 'setting up'\n"
        f"if grep -q ' {failing}$' /proc/net/fib_trie && [ ! -e /root/allow ]; then\n"
        "  echo 'boom: node2 is not ready' >&2\n"
        "  exit 7\n"
        "fi\n"
        "echo 'set up ok'\n"
    )
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    doc["hosts"] = doc["hosts"][:3]
    doc["container"] = {
        **doc["container"],
        "name": NAME,
        "lifetime": "persistent",
        "setup_script": str(script),
        "sshd": {"enabled": False},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield path
    for host in ("node1", "node2", "node3"):
        docker(sandbox, host, "rm", "-f", NAME)


def test_failed_provisioning_is_reported_and_retried_by_the_next_up(
    sandbox: Sandbox, cluster_file: Path
) -> None:
    first = cvs("up", "-c", str(cluster_file))
    assert first.returncode == 1, first.stderr
    # The result on stdout, progress on stderr (docs/cli-output.md).
    failed_lines = [line for line in first.stdout.splitlines() if "FAILED" in line]
    assert len(failed_lines) == 1 and failed_lines[0].startswith("node2:"), first.stdout
    said = first.stdout + first.stderr
    assert "provision" in failed_lines[0] and "boom: node2 is not ready" in said, said

    markers = {h: docker(sandbox, h, "exec", NAME, "cat", MARKER_PATH) for h in ("node1", "node2")}
    assert markers["node1"].returncode == 0
    assert markers["node2"].returncode != 0, "a failed provisioning must leave no marker"

    docker(sandbox, "node2", "exec", NAME, "touch", "/root/allow")
    ids_before = {
        h: docker(sandbox, h, "inspect", "-f", "{{.Id}}", NAME).stdout.strip()
        for h in ("node1", "node2", "node3")
    }
    second = cvs("--json", "up", "-c", str(cluster_file))
    assert second.returncode == 0, second.stderr
    report = last_json(second)
    hosts = report["hosts"]
    assert {h: hosts[h]["action"] for h in hosts} == dict.fromkeys(hosts, "attach")
    assert "provision" in hosts["node2"]["steps"]
    assert "provision" not in hosts["node1"]["steps"]
    assert docker(sandbox, "node2", "exec", NAME, "cat", MARKER_PATH).returncode == 0
    ids_after = {
        h: docker(sandbox, h, "inspect", "-f", "{{.Id}}", NAME).stdout.strip()
        for h in ("node1", "node2", "node3")
    }
    assert ids_after == ids_before
