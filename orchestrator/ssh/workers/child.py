"""A worker process of the coordinator: `python -m orchestrator.ssh.workers.child`.

Reads frames (frames.py) on stdin: `Init` (the cluster, the output tail, its
share of `concurrency.hosts`), then `Fan` (a command per host, fanned out
here: a `Result` per host and `Done` with the pool's handshake figures),
`Call` (one operation of the seam, answered by `Reply` or `Failed`), the
held processes' `Write`, `Eof` and `Signal`, `Keys`, `Cancel` and `Close`.

Writes frames on stdout: every event of its `SSHPool`, the results and
replies, and `Exited` when a held process's channel closes. Its own stdout
is moved aside first, so nothing printed by accident corrupts a frame.

Every task runs in the task group `serve` owns. A request cancelled
(`Cancel`, or the parent gone: stdin closed) is cancelled as one process
cancels it: the pool ends each command's remote process group over its
channel, then the connections close; a held process gets the end of its
input (a lock holder lets go), as in one process.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, assert_never

import anyio
from anyio.abc import TaskGroup

from orchestrator.errors import ConnectError
from orchestrator.events import Event
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.target import Endpoint, NotStarted
from orchestrator.ssh.transport import SSHPool
from orchestrator.ssh.workers import frames as f


class FrameSink:
    """The pool's events, as frames to the parent."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def emit(self, event: Event) -> None:
        f.write_frame(self.out, f.EventFrame(event))

    def close(self) -> None:
        pass


@dataclass
class _Held:
    """A held process, kept open by its task until the parent closes it."""

    process: Any = None
    opened: anyio.Event = field(default_factory=anyio.Event)
    failed: Exception | None = None
    close: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)


