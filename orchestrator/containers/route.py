"""Which way a command reaches a host's container: its own sshd, or the
runtime's `exec` (docker, podman). One pure decision from probed facts,
made once per invocation per host (and command user) by the sshd path
(containers/sshexec.py, `SSHExec.route`), which caches it and says it under
`-v`; exec, cp, suite steps and the warm-up all take the answer from there.

The table (first match wins):

- the cluster runs no sshd path (`sshd.exec: false`, one host, no keys in
  the state directory): the runtime;
- the host went to the runtime earlier in this invocation (its sshd refused
  or vanished; warned once): the runtime;
- the container's facts are unreadable, or it is not running: the runtime
  (which reports it, as it always did);
- no host key of its sshd in the state directory: the runtime;
- the command's user is neither root nor the user the sshd lets in, or names
  a group or a bare uid: the runtime (`exec -u` gives exactly that);
- its network has no address the host reaches (`none`, another container's
  namespace): the runtime;
- the working directory is not an absolute path the sshd path quotes: the
  runtime;
- else its sshd, at the address and port the facts give.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.model import WORKDIR_RE
from orchestrator.errors import Text


@dataclass(frozen=True)
class ExecFacts:
    """What one `inspect` of the running container says, for the sshd path."""

    container_id: str
    running: bool
    started_at: str
    user: str  # Config.User: the image's USER, or container.user
    workdir: str  # Config.WorkingDir ("" means /)
    env: tuple[tuple[str, str], ...]  # Config.Env, in order
    hostname: str
    network_mode: str
    addresses: tuple[str, ...]  # IPv4 addresses on its networks (bridge)
    sshd_port: int | None  # the port it was started with (label), None: not labelled


@dataclass(frozen=True)
class RouteFacts:
    """What the decision reads about one host's container and one command."""

    closed: Text | None  # why the cluster has no sshd path at all (None: it has)
    off: Text | None  # why this host went to the runtime earlier (None: it did not)
    container: ExecFacts | None  # None: unreadable
    host_key: str | None  # its sshd's public key as `cvs up` left it
    user: str | None  # the command's user (None: the container's)
    workdir: str | None  # the command's working directory (None: the container's)
    default_port: int  # sshd.port, for a container started without the label


@dataclass(frozen=True)
class Sshd:
    """Through the container's own sshd."""

    address: str
    port: int
    user: str  # whom to log in as
    host_key: str
    workdir: str  # where the command runs (checked)
    container: ExecFacts

    def __str__(self) -> str:
        return f"via the container's sshd ({self.address}:{self.port})"


@dataclass(frozen=True)
class RuntimeExec:
    """Through `RUNTIME exec` on the host, and why."""

    why: Text


Route = Sshd | RuntimeExec


def login_user(requested: str | None, facts: ExecFacts) -> str | None:
    """The user to log in to the container's sshd as, for a command that runs
    as `requested` (None: the container's user); None when the sshd cannot
    give that user (remote/sshd.sh lets in root and the container's user, by
    name), so the command takes `docker exec -u`."""
    user = facts.user if requested is None else requested
    if user in ("", "root", "0"):
        return "root"
    if ":" in user or user.isdigit():
        return None  # a group, or a bare uid: only docker exec -u gives exactly that
    login = facts.user.split(":", 1)[0]
    return user if user == login else None


def sshd_address(facts: ExecFacts) -> str | None:
    """Where the host reaches the container's sshd: the loopback with host
    networking, the container's first IPv4 address on a bridge; None when
    there is none (`none`, another container's namespace)."""
    mode = facts.network_mode
    if mode == "host":
        return "127.0.0.1"
    if mode == "none" or mode.startswith("container:"):
        return None
    return facts.addresses[0] if facts.addresses else None


def route(facts: RouteFacts) -> Route:
    """The way for one command in one host's container (the module's table)."""
    if facts.closed is not None:
        return RuntimeExec(facts.closed)
    if facts.off is not None:
        return RuntimeExec(facts.off)
    container = facts.container
    if container is None:
        return RuntimeExec("the container could not be inspected")
    if not container.running:
        return RuntimeExec("the container is not running")
    if facts.host_key is None:
        return RuntimeExec("no host key of its sshd in the state directory")
    user = login_user(facts.user, container)
    if user is None:
        wanted = container.user if facts.user is None else facts.user
        lets_in = container.user.split(":", 1)[0] or "root"
        return RuntimeExec(f"user {wanted!r}: its sshd lets in root and {lets_in!r} by name only")
    address = sshd_address(container)
    if address is None:
        mode = container.network_mode
        return RuntimeExec(f"its network ({mode}) has no address the host reaches")
    workdir = facts.workdir or container.workdir or "/"
    if not WORKDIR_RE.fullmatch(workdir):
        return RuntimeExec(f"working directory {workdir!r}: not one the sshd path quotes")
    port = container.sshd_port or facts.default_port
    return Sshd(address, port, user, facts.host_key, workdir, container)
