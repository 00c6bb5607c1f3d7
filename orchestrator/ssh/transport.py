"""One SSH connection per host, reused for every command of an invocation.

`SSHPool` owns the connections. `pool.run(host, argv)` opens the host's
connection on first use (under a fleet-wide handshake limit, with retries on
transient failures) and runs the command on a new channel of it (under a
per-connection channel limit kept below sshd's MaxSessions).

On timeout or cancellation the pool signals the command's process group
over its own channel (sshd runs each session in a new process group and
delivers channel signals to all of it), so nothing is left running.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from orchestrator.config import ClusterConfig, HostSpec, jump_hops
from orchestrator.config.units import parse_size
from orchestrator.errors import ConnectError
from orchestrator.events import (
    CommandFinished,
    Connected,
    ConnectFailed,
    Connecting,
    EventSink,
    Message,
    NullSink,
    started,
)
from orchestrator.results import HostResult, Status
from orchestrator.ssh import hooks
from orchestrator.ssh.admission import AdmissionGate, AimdWindow
from orchestrator.ssh.container_channel import ContainerConnections
from orchestrator.ssh.envpass import env_block, env_reader, new_token
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.keys import load_identities, strict_known_hosts
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.resolver import widen_default_executor
from orchestrator.ssh.seam import Command, HeldRequest, HostRunner, Request
from orchestrator.ssh.segments import acknowledge_promptly, coalesce_writes, tcp_socket
from orchestrator.ssh.session import (
    PREFERRED_CIPHERS,
    CommandSession,
    fed_until_closed,
    keepalive_while_waiting,
)
from orchestrator.ssh.sshconfig import config_route, sshd_key
from orchestrator.ssh.stdin import ExecIO
from orchestrator.ssh.target import Counters, Endpoint, NotStarted, Target

if TYPE_CHECKING:
    from anyio.abc import TaskGroup
    from tenacity import RetryCallState


# How a connect attempt ended, as the error words say it. Only `timeout` and
# `reset` are worth another attempt (a lost SYN, an sshd over its MaxStartups
# dropping the connection); a refused port, a protocol error, a failed login or
# a changed host key is the same the next time, and retrying it only delays the
# error (and can lock an account).
FailureKind = Literal["timeout", "reset", "refused", "protocol", "auth", "host_key", "network"]
RETRIED: frozenset[FailureKind] = frozenset({"timeout", "reset"})


@dataclass
class _AttemptTrace:
    """What one attempt got to: the TCP connection (asyncssh's client
    `connection_made`) tells a host that never answered from a server that
    accepted and then stayed silent or too slow."""

    tcp_connected: bool = False


def failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, asyncssh.PermissionDenied):
        return "auth"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return "host_key"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return "reset"
    if isinstance(exc, asyncssh.ConnectionLost):
        return "reset"  # closed before the handshake finished (sshd's MaxStartups)
    if isinstance(exc, asyncssh.DisconnectError) and exc.code in (
        asyncssh.DISC_TOO_MANY_CONNECTIONS,
        asyncssh.DISC_CONNECTION_LOST,
        asyncssh.DISC_BY_APPLICATION,
    ):
        return "reset"
    if isinstance(exc, asyncssh.Error):
        return "protocol"
    return "network"  # no route, a name that does not resolve, ...


def classify_connect_error(
    exc: BaseException, *, timeout: float | None = None, tcp_connected: bool | None = None
) -> tuple[Status, str]:
    """The result status and the one-line reason of a failed connect; the reason
    starts with the kind of failure (refused, timed out, reset, protocol, auth,
    host key) so that a fleet's failures group by it."""
    kind = failure_kind(exc)
    reason = exc.reason if isinstance(exc, asyncssh.Error) else ""
    reason = reason or str(exc) or type(exc).__name__
    if kind == "auth":
        return "auth", f"authentication failed: {reason}"
    if kind == "host_key":
        return "host_key", (
            f"host key not verifiable: {reason} (check known_hosts, or set ssh.host_key_policy)"
        )
    if kind == "timeout":
        after = f" after {timeout:g}s" if timeout is not None else ""
        if tcp_connected is True:
            return "unreachable", (
                f"connect timed out{after}: the TCP connection was accepted but the "
                "SSH handshake did not finish (server silent or overloaded)"
            )
        if tcp_connected is False:
            return "unreachable", (
                f"connect timed out{after}: no answer to the TCP connection "
                "(host down, or packets dropped on the way)"
            )
        return "unreachable", f"connect timed out{after}"
    if kind == "refused":
        return "unreachable", "connection refused (nothing listens on that port)"
    if kind == "reset":
        return "unreachable", f"connection reset by the server before login: {reason}"
    if kind == "protocol":
        return "unreachable", f"SSH protocol error: {reason}"
    if isinstance(exc, OSError):
        return "unreachable", exc.strerror or str(exc)
    return "unreachable", reason


