"""The worker processes, seen from the coordinator: when to use them, which
hosts go where, and each worker's frames.

One Python process runs on one core: on a 16-core coordinator a 5000-host
fan-out saturates it (3 ms of our CPU per host for a fresh connection) while
15 cores idle. Past a fleet size where it pays, each shard of the hosts
belongs to a worker process (child.py) with its own event loop, `SSHPool`
and connections, kept for the invocation's life so later commands reuse
them. The parent keeps what needs every host: it forwards each worker's
events to its own sink (the live view, the records), gathers the results in
host order and decides exit codes as before.

- **Which hosts go where**: hosts that share an sshd (an address, a
  `HostName`, a `ProxyCommand`, a `ProxyJump`'s bastion) go to the same
  worker, so `concurrency.handshakes` per sshd and one bastion connection
  still hold; each worker works on its share of `concurrency.hosts`.
- **When**: `worker_count`, pure. `concurrency.workers` unset: as many as
  the cores, once the fleet has `WORKERS_FROM` hosts, more hosts than cores,
  and the machine `WORKERS_MIN_CORES` cores (on 2 cores it did not pay);
  1: always one process; N: N (at most the cores, else clamped with a
  warning, and at most the hosts). Never with `ssh.proxy_jump` (every
  worker would open the bastion).
- **Faults**: a worker that dies is named, its hosts' results say they were
  lost with it, the other workers' hosts finish. Cancelling (Ctrl-C, a
  caller's timeout) asks each worker to cancel the request, which ends its
  remote processes as one process would, and waits for it (bounded). The
  workers run in a session of their own (a terminal's Ctrl-C reaches the
  parent only, which decides); a parent that goes away closes their stdin,
  and they cancel everything and exit.

One writer task per worker sends the frames (frames.py), whole and in order
(callers only queue); one reader task per worker hands out what comes back
(events to the sink, replies to their callers). Both run in the task group
of the runner that owns the fleet (runner.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, assert_never

import anyio
from anyio.abc import Process, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from orchestrator.config import ClusterConfig
from orchestrator.config.views import usable_cores, workers_clamped
from orchestrator.errors import ConnectError
from orchestrator.events import CommandFinished, EventSink, Message, named_here
from orchestrator.results import HostResult
from orchestrator.ssh.seam import Request
from orchestrator.ssh.sshconfig import config_route
from orchestrator.ssh.target import NotStarted
from orchestrator.ssh.workers import frames as f

# When `concurrency.workers` is unset, workers are used from this fleet size,
# on a machine with at least WORKERS_MIN_CORES cores. Measured on 2 cores
# (docs/performance.md): two workers cost 0.7-1.2 s more CPU than one process
# (two more interpreters' start and imports, every event pickled once more)
# and gained nothing at 1000 hosts (the farm's sshds and the parent share the
# same two cores), lost 0.7 s at 240. So on 2-3 cores: never by default.
# Above, a worker's start (~0.4 s of CPU) is paid back by ~130 fresh
# handshakes moved off the parent's core (3 ms each on the 16-core machine):
# 512 hosts is an estimate from those figures, not measured on 16 cores.
WORKERS_FROM = 512
WORKERS_MIN_CORES = 4
# How long a cancelled request may take to end its remote processes.
CANCEL_GRACE = 10.0


def worker_count(hosts: int, configured: int | None, cores: int, *, jump: bool = False) -> int:
    """How many processes share a fan-out over `hosts` hosts (1: this one alone)."""
    if jump or hosts < 2 or cores < 2:
        return 1
    if configured is None:
        if hosts < WORKERS_FROM or hosts <= cores or cores < WORKERS_MIN_CORES:
            return 1
        return cores
    return max(1, min(configured, cores, hosts))


def shards(groups: Mapping[str, Sequence[str]], count: int) -> list[list[str]]:
    """Hosts grouped by sshd, spread over `count` shards: each group whole in one
    shard, the largest groups first onto the smallest shard."""
    out: list[list[str]] = [[] for _ in range(count)]
    for _key, hosts in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        min(out, key=len).extend(hosts)
    return [s for s in out if s]


def planned_workers(cluster: ClusterConfig, hosts: int) -> int:
    jump = cluster.ssh.proxy_jump is not None
    return worker_count(hosts, cluster.concurrency.workers, usable_cores(), jump=jump)


def _sshd_groups(cluster: ClusterConfig, hosts: Sequence[str]) -> dict[str, list[str]]:
    """Hosts by the sshd (or bastion) a handshake with them costs."""
    specs = {h.name: h for h in cluster.hosts}
    groups: dict[str, list[str]] = {}
    for host in hosts:
        spec = specs.get(host)
        address = (spec.address if spec else None) or host
        key = address
        if cluster.ssh.use_ssh_config:
            port = (spec.port if spec else None) or cluster.ssh.port
            route = config_route(address, port, (spec.user if spec else None) or cluster.ssh.user)
            key = (
                f"jump:{route.jump}"
                if route.jump
                else ("proxy-command" if route.proxy_command else route.host)
            )
        groups.setdefault(key, []).append(host)
    return groups


def plan_shards(cluster: ClusterConfig, hosts: Sequence[str], count: int) -> list[list[str]]:
    """`hosts` and the cluster's, in `count` shards keeping an sshd's hosts together."""
    everyone = list(dict.fromkeys([*hosts, *(h.name for h in cluster.hosts)]))
    return shards(_sshd_groups(cluster, everyone), count)


class WorkerLost(Exception):
    """The worker process owning a host ended (killed, crashed) before answering."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass
