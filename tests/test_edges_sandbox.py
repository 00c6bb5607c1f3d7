"""Issue 30 on a real sandbox: honest at the edges.

One 3-host sandbox for the module (real OpenSSH, one dockerd per host). Each
test uses a container name of its own and removes it afterwards, also on
failure.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import cvs_on, explain, last_json
from conftest import _built
from labtools import docker

from orchestrator.sandbox import SSHD_TAG, Sandbox

NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with _built(tmp_path_factory.mktemp("edges") / "sb", hosts=3) as sb:
        yield sb


class Lab:
    def __init__(self, sb: Sandbox, directory: Path) -> None:
        self.sb = sb
        self.directory = directory
        self.name = f"cvs-edge-{uuid.uuid4().hex[:8]}"

    def cluster(self, lifetime: str = "persistent", **container: Any) -> Path:
        doc = yaml.safe_load(self.sb.cluster_file.read_text())
        doc["state_dir"] = str(self.directory / "state")
        doc["container"] = {
            "image": SSHD_TAG,
            "name": self.name,
            "lifetime": lifetime,
            "docker_timeout": 10,
            **container,
        }
        path = self.directory / f"cluster-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def clean(self) -> None:
        for node in self.sb.nodes:
            docker(self.sb, node.name, "rm", "-f", "-v", self.name, check=False)
        for lock in Path("/tmp").glob(f"cvs-{self.name}-*.lock"):
            subprocess.run(["rm", "-rf", str(lock)], check=False)


@pytest.fixture
def lab(edges: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(edges, tmp_path)
    try:
        yield lab
    finally:
        lab.clean()


# --- finding 1: causes only from evidence ------------------------------------------


def exec_error(cluster: Path, command: str) -> str:
    proc = cvs_on(cluster, "exec", "--hosts", "node1", "--json", "--", command)
    assert proc.returncode == 1, explain(proc)
    error = last_json(proc)["hosts"]["node1"]["error"]
    assert isinstance(error, str)
    return error


def test_exit_255_a_kill_and_a_real_restart_get_three_different_true_answers(lab: Lab) -> None:
    cluster = lab.cluster(sshd={"enabled": False})
    assert cvs_on(cluster, "up").returncode == 0
    # At once after the start: the container started a moment before each command.
    plain = exec_error(cluster, "exit 255")
    killed = exec_error(cluster, "kill -9 $$")

    def restart() -> None:
        time.sleep(3)
        docker(lab.sb, "node1", "restart", "-t", "1", lab.name)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        restarted = exec_error(cluster, "sleep 30")
    finally:
        thread.join()
    assert plain == "exit code 255", plain
    assert killed == (
        "exit code 137: what a shell reports for a process killed by signal 9 (SIGKILL); "
        "the container kept running (not restarted, not stopped)"
    ), killed
    assert restarted.startswith(
        "exit code 137: the container restarted while the command ran (docker started it again"
    ), restarted
    # The diagnosis removed the pidfile the killed command left behind.
    left = docker(lab.sb, "node1", "exec", lab.name, "sh", "-c", "ls /tmp/.cvs-exec-* || true")
    assert ".pid" not in left, left

