"""`cvs shell HOST` in a real terminal (tmux) against the sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_exec_cli import containers_up, cvs, yaml_container
from test_transport import cluster_variant

from orchestrator.config import load_cluster
from orchestrator.sandbox import Sandbox
from orchestrator.ssh.openssh import openssh_argv

REPO = Path(__file__).resolve().parent.parent
CONTAINER = "cvs-t-shell"


@pytest.fixture(scope="module")
def shell_cluster(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("shell")
    container = {**yaml_container(sandbox, name=CONTAINER), "sshd": {"enabled": False}}
    cluster = cluster_variant(sandbox, directory, container=container)
    with containers_up(cluster):
        yield cluster


class Tmux:
    """A private tmux server (its own socket): nothing else's sessions are touched."""

    def __init__(self, name: str) -> None:
        self.socket = name

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return proc.stdout

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self("capture-pane", "-p", "-t", "t")
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on screen:\n{screen}")


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    t = Tmux(f"cvs-test-shell-{os.getpid()}")
    try:
        yield t
    finally:
        t("kill-server")


def test_shell_is_interactive_inside_the_hosts_container(
    shell_cluster: Path, sandbox: Sandbox, tmux: Tmux
) -> None:
    docker = sandbox.docker_argv("node2")
    subprocess.run([*docker, "exec", CONTAINER, "touch", "/tmp/in-node2-container"], check=True)
    command = (
        f"PYTHONPATH={REPO} {sys.executable} -m orchestrator -c {shell_cluster} shell node2; "
        "echo SHELL-EXIT-$?; sleep 60"
    )
    tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "40", command)
    tmux("send-keys", "-t", "t", "test -f /tmp/in-node2-container && echo MARK-$((40+2))", "Enter")
    tmux.wait_for("MARK-42")
    tmux("send-keys", "-t", "t", "tty; exit 3", "Enter")
    screen = tmux.wait_for("SHELL-EXIT-3")
    assert "/dev/pts/" in screen  # a real terminal inside the container


def test_shell_on_an_unknown_host_is_exit_2(shell_cluster: Path) -> None:
    proc = cvs("shell", "-c", str(shell_cluster), "node9")
    assert proc.returncode == 2
    assert "'node9' is not a host of the cluster" in proc.stderr


def test_shell_uses_the_clusters_host_key_policy_and_identity(shell_cluster: Path) -> None:
    cluster = load_cluster(shell_cluster)
    argv = openssh_argv(cluster, "node1", "true", tty=False)
    assert "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={cluster.ssh.known_hosts}" in argv
    assert argv[argv.index("-i") + 1] == cluster.ssh.identity_files[0]
    assert argv[-2:] == ["--", "true"]
    # The same argv really reaches the host, non-interactively.
    proc = subprocess.run([*argv[:-1], "echo reached"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "reached"
