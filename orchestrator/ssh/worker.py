"""A worker process of the coordinator (ssh/workers.py): `python -m orchestrator.ssh.worker`.

Reads frames on stdin: `init` (the cluster, the output tail, its share of
`concurrency.hosts`), then

- `fan`: a command per host, fanned out here (`run_on_hosts`): a `result`
  frame per host and `done` (with the pool's handshake figures);
- `call`: one operation of the `HostRunner` seam, answered by a `reply`
  frame: `run` (`SSHPool.run`), a held process's open, reads, drain, wait
  and close (`SSHPool.held_process`, proxied by ssh/worker_runner.py), a
  command through a container's sshd (`ContainerConnections.run`, over this
  worker's own connection to the host);
- `post`: a held process's writes, end of input and signals (no answer);
- `cancel` (a fan's or a call's id) and `close`.

Writes frames on stdout: every event of its `SSHPool`, the results and
replies, and `exited` when a held process's channel closes. Its own stdout
is moved aside first, so nothing printed by accident corrupts a frame.

A request cancelled (`cancel`, or the parent gone: stdin closed) is
cancelled as one process cancels it: the pool ends each command's remote
process group over its channel, then the connections close; a held process
gets the end of its input (a lock holder lets go), as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import anyio

from orchestrator.config import ClusterConfig
from orchestrator.errors import ConnectError
from orchestrator.events import Event
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import Command
from orchestrator.ssh.transport import SSHPool
from orchestrator.ssh.workers import read_frame, write_frame


class FrameSink:
    """The pool's events, as frames to the parent."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def emit(self, event: Event) -> None:
        write_frame(self.out, ("event", event))

    def close(self) -> None:
        pass


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Held:
    """A held process, kept open by its task until the parent closes it."""

    process: Any = None
    opened: asyncio.Future[None] = field(default_factory=lambda: _future())
    close: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)