@dataclass
class _Spent:
    """Seconds of a host's connect budget used so far."""

    seconds: float = 0.0


def _connect_retrying(retries: int, budget: float, spent: _Spent) -> AsyncRetrying:
    """How a host's connect attempts are retried (tenacity): the retried kinds,
    at most `retries` times, while the backoff before the next attempt stays
    within what is left of `budget`; random exponential waits."""

    class OutOfBudget(stop_base):
        def __call__(self, retry_state: RetryCallState) -> bool:
            return spent.seconds + retry_state.upcoming_sleep >= budget

    def slept(state: RetryCallState) -> None:
        spent.seconds += state.upcoming_sleep

    return AsyncRetrying(
        retry=retry_if_exception(lambda exc: _connect_failure(exc) in RETRIED),
        stop=stop_after_attempt(retries + 1) | OutOfBudget(),
        wait=lambda state: _retry_delay(state.attempt_number),
        before_sleep=slept,
        sleep=anyio.sleep,
        reraise=True,
    )


def _connect_failure(exc: BaseException) -> str | None:
    """The kind of a failed connect attempt (None: not a connect failure)."""
    if isinstance(exc, OSError | asyncssh.Error | TimeoutError):
        return failure_kind(exc)
    return None


def _retry_delay(attempt: int) -> float:
    """Backoff before attempt `attempt + 1`: random exponential (0.2 s, 0.4 s, ...
    at most 3 s), so throttled clients do not come back in step."""
    return random.uniform(0, min(3.0, 0.2 * 2**attempt))


def _traced_factory(
    base: Callable[[], asyncssh.SSHClient] | None, trace: _AttemptTrace, *, direct: bool
) -> Callable[[], asyncssh.SSHClient]:
    """The client factory of one attempt: `base`'s client, noting in `trace`
    when the TCP connection is made. `direct`: the connection is a TCP socket
    of our own (not through a jump, whose channel reports the jump's socket
    as its own), tuned as ssh/segments.py says."""

    def make() -> asyncssh.SSHClient:
        client = base() if base is not None else asyncssh.SSHClient()
        original = client.connection_made

        def made(conn: asyncssh.SSHClientConnection) -> None:
            trace.tcp_connected = True
            if direct and tcp_socket(conn) is not None:
                acknowledge_promptly(conn)
                transport = hooks.raw_transport(conn)
                if transport is not None:
                    coalesce_writes(transport)
            original(conn)

        client.connection_made = made  # type: ignore[method-assign]
        return client

    return make


def _close_chain(chain: list[asyncssh.SSHClientConnection]) -> None:
    for conn in reversed(chain):
        conn.close()


class _AcceptNewClient(asyncssh.SSHClient):
    """`accept-new`: trust a host seen for the first time, never a changed key."""

    def __init__(self, known_hosts_path: Path, host_patterns: list[str]) -> None:
        self._path = known_hosts_path
        self._patterns = host_patterns

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        if self._path.exists():
            known = asyncssh.read_known_hosts(str(self._path))
            trusted, ca, revoked, *_ = known.match(host, addr, port)
            if trusted or ca or revoked:
                return False  # a different key is on record: that is a mismatch
        self._path.parent.mkdir(parents=True, exist_ok=True)
        line = ",".join(self._patterns) + " " + key.export_public_key().decode().strip()
        with self._path.open("a") as f:
            f.write(line + "\n")
        return True


@dataclass
class _JumpChain:
    """A jump route, opened once and shared by every host behind it
    (`SSHPool._jump`): its hops as (name, asyncssh options), first to last."""

    hops: list[tuple[str, dict[str, Any]]]
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    conns: list[asyncssh.SSHClientConnection] = field(default_factory=list)
    failure: ConnectError | None = None  # remembered: a dead bastion is tried once


@dataclass
class _HostLink:
    """A host's connection and the channels it may open."""

    conn: asyncssh.SSHClientConnection
    # Work channels; one slot beyond this is kept for kill requests.
    channels: anyio.Semaphore
    control: anyio.Semaphore
    # Commands and held processes waiting on the host right now: keepalives
    # run only while there are some (`SSHPool._waiting_on`).
    active: int = 0