class _FanOut:
    """A fan-out (`Fan`) in flight in one worker."""

    hosts: set[str]
    results: dict[str, HostResult] = field(default_factory=dict)
    done: bool = False
    stats: Mapping[str, int] = field(default_factory=dict)
    label: str = "exec"
    finished: anyio.Event = field(default_factory=anyio.Event)
    error: Exception | None = None


@dataclass
class _Pending:
    """A call's answer, once it comes."""

    answered: anyio.Event = field(default_factory=anyio.Event)
    value: object = None
    error: BaseException | None = None

    def settle(self, value: object = None, error: BaseException | None = None) -> None:
        if not self.answered.is_set():
            self.value, self.error = value, error
            self.answered.set()


class WorkerProcess:
    """One worker process, seen from the parent: a writer task sends whole
    frames in order (callers only queue them, so a cancelled caller never
    leaves half of one), a reader task dispatches every frame the worker
    writes (events to the sink, replies to their callers)."""

    def __init__(
        self, process: Process, index: int, stderr: IO[bytes], sink: EventSink, tg: TaskGroup
    ) -> None:
        self.process = process
        self.index = index
        self.stderr = stderr  # a file: a worker's stderr never blocks it
        self.sink = sink
        self.dead: str | None = None  # how it ended, once it has
        assert process.stdout is not None
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._outbox: MemoryObjectSendStream[bytes]
        inbox: MemoryObjectReceiveStream[bytes]
        self._outbox, inbox = anyio.create_memory_object_stream[bytes](math.inf)
        self._next = 0
        self.pending: dict[int, _Pending] = {}
        self.requests: dict[int, _FanOut] = {}  # fan-outs in flight
        self.on_exit: dict[int, Callable[[int | None], None]] = {}  # held processes
        self.stats: Mapping[str, int] = {}
        self._io_done = anyio.Event()
        self._io_left = 2
        tg.start_soon(self._write, inbox)
        tg.start_soon(self._read)

    @property
    def name(self) -> str:
        return f"worker process {self.index} (pid {self.process.pid})"

    def lost_text(self) -> str:
        return (
            f"lost: the {self.name} working on this host {self.dead or 'was stopped'} "
            "before its command finished; the other hosts were not affected"
        )

    def post(self, frame: f.ToChild) -> None:
        """Queue `frame` for the worker (sent whole, in order)."""
        with contextlib.suppress(anyio.ClosedResourceError):
            self._outbox.send_nowait(f.encode(frame))

    def _io_ended(self) -> None:
        self._io_left -= 1
        if self._io_left == 0:
            self._io_done.set()

    async def _write(self, inbox: MemoryObjectReceiveStream[bytes]) -> None:
        assert self.process.stdin is not None
        try:
            async with inbox:
                async for data in inbox:
                    try:
                        await self.process.stdin.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        return  # the reader sees the end and says so
        finally:
            self._io_ended()

    async def _read(self) -> None:
        try:
            with contextlib.suppress(
                anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError
            ):
                while True:
                    header = await self._stdout.receive_exactly(f.HEADER.size)
                    (size,) = f.HEADER.unpack(header)
                    self._receive(f.decode(await self._stdout.receive_exactly(size)))
            await self._ended()
        finally:
            self._io_ended()

    def _receive(self, frame: f.Frame) -> None:
        try:
            if isinstance(frame, f.ToParent):
                self._dispatch(frame)
        except Exception as exc:  # the sink's (a closed stdout): the callers'
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """What the sink raised reaches every caller waiting on this worker, as
        it would have through `SSHPool.run` in one process; the worker
        cancels their commands (ending their remote processes)."""
        for cid, pending in list(self.pending.items()):
            if not pending.answered.is_set():
                pending.settle(error=exc)
                self.post(f.Cancel(cid))
        for rid, request in list(self.requests.items()):
            request.error = exc
            self.post(f.Cancel(rid))
            request.finished.set()

    def _dispatch(self, frame: f.ToParent) -> None:
        match frame:
            case f.EventFrame():
                self.sink.emit(named_here(frame.event))
            case f.Reply():
                pending = self.pending.pop(frame.cid, None)
                if pending is not None:
                    pending.settle(frame.value)
            case f.Failed():
                pending = self.pending.pop(frame.cid, None)
                if pending is not None:
                    pending.settle(error=_rebuilt(frame.error))
            case f.Exited():
                callback = self.on_exit.get(frame.hid)
                if callback is not None:
                    callback(frame.status)
            case f.Result():
                request = self.requests.get(frame.rid)
                if request is not None:
                    request.results[frame.result.host] = frame.result
            case f.Done():
                request = self.requests.pop(frame.rid, None)
                if request is not None:
                    request.stats, request.done = frame.stats, True
                    self.stats = frame.stats
                    request.finished.set()
            case _:
                assert_never(frame)

    async def _ended(self) -> None:
        if self.dead is None:
            with anyio.move_on_after(5, shield=True):
                await self.process.wait()
            self.dead = _exit_words(self.process.returncode) + self._last_words()
        for pending in self.pending.values():
            pending.settle(error=WorkerLost(self.lost_text()))
        self.pending.clear()
        for request in list(self.requests.values()):
            self.lose(request)
        self.requests.clear()
        for callback in list(self.on_exit.values()):
            callback(None)

    def _last_words(self) -> str:
        """The last line the worker wrote on stderr (a traceback's last), if any."""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - 2000))
            lines = self.stderr.read().decode(errors="replace").strip().splitlines()
            if lines:
                return f" ({lines[-1].strip()[:200]})"
        return ""

    def lose(self, request: _FanOut) -> None:
        """The request's hosts not answered yet: lost with this worker, by name."""
        for host in sorted(request.hosts - request.results.keys()):
            result = HostResult(host, "unreachable", error=self.lost_text())
            request.results[host] = result
            self.sink.emit(CommandFinished(host=host, result=result, label=request.label))
        request.done = True
        request.finished.set()

    def new_id(self) -> int:
        self._next += 1
        return self._next

    async def call(self, op: f.Op) -> object:
        """`op` in the worker; raises WorkerLost once it has ended. Cancelled,
        the worker cancels it too (its remote process ends as one process's
        would) and is waited for, bounded."""
        if self.dead is not None:
            raise WorkerLost(self.lost_text())
        cid = self.new_id()
        pending = self.pending[cid] = _Pending()
        self.post(f.Call(cid, op))
        try:
            await pending.answered.wait()
        except BaseException:
            if not pending.answered.is_set():
                with anyio.CancelScope(shield=True):
                    await self._cancel_call(cid, pending)
            raise
        finally:
            self.pending.pop(cid, None)
        if pending.error is not None:
            raise pending.error
        return pending.value

    async def _cancel_call(self, cid: int, pending: _Pending) -> None:
        """The worker cancels call `cid` and answers within CANCEL_GRACE, else is killed."""
        self.post(f.Cancel(cid))
        with anyio.move_on_after(CANCEL_GRACE):
            await pending.answered.wait()
        if not pending.answered.is_set():
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def aclose(self) -> None:
        """Send `Close` after everything queued; wait for the worker (bounded)."""
        self.post(f.Close())
        self._outbox.close()
        with anyio.move_on_after(CANCEL_GRACE):
            await self.process.wait()
        if self.process.returncode is None:
            self.kill()
        with anyio.move_on_after(5):
            await self._io_done.wait()
        with contextlib.suppress(Exception):
            await self.process.aclose()
        self.stderr.close()


