"""A `HostRunner` (ssh/seam.py) backed by worker processes (ssh/workers.py).

When `Cluster.open` plans workers (`planned_workers`: past WORKERS_FROM
hosts on 4+ cores, or `concurrency.workers: N`), every command of the
invocation reaches its hosts through this runner instead of an `SSHPool`:
each host belongs to one worker process (hosts sharing an sshd together),
which holds that host's connection, admission and handshake budget in its
own event loop. Everything above the seam (the lock, the probe, the plan
and its barrier, rollback, records, the live view, exit codes) runs in the
parent as in one process, on the same `HostResult`s and events.

- `run`: one call to the host's worker (`SSHPool.run` there); its events
  come back as frames, ahead of the result.
- `held_process`: the process is opened and held in the worker; the object
  yielded here proxies what the callers use (`stdout.readline/read`,
  `stderr.read`, `stdin.write/drain/write_eof`, `wait`, `send_signal`,
  `exit_status`) by frames. Writes are queued in order and never wait; a
  lock holder's lease renewals reach it as they would in one process.
- `container_connections`: commands through a container's sshd, tunnelled
  over the worker's own connection to the host (one connection per
  container, in that worker).

A worker that dies loses only its hosts, by name: a `run` returns
`unreachable` saying so, a held process reads its end (stderr says why), a
new one raises ConnectError. Its connections drop with it, so the hosts'
lock holders see their input end and let go (the lease bounds it anyway).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from orchestrator.config import ClusterConfig
from orchestrator.errors import ConnectError
from orchestrator.events import CommandFinished, EventSink, NullSink
from orchestrator.results import HostResult
from orchestrator.ssh.seam import Command
from orchestrator.ssh.workers import (
    WorkerFleet,
    WorkerLost,
    _Worker,
    new_fleet,
    plan_shards,
)


@dataclass(frozen=True)
class Completed:
    """What `wait()` returns (asyncssh's SSHCompletedProcess, as far as callers read it)."""

    exit_status: int | None
    returncode: int | None


class _Reader:
    def __init__(self, held: HeldProcess, stream: str) -> None:
        self._held = held
        self._stream = stream

    async def readline(self) -> Any:
        return await self._held._read(self._stream, "readline")

    async def read(self, n: int = -1) -> Any:
        return await self._held._read(self._stream, "read", n)


class _Writer:
    def __init__(self, held: HeldProcess) -> None:
        self._held = held

    def write(self, data: Any) -> None:
        self._held._post("write", data)

    async def drain(self) -> None:
        await self._held._call("held_drain")

    def write_eof(self) -> None:
        self._held._post("eof")


class HeldProcess:
    """A held process in a worker, as the parent's callers see it."""

    def __init__(self, worker: _Worker, hid: int, host: str, encoding: str | None) -> None:
        self.worker = worker
        self.hid = hid
        self.host = host
        self.encoding = encoding
        self.stdout = _Reader(self, "stdout")
        self.stderr = _Reader(self, "stderr")
        self.stdin = _Writer(self)
        self.exit_status: int | None = None
        self.closed = False

    def exited(self, status: int | None) -> None:
        """The worker says the channel closed (None: the worker itself ended)."""
        self.exit_status = status
        self.closed = True

    def _text(self, text: str) -> Any:
        return text if self.encoding is not None else text.encode()

    def _post(self, what: str, *args: Any) -> None:
        if self.worker.dead is not None or self.closed:
            raise BrokenPipeError(f"{self.host}: the held process's channel is closed")
        self.worker.post(("post", what, self.hid, *args))

    async def _call(self, method: str, *args: Any) -> Any:
        return await self.worker.call(method, self.hid, *args)

    async def _read(self, stream: str, how: str, size: int = -1) -> Any:
        try:
            return await self._call("held_read", stream, how, size)
        except WorkerLost as lost:
            # Its end: what was lost, on stderr (the callers' error tails).
            return self._text(lost.text + "\n" if stream == "stderr" else "")

    async def wait(self) -> Completed:
        try:
            status, code = await self._call("held_wait")
        except WorkerLost:
            return Completed(None, None)
        return Completed(status, code)

    def send_signal(self, name: str) -> None:
        self._post("signal", name)


@contextlib.asynccontextmanager
async def _held(
    worker: _Worker,
    host: str,
    encoding: str | None,
    opening: tuple[Any, ...],
    lost: Callable[[str], Exception],
) -> AsyncIterator[tuple[HeldProcess, Any]]:
    """A process held open in `worker` (the call `opening`, given the held id
    after its method's name) while the block runs, and the open call's answer;
    `lost(why)` is raised when the worker is gone before it opened. Closed in
    the worker however the block ends."""
    hid = worker.new_id()
    held = HeldProcess(worker, hid, host, encoding)
    worker.on_exit[hid] = held.exited
    try:
        try:
            answer = await worker.call(opening[0], hid, *opening[1:])
        except WorkerLost as exc:
            raise lost(exc.text) from None
        try:
            yield held, answer
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(WorkerLost):
                await worker.call("held_close", hid)
    finally:
        worker.on_exit.pop(hid, None)


class WorkerContainerConnections:
    """`ContainerConnections` (ssh/container_channel.py) in the hosts' workers:
    `run` and `warm` go to the worker holding the host's connection."""

    def __init__(self, runner: WorkerRunner, private_key: bytes) -> None:
        from orchestrator.ssh.container_channel import Counters

        self.runner = runner
        self._counters: dict[_Worker, Counters] = {}
        self.counters_type = Counters
        runner.fleet.post_all(("keys", private_key))

    @property
    def counters(self) -> Any:
        """The workers' counters, summed (as of their last answers)."""
        total = self.counters_type()
        for c in self._counters.values():
            total.connects += c.connects
            total.channels += c.channels
            total.open_channels += c.open_channels
            total.closed_links += c.closed_links
            for kind, n in c.failures.items():
                total.failures[kind] = total.failures.get(kind, 0) + n
        return total

    async def run(
        self,
        ep: Any,
        text: str,
        *,
        timeout: float,
        input: str | None = None,
        label: str | None = None,
        stream_output: bool = True,
        on_timeout: str | None = None,
    ) -> HostResult:
        """As ContainerConnections.run: NotStarted when it could not start."""
        from orchestrator.ssh.container_channel import NotStarted

        worker = self.runner.fleet.worker_of(ep.host)
        options = {"timeout": timeout, "input": input, "label": label}
        options |= {"stream_output": stream_output, "on_timeout": on_timeout}
        try:
            result, counters = await worker.call("container_run", ep, text, **options)
        except WorkerLost as lost:
            raise NotStarted(ep.host, "host", lost.text) from None
        self._counters[worker] = counters
        return result  # type: ignore[no-any-return]

    async def warm(self, ep: Any) -> bool:
        worker = self.runner.fleet.worker_of(ep.host)
        try:
            ok, counters = await worker.call("container_warm", ep)
        except WorkerLost:
            return False
        self._counters[worker] = counters
        return bool(ok)

    @contextlib.asynccontextmanager
    async def held_process(
        self,
        ep: Any,
        text: str,
        *,
        stdin: str = "",
        label: str | None = None,
        on_end: str | None = None,
    ) -> AsyncIterator[Any]:
        """As ContainerConnections.held_process (a copy's in-container end), the
        process held in the worker holding the host's connection; NotStarted,
        before the block, when it could not start."""
        from orchestrator.ssh.container_channel import NotStarted

        worker = self.runner.fleet.worker_of(ep.host)
        opening = ("container_held_open", ep, text, stdin, label, on_end)

        def lost(text: str) -> Exception:
            return NotStarted(ep.host, "host", text)

        async with _held(worker, ep.host, None, opening, lost) as (held, counters):
            self._counters[worker] = counters
            yield held

    async def aclose(self) -> None:
        """The workers close these connections when the runner closes."""


class WorkerRunner:
    """A HostRunner whose hosts are served by worker processes, one event loop each."""

    def __init__(
        self,
        cluster: ClusterConfig,
        sink: EventSink | None = None,
        *,
        workers: int,
        output_tail: int | None = None,
    ) -> None:
        from orchestrator.config.units import parse_size

        self.cluster = cluster
        self.sink: EventSink = sink or NullSink()
        self.output_tail = parse_size(cluster.output_tail) if output_tail is None else output_tail
        self.count = workers
        self.fleet: WorkerFleet = new_fleet(cluster, self.sink, self.output_tail)

    async def __aenter__(self) -> WorkerRunner:
        if self.cluster.ssh.identity_files:
            from orchestrator.ssh.keys import load_identities

            load_identities(self.cluster.ssh.identity_files)  # a bad file: one error, now
        try:
            hosts = [h.name for h in self.cluster.hosts]
            await self.fleet.start(plan_shards(self.cluster, hosts, self.count))
        except BaseException:
            await self.fleet.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.fleet.aclose()

    async def run(
        self,
        host: str,
        command: Command,
        *,
        timeout: float | None = None,
        input: str | bytes | None = None,
        env: dict[str, str] | None = None,
        stream_output: bool = True,
        label: str | None = None,
        on_timeout: Callable[[], Command] | None = None,
    ) -> HostResult:
        """As SSHPool.run, in the host's worker. `on_timeout` is asked here,
        at once (the callers' are constants: `lambda: kill`)."""
        worker = self.fleet.worker_of(host)
        options: dict[str, Any] = {"timeout": timeout, "input": input, "env": env}
        options |= {"stream_output": stream_output, "label": label}
        options["on_timeout"] = None if on_timeout is None else on_timeout()
        try:
            result: HostResult = await worker.call("run", host, command, **options)
        except WorkerLost as lost:
            result = HostResult(host, "unreachable", error=lost.text)
            self.sink.emit(CommandFinished(host=host, result=result, label=label))
        return result

    @contextlib.asynccontextmanager
    async def held_process(
        self, host: str, command: Command, *, encoding: str | None = "utf-8"
    ) -> AsyncIterator[Any]:
        """As SSHPool.held_process, the process held in the host's worker."""
        worker = self.fleet.worker_of(host)
        text = command if isinstance(command, str) else shlex.join(command)
        opening = ("held_open", host, text, encoding)

        def lost(text: str) -> Exception:
            return ConnectError(host, "unreachable", text)

        async with _held(worker, host, encoding, opening, lost) as (held, _answer):
            yield held

    def container_connections(self, private_key: bytes) -> WorkerContainerConnections:
        return WorkerContainerConnections(self, private_key)
