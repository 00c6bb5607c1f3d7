"""Connections to the containers' own sshd, tunnelled through the hosts'.

Every container of a multi-host cluster runs an sshd with a host key and an
authorized user key that cvs made (ssh/keys.py, containers/provision.py). A
command run over a channel of a connection to it costs what a host channel
costs; `docker exec` costs a docker CLI, dockerd, containerd, a shim and a
fresh runc on the host (containers/exec.py).

`ContainerConnections` opens at most one connection per container (and login
user) per invocation, as a `direct-tcpip` channel of the host's existing
connection (`SSHPool.link`) to the sshd's address and port *as the host sees
them*: 127.0.0.1 with host networking, the container's address on a bridge.
No port has to be open to the coordinator, and nothing new is listening.

The host key is checked against the one key cvs gave that container, and
nothing else: a different key is refused (`host_key`), never learned.

What this module does not know is what a container is: the command text, the
endpoint and what to do when the sshd cannot be reached are the caller's
(containers/sshexec.py). A command that could not start (no connection, the
channel refused) raises `NotStarted`, so the caller may take another path;
once started, the result says how it ended, as `SSHPool.send`'s does: both
take the same `Request` (ssh/seam.py).
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import anyio
import asyncssh

from orchestrator.errors import Call, Option, Phrase, Text
from orchestrator.events import CommandFinished, EventSink, NullSink, started
from orchestrator.results import HostResult, Status
from orchestrator.ssh import hooks
from orchestrator.ssh.seam import HeldRequest, Request
from orchestrator.ssh.segments import coalesce_writes
from orchestrator.ssh.session import (
    PREFERRED_CIPHERS,
    CommandSession,
    fed_until_closed,
    keepalive_while_waiting,
)
from orchestrator.ssh.stdin import ExecIO
from orchestrator.ssh.target import ConnectKind, Counters, Endpoint, NotStarted

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

# How long ending a command's processes through the host may take (a
# `RUNTIME exec` of kill_tree.sh: its TERM, 0.3 s, then KILL).
KILL_BOUND = 10.0


@dataclass
class _Link:
    conn: asyncssh.SSHClientConnection
    endpoint: Endpoint
    channels: anyio.Semaphore
    control: anyio.Semaphore
    active: int = 0


_T = TypeVar("_T")

# Reads answered after a login (_Reads.to_answer): its three writes.
_ANSWERED_READS = 3


class _Reads:
    """The reads of one tunnelled connection, counted, and the count when its
    login succeeded."""

    def __init__(self) -> None:
        self.count = 0
        self.at_login: int | None = None
        self.wrote = False  # during the read being handled

    def to_answer(self) -> bool:
        """Whether this read is one of the first after the login, which are
        answered (with an SSH_MSG_IGNORE when nothing else was written).

        After a login OpenSSH's sshd writes three times (the login's success,
        then its host keys and the `debug` messages of the authorized_keys
        line's options), with TCP_NODELAY off: each write waits for the
        previous one to be acknowledged, and the host's kernel, relaying,
        delays that by 40 ms unless the host's sshd writes to it first. So
        each of those reads is answered: without it, a 2-host attach waited
        40 ms here for its first command (tcpdump)."""
        return self.at_login is not None and 0 < self.count - self.at_login <= _ANSWERED_READS


class _LoginNoted(asyncssh.SSHClient):
    def __init__(self, reads: _Reads) -> None:
        self._reads = reads

    def auth_completed(self) -> None:
        self._reads.at_login = self._reads.count


class _CoalescingTunnel:
    """The host's connection as asyncssh's `tunnel`, with the tunnelled
    connection's writes gathered into one channel message per turn of the
    event loop.

    asyncssh writes an SSH_MSG_IGNORE ahead of every packet, as a write of its
    own: through a `direct-tcpip` channel each write is a message the host's
    sshd writes to the container's sshd as a segment of its own, on a socket
    without TCP_NODELAY. The second segment then waits for the container's
    kernel to acknowledge the first, which it delays by 40 ms: measured here,
    a 40-50 ms stall on most round trips right after connecting, and on some
    later ones. One write per turn makes one segment."""

    def __init__(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn
        self.reads = _Reads()

    async def create_connection(
        self, session_factory: Callable[[], Any], remote_host: str, remote_port: int
    ) -> Any:
        reads = self.reads

        def factory() -> Any:
            session = session_factory()
            made = session.connection_made
            received = session.data_received

            def connection_made(chan: Any) -> None:
                coalesce_writes(chan, (asyncssh.Error, OSError))
                write = chan.write

                def noted(data: bytes) -> None:
                    reads.wrote = True
                    write(data)

                chan.write = noted
                made(chan)

            def data_received(data: bytes, datatype: Any = None) -> None:
                reads.count += 1  # before: a login noted in this read counts it
                reads.wrote = False
                received(data, datatype)
                if reads.to_answer() and not reads.wrote:
                    with contextlib.suppress(asyncssh.Error, OSError):
                        hooks.send_ignore(session)

            session.connection_made = connection_made
            session.data_received = data_received
            return session

        return await self._conn.create_connection(factory, remote_host, remote_port)


def _kind(exc: BaseException) -> ConnectKind:
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return "host_key"
    if isinstance(exc, asyncssh.PermissionDenied):
        return "auth"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, asyncssh.ChannelOpenError | ConnectionRefusedError):
        return "refused"
    if isinstance(exc, asyncssh.Error):
        return "protocol"
    return "refused"


def _reason(exc: BaseException, ep: Endpoint, timeout: float) -> Text:
    where = f"the container's sshd ({ep.address}:{ep.port} on {ep.host})"
    kind = _kind(exc)
    if kind == "host_key":
        return Phrase(
            f"{where} offered a host key other than the one cvs gave it: refused "
            "(the container was replaced or reprovisioned by someone else; ",
            Call("up", (Option("reprovision"),)),
            " installs this cluster's keys again)",
        )
    if kind == "auth":
        return f"{where} refused the cluster key for user {ep.username}"
    if kind == "timeout":
        return f"{where} did not answer within {timeout:g}s"
    text = exc.reason if isinstance(exc, asyncssh.Error) else str(exc)
    return f"{where} could not be reached: {text or type(exc).__name__}"


class HostConnection(Protocol):
    """A host's connection, which a container's is tunnelled through."""

    conn: asyncssh.SSHClientConnection


class Hosts(Protocol):
    """What the container connections need of the hosts' (SSHPool, their owner)."""

    cluster: ClusterConfig
    output_tail: int

    async def link(self, host: str) -> HostConnection: ...

    def host_open(self, host: str) -> bool: ...

    async def run_control(self, host: str, script: str, *, bound: float = 5.0) -> str | None: ...