class Child:
    """What one worker serves: its pool (hosts and their containers' sshd), its held processes."""

    def __init__(self, pool: SSHPool, limit: int, out: IO[bytes], tg: TaskGroup) -> None:
        self.out = out
        self.limit = limit
        self.tg = tg
        self.pool = pool
        self.scopes: dict[int, anyio.CancelScope] = {}  # fan-outs and calls, by id
        self.held: dict[int, _Held] = {}

    def send(self, frame: f.ToParent) -> None:
        f.write_frame(self.out, frame)

    # -- a frame from the parent ----------------------------------------------------

    def receive(self, frame: f.ToChild) -> None:
        """Act on one frame (Init and Close are the loop's)."""
        match frame:
            case f.Fan():
                self.scopes[frame.rid] = anyio.CancelScope()
                self.tg.start_soon(self.fan, frame)
            case f.Call():
                self.scopes[frame.cid] = anyio.CancelScope()
                self.tg.start_soon(self.call, frame)
            case f.Write() | f.Eof() | f.Signal():
                self.post(frame)
            case f.Cancel():
                scope = self.scopes.get(frame.id)
                if scope is not None:
                    scope.cancel()
            case f.Keys():
                self.keys(frame.private_key)
            case f.Init() | f.Close():
                pass
            case _:
                assert_never(frame)

    # -- fan: a command per host ------------------------------------------------------

    async def fan(self, fan: f.Fan) -> None:
        pool = self.pool

        async def one(host: str) -> HostResult:
            result = await pool.send(host, fan.requests[host])
            self.send(f.Result(fan.rid, result))
            return result

        try:
            with self.scopes.setdefault(fan.rid, anyio.CancelScope()):
                await fan_out(list(fan.requests), one, limit=self.limit)
        finally:
            self.scopes.pop(fan.rid, None)
            self.send(f.Done(fan.rid, self.stats()))

    def stats(self) -> dict[str, int]:
        pool = self.pool
        return {
            "connects": pool.connects,
            "peak_in_flight": pool.admission.peak_in_flight,
            "window_decreases": pool.admission.window.decreases,
            # This process's own cost so far (for the benchmark's CPU and memory).
            "cpu_ms": int(time.process_time() * 1000),
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }

    # -- call: one operation, one answer ----------------------------------------------

    async def call(self, call: f.Call) -> None:
        answer: f.Reply | f.Failed = f.Failed(call.cid, "cancelled")
        try:
            with self.scopes.setdefault(call.cid, anyio.CancelScope()):
                answer = f.Reply(call.cid, await self.perform(call.op))
        except ConnectError as exc:
            failed = f.ConnectFailed(exc.host, exc.status, exc.message, exc.attempts)
            answer = f.Failed(call.cid, failed)
        except Exception as exc:
            if isinstance(exc, NotStarted):
                answer = f.Failed(call.cid, f.NotStartedFailed(exc.host, exc.kind, exc.reason))
            else:
                answer = f.Failed(call.cid, f"{type(exc).__name__}: {exc}")
        finally:
            self.scopes.pop(call.cid, None)
            self.send(answer)

    async def perform(self, op: f.Op) -> object:
        """The dispatch table: every operation has its handler (mypy checks)."""
        match op:
            case f.RunOp():
                return await self.pool.send(op.host, op.request)
            case f.HeldOpen():
                target, request = op.target, op.held
                await self._open_held(op.hid, lambda: self.pool.held_process(target, request))
                return self.pool.container_counters if isinstance(target, Endpoint) else None
            case f.HeldRead():
                process = self._process(op.hid)
                reader = process.stdout if op.stream == "stdout" else process.stderr
                if op.how == "readline":
                    return await reader.readline()
                return await reader.read(op.size)
            case f.HeldDrain():
                await self._process(op.hid).stdin.drain()
                return None
            case f.HeldWait():
                done = await self._process(op.hid).wait(check=False)
                return done.exit_status, done.returncode
            case f.HeldClose():
                held = self.held.get(op.hid)
                if held is not None:
                    held.close.set()
                    await held.ended.wait()
                return None
            case f.ContainerRun():
                result = await self.pool.send(op.ep, op.request)
                return result, self.pool.container_counters
            case f.ContainerWarm():
                return await self.pool.warm(op.ep), self.pool.container_counters
            case _:
                assert_never(op)

    # -- held processes ------------------------------------------------------------------

    async def _open_held(
        self, hid: int, opener: Callable[[], contextlib.AbstractAsyncContextManager[Any]]
    ) -> None:
        held = self.held[hid] = _Held()
        self.tg.start_soon(self._hold, hid, held, opener)
        try:
            await held.opened.wait()
        except BaseException:
            held.close.set()
            raise
        if held.failed is not None:
            raise held.failed

    async def _hold(
        self,
        hid: int,
        held: _Held,
        opener: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    ) -> None:
        try:
            async with opener() as process:
                held.process = process
                held.opened.set()
                self.tg.start_soon(self._watch, hid, process)
                await held.close.wait()
        except BaseException as exc:
            if not held.opened.is_set():
                held.failed = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
                held.opened.set()
            if not isinstance(exc, Exception):
                raise
        finally:
            self.held.pop(hid, None)
            held.ended.set()

    async def _watch(self, hid: int, process: Any) -> None:
        """Tell the parent when the held process's channel closes (its exit status)."""
        with contextlib.suppress(Exception):
            await process.channel.wait_closed()
        self.send(f.Exited(hid, process.exit_status))

    def _process(self, hid: int) -> Any:
        held = self.held.get(hid)
        if held is None or held.process is None:
            raise ConnectionError("the held process is closed")
        return held.process

    def post(self, frame: f.Post) -> None:
        held = self.held.get(frame.hid)
        if held is None or held.process is None:
            return
        with contextlib.suppress(Exception):
            match frame:
                case f.Write():
                    held.process.stdin.write(frame.data)
                case f.Eof():
                    held.process.stdin.write_eof()
                case f.Signal():
                    held.process.send_signal(frame.name)
                case _:
                    assert_never(frame)

    # -- commands through a container's sshd ----------------------------------------------

    def keys(self, private_key: bytes) -> None:
        """The containers' key: the pool connects to their sshd (and closes them)."""
        self.pool.use_container_key(asyncssh.import_private_key(private_key))

    async def aclose(self) -> None:
        for held in list(self.held.values()):
            held.close.set()
        for held in list(self.held.values()):
            with anyio.move_on_after(10):
                await held.ended.wait()


async def serve(stdin: IO[bytes], out: IO[bytes]) -> None:
    init = f.read_frame(stdin)
    if not isinstance(init, f.Init):
        return
    pool = SSHPool(init.cluster, FrameSink(out), output_tail=init.output_tail)
    # The pool outlives the tasks: a cancelled command ends its remote side over it.
    async with pool, anyio.create_task_group() as tg:
        child = Child(pool, init.limit, out, tg)
        try:
            await _loop(child, stdin, tg)
        finally:
            with anyio.CancelScope(shield=True):
                await child.aclose()
            tg.cancel_scope.cancel()  # what is left (a call the parent gave up on)


async def _loop(child: Child, stdin: IO[bytes], tg: TaskGroup) -> None:
    while True:
        frame = await anyio.to_thread.run_sync(f.read_frame, stdin, abandon_on_cancel=True)
        if frame is None:  # the parent went away: end everything
            tg.cancel_scope.cancel()
            return
        if isinstance(frame, f.Close):
            return
        if isinstance(frame, f.ToChild):
            child.receive(frame)


def main() -> int:
    # Frames go to the real stdout; anything else printing lands on stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # The worker is ours to tune, as the `cvs` process is (cli/collector.py).
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(20_000, middle, old)
    anyio.run(serve, sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
