"""`cvs shell HOST`: an interactive shell in that host's container (or on the host).

It hands the terminal to OpenSSH's client (execvp), which does what an
interactive session needs (raw mode, window resizes, escape sequences) and
returns the shell's exit status; the options come from the cluster's SSH
settings and host-key policy (ssh/openssh.py), which with ssh.proxy_jump also
writes them to a config file in the state dir for the jump: nothing is left
running here to remove a temporary one.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from orchestrator.cli.common import load
from orchestrator.config import container_name
from orchestrator.containers.copy import cluster_runtime, in_container
from orchestrator.containers.exec import NOT_RUNNING_EXIT
from orchestrator.errors import ExitCode, UsageError
from orchestrator.ssh.openssh import openssh_argv

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

# bash when the image has it, else sh: minimal images have only sh.
LOGIN_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"


def remote_command(
    cluster: ClusterConfig,
    *,
    host_os: bool,
    tty: bool,
    host: str = "",
    command: list[str] | None = None,
) -> str:
    """What runs on the host: the shell (or `command`), inside the container
    unless `host_os`."""
    # The cluster's `env` is not passed: its values are secrets, which never go in
    # an argv, and an interactive shell's stdin is the terminal, not a channel for them.
    argv = command or ["sh", "-c", LOGIN_SHELL]
    if host_os or cluster.container is None:
        return shlex.join(argv)
    return in_container(
        container_name(cluster),
        argv,
        tty=tty,
        runtime=cluster_runtime(cluster),
        host=host,
        advice="run `cvs up`",
    )


def _not_running(cluster: ClusterConfig, host: str) -> str | None:
    """The host's one line when the container does not run there (checked
    first, in a round trip of its own: once ssh has the terminal, its exit
    status is the shell's, and a shell may exit 125 too); None otherwise,
    also when the check itself cannot tell (ssh then says why)."""
    check = remote_command(cluster, host_os=False, tty=False, host=host, command=["true"])
    try:
        done = subprocess.run(
            openssh_argv(cluster, host, check, tty=False),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=cluster.ssh.command_timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    said = done.stderr.strip().splitlines()
    if done.returncode == NOT_RUNNING_EXIT and said and said[-1].startswith("container "):
        return said[-1]
    return None


def cmd_shell(args: argparse.Namespace) -> int:
    if args.json:
        # The terminal is ssh's, with nothing of ours to say in JSON lines.
        raise UsageError("cvs shell is interactive: it has no --json form")
    cluster = load(args)
    names = [h.name for h in cluster.hosts]
    if args.host not in names:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise UsageError(f"cvs shell: {args.host!r} is not a host of the cluster ({shown})")
    if shutil.which("ssh") is None:
        raise UsageError("cvs shell: needs OpenSSH's client (`ssh`) on PATH")
    tty = sys.stdin.isatty()
    if not args.host_os and cluster.container is not None:
        absent = _not_running(cluster, args.host)
        if absent is not None:
            sys.stderr.write(f"cvs: {absent}\n")
            return ExitCode.FAILED
    remote = remote_command(cluster, host_os=args.host_os, tty=tty, host=args.host)
    argv = openssh_argv(cluster, args.host, remote, tty=tty)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    return 0  # not reached
