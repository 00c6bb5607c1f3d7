"""Commands in the containers through their own sshd, when it runs.

`docker exec` costs a docker CLI, dockerd, containerd, a shim and a fresh
runc on the host for every command (75-90 ms for `true` on two sandbox
hosts). A container of a multi-host cluster already runs an sshd with keys
cvs made: a channel on a connection to it costs what a host channel costs.
So `Cluster.exec` (and whatever runs on it: `cvs exec`, suite steps, the
CVS-compatible engine) asks `SSHExec.route` which way each host's commands
go (containers/route.py decides from the facts below, once per invocation
per host, and `-v` says it), then runs on that way: `SSHExec.run` for the
sshd, the `docker exec` path (containers/exec.py) for the runtime; a copy
(containers/copy.py) takes the same route for its in-container end
(`SSHExec.held_process`, else `docker exec -i`). Both go through the pool's
seam with the container's `Endpoint` as the target: the pool (`SSHPool`, or
the worker holding the host) owns the one connection per container.

Which way, from facts (containers/route.py's table):

- the cluster runs no sshd (`sshd.enabled: false`, one host), this cluster's
  keys are not in its state directory, the container's network has no
  address the host can reach: `docker exec`, said under `-v` only;
- the command's user is neither root nor the user the sshd lets in (the
  image's USER, or container.user), or names a group (`-u name:group`):
  `docker exec` for that command, said under `-v` only;
- the sshd does not answer, refuses the key, or offers another host key
  (refused, never learned): `docker exec` for the rest of the invocation on
  that host, and one warning saying why (`run` answers with that route).

A connection that worked and is found closed before a step (the sshd died
between steps, the container restarted) is opened again once; when that
fails, the host goes to `docker exec` with one warning naming what the
runtime says happened (restarted at, replaced, stopped). A connection lost
while a command runs fails that command with no exit code, and the caller
asks the runtime why (containers/causes.py), as for `docker exec`.

The same command gives the same result on both paths: the container's
environment is read once per invocation (one `inspect` per host) and sent
on stdin with the command's own (remote/run.sh's block; never in an argv);
remote/ssh_run.sh drops what sshd added, takes docker's umask and working
directory; remote/run.sh runs the command as on the docker path (pid file
for kill_tree.sh, the OOM line, the exit status).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from orchestrator import remote
from orchestrator.config import ClusterConfig, container_name, sshd_wanted
from orchestrator.config.model import WORKDIR_RE
from orchestrator.containers.argv import validate_container_name
from orchestrator.containers.exec import ContainerCommand, kill_command, pidfile_of
from orchestrator.containers.invocation import Invocation
from orchestrator.containers.labels import LABEL_SSHD_PORT
from orchestrator.containers.route import ExecFacts, Route, RouteFacts, RuntimeExec, Sshd
from orchestrator.containers.route import route as decide
from orchestrator.errors import Call, Phrase, Text
from orchestrator.events import EventSink, HostStep, Message
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.envpass import env_block, new_token
from orchestrator.ssh.keys import USER_KEY_FILE, default_state_dir
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.seam import HeldRequest, Request
from orchestrator.ssh.stdin import ExecIO
from orchestrator.ssh.target import Counters, Endpoint, NotStarted

if TYPE_CHECKING:
    from orchestrator.ssh.transport import SSHPool
    from orchestrator.ssh.workers.runner import WorkerRunner

_T = TypeVar("_T")

# What docker puts first in an exec's environment when the image sets no PATH
# (the daemon's `CreateDaemonEnvironment`); HOSTNAME is the container's.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IPV4_RE_PARTS = 4
# How long closing waits for warm-ups it cancelled (each ends at once).
WARM_END_BOUND = 5.0


def facts_command(name: str, runtime: ContainerRuntime) -> list[str]:
    """`RUNTIME inspect --type container NAME` (the whole object, as JSON)."""
    validate_container_name(name)
    return runtime.read(["inspect", "--type", "container", name])


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == _IPV4_RE_PARTS and all(p.isdigit() and int(p) < 256 for p in parts)


def parse_exec_facts(text: str) -> ExecFacts:
    """`inspect` output (a JSON array of one object, docker's or podman's) ->
    ExecFacts; ValueError when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"inspect printed no JSON ({exc})") from None
    return exec_facts_of(_obj(data[0] if isinstance(data, list) and data else data))