class SSHPool(HostRunner):
    """Connections to a cluster's hosts, opened lazily, one per host, reused;
    and to their containers' sshd (`Endpoint` targets), one per container,
    tunnelled through the host's (ssh/container_channel.py), once the
    cluster's key is given (`use_container_key`)."""

    raw_output = True

    def __init__(
        self,
        cluster: ClusterConfig,
        sink: EventSink | None = None,
        *,
        output_tail: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.sink: EventSink = sink or NullSink()
        # Characters of each command's stdout and stderr kept per host (the
        # rest is streamed to the sink and counted as dropped).
        self.output_tail = parse_size(cluster.output_tail) if output_tail is None else output_tail
        self._links: dict[str, _HostLink] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._failures: dict[str, ConnectError] = {}
        # Per sshd that a handshake costs (see `sshd_key`), not fleet-wide.
        self._handshakes: dict[str, anyio.CapacityLimiter] = {}
        self.connects = 0  # handshakes performed (for the benchmark / tests)
        # Handshakes in flight, fleet-wide, as many as the coordinator completes
        # in time (admission.py): `--forks` at the fleet size cannot collapse it.
        self.admission = AdmissionGate(AimdWindow(connect_timeout=cluster.ssh.connect_timeout))
        self._warned: set[str] = set()
        self._keys: list[asyncssh.SSHKeyPair] | None = None
        # known_hosts paths -> (their mtimes, the parsed files)
        self._known_hosts: dict[
            tuple[str, ...], tuple[tuple[int, ...], asyncssh.SSHKnownHosts]
        ] = {}
        # `ssh.proxy_jump`, and the ProxyJumps of ~/.ssh/config by their text.
        self._cluster_jump: _JumpChain | None = None
        self._config_jumps: dict[str, _JumpChain] = {}
        self.jump_connects = 0  # handshakes with jump hosts that succeeded (for the tests)
        self._stack = contextlib.AsyncExitStack()
        self._background: TaskGroup | None = None
        # The containers' sshd connections, once their key is given.
        self.containers: ContainerConnections | None = None

    def use_container_key(self, key: asyncssh.SSHKey) -> None:
        """The cluster's user key, which the containers' sshd accept: commands
        to an `Endpoint` can start from now on (a second key, made by a cold
        start of this invocation, serves the connections opened after it)."""
        if self.containers is None:
            self.containers = ContainerConnections(self, key, sink=self.sink)
        else:
            self.containers.use_key(key)

    @property
    def container_counters(self) -> Counters:
        """What the container connections did so far (zeros: none yet)."""
        return self.containers.counters if self.containers is not None else Counters()

    def _containers(self, ep: Endpoint) -> ContainerConnections:
        if self.containers is None:
            raise NotStarted(ep.host, "host", "no key for the containers' sshd was given")
        return self.containers

    async def warm(self, ep: Endpoint) -> bool:
        """Connect to `ep`'s sshd ahead of its first command (ContainerConnections.warm)."""
        return await self._containers(ep).warm(ep)

    def host_open(self, host: str) -> bool:
        """Whether `host`'s connection is open now."""
        link = self._links.get(host)
        return link is not None and not link.conn.is_closed()

    async def __aenter__(self) -> SSHPool:
        if self.cluster.ssh.identity_files:
            self._client_keys()  # a bad identity file: one error now, before any host
        self._background = await self._stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def background(self) -> TaskGroup | None:
        """The task group of work the pool runs for its callers without one
        of them waiting on it (a container's sshd connected ahead of its first
        command: containers/sshexec.py), cancelled when the pool closes. None
        outside `async with` (nothing is started in the background then)."""
        return self._background

    async def aclose(self) -> None:
        if self._background is not None:
            # Cancelled, then left without the caller's exception: the
            # caller's own propagates as it was (a task group given it would
            # wrap it in an ExceptionGroup). Not under a scope of its own:
            # the task group's scope must be the innermost when it exits.
            self._background.cancel_scope.cancel()
            self._background = None
        try:
            await self._stack.aclose()
        finally:  # also when a cancellation reached us while the group ended
            with anyio.CancelScope(shield=True):
                # First: they are channels of the hosts' connections.
                if self.containers is not None:
                    await self.containers.aclose()
                for link in self._links.values():
                    link.conn.close()
                for link in self._links.values():
                    with anyio.move_on_after(2), contextlib.suppress(Exception):
                        await link.conn.wait_closed()
                self._links.clear()
                # After the hosts: their connections are channels of the jumps'.
                await self._close_jumps()

    # -- connecting ---------------------------------------------------------

    def _connect_options(self, spec: HostSpec) -> dict[str, Any]:
        ssh = self.cluster.ssh
        return self._endpoint_options(spec.address or spec.name, spec.port or ssh.port, spec.user)

    def _endpoint_options(self, address: str, port: int, user: str | None) -> dict[str, Any]:
        """asyncssh options for one endpoint, a target or a jump hop alike: the
        cluster's checking, keys and ciphers apply to every hop of the path."""
        ssh = self.cluster.ssh
        opts: dict[str, Any] = {
            "host": address,
            "port": port,
            "connect_timeout": ssh.connect_timeout,
            # A host whose network goes silent is lost after keepalive x
            # (keepalive_count + 1) seconds without a byte from it. Off until
            # something waits on the host (`_waiting_on`).
            "keepalive_interval": 0,
            "keepalive_count_max": ssh.keepalive_count,
            # AES-GCM runs in OpenSSL; asyncssh's chacha20-poly1305 spends
            # Python time per packet, which dominates a fan-out on reused
            # connections. Compression costs CPU on both ends for tiny packets.
            "encryption_algs": PREFERRED_CIPHERS,
            "compression_algs": ["none"],
        }
        user = user or ssh.user
        if user:
            opts["username"] = user
        if ssh.identity_files:
            opts["client_keys"] = self._client_keys()
            opts["agent_path"] = None
        if not ssh.use_ssh_config:
            opts["config"] = None
        known = Path(ssh.known_hosts).expanduser() if ssh.known_hosts else None
        if ssh.host_key_policy == "off":
            opts["known_hosts"] = None
        elif ssh.host_key_policy == "strict":
            # Always an explicit known_hosts: ~/.ssh/config must not turn checking off.
            strict = strict_known_hosts(
                configured=str(known) if known is not None else None,
                use_ssh_config=ssh.use_ssh_config,
                host=address,
                port=port,
                username=user,
            )
            opts["known_hosts"] = self._parsed_known_hosts(strict.known_hosts)
            for conflict in strict.conflicts:
                self._warn_once(conflict)
        else:
            path = known or Path("~/.ssh/known_hosts").expanduser()
            patterns = [address if port == 22 else f"[{address}]:{port}"]
            opts["client_factory"] = lambda: _AcceptNewClient(path, patterns)
            opts["known_hosts"] = str(path) if path.exists() else ([], [], [])
        return opts

    def _parsed_known_hosts(self, value: Any) -> Any:
        """known_hosts files parsed once per version, not per handshake. Given a
        path, asyncssh reads and parses the file again for every handshake:
        with one line per host that is O(hosts²), 6.6 ms per connection for a
        1000-line file, so 6.6 s of CPU to reach 1000 hosts. A file edited
        meanwhile (a long pytest session, a key added) is read again."""
        if isinstance(value, str):
            paths: tuple[str, ...] = (value,)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            paths = tuple(value)
        else:
            return value
        try:
            versions = tuple(os.stat(p).st_mtime_ns for p in paths)
        except OSError:
            return value  # asyncssh reports it at connect time, naming the host
        cached = self._known_hosts.get(paths)
        if cached is not None and cached[0] == versions:
            return cached[1]
        try:
            parsed = asyncssh.read_known_hosts(list(paths))
        except (OSError, ValueError):
            return value
        self._known_hosts[paths] = (versions, parsed)
        return parsed

    def _client_keys(self) -> list[asyncssh.SSHKeyPair]:
        """The identity files, read once per pool (not per host) and checked here so a
        bad key is one clear line (exit 2), not a traceback out of every connect."""
        if self._keys is None:
            self._keys = load_identities(self.cluster.ssh.identity_files)
        return self._keys

    def _warn_once(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self.sink.emit(Message(level="warning", text=text))

    def _connect_budget(self) -> float:
        ssh = self.cluster.ssh
        return ssh.connect_budget if ssh.connect_budget is not None else ssh.connect_timeout

    async def _handshake(
        self,
        opts: dict[str, Any],
        host: str,
        what: str = "",
        *,
        jump: Callable[[], Awaitable[asyncssh.SSHClientConnection]] | None = None,
    ) -> tuple[asyncssh.SSHClientConnection, int]:
        """`asyncssh.connect` within one connect budget per host; the final failure
        is a ConnectError for `host` whose message starts with `what`. `jump`
        gives the shared connection to tunnel through.

        Each attempt waits for admission (`AdmissionGate`), then has
        `connect_timeout` or what is left of the budget, whichever is less; the
        wait for admission is not the host's time and counts against neither.
        Attempts are strictly one after the other: a retry is queued only once
        its host's previous attempt has left the window. Timeouts and resets are
        retried while the budget lasts (at most `connect_retries` times);
        everything else is final at once."""
        ssh = self.cluster.ssh
        budget = self._connect_budget()
        # The host's own time: attempts and backoff, not queueing for admission.
        spent = _Spent()
        trace = _AttemptTrace()

        retrying = _connect_retrying(ssh.connect_retries, budget, spent)
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    if jump is not None:
                        # Each attempt: a jump that dropped meanwhile is reopened.
                        opts["tunnel"] = await jump()
                    trace = _AttemptTrace()
                    allowed = min(ssh.connect_timeout, budget - spent.seconds)
                    conn = await self._connect_once(
                        opts, trace, allowed, spent, through_jump=jump is not None
                    )
            return conn, attempts
        except (OSError, asyncssh.Error, TimeoutError) as failure:
            status, message = classify_connect_error(
                failure,
                timeout=min(ssh.connect_timeout, budget),
                tcp_connected=trace.tcp_connected,
            )
            if attempts > 1:
                # The same words on every host that failed alike (the count of
                # attempts is in the ConnectFailed event): a fleet's failures
                # fold into one line per cause.
                message += f" (retried within the {budget:g}s connect budget)"
            raise ConnectError(host, status, what + message, attempts) from failure

    async def _connect_once(
        self,
        opts: dict[str, Any],
        trace: _AttemptTrace,
        allowed: float,
        spent: _Spent,
        *,
        through_jump: bool,
    ) -> asyncssh.SSHClientConnection:
        """One `asyncssh.connect` within `allowed` seconds, once admitted; what
        it got to goes to the admission window (a congestion signal or not)."""
        attempt_opts = {
            **opts,
            "connect_timeout": allowed,
            "client_factory": _traced_factory(
                opts.get("client_factory"),
                trace,
                direct=not through_jump and opts.get("tunnel") is None,
            ),
        }
        # Resolution and asyncssh's options use the loop's threads (resolver.py).
        widen_default_executor()
        async with (
            self._handshake_limiter(opts, through_jump=through_jump),
            self.admission.slot() as ticket,
        ):
            try:
                self.connects += 1
                conn = await asyncssh.connect(**attempt_opts)
                ticket.outcome = "ok"
                return conn
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                kind = failure_kind(exc)
                # What our load can cause is a congestion signal; a login
                # refused after a full handshake says the handshake was fine.
                ticket.outcome = (
                    "congested"
                    if kind in RETRIED
                    else "ok"
                    if kind in ("auth", "host_key")
                    else "neutral"
                )
                raise
            finally:
                spent.seconds += time.monotonic() - ticket.admitted_at

    def _handshake_limiter(
        self, opts: dict[str, Any], *, through_jump: bool
    ) -> anyio.CapacityLimiter:
        """`concurrency.handshakes` per sshd: an sshd refuses unauthenticated
        connections beyond its MaxStartups, and that is all the cap is for, so
        hosts with sshds of their own do not wait for one another."""
        if through_jump or not self.cluster.ssh.use_ssh_config:
            key = str(opts["host"])  # through a shared jump the bastion sees a channel
        else:
            port = opts.get("port")
            key = sshd_key(
                str(opts["host"]), port if isinstance(port, int) else 22, opts.get("username")
            )
        limiter = self._handshakes.get(key)
        if limiter is None:
            limiter = anyio.CapacityLimiter(self.cluster.concurrency.handshakes)
            self._handshakes[key] = limiter
        return limiter

    def _jump_route(self, host: str, opts: dict[str, Any]) -> _JumpChain | None:
        """The shared jump a host's connection goes through, if any.

        `ssh.proxy_jump` is opened with the cluster's own settings (checking,
        keys, timeouts). A `ProxyJump` from ~/.ssh/config is opened as
        asyncssh would open it (the ssh config and its defaults apply to the
        bastion, as they do for ssh), but once per chain: left to asyncssh,
        each host would open a bastion connection of its own. A jump the
        ssh config writes wrong fails the host with one line naming it."""
        ssh = self.cluster.ssh
        if ssh.proxy_jump:
            if self._cluster_jump is None:
                hops = jump_hops(ssh.proxy_jump)  # checked when the file loaded
                self._cluster_jump = _JumpChain(
                    [(str(h), self._endpoint_options(h.host, h.port or 22, h.user)) for h in hops]
                )
            return self._cluster_jump
        if not ssh.use_ssh_config:
            return None
        tunnel = config_route(opts["host"], opts["port"], opts.get("username")).jump
        if tunnel is None:
            return None
        chain = self._config_jumps.get(tunnel)
        if chain is None:
            try:
                hops = jump_hops(tunnel)
            except ValueError as exc:
                raise ConnectError(
                    host, "unreachable", f"~/.ssh/config ProxyJump: {exc}", 0
                ) from None
            chain = _JumpChain(
                [
                    (
                        str(h),
                        {
                            "host": h.host,
                            "port": h.port or (),
                            "username": h.user or (),
                            "connect_timeout": ssh.connect_timeout,
                        },
                    )
                    for h in hops
                ]
            )
            self._config_jumps[tunnel] = chain
        return chain

    async def _jump(self, chain: _JumpChain, host: str) -> asyncssh.SSHClientConnection:
        """The last hop of `chain`, opened once (under its lock) and reopened
        when it was closed; its failure, remembered, is reported as `host`'s."""
        try:
            async with chain.lock:
                if chain.conns and not chain.conns[-1].is_closed():
                    return chain.conns[-1]
                if chain.failure is not None:
                    raise chain.failure
                _close_chain(chain.conns)
                chain.conns = []
                try:
                    await self._open_hops(chain)
                except ConnectError as exc:
                    chain.failure = exc
                    _close_chain(chain.conns)
                    chain.conns = []
                    raise
                except BaseException:
                    _close_chain(chain.conns)
                    chain.conns = []
                    raise
                return chain.conns[-1]
        except ConnectError as exc:
            raise ConnectError(host, exc.status, exc.message, exc.attempts) from exc

    async def _open_hops(self, chain: _JumpChain) -> None:
        """Each hop of `chain` in turn, each through the one before."""
        for name, hop_opts in chain.hops:
            opts = dict(hop_opts)
            if chain.conns:
                opts["tunnel"] = chain.conns[-1]
            conn, _ = await self._handshake(opts, name, f"via jump host {name}: ")
            chain.conns.append(conn)
            self.jump_connects += 1

    async def _close_jumps(self) -> None:
        chains = [c for c in (self._cluster_jump, *self._config_jumps.values()) if c]
        for chain in chains:
            _close_chain(chain.conns)
        for chain in chains:
            for conn in reversed(chain.conns):
                with anyio.move_on_after(2), contextlib.suppress(Exception):
                    await conn.wait_closed()
            chain.conns = []

    async def _open(self, spec: HostSpec) -> _HostLink:
        opts = self._connect_options(spec)
        self.sink.emit(Connecting(host=spec.name, address=f"{opts['host']}:{opts['port']}"))
        start = time.monotonic()
        route = self._jump_route(spec.name, opts)
        jump = None if route is None else functools.partial(self._jump, route, spec.name)
        conn, attempts = await self._handshake(opts, spec.name, jump=jump)
        self.sink.emit(
            Connected(host=spec.name, seconds=time.monotonic() - start, attempts=attempts)
        )
        work = max(1, self.cluster.ssh.max_channels - 1)
        return _HostLink(conn, anyio.Semaphore(work), anyio.Semaphore(1))

    async def link(self, host: str) -> _HostLink:
        """The host's connection, opening it once; a failure is remembered."""
        if host in self._links:
            return self._links[host]
        if host in self._failures:
            raise self._failures[host]
        lock = self._locks.setdefault(host, anyio.Lock())
        async with lock:
            if host in self._links:
                return self._links[host]
            if host in self._failures:
                raise self._failures[host]
            try:
                self._links[host] = await self._open(self.cluster.host(host))
            except ConnectError as exc:
                self._failures[host] = exc
                self.sink.emit(
                    ConnectFailed(
                        host=host, status=exc.status, error=exc.message, attempts=exc.attempts
                    )
                )
                raise
            return self._links[host]

    async def connect(self, host: str) -> ConnectError | None:
        """Open the host's connection now; the failure (if any) is returned, not raised."""
        try:
            await self.link(host)
        except ConnectError as exc:
            return exc
        return None

    # -- running ------------------------------------------------------------

    async def send(self, target: Target, request: Request) -> HostResult:
        """Run `request` on `target` and wait for it (see `Request`); an
        `Endpoint`'s goes to its container's connection (NotStarted when it
        could not start: ContainerConnections.send). On a host: the
        command is an argv list (quoted here with `shlex.join`) or a shell
        string that the caller built from quoted pieces; cancellation kills
        the remote side too. Never raises for remote failures: the result's
        status says what happened. `request.io` streams stdin to it after
        `input` and takes its output as bytes (ssh/stdin.py).
        """
        if isinstance(target, Endpoint):
            return await self._containers(target).send(target, request)
        host, label, io = target, request.label, request.io
        text = request.text
        timeout = self.cluster.ssh.command_timeout if request.timeout is None else request.timeout
        start = time.monotonic()
        try:
            link = await self.link(host)
        except ConnectError as exc:
            result = HostResult(
                host, exc.status, duration=time.monotonic() - start, error=exc.message
            )
            self.sink.emit(CommandFinished(host=host, result=result, label=label))
            if io is not None and io.stdin is not None:
                await io.stdin.aclose()  # never run: out of the stdin feed
            return result
        self.sink.emit(started(host, text, label))
        async with link.channels, self._waiting_on(link):
            result = await self._run_on(link, host, request, timeout, start)
        self.sink.emit(CommandFinished(host=host, result=result, label=label))
        return result

    async def send_many(
        self, requests: Mapping[str, Request], *, limit: int | None = None
    ) -> dict[str, HostResult]:
        """`requests[host]` on each host, at most `limit` at once (by default
        `concurrency.hosts`), each as `send`; results in the mapping's order."""

        async def one(host: str) -> HostResult:
            return await self.send(host, requests[host])

        return await fan_out(list(requests), one, limit=limit or self.cluster.concurrency.hosts)

    async def _run_on(
        self,
        link: _HostLink,
        host: str,
        request: Request,
        timeout: float,
        start: float,
    ) -> HostResult:
        command = text = request.text
        label, input, on_timeout = request.label, request.input, request.on_timeout
        io = request.io or ExecIO()
        # Environment values travel over stdin, ahead of `input`: never in argv.
        merged_env = {**self.cluster.env, **(request.env or {})}
        prefix = ""
        if merged_env:
            token = new_token()
            text = env_reader(token) + text
            prefix = env_block(merged_env, token)
        emit = self.sink.emit if request.stream_output else None
        tail = self.output_tail
        try:
            chan, client_session = await link.conn.create_session(
                lambda: CommandSession(host, emit, tail, io.raw),
                text,
                encoding=None,
                **(_PTY if request.pty else {}),
            )
        except (asyncssh.Error, OSError) as exc:
            if io.stdin is not None:
                await io.stdin.aclose()
            return HostResult(
                host,
                "unreachable",
                duration=time.monotonic() - start,
                error=f"could not open a channel: {exc}",
            )
        # asyncssh types the session as SSHClientSession whatever the factory
        # makes; it is the CommandSession made above.
        session = cast(CommandSession, client_session)
        status: Status = "ok"
        error: str | None = None
        try:
            with anyio.fail_after(timeout):
                if prefix:
                    chan.write(prefix.encode())
                if input is not None:
                    chan.write(input.encode() if isinstance(input, str) else input)
                await fed_until_closed(chan, session, io.stdin)
        except TimeoutError:
            status, error = "timeout", f"timed out after {timeout:g}s; remote process killed"
            await self._kill(link, chan, session, on_timeout)
            chan.close()
        except (asyncssh.Error, OSError) as exc:
            status, error = "unreachable", self._lost(exc, label, command)
        except BaseException:
            # Cancelled (Ctrl-C, a sibling failed): stop the remote side too.
            session.discard()
            with anyio.CancelScope(shield=True):
                await self._kill(link, chan, session, on_timeout)
                chan.close()
            raise
        exit_code = session.exit_code
        if status == "ok":
            if session.lost is not None:
                status, error = "unreachable", self._lost(session.lost, label, command)
            elif exit_code != 0:
                status, error = "failed", f"exit code {exit_code}"
        return session.result(status, exit_code, error, start)

    def _waiting_on(self, link: _HostLink) -> contextlib.AbstractAsyncContextManager[None]:
        return keepalive_while_waiting(link, self.cluster.ssh.keepalive)

    def _lost(self, exc: BaseException, label: str | None, command: str) -> str:
        """Why a running command lost its host, naming what was running (its
        label and the end of its command line, where a wrapped command such as
        `docker exec ... sh -c '...'` keeps the user's part). A keepalive
        timeout is the silent host: no byte for the whole bound."""
        ssh = self.cluster.ssh
        tail = command if len(command) <= 60 else "..." + command[-57:]
        what = f"{label} {tail!r}" if label else repr(tail)
        if isinstance(exc, asyncssh.ConnectionLost) and "keepalive" in str(exc.reason):
            bound = ssh.keepalive * (ssh.keepalive_count + 1)
            return (
                f"host stopped answering while running {what}: nothing received for "
                f"{bound:g}s, {ssh.keepalive_count} keepalives unanswered "
                "(network silent or host hung)"
            )
        return f"connection lost while running {what}: {exc}"

    @contextlib.asynccontextmanager
    async def held_process(self, target: Target, held: HeldRequest) -> AsyncIterator[Any]:
        """A remote process kept running while the block runs (e.g. one holding a lock).

        Yields the asyncssh process (read its stdout for what it reports;
        `encoding` None for bytes, as a file copy streams them).
        On exit its stdin is closed, which ends a process waiting on it, and
        the channel is closed. Raises ConnectError when the host is not reached;
        an `Endpoint`'s is ContainerConnections.held_process (NotStarted).
        """
        if isinstance(target, Endpoint):
            async with self._containers(target).held_process(target, held) as process:
                yield process
            return
        host, text, on_end = target, held.text, held.end_text
        link = await self.link(host)
        async with link.channels, self._waiting_on(link):
            self.sink.emit(started(host, text, held.label or "held"))
            process = await link.conn.create_process(text, encoding=held.encoding, errors="replace")
            # Cut short (an error, a timeout, a cancel): `on_end` at once.
            wait = 0.0
            try:
                if held.stdin:
                    process.stdin.write(held.stdin if held.encoding else held.stdin.encode())
                yield process
                wait = 5.0
            finally:
                with anyio.CancelScope(shield=True):
                    await self._end_held(host, process, on_end, wait)

    async def _end_held(self, host: str, process: Any, on_end: str | None, wait: float) -> None:
        """A host's held process's end: its stdin closed and `wait` s to exit
        (with `on_end`; 5 s without); what still runs then (a process inside
        `docker exec`, which closing the channel does not end) is ended by
        `on_end` on the connection's control channel; the channel closed."""
        with contextlib.suppress(asyncssh.Error, OSError):
            process.stdin.write_eof()
            with anyio.move_on_after(wait if on_end is not None else 5.0):
                await process.wait_closed()
        if process.exit_status is None and on_end is not None:
            await self.run_control(host, on_end, bound=10.0)
        process.close()

    async def run_control(self, host: str, script: str, *, bound: float = 5.0) -> str | None:
        """Run shell text `script` on `host` on the channel its connection
        keeps for cleanups (a kill: never waiting behind the work channels),
        within `bound` seconds: its stdout when it exited 0, else None."""
        link = self._links.get(host)
        if link is None or link.conn.is_closed():
            return None
        with anyio.move_on_after(bound), contextlib.suppress(asyncssh.Error, OSError):
            async with link.control:
                done = await link.conn.run(script, check=False)
            if done.exit_status == 0:
                out = done.stdout
                return out.decode(errors="replace") if isinstance(out, bytes) else str(out or "")
        return None

    async def _kill(
        self,
        link: _HostLink,
        chan: asyncssh.SSHClientChannel[bytes],
        session: CommandSession,
        on_timeout: Command | None,
    ) -> None:
        """Stop the command: TERM its process group, then KILL if it lingers.

        OpenSSH's sshd delivers a channel `signal` request with killpg() to
        the session's process group (OpenSSH >= 7.9), so the command and its
        children stop without a second connection. `on_timeout` cleans up
        what the group does not own (a process inside `docker exec`), over a
        channel slot kept free for this.
        """
        with contextlib.suppress(asyncssh.Error, OSError):
            chan.send_signal("TERM")
        with anyio.move_on_after(0.5):
            await session.closed.wait()
        if not session.closed.is_set():
            with contextlib.suppress(asyncssh.Error, OSError):
                chan.send_signal("KILL")
        if on_timeout is not None:
            script = on_timeout if isinstance(on_timeout, str) else shlex.join(on_timeout)
            with anyio.move_on_after(5), contextlib.suppress(asyncssh.Error, OSError):
                async with link.control:
                    await link.conn.run(script, check=False)


# A pseudo-terminal for a CLI that prints progress only to one
# (Request.pty): wide enough that no bar is cut; no echo of what we write
# (the environment block), no signal or flow-control keys, input raw.
_PTY: dict[str, Any] = {
    "term_type": "xterm",
    "term_size": (200, 50),
    "term_modes": {
        asyncssh.PTY_ECHO: 0,
        asyncssh.PTY_ICANON: 0,
        asyncssh.PTY_ISIG: 0,
        asyncssh.PTY_IEXTEN: 0,
        asyncssh.PTY_IXON: 0,
    },
}
