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
import sys
from typing import TYPE_CHECKING

from orchestrator.cli.common import load
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

# bash when the image has it, else sh: minimal images have only sh.
LOGIN_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"


def remote_command(cluster: ClusterConfig, *, host_os: bool, tty: bool, host: str = "") -> str:
    """What runs on the host: the shell, inside the container unless `host_os`."""
    from orchestrator.config import container_name
    from orchestrator.containers.copy import cluster_runtime, in_container

    # The cluster's `env` is not passed: its values are secrets, which never go in
    # an argv, and an interactive shell's stdin is the terminal, not a channel for them.
    argv = ["sh", "-c", LOGIN_SHELL]
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


def cmd_shell(args: argparse.Namespace) -> int:
    from orchestrator.ssh.openssh import openssh_argv

    cluster = load(args)
    names = [h.name for h in cluster.hosts]
    if args.host not in names:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise UsageError(f"cvs shell: {args.host!r} is not a host of the cluster ({shown})")
    if shutil.which("ssh") is None:
        raise UsageError("cvs shell: needs OpenSSH's client (`ssh`) on PATH")
    tty = sys.stdin.isatty()
    remote = remote_command(cluster, host_os=args.host_os, tty=tty, host=args.host)
    argv = openssh_argv(cluster, args.host, remote, tty=tty)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    return 0  # not reached