def _rebuilt(error: f.ConnectFailed | f.NotStartedFailed | str) -> BaseException:
    """An exception a worker's call raised, as the parent raises it."""
    if isinstance(error, f.ConnectFailed):
        return ConnectError(error.host, error.status, error.message, error.attempts)
    if isinstance(error, f.NotStartedFailed):
        return NotStarted(error.host, error.kind, error.reason)
    return ConnectionError(error)


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerFleet:
    """Worker processes serving one cluster's hosts (each host in one worker)."""

    def __init__(self, cluster: ClusterConfig, sink: EventSink, output_tail: int) -> None:
        self.cluster = cluster
        self.sink = sink
        self.output_tail = output_tail
        self.workers: list[WorkerProcess] = []
        self.assigned: dict[str, WorkerProcess] = {}
        self.closed = False

    @property
    def stats(self) -> dict[WorkerProcess, Mapping[str, int]]:
        """Each worker's pool's figures, as its last fan-out ended."""
        return {w: w.stats for w in self.workers if w.stats}

    async def start(self, plan: list[list[str]], tg: TaskGroup) -> None:
        """One worker per shard of `plan`, its frames' tasks in `tg`; each host
        stays with its worker."""
        limit = self.cluster.concurrency.hosts
        total = sum(len(s) for s in plan)
        argv = [sys.executable, "-m", "orchestrator.ssh.workers.child"]
        for index, shard in enumerate(plan, 1):
            if self.closed:
                break
            # A file, not a pipe: a worker's stderr never blocks it (closed in aclose).
            stderr = tempfile.TemporaryFile()  # noqa: SIM115
            process = await anyio.open_process(argv, stderr=stderr, start_new_session=True)
            worker = WorkerProcess(process, index, stderr, self.sink, tg)
            self.workers.append(worker)
            # Queued: each worker's writer task sends it while the next worker
            # starts (a big fleet's cluster is larger than a pipe's buffer, and
            # a worker reads only once its imports are done, so waiting on each
            # send would start the workers one after the other).
            share = max(1, math.ceil(limit * len(shard) / total))
            worker.post(f.Init(self.cluster, self.output_tail, share))
            for host in shard:
                self.assigned[host] = worker

    def worker_of(self, host: str) -> WorkerProcess:
        """The worker owning `host` (a host outside the cluster: one chosen by its name)."""
        worker = self.assigned.get(host)
        if worker is None:
            worker = self.workers[zlib.crc32(host.encode()) % len(self.workers)]
            self.assigned[host] = worker
        return worker

    def post_all(self, frame: f.ToChild) -> None:
        for worker in self.workers:
            if worker.dead is None:
                worker.post(frame)

    async def run(self, requests: Mapping[str, Request]) -> dict[str, HostResult]:
        """`requests[host]` on each host, each worker fanning out over its own."""
        parts: dict[WorkerProcess, dict[str, Request]] = {}
        for host, one in requests.items():
            parts.setdefault(self.worker_of(host), {})[host] = one
        pending: list[tuple[WorkerProcess, int, _FanOut]] = []
        for worker, part in parts.items():
            label = next(iter(part.values())).label
            fan = _FanOut(set(part), label=label or "exec")
            rid = 0
            if worker.dead is not None:
                worker.lose(fan)
            else:
                rid = worker.new_id()
                worker.requests[rid] = fan
                worker.post(f.Fan(rid, part))
            pending.append((worker, rid, fan))
        try:
            for _worker, _rid, fan in pending:
                await fan.finished.wait()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._cancel(pending)
            raise
        results: dict[str, HostResult] = {}
        for _worker, _rid, fan in pending:
            if fan.error is not None:
                raise fan.error
            results.update(fan.results)
        return results

    async def _cancel(self, requests: list[tuple[WorkerProcess, int, _FanOut]]) -> None:
        """Each worker cancels the fan-out (its remote processes end as one
        process's do when cancelled); a worker that has not finished within
        CANCEL_GRACE is killed, and its hosts are reported lost."""
        pending = [(w, rid, r) for w, rid, r in requests if not r.done]
        for worker, rid, _request in pending:
            worker.post(f.Cancel(rid))
        with anyio.move_on_after(CANCEL_GRACE):
            for _worker, _rid, request in pending:
                await request.finished.wait()
        for worker, _rid, request in pending:
            if not request.done:
                worker.kill()
                with anyio.move_on_after(CANCEL_GRACE):
                    await request.finished.wait()
                if not request.done:
                    worker.lose(request)

    def totals(self) -> dict[str, int]:
        """Handshakes and admission figures of the workers (for the benchmark)."""
        keys = ("connects", "peak_in_flight", "window_decreases", "cpu_ms", "maxrss_kib")
        totals = {k: sum(s.get(k, 0) for s in self.stats.values()) for k in keys}
        return {**totals, "workers": len(self.workers)}

    async def aclose(self) -> None:
        """Ask every worker to close its connections and exit; wait for them."""
        self.closed = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for worker in self.workers:
                    tg.start_soon(worker.aclose)


def new_fleet(cluster: ClusterConfig, sink: EventSink, output_tail: int) -> WorkerFleet:
    """A fleet not started yet (the caller starts it, and closes it also when
    starting failed half way); warns when `concurrency.workers` is clamped."""
    configured = cluster.concurrency.workers
    if configured is not None and configured > usable_cores():
        sink.emit(Message(level="warning", text=workers_clamped(configured)))
    return WorkerFleet(cluster, sink, output_tail)
