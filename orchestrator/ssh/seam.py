"""The seam between what runs on a host and how it gets there.

Everything above this layer (the lifecycle, the locks, provisioning) decides
*what* to run, as argv or shell text, and reads back a `HostResult` or a held
process's output; `HostRunner` is all it needs of *how*. A command goes to
a target (ssh/target.py): a host, or a container's sshd (`Endpoint`, the way
containers/route.py chose). `SSHPool` implements it over one asyncssh
connection per host and one per container, tunnelled through its host's
(ssh/container_channel.py); a scripted fake
(`orchestrator/testing.py`, shipped with the package) implements it too,
so rollback, the barrier, lock conversion, timeouts and partial failures
are tested without root or hosts, the way
httpx's `MockTransport` stands in for `HTTPTransport` behind one
`BaseTransport`. The fake adds tests; everything that crosses SSH or touches
docker is still tested on the sandbox.
"""

from __future__ import annotations

import abc
import shlex
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.results import HostResult
from orchestrator.ssh.target import Target

if TYPE_CHECKING:
    from orchestrator.ssh.stdin import ExecIO

# An argv list (quoted once with shlex.join) or shell text.
Command = str | Sequence[str]


@dataclass(frozen=True)
class Request:
    """One command for one host: what to run and how (httpx's `Request`).

    `input` is fed to the command's standard input (secrets and payloads go
    this way, never in argv); `env` travels over stdin too, ahead of it.
    `timeout` None is the runner's default (`ssh.command_timeout`), `math.inf`
    no deadline. `on_timeout` is a cleanup command for work the process group
    does not own (the process inside `docker exec`). A new field takes a
    default, so every `Request(...)` already written stays valid.
    """

    command: Command
    timeout: float | None = None
    input: str | bytes | None = None
    env: Mapping[str, str] | None = None
    stream_output: bool = True
    label: str | None = None
    on_timeout: Command | None = None
    # `cvs exec`'s own stdin and byte output (ssh/stdin.py): SSHPool only, in
    # this process (a worker process has no terminal to stream).
    io: ExecIO | None = None
    # On a pseudo-terminal (echo and signal keys off): a CLI that prints its
    # progress only to a terminal (containers/pull_progress.py). stdout and
    # stderr come merged, as on a terminal. SSHPool only (`raw_output`).
    pty: bool = False

    @property
    def text(self) -> str:
        """The command as the remote shell reads it."""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)


@dataclass(frozen=True)
class HeldRequest:
    """One process held open while a block runs (a lock holder, a copy's
    end): what to run and how, for `HostRunner.held_process`.

    `encoding` None: its streams carry bytes (a copy's). `stdin` is written
    to it first (a container's environment block). `on_end` is what ends it
    when it has not exited once its stdin closed: the containers' sshd takes
    no channel signals for root, and on a host what `docker exec` started
    outlives the channel. `label` names it in the events ("held" by default).
    """

    command: Command
    encoding: str | None = "utf-8"
    stdin: str = ""
    label: str | None = None
    on_end: Command | None = None

    @property
    def text(self) -> str:
        """The command as the remote shell reads it."""
        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    @property
    def end_text(self) -> str | None:
        """`on_end` as shell text."""
        end = self.on_end
        return end if end is None or isinstance(end, str) else shlex.join(end)


class HostRunner(abc.ABC):
    """Run commands on the cluster's hosts: `SSHPool`, `WorkerRunner`, the
    scripted fake. A target is a host's name or a container's `Endpoint`.
    An implementation writes `send`, `send_many` and `held_process`; `run`
    and `run_many`, the keyword forms most callers use, build the Requests
    here, the one place their keywords are spelled."""

    # Whether `Request.io`'s raw callback and `Request.pty` are served in
    # this process (SSHPool); a runner that sends requests elsewhere cannot.
    raw_output: bool = False

    @abc.abstractmethod
    async def send(self, target: Target, request: Request) -> HostResult:
        """Run `request` on `target` and wait for it: never raises for a
        host's sake (unreachable, failed, timed out: the result says). For an
        `Endpoint`, raises `NotStarted` (ssh/target.py) when the command could
        not start there (the caller takes another way); once started, the
        result says how it ended, as for a host."""

    @abc.abstractmethod
    async def send_many(
        self, requests: Mapping[str, Request], *, limit: int | None = None
    ) -> dict[str, HostResult]:
        """`requests[host]` on each of its hosts, concurrently (at most `limit`
        at once; by default the runner's own bound), results in the mapping's
        order. Never raises for a host's sake, as `send`."""

    @abc.abstractmethod
    def held_process(self, target: Target, held: HeldRequest) -> AbstractAsyncContextManager[Any]:
        """A remote process kept running while the block runs (a lock
        holder, a copy's stream): `.stdout.readline()`, `.stdin.write()`,
        `.stderr.read()`, `.wait()`. Raises ConnectError when a host is not
        reached (NotStarted for an `Endpoint`, before the block); on exit its
        stdin is closed."""

    async def run(
        self,
        host: str,
        command: Command,
        *,
        timeout: float | None = None,
        input: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        stream_output: bool = True,
        label: str | None = None,
        on_timeout: Callable[[], Command] | None = None,
        io: ExecIO | None = None,
        pty: bool = False,
    ) -> HostResult:
        """`command` on `host` (see Request); `on_timeout` is asked at once (the
        callers' are constants: `lambda: kill`)."""
        kill = None if on_timeout is None else on_timeout()
        request = Request(command, timeout, input, env, stream_output, label, kill, io, pty)
        return await self.send(host, request)

    async def run_many(
        self,
        commands: Mapping[str, Command],
        *,
        timeout: float | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        label: str | None = None,
        limit: int | None = None,
    ) -> dict[str, HostResult]:
        """`commands[host]` on each host, the same options for all."""
        requests = {
            host: Request(command, timeout, input, env, label=label)
            for host, command in commands.items()
        }
        return await self.send_many(requests, limit=limit)
