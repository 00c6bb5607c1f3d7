"""Real images on the real sandbox: non-root images, rollback, adoption.

Each test has its own container name (the `lab` fixture of test_lifecycle)
and removes what it made from every host, also on failure.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from test_lifecycle import Lab, cvs, docker, explain

from orchestrator.api import Cluster
from orchestrator.errors import PolicyRefused
from orchestrator.events import CollectingSink, Message
from orchestrator.sandbox import IMAGE_USER, USER_TAG, Sandbox, ensure_user_image

TWO = ["node1", "node2"]


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


def free_port() -> int:
    # Per-host network namespaces, but other tests share them: a port of our own.
    return random.randint(21000, 29000)


@pytest.fixture
def user_image(sandbox: Sandbox) -> Iterator[str]:
    """USER_TAG (USER cvsuser) loaded on node1 and node2, removed afterwards."""
    tar = ensure_user_image(lambda _: None)
    for host in TWO:
        sandbox.load_image(host, tar)
    try:
        yield USER_TAG
    finally:
        for host in TWO:
            docker(sandbox, host, "rmi", USER_TAG, check=False)


def test_non_root_image_is_provisioned_as_root_and_runs_commands_as_its_user(
    lab: Lab, user_image: str
) -> None:
    path = lab.cluster(lifetime="per_run", hosts=TWO, image=user_image, sshd_port=free_port())
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert "no resource caps" in up.stderr
    # Commands run as the image's USER, in its WORKDIR...
    who = cvs(path, "exec", "--", "echo $(id -un) $(pwd)")
    assert who.returncode == 0, explain(who)
    assert who.stdout.count(f"{IMAGE_USER} /home/{IMAGE_USER}") == 2, who.stdout
    # ...unless -u / -w say otherwise (and -e sets the environment).
    root = cvs(
        path,
        "exec",
        "-u",
        "root",
        "-w",
        "/tmp",
        "-e",
        "GREETING=hi",
        "--",
        "echo $(id -un) $(pwd) $GREETING",
    )
    assert root.returncode == 0, explain(root)
    assert root.stdout.count("root /tmp hi") == 2, root.stdout
    # The setup script ran as root: its marker is in /var/lib/cvs.
    assert docker(lab.sandbox, "node1", "exec", lab.name, "cat", "/var/lib/cvs/provisioned")
    # mpirun-style: the image's user reaches the peer container's sshd as itself.
    hop = cvs(path, "exec", "--hosts", "node1", "--", "ssh node2 'echo $(id -un)@$(hostname)'")
    assert hop.returncode == 0, explain(hop)
    assert f"{IMAGE_USER}@" in hop.stdout
    down = cvs(path, "down")
    assert down.returncode == 0, explain(down)


def test_no_caps_warning_is_an_api_event(lab: Lab) -> None:
    path = lab.cluster(lifetime="no_launch", hosts=["node1"])
    sink = CollectingSink()

    async def main() -> None:
        async with Cluster.open(path, sink=sink) as cluster:
            with pytest.raises(PolicyRefused):
                await cluster.up()  # nothing runs there: refused, after the warning

    anyio.run(main)
    texts = [e.text for e in sink.events if isinstance(e, Message) and e.level == "warning"]
    assert "no resource caps: containers may take the whole host" in texts


def test_pytest_fixture_reports_the_no_caps_warning(lab: Lab, tmp_path: Path) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"])
    test_file = tmp_path / "test_fleet.py"
    test_file.write_text("def test_fleet(cluster):\n    assert cluster.exec('true')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file),
         "--cluster-file", str(path), "-W", "default::UserWarning"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CvsWarning: cvs: no resource caps" in proc.stdout
