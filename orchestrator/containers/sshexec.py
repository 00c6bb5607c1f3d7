"""Commands in the containers through their own sshd, when it runs.

`docker exec` costs a docker CLI, dockerd, containerd, a shim and a fresh
runc on the host for every command (75-90 ms for `true` on two sandbox
hosts). A container of a multi-host cluster already runs an sshd with keys
cvs made: a channel on a connection to it costs what a host channel costs.
So `Cluster.exec` (and whatever runs on it: `cvs exec`, suite steps, the
CVS-compatible engine) asks `SSHExec.run` first, and takes the `docker exec`
path (containers/exec.py) when it answers None; a copy (containers/copy.py)
asks `SSHExec.held_process` for its in-container end the same way, else
takes `docker exec -i`.

Which path, decided from facts (pure functions below, `login_user` and
`sshd_address`):

- the cluster runs no sshd (`sshd.enabled: false`, one host), this cluster's
  keys are not in its state directory, the container's network has no
  address the host can reach: `docker exec`, nothing said;
- the command's user is neither root nor the user the sshd lets in (the
  image's USER, or container.user), or names a group (`-u name:group`):
  `docker exec` for that command, nothing said;
- the sshd does not answer, refuses the key, or offers another host key
  (refused, never learned): `docker exec` for the rest of the invocation on
  that host, and one warning saying why.

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

import asyncio
import contextlib
import json
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from orchestrator import remote
from orchestrator.config import ClusterConfig, container_name, sshd_wanted
from orchestrator.config.model import WORKDIR_RE
from orchestrator.containers.docker import LABEL_SSHD_PORT, validate_container_name
from orchestrator.containers.exec import ContainerCommand, kill_command, pidfile_of
from orchestrator.errors import Call, Phrase, Text
from orchestrator.events import EventSink, Message
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.envpass import env_block, new_token
from orchestrator.ssh.stdin import ExecIO

if TYPE_CHECKING:
    import asyncssh

    from orchestrator.ssh.container_channel import ContainerConnections, Endpoint, NotStarted
    from orchestrator.ssh.transport import SSHPool
    from orchestrator.ssh.workers.runner import WorkerContainerConnections, WorkerRunner

_T = TypeVar("_T")

# What docker puts first in an exec's environment when the image sets no PATH
# (the daemon's `CreateDaemonEnvironment`); HOSTNAME is the container's.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IPV4_RE_PARTS = 4


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
    import asyncssh

    from orchestrator.ssh.keys import USER_KEY_FILE

    keys_dir = state_dir / "keys"
    user = asyncssh.import_private_key((keys_dir / USER_KEY_FILE).read_text())
    public: dict[str, str] = {}
    for host in hosts:
        path = keys_dir / "hosts" / f"{host}_ed25519.pub"
        if path.is_file():
            public[host] = " ".join(path.read_text().split()[:2])
    return user, public


class SSHExec:
    """The sshd path of one invocation (one `Cluster`): the facts read once
    per host, the connections, and which hosts went back to `docker exec`."""

    def __init__(
        self, config: ClusterConfig, pool: SSHPool | WorkerRunner, sink: EventSink
    ) -> None:
        self.config = config
        self.pool = pool
        self.sink = sink
        self.connections: ContainerConnections | WorkerContainerConnections | None = None
        self._host_keys: dict[str, str] = {}
        self._facts: dict[str, ExecFacts | None] = {}
        self._facts_lock: dict[str, anyio.Lock] = {}
        self.off: dict[str, Text] = {}  # host -> why it takes docker exec (said once)
        self._worked: set[str] = set()  # hosts where a command ran through the sshd
        self._warming: dict[str, asyncio.Task[bool]] = {}  # warm_up's connects
        # No keys yet: a first cold start makes them, in this same invocation.
        self._keys_missing = False
        self.enabled = self._start()

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
        from orchestrator.ssh.container_channel import ContainerConnections
        from orchestrator.ssh.keys import default_state_dir
        from orchestrator.ssh.workers.runner import WorkerRunner

        try:
            key, self._host_keys = read_keys(
                default_state_dir(self.config), [h.name for h in self.config.hosts]
            )
        except (OSError, ValueError):  # asyncssh's KeyImportError is a ValueError
            self._keys_missing = True
            return False  # no keys here (yet): this state directory never brought it up
        self._keys_missing = False
        if isinstance(self.pool, WorkerRunner):
            # Worker processes: each opens its hosts' containers' connections.
            self.connections = self.pool.container_connections(key.export_private_key())
        else:
            self.connections = ContainerConnections(self.pool, key, sink=self.sink)
        return True

    async def aclose(self) -> None:
        for task in self._warming.values():
            task.cancel()
        for task in self._warming.values():
            with contextlib.suppress(BaseException):
                await task
        if self.connections is not None:
            await self.connections.aclose()

    def _fall_back(self, host: str, why: Text, runtime: ContainerRuntime) -> None:
        if host in self.off:
            return
        self.off[host] = why
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
        endpoint the cluster file implies (host networking, sshd.port, root or
        container.user). A command whose facts say otherwise connects anew;
        a container that is not there (a cold start) costs a refused
        connection, said nowhere."""
        container = self.config.container
        if not self._on() or self.connections is None or container is None:
            return
        if container.network != "host":
            return  # the address comes with the probe's facts
        user = container.user or "root"
        if user in ("0", "root"):
            user = "root"
        elif ":" in user or user.isdigit():
            return
        from orchestrator.ssh.container_channel import Endpoint

        loop = asyncio.get_running_loop()
        for host in hosts:
            key = self._host_keys.get(host)
            if key is None or host in self.off or host in self._warming:
                continue
            ep = Endpoint(host, "127.0.0.1", container.sshd.port, user, key)
            self._warming[host] = loop.create_task(self.connections.warm(ep))

    async def _warmed(self, host: str) -> None:
        task = self._warming.get(host)
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def known(self, host: str, facts: ExecFacts | None) -> None:
        """Facts read under this invocation's lock (the probe's inspect): no
        inspect of its own for this host."""
        if facts is not None and host not in self._facts:
            self._facts[host] = facts

    async def facts(self, host: str, runtime: ContainerRuntime) -> ExecFacts | None:
        """The container's facts, read once per invocation (None: unreadable)."""
        if host not in self._facts:
            async with self._facts_lock.setdefault(host, anyio.Lock()):
                if host not in self._facts:
                    self._facts[host] = await self._read_facts(host, runtime)
        return self._facts[host]

    def endpoint(self, host: str, facts: ExecFacts, username: str) -> Endpoint | None:
        container = self.config.container
        address = sshd_address(facts)
        key = self._host_keys.get(host)
        if container is None or address is None or key is None:
            return None
        from orchestrator.ssh.container_channel import Endpoint

        port = facts.sshd_port or container.sshd.port
        return Endpoint(host, address, port, username, key, facts.container_id)

    async def _route(
        self, host: str, runtime: ContainerRuntime, user: str | None
    ) -> tuple[ExecFacts, Endpoint] | None:
        """The container's facts and its sshd's endpoint for a command run as
        `user`; None: this one takes `docker exec` (as the module's header says)."""
        if not self._on() or host in self.off or self.connections is None:
            return None
        facts = await self.facts(host, runtime)
        if facts is None or not facts.running:
            return None  # the docker path reports it, as it always did
        username = login_user(user, facts)
        ep = self.endpoint(host, facts, username) if username is not None else None
        if ep is None:
            return None
        await self._warmed(host)
        return facts, ep

    async def _started(
        self,
        host: str,
        runtime: ContainerRuntime,
        facts: ExecFacts,
        start: Callable[[], Awaitable[_T]],
    ) -> _T | None:
        """`start()` (a command through the sshd); None when it could not
        start: a connection that had worked is opened again once, else the
        host goes to `docker exec` with one warning (nothing said when the
        host itself was not reached: the docker path reports that)."""
        from orchestrator.ssh.container_channel import NotStarted

        was_open = host in self._worked
        for attempt in (1, 2):
            try:
                started = await start()
                self._worked.add(host)
                return started
            except NotStarted as exc:
                if exc.kind == "host":
                    return None
                if attempt == 1 and was_open and exc.kind == "refused":
                    continue  # the connection had worked: open it again, once
                why = await self._why(host, runtime, facts, exc, was_open)
                self._fall_back(host, why, runtime)
                return None
        return None

    async def run(
        self,
        host: str,
        command: str | Sequence[str],
        *,
        runtime: ContainerRuntime,
        env: Mapping[str, str],
        user: str | None,
        workdir: str | None,
        timeout: float | None,
        label: str = "exec",
        token: str | None = None,
        io: ExecIO | None = None,
    ) -> HostResult | None:
        """Run `command` in `host`'s container through its sshd; None: take
        `docker exec` (this command, or the rest of the invocation, as the
        module's header says). `token` names its pidfile (exec.pidfile_of),
        which a diagnosis reads (containers/causes.py), and which the kill
        reads when cvs gives up on the command: through the host's runtime
        (`RUNTIME exec -u 0 NAME kill_tree.sh`), so that it works when the
        connection to the sshd is what was lost. `io`: stdin, raw output."""
        route = await self._route(host, runtime, user)
        if route is None or self.connections is None:
            return None
        facts, ep = route
        token = token or secrets.token_hex(6)
        cmd = ssh_command(
            command,
            exec_env(facts, runtime, env),
            workdir=workdir or facts.workdir or "/",
            runtime=runtime.name,
            token=token,
        )
        kill = kill_command(container_name(self.config), pidfile_of(token), runtime)
        bound = self.config.ssh.command_timeout if timeout is None else timeout
        connections = self.connections
        options: dict[str, Any] = {"timeout": bound, "input": cmd.stdin, "label": label}
        if io is not None:
            options["io"] = io  # only then: worker processes take no `io` (api.py)
        return await self._started(
            host,
            runtime,
            facts,
            lambda: connections.run(ep, cmd.script, on_timeout=kill, **options),
        )

    async def held_process(
        self,
        stack: contextlib.AsyncExitStack,
        host: str,
        argv: Sequence[str],
        *,
        runtime: ContainerRuntime,
        label: str = "cp",
    ) -> asyncssh.SSHClientProcess[bytes] | None:
        """`argv` in `host`'s container through its sshd as a process whose
        bytes the caller streams (a copy's in-container end), held open until
        `stack` closes; None: take `docker exec -i` instead, decided as for
        `run` (the container's user, its environment and working directory,
        what `docker exec -i NAME ARGV` gives)."""
        route = await self._route(host, runtime, None)
        if route is None or self.connections is None:
            return None
        facts, ep = route
        try:
            env = exec_env(facts, runtime, {})
            cmd = ssh_command(argv, env, workdir=facts.workdir or "/", runtime=runtime.name)
        except ValueError:
            return None  # a working directory not ours to quote: docker exec takes it
        connections = self.connections
        return await self._started(
            host,
            runtime,
            facts,
            lambda: stack.enter_async_context(
                connections.held_process(
                    ep, cmd.script, stdin=cmd.stdin or "", label=label, on_end=cmd.kill
                )
            ),
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
            self._facts[host] = now
            return Phrase(
                exc.reason,
                f": the container restarted at {now.started_at} (its sshd did not come back; ",
                Call("up"),
                " starts it)",
            )
        return Phrase(exc.reason, ": its sshd stopped (the container still runs)")
