"""Commands inside each host's container, killable on timeout.

`docker exec` has no way to stop what it started: killing the client leaves
the process running in the container. So the in-container side
(remote/run.sh) records its pid, and a timeout (or Ctrl-C) kills that process
tree from a second exec (remote/kill_tree.sh).

Environment values never appear in an argv (`docker exec -e K=V` would show
them in `ps` on the host): they go over stdin (`ssh.envpass`), read by
run.sh before it starts the command.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from orchestrator import remote
from orchestrator.config.model import CONTAINER_USER_RE, WORKDIR_RE
from orchestrator.ssh.envpass import env_block, new_token

if TYPE_CHECKING:
    from orchestrator.remote.runtime import ContainerRuntime

# containers.argv (with limits.*) and remote.runtime are imported
# where a container command is built: `cvs exec --host-os` needs only
# NOT_RUNNING_EXIT of this module (tests/test_startup.py).

NOT_RUNNING_EXIT = 125

# What an MPI launch starts with (`cvs exec -- mpirun ...`); an `mpi: true`
# suite step is one by definition.
LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun", "prterun"})


def pidfile_of(token: str) -> str:
    """Where run.sh records the command's pid in the container (and leaves it
    behind only when it was killed itself: containers/causes.py reads it)."""
    return f"/tmp/.cvs-exec-{token}.pid"


_pidfile = pidfile_of


def not_running_message(name: str, host: str = "", advice: str = "") -> str:
    """What a host says when the container is not running there (naming `host`,
    the cluster's name for it, when given; `advice` is the caller's way out)."""
    where = f"on {host}" if host else "here"
    return f"container {name} is not running {where}" + (f" ({advice})" if advice else "")


class ContainerCommand(NamedTuple):
    script: str  # host shell text: runs the command in the container
    kill: str  # host shell text: kills what `script` started, for timeouts
    stdin: str | None  # what to send on stdin (the env block), or None


def in_running_container(
    name: str,
    docker_args: Sequence[str],
    runtime: ContainerRuntime | None = None,
    *,
    host: str = "",
    advice: str = "",
) -> str:
    """Host shell text that runs `docker DOCKER_ARGS` once container `name` is
    found running, in the same round trip; exit 125 with one line saying so
    (naming `host`) when it is not. A known `runtime` (probed under this
    invocation's lock) skips the check."""
    from orchestrator.containers.argv import validate_container_name
    from orchestrator.remote.runtime import DOCKER_CLI_ENV, ContainerRuntime

    validate_container_name(name)
    runtime = runtime or ContainerRuntime()
    argv = runtime.when_running(name, docker_args, not_running_message(name, host, advice))
    if runtime.known:
        return f"{DOCKER_CLI_ENV}; exec {shlex.join(argv)}"
    return f"exec {shlex.join(argv)}"


def container_command(
    name: str,
    command: str | Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    user: str | None = None,
    workdir: str | None = None,
    runtime: ContainerRuntime | None = None,
    stdin: bool = False,
    host: str = "",
) -> ContainerCommand:
    """How to run `command` in container `name` (and stop it on timeout).

    The host side finds how to reach docker and that the container runs, in
    the same round trip as the command itself. The command runs as `user`
    (`docker exec -u`; default: the image's USER) in `workdir` (default: the
    image's WORKDIR). `stdin`: the caller streams the command's stdin after
    the environment block (`docker exec -i`). `host`: the cluster's name for
    the host, in the line saying the container is not running.

    A known `runtime` says the container is known to run and how to reach
    docker: an `up` of this invocation probed it under the lock it still
    holds. The check is then skipped, so the command costs one docker process
    on the host instead of two.
    """
    from orchestrator.containers.argv import validate_container_name
    from orchestrator.remote.runtime import ContainerRuntime

    validate_container_name(name)
    token = token or secrets.token_hex(6)
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    exec_opts: list[str] = []
    if user is not None:
        if not CONTAINER_USER_RE.fullmatch(user):
            raise ValueError(f"invalid container user {user!r} (NAME, UID, NAME:GROUP or UID:GID)")
        exec_opts += ["-u", user]
    if workdir is not None:
        if not WORKDIR_RE.fullmatch(workdir):
            raise ValueError(f"invalid working directory {workdir!r} (an absolute path)")
        exec_opts += ["-w", workdir]
    env_token, block = "", None
    if env:
        # Values over stdin, read in the container before the command starts.
        env_token = new_token()
        block = env_block(env, env_token)
    if env or stdin:
        exec_opts = ["-i", *exec_opts]
    run = remote.argv("run", _pidfile(token), env_token, *argv)
    inner = ["exec", *exec_opts, name, *run]
    script = in_running_container(name, inner, runtime, host=host)
    kill = kill_command(name, _pidfile(token), runtime or ContainerRuntime())
    return ContainerCommand(script, kill, block)


_SESSION_RE = re.compile(r"[0-9a-f]{8,32}")


def kill_command(
    name: str, pidfile: str, runtime: ContainerRuntime, *, session: bool = False
) -> str:
    """Host shell text that ends the process tree run.sh recorded in
    `pidfile` in container `name` (remote/kill_tree.sh), through the runtime:
    it needs no connection to the container's sshd. `session`: `pidfile` is
    an invocation's prefix instead, and every command of it is ended."""
    from orchestrator.containers.argv import validate_container_name

    validate_container_name(name)
    if session and not _SESSION_RE.fullmatch(pidfile):
        raise ValueError(f"invalid session {pidfile!r}")
    which = ["--session", pidfile] if session else [pidfile]
    # As root: the command may run as any user (or -u root).
    kill_argv = ["exec", "-u", "0", name, *remote.argv("kill_tree", *which)]
    return shlex.join(runtime.read(kill_argv))


def launches_mpi(command: str | Sequence[str]) -> bool:
    """Whether the command runs an MPI launcher (by a word of it: `mpirun`,
    `/usr/bin/mpiexec`, inside `sh -c "..."` too)."""
    text = command if isinstance(command, str) else " ".join(command)
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    # A word of a `sh -c` string is itself shell text: its own words count.
    for word in words:
        for part in word.replace(";", " ").replace("&", " ").replace("|", " ").split():
            if os.path.basename(part) in LAUNCHERS:
                return True
    return False
