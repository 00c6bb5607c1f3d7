"""The fan-out in several coordinator processes, one per core.

One Python process runs on one core: on a 16-core coordinator a 5000-host
fan-out saturates it (3 ms of our CPU per host for a fresh connection) while
15 cores idle. Past a fleet size where it pays, `run_on_hosts` hands each
shard of the hosts to a worker process (`python -m orchestrator.ssh.worker`)
with its own event loop, `SSHPool` and connections, kept for the parent
pool's life so later commands reuse them. The parent keeps what needs every
host: it forwards each worker's events to its own sink (the live view, the
records), gathers the results in host order and decides exit codes as
before.

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
- **What**: `run_on_hosts` (`cvs exec --host-os`, the API's `exec` on the
  hosts, the benchmark). `up`, `status`, `down` and in-container `exec`
  (locks, probes, held processes) still run in one process.
- **Faults**: a worker that dies is named, its hosts' results say they were
  lost with it, the other workers' hosts finish. Cancelling (Ctrl-C, a
  caller's timeout) asks each worker to cancel the request, which ends its
  remote processes as one process would, and waits for it (bounded). The
  workers run in a session of their own (a terminal's Ctrl-C reaches the
  parent only, which decides); a parent that goes away closes their stdin,
  and they cancel everything and exit.

The protocol is pickled frames over the worker's stdin and stdout, between
processes of the same program.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import struct
import sys
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from orchestrator.config import ClusterConfig
from orchestrator.config.views import usable_cores, workers_clamped
from orchestrator.events import CommandFinished, EventSink, Message
from orchestrator.results import HostResult
from orchestrator.ssh.seam import Command

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
_HEADER = struct.Struct("!I")


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


def write_frame(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


@dataclass
class _Request:
    hosts: set[str]
    results: dict[str, HostResult] = field(default_factory=dict)
    done: bool = False
    stats: dict[str, int] = field(default_factory=dict)


class _Worker:
    """One worker process, seen from the parent. Its frames are read while a
    request of the parent waits on it (a worker speaks only then)."""

    def __init__(self, process: Process, index: int, stderr: IO[bytes]) -> None:
        self.process = process
        self.index = index
        self.stderr = stderr  # a file: a worker's stderr never blocks it
        self.dead: str | None = None  # how it ended, once it has
        assert process.stdout is not None
        self._stdout = BufferedByteReceiveStream(process.stdout)
        # A frame's size, read while its body was not yet (a cancelled read
        # keeps its place: the body's bytes stay in the buffered stream).
        self._size: int | None = None

    @property
    def name(self) -> str:
        return f"worker process {self.index} (pid {self.process.pid})"

    async def send(self, message: object) -> None:
        assert self.process.stdin is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        # Whole frames only: a cancelled write would leave the worker half of one.
        with (
            anyio.CancelScope(shield=True),
            contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError),
        ):
            await self.process.stdin.send(_HEADER.pack(len(data)) + data)

    async def pump(self, rid: int, request: _Request, sink: EventSink, label: str) -> None:
        """Frames from the worker until `request` is done; at the worker's end,
        every host it still owed a result is reported lost with it, by name."""
        try:
            while not request.done and self.dead is None:
                if self._size is None:
                    header = await self._stdout.receive_exactly(_HEADER.size)
                    (self._size,) = _HEADER.unpack(header)
                message = pickle.loads(await self._stdout.receive_exactly(self._size))
                self._size = None
                if message[0] == "event":
                    sink.emit(message[1])
                elif message[0] == "result" and message[1] == rid:
                    request.results[message[2].host] = message[2]
                elif message[0] == "done" and message[1] == rid:
                    request.stats, request.done = message[2], True
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
            await self._ended()
        if not request.done:
            self._lose(request, sink, label)

    async def _ended(self) -> None:
        with anyio.move_on_after(5, shield=True):
            await self.process.wait()
        self.dead = _exit_words(self.process.returncode) + self._last_words()

    def _last_words(self) -> str:
        """The last line the worker wrote on stderr (a traceback's last), if any."""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - 2000))
            lines = self.stderr.read().decode(errors="replace").strip().splitlines()
            if lines:
                return f" ({lines[-1].strip()[:200]})"
        return ""

    def _lose(self, request: _Request, sink: EventSink, label: str) -> None:
        for host in sorted(request.hosts - request.results.keys()):
            error = (
                f"lost: the {self.name} working on this host {self.dead or 'was stopped'} "
                "before its command finished; the other hosts were not affected"
            )
            result = HostResult(host, "unreachable", error=error)
            request.results[host] = result
            sink.emit(CommandFinished(host=host, result=result, label=label))
        request.done = True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerFleet:
    """Worker processes serving one parent `SSHPool`'s hosts, started on first use."""

    def __init__(self, cluster: ClusterConfig, sink: EventSink, output_tail: int) -> None:
        self.cluster = cluster
        self.sink = sink
        self.output_tail = output_tail
        self.workers: list[_Worker] = []
        self.assigned: dict[str, _Worker] = {}
        # Each worker's pool's figures, as its last request ended.
        self.stats: dict[_Worker, dict[str, int]] = {}
        self._next_id = 0
        self.closed = False
        # One fan-out at a time through the workers (each speaks to one reader).
        self._lock = anyio.Lock()

    async def start(self, plan: list[list[str]]) -> None:
        """One worker per shard of `plan`; each host stays with its worker."""
        limit = self.cluster.concurrency.hosts
        total = sum(len(s) for s in plan)
        argv = [sys.executable, "-m", "orchestrator.ssh.worker"]
        started: list[tuple[_Worker, int]] = []
        for index, shard in enumerate(plan, 1):
            if self.closed:
                break
            # A file, not a pipe: a worker's stderr never blocks it (closed in aclose).
            stderr = tempfile.TemporaryFile()  # noqa: SIM115
            process = await anyio.open_process(argv, stderr=stderr, start_new_session=True)
            worker = _Worker(process, index, stderr)
            self.workers.append(worker)
            started.append((worker, max(1, math.ceil(limit * len(shard) / total))))
            for host in shard:
                self.assigned[host] = worker
        # Every worker gets its init at once: a big fleet's cluster is larger than a
        # pipe's buffer, and a worker reads only once its imports are done, so
        # sending one after the other would start the workers one after the other.
        async with anyio.create_task_group() as tg:
            for worker, share in started:
                tg.start_soon(worker.send, ("init", self.cluster, self.output_tail, share))

    async def run(
        self,
        commands: Mapping[str, Command],
        *,
        timeout: float | None,
        input: str | None,
        env: dict[str, str] | None,
        label: str | None,
    ) -> dict[str, HostResult]:
        """`commands[host]` on each host, through the host's worker."""
        async with self._lock:
            self._next_id += 1
            rid = self._next_id
            parts: dict[_Worker, dict[str, Command]] = {}
            for host, command in commands.items():
                parts.setdefault(self.assigned[host], {})[host] = command
            requests = [(w, _Request(set(part))) for w, part in parts.items()]
            for worker, part in parts.items():
                await worker.send(("run", rid, part, timeout, input, env, label))
            try:
                await self._pump(rid, requests, label)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._cancel(rid, requests, label)
                raise
        results: dict[str, HostResult] = {}
        for worker, request in requests:
            results.update(request.results)
            if request.stats:
                self.stats[worker] = request.stats
        return results

    async def _pump(
        self, rid: int, requests: list[tuple[_Worker, _Request]], label: str | None
    ) -> None:
        async with anyio.create_task_group() as tg:
            for worker, request in requests:
                tg.start_soon(worker.pump, rid, request, self.sink, label or "exec")

    async def _cancel(
        self, rid: int, requests: list[tuple[_Worker, _Request]], label: str | None
    ) -> None:
        """Each worker cancels the request (its remote processes end as one
        process's do when cancelled); a worker that has not finished within
        CANCEL_GRACE is killed, and its hosts are reported lost."""
        pending = [(w, r) for w, r in requests if not r.done]
        for worker, _request in pending:
            await worker.send(("cancel", rid))
        with anyio.move_on_after(CANCEL_GRACE):
            await self._pump(rid, pending, label)
        for worker, request in pending:
            if not request.done:
                worker.kill()
                await worker._ended()
                worker._lose(request, self.sink, label or "exec")

    async def aclose(self) -> None:
        """Ask every worker to close its connections and exit; wait for them."""
        self.closed = True
        with anyio.CancelScope(shield=True):
            for worker in self.workers:
                await worker.send(("close",))
            with anyio.move_on_after(CANCEL_GRACE):
                for worker in self.workers:
                    await worker.process.wait()
            for worker in self.workers:
                if worker.process.returncode is None:
                    worker.kill()
                with contextlib.suppress(Exception):
                    await worker.process.aclose()
                worker.stderr.close()


# The fleet serving each pool (closed with the pool).
_FLEETS: weakref.WeakKeyDictionary[Any, WorkerFleet] = weakref.WeakKeyDictionary()


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
            from orchestrator.ssh.sshconfig import config_route

            port = (spec.port if spec else None) or cluster.ssh.port
            route = config_route(address, port, (spec.user if spec else None) or cluster.ssh.user)
            key = (
                f"jump:{route.jump}"
                if route.jump
                else ("proxy-command" if route.proxy_command else route.host)
            )
        groups.setdefault(key, []).append(host)
    return groups


async def fleet_for(pool: Any, hosts: Sequence[str]) -> WorkerFleet | None:
    """The pool's worker fleet when a fan-out over `hosts` is worth one (started
    now, over the pool's hosts, for this and later fan-outs), else None."""
    from orchestrator.ssh.transport import SSHPool

    if not isinstance(pool, SSHPool):
        return None  # a scripted stand-in (tests): one process
    fleet = _FLEETS.get(pool)
    if fleet is not None and not fleet.closed:
        return fleet if all(h in fleet.assigned for h in hosts) else None
    cluster: ClusterConfig = pool.cluster
    configured = cluster.concurrency.workers
    count = planned_workers(cluster, len(hosts))
    if count < 2:
        return None
    if configured is not None and configured > usable_cores():
        pool.sink.emit(Message(level="warning", text=workers_clamped(configured)))
    fleet = WorkerFleet(cluster, pool.sink, pool.output_tail)
    everyone = list(dict.fromkeys([*hosts, *(h.name for h in cluster.hosts)]))
    _FLEETS[pool] = fleet
    pool.closers.append(fleet.aclose)  # also what a failed start started
    await fleet.start(shards(_sshd_groups(cluster, everyone), count))
    return fleet


def fleet_stats(pool: Any) -> dict[str, int]:
    """Handshakes and admission figures of the pool's workers (for the benchmark)."""
    fleet = _FLEETS.get(pool)
    if fleet is None:
        return {}
    keys = ("connects", "peak_in_flight", "window_decreases", "cpu_ms", "maxrss_kib")
    totals = {k: sum(s.get(k, 0) for s in fleet.stats.values()) for k in keys}
    return {**totals, "workers": len(fleet.workers)}
