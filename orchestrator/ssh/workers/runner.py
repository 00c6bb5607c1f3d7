"""A `HostRunner` (ssh/seam.py) backed by worker processes (parent.py, child.py).

When `Cluster.open` plans workers (`planned_workers`: past WORKERS_FROM
hosts on 4+ cores, or `concurrency.workers: N`), every command of the
invocation reaches its hosts through this runner instead of an `SSHPool`:
each host belongs to one worker process (hosts sharing an sshd together),
which holds that host's connection, admission and handshake budget in its
own event loop. Everything above the seam (the lock, the probe, the plan
and its barrier, rollback, records, the live view, exit codes) runs in the
parent as in one process, on the same `HostResult`s and events.

The runner forwards the seam's calls and nothing else:

- `send`: one call to the host's worker (`SSHPool.send` there); its events
  come back as frames, ahead of the result.
- `send_many`: each worker gets its whole shard at once and fans out there.
- `held_process` (a host's or a container's): the process is opened and
  held in the worker; the object yielded here proxies what the callers use
  (`stdout.readline/read`, `stderr.read`, `stdin.write/drain/write_eof`,
  `wait`, `send_signal`, `exit_status`) by frames. Writes are queued in order and never wait; a
  lock holder's lease renewals reach it as they would in one process.
- an `Endpoint` target (a container's sshd) goes to its host's worker too,
  whose `SSHPool` tunnels it over its own connection to the host (one
  connection per container, in that worker), once `use_container_key`
  gave the workers the key.

The runner owns the task group every frame task runs in: nothing outlives
`async with WorkerRunner(...)`.

A worker that dies loses only its hosts, by name: a `run` returns
`unreachable` saying so, a held process reads its end (stderr says why), a
new one raises ConnectError. Its connections drop with it, so the hosts'
lock holders see their input end and let go (the lease bounds it anyway).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
from anyio.abc import TaskGroup

from orchestrator.config import ClusterConfig
from orchestrator.config.units import parse_size
from orchestrator.errors import ConnectError
from orchestrator.events import CommandFinished, EventSink, NullSink
from orchestrator.results import HostResult
from orchestrator.ssh.keys import load_identities
from orchestrator.ssh.seam import HeldRequest, HostRunner, Request
from orchestrator.ssh.target import Counters, Endpoint, NotStarted, Target, host_of
from orchestrator.ssh.workers import frames as f
from orchestrator.ssh.workers.parent import (
    WorkerFleet,
    WorkerLost,
    WorkerProcess,
    new_fleet,
    plan_shards,
)

if TYPE_CHECKING:
    from orchestrator.ssh.libsearch import asyncssh


@dataclass(frozen=True)
class Completed:
    """What `wait()` returns (asyncssh's SSHCompletedProcess, as far as callers read it)."""

    exit_status: int | None
    returncode: int | None


class _Reader:
    def __init__(self, held: HeldProcess, stream: Literal["stdout", "stderr"]) -> None:
        self._held = held
        self._stream = stream

    async def readline(self) -> Any:
        return await self._held.read(self._stream, "readline")

    async def read(self, n: int = -1) -> Any:
        return await self._held.read(self._stream, "read", n)


class _Writer:
    def __init__(self, held: HeldProcess) -> None:
        self._held = held

    def write(self, data: str | bytes) -> None:
        self._held.post(f.Write(self._held.hid, data))

    async def drain(self) -> None:
        await self._held.worker.call(f.HeldDrain(self._held.hid))

    def write_eof(self) -> None:
        self._held.post(f.Eof(self._held.hid))


class HeldProcess:
    """A held process in a worker, as the parent's callers see it."""

    def __init__(self, worker: WorkerProcess, hid: int, host: str, encoding: str | None) -> None:
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

    def _text(self, text: str) -> str | bytes:
        return text if self.encoding is not None else text.encode()

    def post(self, frame: f.Post) -> None:
        if self.worker.dead is not None or self.closed:
            raise BrokenPipeError(f"{self.host}: the held process's channel is closed")
        self.worker.post(frame)

    async def read(
        self,
        stream: Literal["stdout", "stderr"],
        how: Literal["readline", "read"],
        size: int = -1,
    ) -> object:
        try:
            return await self.worker.call(f.HeldRead(self.hid, stream, how, size))
        except WorkerLost as lost:
            # Its end: what was lost, on stderr (the callers' error tails).
            return self._text(lost.text + "\n" if stream == "stderr" else "")

    async def wait(self) -> Completed:
        try:
            answer = await self.worker.call(f.HeldWait(self.hid))
        except WorkerLost:
            return Completed(None, None)
        status, code = cast("tuple[int | None, int | None]", answer)
        return Completed(status, code)

    def send_signal(self, name: str) -> None:
        self.post(f.Signal(self.hid, name))


@contextlib.asynccontextmanager
async def _held(
    worker: WorkerProcess,
    host: str,
    encoding: str | None,
    opening: Callable[[int], f.Op],
    lost: Callable[[str], Exception],
) -> AsyncIterator[tuple[HeldProcess, object]]:
    """A process held open in `worker` (the operation `opening(hid)`) while the
    block runs, and the open call's answer; `lost(why)` is raised when the
    worker is gone before it opened. Closed in the worker however the block
    ends."""
    hid = worker.new_id()
    held = HeldProcess(worker, hid, host, encoding)
    worker.on_exit[hid] = held.exited
    try:
        try:
            answer = await worker.call(opening(hid))
        except WorkerLost as exc:
            raise lost(exc.text) from None
        try:
            yield held, answer
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(WorkerLost):
                await worker.call(f.HeldClose(hid))
    finally:
        worker.on_exit.pop(hid, None)


class WorkerRunner(HostRunner):
    """A HostRunner whose hosts are served by worker processes, one event loop each."""

    def __init__(
        self,
        cluster: ClusterConfig,
        sink: EventSink | None = None,
        *,
        workers: int,
        output_tail: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.sink: EventSink = sink or NullSink()
        self.output_tail = parse_size(cluster.output_tail) if output_tail is None else output_tail
        self.count = workers
        self.fleet: WorkerFleet = new_fleet(cluster, self.sink, self.output_tail)
        self._stack = contextlib.AsyncExitStack()
        self._background: TaskGroup | None = None
        # The container counters of each worker, as of its last answer.
        self._counters: dict[WorkerProcess, Counters] = {}

    async def __aenter__(self) -> WorkerRunner:
        if self.cluster.ssh.identity_files:
            load_identities(self.cluster.ssh.identity_files)  # a bad file: one error, now
        tg = self._background = await self._stack.enter_async_context(anyio.create_task_group())
        # Runs before the task group ends: the workers close, their frame tasks end.
        self._stack.push_async_callback(self._close, tg)
        try:
            hosts = [h.name for h in self.cluster.hosts]
            await self.fleet.start(plan_shards(self.cluster, hosts, self.count), tg)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def background(self) -> TaskGroup | None:
        """As SSHPool.background: the runner's own task group (None outside
        `async with`)."""
        return self._background

    async def _close(self, tg: anyio.abc.TaskGroup) -> None:
        self._background = None
        await self.fleet.aclose()  # shielded: the workers end also when cancelled
        tg.cancel_scope.cancel()  # a frame task still waiting on a worker that never ended

    async def aclose(self) -> None:
        # Not under a scope of its own: the task group's scope must be the
        # innermost when it exits.
        await self._stack.aclose()

    def stats(self) -> dict[str, int]:
        """The workers' handshakes, admission figures and CPU (for the benchmark)."""
        return self.fleet.totals()

    def use_container_key(self, key: asyncssh.SSHKey) -> None:
        """As SSHPool.use_container_key, in every worker."""
        self.fleet.post_all(f.Keys(key.export_private_key()))

    @property
    def container_counters(self) -> Counters:
        """The workers' container counters, summed (as of their last answers)."""
        return sum(self._counters.values(), Counters())

    async def warm(self, ep: Endpoint) -> bool:
        """As SSHPool.warm, in the host's worker."""
        worker = self.fleet.worker_of(ep.host)
        try:
            answer = await worker.call(f.ContainerWarm(ep))
        except WorkerLost:
            return False
        ok, self._counters[worker] = cast("tuple[bool, Counters]", answer)
        return ok

    async def send(self, target: Target, request: Request) -> HostResult:
        """As SSHPool.send, in the host's worker (`request.io` stays None for
        an `Endpoint`: a worker process has no terminal to stream)."""
        if isinstance(target, Endpoint):
            return await self._send_to_container(target, request)
        host = target
        worker = self.fleet.worker_of(host)
        try:
            result = cast(HostResult, await worker.call(f.RunOp(host, request)))
        except WorkerLost as lost:
            result = HostResult(host, "unreachable", error=lost.text)
            self.sink.emit(CommandFinished(host=host, result=result, label=request.label))
        return result

    async def send_many(
        self, requests: Mapping[str, Request], *, limit: int | None = None
    ) -> dict[str, HostResult]:
        """As SSHPool.send_many, each worker fanning out over its hosts (each
        at most its share of `concurrency.hosts` at once; `limit` is not
        split further)."""
        results = await self.fleet.run(requests)
        return {h: results[h] for h in requests}

    async def _send_to_container(self, ep: Endpoint, request: Request) -> HostResult:
        """NotStarted when it could not start (the worker lost, too)."""
        worker = self.fleet.worker_of(ep.host)
        try:
            answer = await worker.call(f.ContainerRun(ep, request))
        except WorkerLost as lost:
            raise NotStarted(ep.host, "host", lost.text) from None
        result, self._counters[worker] = cast("tuple[HostResult, Counters]", answer)
        return result

    @contextlib.asynccontextmanager
    async def held_process(self, target: Target, held: HeldRequest) -> AsyncIterator[Any]:
        """As SSHPool.held_process, the process held in the host's worker."""
        host = host_of(target)
        worker = self.fleet.worker_of(host)

        def opening(hid: int) -> f.Op:
            return f.HeldOpen(hid, target, held)

        def lost(text: str) -> Exception:
            if isinstance(target, Endpoint):
                return NotStarted(host, "host", text)
            return ConnectError(host, "unreachable", text)

        async with _held(worker, host, held.encoding, opening, lost) as (process, counters):
            if isinstance(counters, Counters):
                self._counters[worker] = counters
            yield process
