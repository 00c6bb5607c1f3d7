"""A worker process of the fan-out (ssh/workers.py): `python -m orchestrator.ssh.worker`.

Reads frames on stdin: `init` (the cluster, the output tail, its share of
`concurrency.hosts`), then `run` (a request: a command per host), `cancel`
(a request's id) and `close`. Writes frames on stdout: every event of its
`SSHPool`, each host's result, and `done` per request (with the pool's
handshake figures). Its own stdout is moved aside first, so nothing printed
by accident corrupts a frame.

A request cancelled (`cancel`, or the parent gone: stdin closed) is
cancelled as one process cancels a fan-out: the pool ends each command's
remote process group over its channel, then the connections close.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

import anyio

from orchestrator.config import ClusterConfig
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


async def _run(
    pool: SSHPool,
    out: IO[bytes],
    rid: int,
    commands: Mapping[str, Command],
    options: tuple[Any, ...],
    limit: int,
    scope: anyio.CancelScope,
) -> None:
    timeout, input, env, label = options

    async def one(host: str) -> HostResult:
        result = await pool.run(
            host, commands[host], timeout=timeout, input=input, env=env, label=label
        )
        write_frame(out, ("result", rid, result))
        return result

    try:
        with scope:
            await fan_out(list(commands), one, limit=limit)
    finally:
        stats = {
            "connects": pool.connects,
            "peak_in_flight": pool.admission.peak_in_flight,
            "window_decreases": pool.admission.window.decreases,
            # This process's own cost so far (for the benchmark's CPU and memory).
            "cpu_ms": int(time.process_time() * 1000),
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }
        write_frame(out, ("done", rid, stats))


async def serve(stdin: IO[bytes], out: IO[bytes]) -> None:
    init = read_frame(stdin)
    if init is None or init[0] != "init":
        return
    cluster: ClusterConfig = init[1]
    output_tail: int = init[2]
    limit: int = init[3]
    scopes: dict[int, anyio.CancelScope] = {}
    pool = SSHPool(cluster, FrameSink(out), output_tail=output_tail)
    async with pool, anyio.create_task_group() as tg:
        while True:
            message = await anyio.to_thread.run_sync(read_frame, stdin, abandon_on_cancel=True)
            if message is None:  # the parent went away: end everything
                tg.cancel_scope.cancel()
                break
            if message[0] == "close":
                break
            if message[0] == "cancel":
                scope = scopes.pop(message[1], None)
                if scope is not None:
                    scope.cancel()
            elif message[0] == "run":
                _, rid, commands, *options = message
                scope = scopes[rid] = anyio.CancelScope()
                tg.start_soon(_run, pool, out, rid, commands, tuple(options), limit, scope)


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
