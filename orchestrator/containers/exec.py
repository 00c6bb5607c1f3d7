"""Commands inside each host's container, killable on timeout.

`docker exec` has no way to stop what it started: killing the client leaves
the process running in the container. So the in-container side records its
pid, and a timeout (or Ctrl-C) kills that process tree from a second exec.

Environment values never appear in an argv (`docker exec -e K=V` would show
them in `ps` on the host): they go over stdin (`ssh.envpass`), read by the
in-container shell before it starts the command.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from orchestrator.config.model import CONTAINER_USER_RE, WORKDIR_RE
from orchestrator.containers.docker import DOCKER_CLI_ENV, validate_container_name
from orchestrator.containers.runtime import RuntimeName, candidates, first_that_answers
from orchestrator.ssh.envpass import env_block, env_reader, new_token

NOT_RUNNING_EXIT = 125

# Descendants by walking /proc/*/status (no pgrep/ps: minimal images lack them).
# KILL goes to the first walk's pids too: once TERM has ended the recording
# shell, a command that ignored TERM is no longer its descendant.
_KILL_TREE = r"""
p=$(cat "$1" 2>/dev/null) || exit 0
tree() {
  for d in /proc/[0-9]*; do
    pp=
    while read -r k v; do [ "$k" = PPid: ] && { pp=$v; break; }; done < "$d/status" 2>/dev/null
    [ "$pp" = "$1" ] && tree "${d#/proc/}"
  done
  echo "$1"
}
pids=$(tree "$p")
kill -TERM $pids 2>/dev/null
sleep 0.3
kill -KILL $pids $(tree "$p") 2>/dev/null
rm -f "$1"
true
"""

# `sh -c _RECORD…_RUN cvs PIDFILE CMD…`: the shell records its pid for _KILL_TREE
# and stays the command's parent, so that it can remove the pidfile when the
# command ends and exit with its status (a command that ends normally leaves no
# file behind).
# - The command is exec'd from a subshell: it is the program named, as before,
#   never a builtin (`exit`, `exec`) that would skip the clean-up.
# - The shell's own stderr is /dev/null while it waits, since shells report a
#   child killed by a signal ("Killed") and the command's stderr used to be its
#   own; the command gets the real stderr through fd 3.
# - Only positional parameters: the env block may export any variable name.
_RECORD = 'echo $$ > "$1"; '
_RUN = '{ (shift; exec "$@" 2>&3 3>&-); set -- "$?" "$1"; rm -f "$2"; } 3>&2 2>/dev/null; exit "$1"'


def _pidfile(token: str) -> str:
    return f"/tmp/.cvs-exec-{token}.pid"


class ContainerCommand(NamedTuple):
    script: str  # host shell text: runs the command in the container
    kill: str  # host shell text: kills what `script` started, for timeouts
    stdin: str | None  # what to send on stdin (the env block), or None


def in_running_container(
    name: str,
    docker_args: Sequence[str],
    *,
    runtime: RuntimeName = "docker",
    rootless: bool = False,
) -> str:
    """Host shell text that runs `docker DOCKER_ARGS` (else `sudo -n docker ...`;
    podman as containers/runtime.py reaches it) once container `name` is found
    running, in the same round trip; exit 125 with one line saying so when it is not."""
    validate_container_name(name)
    running = ["inspect", "--type", "container", "-f", "{{.State.Running}}", name]
    branches = [
        f'{guard}[ "$({shlex.join([*prefix, *running])} 2>/dev/null)" = true ]; then '
        f"set -- {shlex.join(prefix)}; "
        for guard, prefix in candidates(runtime, rootless)
    ]
    return (
        "if "
        + "elif ".join(branches)
        + f"else echo {shlex.quote(f'container {name} is not running here (run `cvs up`)')} >&2; "
        f"exit {NOT_RUNNING_EXIT}; fi; "
        f'exec "$@" {shlex.join(docker_args)}'
    )


def container_command(
    name: str,
    command: str | Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    user: str | None = None,
    workdir: str | None = None,
    ready_via: Sequence[str] | None = None,
    runtime: RuntimeName = "docker",
    rootless: bool = False,
) -> ContainerCommand:
    """How to run `command` in container `name` (and stop it on timeout).

    The host side finds how to reach docker (plain, else `sudo -n`) and that
    the container runs, in the same round trip as the command itself. The
    command runs as `user` (`docker exec -u`; default: the image's USER) in
    `workdir` (default: the image's WORKDIR).

    `ready_via` (the docker prefix, e.g. `["docker"]`) says the container is
    known to run and how to reach docker: an `up` of this invocation probed
    it under the lock it still holds. The check is then skipped, so the
    command costs one docker process on the host instead of two.
    """
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
    run, stdin = _RECORD + _RUN, None
    if env:
        # Values over stdin, read in the container before the command starts.
        env_token = new_token()
        run = _RECORD + env_reader(env_token) + _RUN
        exec_opts, stdin = ["-i", *exec_opts], env_block(env, env_token)
    inner = ["exec", *exec_opts, name, "sh", "-c", run, "cvs", _pidfile(token), *argv]
    if ready_via is not None:
        script = f"{DOCKER_CLI_ENV}; exec {shlex.join([*ready_via, *inner])}"
    else:
        reach = in_running_container(name, inner, runtime=runtime, rootless=rootless)
        script = f"{DOCKER_CLI_ENV}; {reach}"
    # As root: the command may run as any user (or -u root).
    kill_argv = ["exec", "-u", "0", name, "sh", "-c", _KILL_TREE, "cvs", _pidfile(token)]
    kill = first_that_answers(kill_argv, runtime, rootless)
    return ContainerCommand(script, kill, stdin)