def exec_facts_of(obj: Mapping[str, Any]) -> ExecFacts:
    """ExecFacts from one container's inspect object (the probe has it too);
    ValueError when it is not a container's."""
    config, state = _obj(obj.get("Config")), _obj(obj.get("State"))
    if not _str(obj.get("Id")) or not state:
        raise ValueError("inspect printed no container Id/State")
    env: list[tuple[str, str]] = []
    for item in config.get("Env") or ():
        if isinstance(item, str) and "=" in item:
            key, _, value = item.partition("=")
            env.append((key, value))
    networks = _obj(_obj(obj.get("NetworkSettings")).get("Networks"))
    addresses = [_str(_obj(n).get("IPAddress")) for n in networks.values()]
    addresses.append(_str(_obj(obj.get("NetworkSettings")).get("IPAddress")))
    labels = _obj(config.get("Labels"))
    port_label = _str(labels.get(LABEL_SSHD_PORT))
    return ExecFacts(
        container_id=_str(obj.get("Id")),
        running=state.get("Running") is True,
        started_at=_str(state.get("StartedAt")),
        user=_str(config.get("User")),
        workdir=_str(config.get("WorkingDir")),
        env=tuple(env),
        hostname=_str(config.get("Hostname")),
        network_mode=_str(_obj(obj.get("HostConfig")).get("NetworkMode")),
        addresses=tuple(dict.fromkeys(a for a in addresses if _ipv4(a))),
        sshd_port=int(port_label) if port_label.isdigit() else None,
    )


def exec_env(
    facts: ExecFacts, runtime: ContainerRuntime, extra: Mapping[str, str]
) -> dict[str, str]:
    """The environment `RUNTIME exec` gives a command in this container, plus
    the command's own `extra` (the cluster's env, `exec --env`): docker puts
    its default PATH and the container's HOSTNAME first, then the container's
    Env (the image's ENV, container.env, cvs's visible-devices variables);
    podman keeps all of that in the container's Env itself, to which its
    `inspect` adds HOSTNAME (the container's hostname) that its exec does
    not give (podman 4.3, seen on the sandbox): dropped when it is that one."""
    env: dict[str, str] = {}
    if runtime.exec_sets_path_and_hostname:
        env["PATH"] = DEFAULT_PATH
        if facts.hostname:
            env["HOSTNAME"] = facts.hostname
    env.update(facts.env)
    if not runtime.exec_sets_path_and_hostname and env.get("HOSTNAME") == facts.hostname:
        del env["HOSTNAME"]
    env.update(extra)
    return env


def ssh_command(
    command: str | Sequence[str],
    env: Mapping[str, str],
    *,
    workdir: str,
    runtime: str = "docker",
    token: str | None = None,
) -> ContainerCommand:
    """Shell text for the container's sshd (its login shell reads it), the
    kill for a timeout, and stdin (the env block): remote/ssh_run.sh, then
    remote/run.sh as on the docker path, in one shell."""
    if not WORKDIR_RE.fullmatch(workdir):
        raise ValueError(f"invalid working directory {workdir!r} (an absolute path)")
    token = token or secrets.token_hex(6)
    pidfile = pidfile_of(token)
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    env_token = new_token()
    # exits as `RUNTIME exec -w DIR` would when DIR cannot be entered
    no_workdir = str(ContainerRuntime.unprobed(runtime).no_workdir_exit)
    script = shlex.join(remote.argv("ssh_run", workdir, no_workdir, pidfile, env_token, *argv))
    kill = shlex.join(remote.argv("kill_tree", pidfile))
    return ContainerCommand(script, kill, env_block(env, env_token))


def read_keys(state_dir: Path, hosts: Sequence[str]) -> tuple[asyncssh.SSHKey, dict[str, str]]:
    """The cluster's user key and each host's sshd public key (`ssh-ed25519
    AAAA`), as `cvs up` left them; nothing is created (OSError, ValueError
    when they are missing or unreadable)."""
    keys_dir = state_dir / "keys"
    user = asyncssh.import_private_key((keys_dir / USER_KEY_FILE).read_text())
    public: dict[str, str] = {}
    for host in hosts:
        path = keys_dir / "hosts" / f"{host}_ed25519.pub"
        if path.is_file():
            public[host] = " ".join(path.read_text().split()[:2])
    return user, public