class ContainerConnections:
    """At most one connection per container (and login user) for an
    invocation, owned by the pool of its hosts' connections (`SSHPool`)."""

    def __init__(
        self,
        pool: Hosts,
        client_key: asyncssh.SSHKey,
        *,
        sink: EventSink | None = None,
    ) -> None:
        self.pool = pool
        self.sink: EventSink = sink or NullSink()
        self._key = client_key
        self._links: dict[tuple[str, str], _Link] = {}
        self._locks: dict[tuple[str, str], anyio.Lock] = {}
        self.counters = Counters()
        ssh = pool.cluster.ssh
        # A container's sshd is one hop past a host already reached: it answers
        # at once or not at all, so a short bound, never more than the host's.
        self.connect_timeout = min(ssh.connect_timeout, 5.0)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            links = list(self._links.values())
            self._links.clear()
            for link in links:
                link.conn.close()
            for link in links:
                with anyio.move_on_after(2), contextlib.suppress(Exception):
                    await link.conn.wait_closed()

    def use_key(self, client_key: asyncssh.SSHKey) -> None:
        """The key connections opened from now on log in with (a cold start
        of this invocation made the cluster's keys since)."""
        self._key = client_key

    def drop(self, ep: Endpoint) -> None:
        """Forget (and close) the connection to `ep`'s container."""
        link = self._links.pop((ep.host, ep.username), None)
        if link is not None:
            link.conn.close()

    async def _link(self, ep: Endpoint, counted: bool = True) -> _Link:
        key = (ep.host, ep.username)
        link = self._links.get(key)
        if link is not None and not link.conn.is_closed() and link.endpoint == ep:
            return link
        async with self._locks.setdefault(key, anyio.Lock()):
            link = self._links.get(key)
            if link is not None and not link.conn.is_closed() and link.endpoint == ep:
                return link
            if link is not None:
                self._links.pop(key, None)
                link.conn.close()
                self.counters.closed_links += 1
            conn = await self._connect(ep, counted)
            work = max(1, self.pool.cluster.ssh.max_channels - 1)
            link = _Link(conn, ep, anyio.Semaphore(work), anyio.Semaphore(1))
            self._links[key] = link
            return link

    async def connection(self, ep: Endpoint) -> asyncssh.SSHClientConnection:
        """The connection to `ep`'s container that commands take, opened once
        per invocation. Raises NotStarted."""
        return (await self._link(ep)).conn

    async def warm(self, ep: Endpoint, bound: float = 2.0) -> bool:
        """Open the connection to `ep` ahead of its first command, and make its
        first round trip (the first after a handshake waits on the peers'
        delayed acknowledgements, 40-50 ms here); False when it could not.
        A failure here is nobody's: the command that needs it tries again."""
        try:
            link = await self._link(ep, counted=False)
            # A round trip that runs nothing in the container (this runs
            # before the caller holds its lock): ssh/hooks.py.
            with anyio.move_on_after(bound), contextlib.suppress(asyncssh.Error, OSError):
                await hooks.round_trip(link.conn)
        except NotStarted:
            return False
        return True

    async def _connect(self, ep: Endpoint, counted: bool = True) -> asyncssh.SSHClientConnection:
        try:
            host_link = await self.pool.link(ep.host)
        except Exception as exc:
            raise NotStarted(ep.host, "host", f"host not reached: {exc}") from None
        pattern = ep.address if ep.port == 22 else f"[{ep.address}]:{ep.port}"
        known = asyncssh.import_known_hosts(f"{pattern} {ep.host_key}\n")
        try:
            with anyio.fail_after(self.connect_timeout):
                tunnel = _CoalescingTunnel(host_link.conn)
                conn = await asyncssh.connect(
                    ep.address,
                    ep.port,
                    tunnel=tunnel,
                    client_factory=functools.partial(_LoginNoted, tunnel.reads),
                    username=ep.username,
                    client_keys=[self._key],
                    known_hosts=known,
                    agent_path=None,
                    config=None,
                    connect_timeout=self.connect_timeout,
                    keepalive_interval=0,
                    keepalive_count_max=self.pool.cluster.ssh.keepalive_count,
                    encryption_algs=PREFERRED_CIPHERS,
                    compression_algs=["none"],
                )
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            kind = _kind(exc)
            if counted:
                self.counters.failures[kind] = self.counters.failures.get(kind, 0) + 1
            raise NotStarted(ep.host, kind, _reason(exc, ep, self.connect_timeout)) from None
        self.counters.connects += 1
        return conn

    async def send(self, ep: Endpoint, request: Request) -> HostResult:
        """Run `request` (shell text the login shell reads) in `ep`'s container,
        as `SSHPool.send` runs one on a host: the same `Request`.

        Raises NotStarted when it could not start. Once started, it is the
        caller's: the result's status says how it ended. When cvs gives up on
        it (a timeout, a cancellation, the connection to the sshd lost while
        it ran), the session's process group is signalled and
        `request.on_timeout`, a command for the HOST, runs there on the channel
        its connection keeps for it: that is what ends the command's processes
        in the container (the containers' sshd refuses channel signals for a
        root login, "session signalling requires privilege separation", and a
        lost connection leaves them running), and the result says so.
        `request.io`: stdin fed while it runs, output as bytes (ssh/stdin.py).
        `request.env` is refused: the container's environment travels in
        `input`, as the script it runs reads it (containers/sshexec.py).
        """
        if request.env:
            raise ValueError("a container endpoint takes its environment in the input")
        start = time.monotonic()
        text, label, io = request.text, request.label, request.io or ExecIO()
        timeout = request.timeout
        if timeout is None:
            timeout = self.pool.cluster.ssh.command_timeout
        kill = request.on_timeout
        on_timeout = kill if kill is None or isinstance(kill, str) else shlex.join(kill)
        link = await self._link(ep)
        emit = self.sink.emit if request.stream_output else None
        tail = self.pool.output_tail
        raw = io.raw
        async with link.channels:
            chan, client_session = await self._opened(
                ep,
                text,
                label,
                link.conn.create_session(
                    lambda: CommandSession(ep.host, emit, tail, raw), text, encoding=None
                ),
            )
            session = cast(CommandSession, client_session)
            try:
                async with self._waiting_on(link):
                    result = await self._wait(
                        link, chan, session, timeout, request.input, on_timeout, io
                    )
            finally:
                self.counters.open_channels -= 1
        host_result = session.result(*result, start)
        self.sink.emit(CommandFinished(host=ep.host, result=host_result, label=label))
        return host_result

    async def _opened(
        self, ep: Endpoint, text: str, label: str | None, opening: Awaitable[_T]
    ) -> _T:
        """`opening` (a channel on `ep`'s connection for `text`), counted and
        announced; NotStarted, and the connection dropped, when it fails."""
        try:
            opened = await opening
        except (asyncssh.Error, OSError) as exc:
            self.drop(ep)
            raise NotStarted(ep.host, "refused", f"no channel: {exc}") from None
        self.counters.channels += 1
        self.counters.open_channels += 1
        self.sink.emit(started(ep.host, text, label))
        return opened

    @contextlib.asynccontextmanager
    async def held_process(self, ep: Endpoint, held: HeldRequest) -> AsyncIterator[Any]:
        """`held.command` (shell text) in `ep`'s container as a process the
        block streams (a copy's in-container end, in bytes with `encoding`
        None), `held.stdin` written first (an environment block). Raises
        NotStarted, before the block, when it could not start. However the
        block ends, the process ends as `_end_process` says (`on_end`: what
        kills it, run when it has not ended)."""
        link = await self._link(ep)
        text, stdin, on_end = held.text, held.stdin, held.end_text
        async with link.channels:
            process = await self._opened(
                ep,
                text,
                held.label,
                link.conn.create_process(text, encoding=held.encoding, errors="replace"),
            )
            try:
                if stdin:
                    process.stdin.write(stdin.encode() if held.encoding is None else stdin)
                async with self._waiting_on(link):
                    yield process
            finally:
                with anyio.CancelScope(shield=True):
                    await self._end_process(link, process, on_end)
                self.counters.open_channels -= 1

    async def _end_process(
        self, link: _Link, process: asyncssh.SSHClientProcess[Any], on_end: str | None
    ) -> None:
        """A held process's end, as `SSHPool.held_process` ends one under
        `docker exec -i`: its stdin closed (a copy's receiving end then removes
        what it did not finish) and 5 s to exit; what still runs then is
        killed by `on_end` on the channel kept for it, and the channel closed.
        (No channel signal: the containers' sshd refuses them for root
        logins, "session signalling requires privilege separation".)"""
        with contextlib.suppress(asyncssh.Error, OSError):
            with anyio.move_on_after(5):
                process.stdin.write_eof()
                await process.wait_closed()
            if process.exit_status is None and on_end is not None and not link.conn.is_closed():
                with anyio.move_on_after(5):
                    async with link.control:
                        await link.conn.run(on_end, check=False)
        process.close()

    async def _wait(
        self,
        link: _Link,
        chan: asyncssh.SSHClientChannel[bytes],
        session: CommandSession,
        timeout: float,
        input: str | bytes | None,
        on_timeout: str | None,
        io: ExecIO,
    ) -> tuple[Status, int | None, str | None]:
        try:
            with anyio.fail_after(timeout):
                # A command may end before it reads its stdin (a working
                # directory it could not enter): what it did not read is moot.
                with contextlib.suppress(asyncssh.Error, OSError):
                    if input is not None:
                        chan.write(input.encode() if isinstance(input, str) else input)
                await fed_until_closed(chan, session, io.stdin)
        except TimeoutError:
            ended = await self._kill(link, chan, session, on_timeout)
            chan.close()
            return ("timeout", session.exit_code, f"timed out after {timeout:g}s; {ended}")
        except (asyncssh.Error, OSError) as exc:
            return await self._lost(link, exc, on_timeout)
        except BaseException:
            session.discard()  # as SSHPool's: nobody reads it now
            with anyio.CancelScope(shield=True):
                await self._kill(link, chan, session, on_timeout)
                chan.close()
            raise
        if session.lost is not None:
            return await self._lost(link, session.lost, on_timeout)
        code = session.exit_code
        if code is None:
            # Closed without an exit status: the sshd (or the container) went away.
            return await self._lost(link, None, on_timeout)
        return ("ok", 0, None) if code == 0 else ("failed", code, f"exit code {code}")

    async def _lost(
        self, link: _Link, exc: BaseException | None, on_timeout: str | None
    ) -> tuple[Status, int | None, str | None]:
        """A started command whose connection went away: `failed` with no exit
        code while its host still answers (its processes in the container
        ended through the host; the caller asks the runtime why),
        `unreachable` when the host's own connection went too."""
        ep = link.endpoint
        self.drop(ep)
        why = f": {exc}" if exc is not None else ""
        if not self.pool.host_open(ep.host):
            return "unreachable", None, f"connection to {ep.host} lost while running{why}"
        ended = await self._end_on_host(ep.host, on_timeout)
        return (
            "failed",
            None,
            f"the container's sshd closed the connection while the command ran{why}; {ended}",
        )

    async def _end_on_host(self, host: str, on_timeout: str | None) -> str:
        """Run `on_timeout` (the command's kill, for the host) on the host's
        connection: what the result says of the command's processes."""
        if on_timeout is None:
            return "remote process killed"
        with anyio.CancelScope(shield=True):
            said = await self.pool.run_control(host, on_timeout, bound=KILL_BOUND)
        if said is not None and "ended " in said:
            return "its processes in the container were ended through the host"
        if said is not None:
            return "none of its processes was left in the container (looked through the host)"
        return (
            f"its processes in the container could not be ended through the host within "
            f"{KILL_BOUND:g}s (they may still run)"
        )

    def _waiting_on(self, link: _Link) -> contextlib.AbstractAsyncContextManager[None]:
        """Keepalives while a command runs (as SSHPool does for hosts)."""
        return keepalive_while_waiting(link, self.pool.cluster.ssh.keepalive)

    async def _kill(
        self,
        link: _Link,
        chan: asyncssh.SSHClientChannel[bytes],
        session: CommandSession,
        on_timeout: str | None,
    ) -> str:
        """TERM the session's process group, KILL if it lingers, then
        `on_timeout` on the host (`_end_on_host`): what the result says."""
        with contextlib.suppress(asyncssh.Error, OSError):
            chan.send_signal("TERM")
        with anyio.move_on_after(0.5):
            await session.closed.wait()
        if not session.closed.is_set():
            with contextlib.suppress(asyncssh.Error, OSError):
                chan.send_signal("KILL")
        return await self._end_on_host(link.endpoint.host, on_timeout)
