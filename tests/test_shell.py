"""In a real terminal (tmux) against the sandbox: `cvs shell HOST`, and what
`cvs status` shows there (colours, and none with --color never / NO_COLOR)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from exectools import containers_up, cvs, yaml_container
from sandboxtools import cluster_variant
from terminal import Tmux

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


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    t = Tmux(f"cvs-test-{os.getpid()}")
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


def test_status_in_a_terminal_is_a_coloured_table_unless_color_never(
    shell_cluster: Path, tmux: Tmux
) -> None:
    base = f"PYTHONPATH={REPO} {sys.executable} -m orchestrator -c {shell_cluster} status"
    command = (
        f"env -u CI -u NO_COLOR {base}; echo DONE-1; {base} --color never; echo DONE-2; sleep 60"
    )
    tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "60", command)
    tmux.wait_for("DONE-2")
    screen = tmux("capture-pane", "-p", "-e", "-t", "t")
    coloured, plain = screen.split("DONE-1")
    assert "\x1b[32mrunning" in coloured  # the state column, green
    assert "┏━" in coloured and "host" in coloured  # a rich table
    assert "running" in plain and "\x1b[32m" not in plain and "┃" not in plain