async def _warm(
    pool: SSHPool | WorkerRunner,
    ep: Endpoint,
    scope: anyio.CancelScope,
    ended: anyio.Event,
) -> None:
    """`pool.warm(ep)` within `scope`; `ended` set however it ends.
    Never raises: a failure here is nobody's (the command that needs the
    connection tries again), and a task of the pool's group that raised
    would cancel the group's owner."""
    try:
        with scope, contextlib.suppress(Exception):
            await pool.warm(ep)
    finally:
        ended.set()


class SSHExec:
    """The sshd path of one invocation (one `Cluster`): the facts read once
    per host, the route each host's commands take (decided once, shown under
    `-v`), and which hosts went back to `docker exec`. The connections are
    the pool's (`SSHPool.use_container_key`)."""

    def __init__(
        self,
        config: ClusterConfig,
        pool: SSHPool | WorkerRunner,
        sink: EventSink,
        invocation: Invocation | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.sink = sink
        self._host_keys: dict[str, str] = {}
        # The containers' exec facts are this invocation's (containers/invocation.py).
        self.invocation = invocation or Invocation()
        self.off: dict[str, Text] = {}  # host -> why it takes docker exec (said once)
        self._worked: set[str] = set()  # hosts where a command ran through the sshd
        # warm_up's connects, in the pool's background group: each one's scope
        # (cancelled on close) and its end.
        self._warming: dict[str, tuple[anyio.CancelScope, anyio.Event]] = {}
        # (host, user, workdir) -> the way decided (containers/route.py).
        self._routes: dict[tuple[str, str | None, str | None], Route] = {}
        self._shown: dict[str, Route] = {}  # host -> the route last said under -v
        # No keys yet: a first cold start makes them, in this same invocation.
        self._keys_missing = False
        self._enabled = False
        self.enabled = self._start()

    @property
    def enabled(self) -> bool:
        """Whether this path is open (tests close it to compare the two)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value
        self._routes.clear()  # decided with the path open, or closed: decide again

    def _on(self) -> bool:
        """Whether this path is open; keys a cold start of this invocation made
        since are read on the next command (until then, `docker exec`)."""
        if not self.enabled and self._keys_missing:
            self.enabled = self._start()
        return self.enabled

    def _start(self) -> bool:
        container = self.config.container
        if container is None or not container.sshd.exec:
            return False
        if not sshd_wanted(container, len(self.config.hosts)):
            return False
        try:
            key, self._host_keys = read_keys(
                default_state_dir(self.config), [h.name for h in self.config.hosts]
            )
        except (OSError, ValueError):  # asyncssh's KeyImportError is a ValueError
            self._keys_missing = True
            return False  # no keys here (yet): this state directory never brought it up
        self._keys_missing = False
        # The pool opens the containers' connections (in the hosts' workers
        # when there are workers) and closes them with its own.
        self.pool.use_container_key(key)
        return True

    @property
    def counters(self) -> Counters:
        """What the pool's container connections did (all workers' summed)."""
        return self.pool.container_counters

    def _closed(self) -> Text | None:
        """Why this invocation has no sshd path (None: it has one)."""
        if self._on():
            return None
        container = self.config.container
        if container is None or not container.sshd.exec:
            return "the cluster file turns the sshd path off (sshd.exec: false)"
        if not sshd_wanted(container, len(self.config.hosts)):
            return "its containers run no sshd (sshd.enabled, or one host)"
        if self._keys_missing:
            return "this cluster's keys are not in its state directory"
        return "the sshd path is closed in this invocation"

    async def aclose(self) -> None:
        for scope, _ in self._warming.values():
            scope.cancel()
        # Each ends at its next checkpoint: bounded all the same.
        with anyio.CancelScope(shield=True), anyio.move_on_after(WARM_END_BOUND):
            for _, ended in self._warming.values():
                await ended.wait()

    def _fall_back(self, host: str, why: Text, runtime: ContainerRuntime) -> None:
        if host in self.off:
            return
        self.off[host] = why
        for key in [k for k in self._routes if k[0] == host]:
            del self._routes[key]  # decided again: the runtime, for `why`
        text = Phrase(  # the renderers put the host first
            why,
            f"; commands in its container go through `{runtime.name} exec` "
            "for the rest of this invocation",
        )
        self.sink.emit(Message(level="warning", host=host, text=text))

    async def _read_facts(self, host: str, runtime: ContainerRuntime) -> ExecFacts | None:
        assert self.config.container is not None
        name = container_name(self.config)
        result = await self.pool.run(
            host,
            facts_command(name, runtime),
            timeout=self.config.container.runtime_timeout,
            stream_output=False,
            label="inspect",
        )
        if not result.ok:
            return None
        try:
            return parse_exec_facts(result.stdout)
        except ValueError:
            return None

    def warm_up(self, hosts: Sequence[str]) -> None:
        """Start connecting to these hosts' container sshds now, in the
        background, while the caller's lock and probe round trip runs: the
        route the cluster file implies (its network, sshd.port, its user),
        decided as for a command. A command whose facts say otherwise connects
        anew; a container that is not there (a cold start) costs a refused
        connection, said nowhere."""
        container = self.config.container
        if container is None or self._closed() is not None:
            return
        expected = ExecFacts(
            container_id="",
            running=True,
            started_at="",
            user=container.user or "",
            workdir="",
            env=(),
            hostname="",
            network_mode=container.network,
            addresses=(),  # on a bridge the address comes with the probe's facts
            sshd_port=None,
        )
        # A pool outside `async with` (or a runner with no such group: the
        # scripted fake) runs nothing in the background.
        background = getattr(self.pool, "background", None)
        if background is None:
            return
        for host in hosts:
            if host in self._warming:
                continue
            way = decide(
                RouteFacts(
                    closed=None,
                    off=self.off.get(host),
                    container=expected,
                    host_key=self._host_keys.get(host),
                    user=None,
                    workdir=None,
                    default_port=container.sshd.port,
                )
            )
            if isinstance(way, Sshd):
                scope, ended = self._warming[host] = anyio.CancelScope(), anyio.Event()
                ep = self.endpoint(host, way)
                background.start_soon(_warm, self.pool, ep, scope, ended)

    async def _warmed(self, host: str) -> None:
        """Until `host`'s warm-up (if any) has ended; a caller cancelled
        meanwhile leaves it running for the next."""
        warming = self._warming.get(host)
        if warming is not None:
            await warming[1].wait()

    def known(self, host: str, facts: ExecFacts | None) -> None:
        """Facts read under this invocation's lock (the probe's inspect): no
        inspect of its own for this host."""
        self.invocation.known(host, facts)

    async def facts(self, host: str, runtime: ContainerRuntime) -> ExecFacts | None:
        """The container's facts, read once per invocation (None: unreadable)."""
        return await self.invocation.exec_facts(host, lambda: self._read_facts(host, runtime))

    def endpoint(self, host: str, way: Sshd) -> Endpoint:
        """The target `way` names, for the pool's seam."""
        container_id = way.container.container_id
        return Endpoint(host, way.address, way.port, way.user, way.host_key, container_id)

    async def route(
        self,
        host: str,
        runtime: ContainerRuntime,
        user: str | None,
        workdir: str | None = None,
    ) -> Route:
        """The way a command run as `user` in `workdir` takes into `host`'s
        container (containers/route.py decides), decided once per invocation
        and said under `-v` when it is new for the host. Inspects the
        container once, when the path is open."""
        closed = self._closed()
        key = (host, user, workdir)
        way = self._routes.get(key)
        if way is None:
            off = self.off.get(host)
            facts = await self.facts(host, runtime) if closed is None and off is None else None
            assert self.config.container is not None
            way = decide(
                RouteFacts(
                    closed=closed,
                    off=off,
                    container=facts,
                    host_key=self._host_keys.get(host),
                    user=user,
                    workdir=workdir,
                    default_port=self.config.container.sshd.port,
                )
            )
            self._routes[key] = way
            self._show(host, way, runtime)
        if isinstance(way, Sshd):
            await self._warmed(host)
        return way

    def _show(self, host: str, way: Route, runtime: ContainerRuntime) -> None:
        """`-v`'s line for `host`'s route, when it is not the one said last."""
        if self._shown.get(host) == way:
            return
        self._shown[host] = way
        detail: Text = (
            str(way) if isinstance(way, Sshd) else Phrase(f"via `{runtime.name} exec`: ", way.why)
        )
        self.sink.emit(HostStep(host=host, step="route", status="ok", detail=detail))

    async def _started(
        self,
        host: str,
        runtime: ContainerRuntime,
        facts: ExecFacts,
        start: Callable[[], Awaitable[_T]],
    ) -> _T | RuntimeExec:
        """`start()` (a command through the sshd), or the way it takes instead
        when it could not start: a connection that had worked is opened again
        once, else the host goes to `docker exec` with one warning (nothing
        said, and for this command only, when the host itself was not
        reached: the docker path reports that)."""
        was_open = host in self._worked
        for attempt in (1, 2):
            try:
                started = await start()
                self._worked.add(host)
                return started
            except NotStarted as exc:
                if exc.kind == "host":
                    return RuntimeExec(exc.reason)
                if attempt == 1 and was_open and exc.kind == "refused":
                    continue  # the connection had worked: open it again, once
                why = await self._why(host, runtime, facts, exc, was_open)
                self._fall_back(host, why, runtime)
                return RuntimeExec(why)
        raise AssertionError("unreachable: the second attempt returns")

    async def run(
        self,
        way: Sshd,
        host: str,
        command: str | Sequence[str],
        *,
        runtime: ContainerRuntime,
        env: Mapping[str, str],
        timeout: float | None,
        label: str = "exec",
        token: str | None = None,
        io: ExecIO | None = None,
    ) -> HostResult | RuntimeExec:
        """Run `command` in `host`'s container the way `route` gave (its
        sshd, as its user, in its working directory); a RuntimeExec when it
        could not start there: the way it takes instead (this command, or the
        rest of the invocation, as the module's header says). `token` names
        its pidfile (exec.pidfile_of), which a diagnosis reads
        (containers/causes.py), and which the kill reads when cvs gives up on
        the command: through the host's runtime (`RUNTIME exec -u 0 NAME
        kill_tree.sh`), so that it works when the connection to the sshd is
        what was lost. `io`: stdin, raw output."""
        token = token or secrets.token_hex(6)
        cmd = ssh_command(
            command,
            exec_env(way.container, runtime, env),
            workdir=way.workdir,
            runtime=runtime.name,
            token=token,
        )
        kill = kill_command(container_name(self.config), pidfile_of(token), runtime)
        request = Request(cmd.script, timeout, cmd.stdin, label=label, on_timeout=kill, io=io)
        ep = self.endpoint(host, way)
        return await self._started(
            host, runtime, way.container, lambda: self.pool.send(ep, request)
        )

    async def held_process(
        self,
        stack: contextlib.AsyncExitStack[Any],
        way: Sshd,
        host: str,
        argv: Sequence[str],
        *,
        runtime: ContainerRuntime,
        label: str = "cp",
    ) -> asyncssh.SSHClientProcess[bytes] | RuntimeExec:
        """`argv` in `host`'s container the way `route` gave, as a process whose
        bytes the caller streams (a copy's in-container end), held open until
        `stack` closes (the container's user, its environment and working
        directory: what `docker exec -i NAME ARGV` gives); a RuntimeExec when
        it could not start there, as for `run`."""
        env = exec_env(way.container, runtime, {})
        cmd = ssh_command(argv, env, workdir=way.workdir, runtime=runtime.name)
        ep = self.endpoint(host, way)
        held = HeldRequest(cmd.script, None, cmd.stdin or "", label, cmd.kill)
        return await self._started(
            host,
            runtime,
            way.container,
            lambda: stack.enter_async_context(self.pool.held_process(ep, held)),
        )

    async def _why(
        self,
        host: str,
        runtime: ContainerRuntime,
        before: ExecFacts,
        exc: NotStarted,
        was_open: bool,
    ) -> Text:
        """`exc`'s reason, with what the runtime says happened to the container
        since the facts were read (only when a working connection was lost)."""
        if not was_open:
            return exc.reason
        now = await self._read_facts(host, runtime)
        if now is None:
            return Phrase(exc.reason, " (and the container could not be inspected)")
        if now.container_id != before.container_id:
            return Phrase(exc.reason, f": the container was replaced (now {now.container_id[:12]})")
        if not now.running:
            return Phrase(exc.reason, ": the container is not running")
        if now.started_at != before.started_at:
            self.invocation.reread(host, now)
            return Phrase(
                exc.reason,
                f": the container restarted at {now.started_at} (its sshd did not come back; ",
                Call("up"),
                " starts it)",
            )
        return Phrase(exc.reason, ": its sshd stopped (the container still runs)")