class Worker:
    """What one worker serves: its pool, its held processes, its container sshd connections."""

    def __init__(
        self, cluster: ClusterConfig, out: IO[bytes], output_tail: int, limit: int
    ) -> None:
        self.out = out
        self.limit = limit
        self.pool = SSHPool(cluster, FrameSink(out), output_tail=output_tail)
        self.scopes: dict[tuple[str, int], anyio.CancelScope] = {}
        self.held: dict[int, _Held] = {}
        self.containers: Any = None  # ContainerConnections, once the parent sends the key
        self.tg: Any = None

    # -- fan: a command per host ------------------------------------------------

    async def fan(
        self, rid: int, commands: Mapping[str, Command], options: tuple[Any, ...]
    ) -> None:
        timeout, input, env, label = options
        pool, out = self.pool, self.out

        async def one(host: str) -> HostResult:
            result = await pool.run(
                host, commands[host], timeout=timeout, input=input, env=env, label=label
            )
            write_frame(out, ("result", rid, result))
            return result

        try:
            with self.scopes.setdefault(("fan", rid), anyio.CancelScope()):
                await fan_out(list(commands), one, limit=self.limit)
        finally:
            self.scopes.pop(("fan", rid), None)
            write_frame(out, ("done", rid, self.stats()))

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

    # -- call: one operation, one reply -------------------------------------------

    async def call(
        self, cid: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        ok = False
        value: Any = ("error", f"{method}: cancelled")
        try:
            handler: Callable[..., Coroutine[Any, Any, Any]] = getattr(self, "op_" + method)
            with self.scopes.setdefault(("call", cid), anyio.CancelScope()):
                value, ok = await handler(*args, **kwargs), True
        except ConnectError as exc:
            value = ("connect", exc.host, exc.status, exc.message, exc.attempts)
        except Exception as exc:
            from orchestrator.ssh.container_channel import NotStarted

            if isinstance(exc, NotStarted):
                value = ("not_started", exc.host, exc.kind, exc.reason)
            else:
                value = ("error", f"{type(exc).__name__}: {exc}")
        finally:
            self.scopes.pop(("call", cid), None)
            write_frame(self.out, ("reply", cid, ok, value))

    async def op_run(self, host: str, command: Command, **options: Any) -> HostResult:
        kill = options.pop("on_timeout", None)
        on_timeout = None if kill is None else (lambda: kill)
        return await self.pool.run(host, command, on_timeout=on_timeout, **options)

    async def op_held_open(
        self, hid: int, host: str, command: Command, encoding: str | None
    ) -> None:
        await self._open_held(hid, lambda: self.pool.held_process(host, command, encoding=encoding))

    async def op_container_held_open(
        self, hid: int, ep: Any, text: str, stdin: str, label: str | None, on_end: str | None
    ) -> Any:
        """A copy's in-container end through the container's sshd, held as above;
        the connections' counters once it is open."""
        await self._open_held(
            hid,
            lambda: self.containers.held_process(ep, text, stdin=stdin, label=label, on_end=on_end),
        )
        return self.containers.counters

    async def _open_held(
        self, hid: int, opener: Callable[[], contextlib.AbstractAsyncContextManager[Any]]
    ) -> None:
        held = self.held[hid] = _Held()
        self.tg.start_soon(self._hold, hid, held, opener)
        try:
            await asyncio.shield(held.opened)
        except BaseException:
            held.close.set()
            raise

    async def _hold(
        self,
        hid: int,
        held: _Held,
        opener: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
    ) -> None:
        try:
            async with opener() as process:
                held.process = process
                held.opened.set_result(None)
                self.tg.start_soon(self._watch, hid, process)
                await held.close.wait()
        except BaseException as exc:
            if not held.opened.done():
                failed = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
                held.opened.set_exception(failed)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.held.pop(hid, None)
            held.ended.set()

    async def _watch(self, hid: int, process: Any) -> None:
        """Tell the parent when the held process's channel closes (its exit status)."""
        with contextlib.suppress(Exception):
            await process.channel.wait_closed()
        write_frame(self.out, ("exited", hid, process.exit_status))

    def _process(self, hid: int) -> Any:
        held = self.held.get(hid)
        if held is None or held.process is None:
            raise ConnectionError("the held process is closed")
        return held.process

    async def op_held_read(self, hid: int, stream: str, how: str, size: int = -1) -> Any:
        reader = getattr(self._process(hid), stream)
        return await (reader.readline() if how == "readline" else reader.read(size))

    async def op_held_drain(self, hid: int) -> None:
        await self._process(hid).stdin.drain()

    async def op_held_wait(self, hid: int) -> tuple[int | None, int | None]:
        done = await self._process(hid).wait(check=False)
        return done.exit_status, done.returncode

    async def op_held_close(self, hid: int) -> None:
        held = self.held.get(hid)
        if held is not None:
            held.close.set()
            await held.ended.wait()

    def post(self, what: str, hid: int, *args: Any) -> None:
        held = self.held.get(hid)
        if held is None or held.process is None:
            return
        with contextlib.suppress(Exception):
            if what == "write":
                held.process.stdin.write(args[0])
            elif what == "eof":
                held.process.stdin.write_eof()
            elif what == "signal":
                held.process.send_signal(args[0])

    # -- commands through a container's sshd ------------------------------------------

    def keys(self, private_key: bytes) -> None:
        import asyncssh

        from orchestrator.ssh.container_channel import ContainerConnections

        key = asyncssh.import_private_key(private_key)
        self.containers = ContainerConnections(self.pool, key, sink=self.pool.sink)

    async def op_container_run(self, ep: Any, text: str, **options: Any) -> tuple[HostResult, Any]:
        result = await self.containers.run(ep, text, **options)
        return result, self.containers.counters

    async def op_container_warm(self, ep: Any) -> tuple[bool, Any]:
        return await self.containers.warm(ep), self.containers.counters

    async def aclose(self) -> None:
        for held in list(self.held.values()):
            held.close.set()
        for held in list(self.held.values()):
            with anyio.move_on_after(10):
                await held.ended.wait()
        if self.containers is not None:
            await self.containers.aclose()


async def serve(stdin: IO[bytes], out: IO[bytes]) -> None:
    init = read_frame(stdin)
    if init is None or init[0] != "init":
        return
    worker = Worker(init[1], out, init[2], init[3])
    async with worker.pool, anyio.create_task_group() as tg:
        worker.tg = tg
        try:
            await _loop(worker, stdin, tg)
        finally:
            with anyio.CancelScope(shield=True):
                await worker.aclose()
            tg.cancel_scope.cancel()  # what is left (a call the parent gave up on)


async def _loop(worker: Worker, stdin: IO[bytes], tg: Any) -> None:
    while True:
        message = await anyio.to_thread.run_sync(read_frame, stdin, abandon_on_cancel=True)
        if message is None:  # the parent went away: end everything
            tg.cancel_scope.cancel()
            return
        kind = message[0]
        if kind == "close":
            return
        if kind == "cancel":
            for key in (("fan", message[1]), ("call", message[1])):
                scope = worker.scopes.get(key)
                if scope is not None:
                    scope.cancel()
        elif kind == "fan":
            _, rid, commands, *options = message
            worker.scopes[("fan", rid)] = anyio.CancelScope()
            tg.start_soon(worker.fan, rid, commands, tuple(options))
        elif kind == "call":
            _, cid, method, args, kwargs = message
            worker.scopes[("call", cid)] = anyio.CancelScope()
            tg.start_soon(worker.call, cid, method, args, kwargs)
        elif kind == "post":
            worker.post(message[1], *message[2:])
        elif kind == "keys":
            worker.keys(message[1])


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
