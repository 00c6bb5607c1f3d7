"""One `exec`'s stdin feed and raw output, handed to each host's command.

`ExecStreams` holds what `Cluster.exec` was given (a file descriptor to feed
every host from, a callback taking the output as bytes) and gives each host
its `ExecIO` (ssh/stdin.py): `start(hosts)` subscribes every selected host
before the first byte is read, `of(host)` is that host's share, closed when
its command is done (or never ran), so the feed never waits on it.

Both need the commands in this process: worker processes (ssh/workers.py,
a fleet of hundreds of hosts on a machine with many cores) take no callback
and no stream, so there they are refused, naming the way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import anyio
from anyio.abc import ObjectReceiveStream, TaskGroup

from orchestrator.errors import Call, Option, Phrase, UsageError
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import Command, HostRunner
from orchestrator.ssh.stdin import ExecIO, RawOutput, StdinFeed
from orchestrator.ssh.transport import SSHPool


class ExecStreams:
    """One exec's streams (as the module's header says)."""

    def __init__(self, stdin: int | None, raw: RawOutput | None, pool: HostRunner) -> None:
        self.feed = StdinFeed(stdin) if stdin is not None else None
        self.raw = raw
        self.pool = pool
        self._mine: dict[str, ObjectReceiveStream[bytes]] = {}
        self._tg: TaskGroup | None = None

    @property
    def wanted(self) -> bool:
        return self.feed is not None or self.raw is not None

    @contextlib.asynccontextmanager
    async def feeding(self) -> AsyncIterator[None]:
        """The scope the feed runs in (`start` starts it); it stops on exit."""
        if self.wanted and not isinstance(self.pool, SSHPool):
            raise UsageError(
                Phrase(
                    "exec: stdin and output as bytes need the commands in this process, and "
                    "this cluster runs them in worker processes (concurrency.workers): "
                    "close stdin (",
                    Call("exec", (Option("stdin", False),)),
                    "), or set concurrency.workers: 1",
                )
            )
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self._tg = None

    def start(self, hosts: Sequence[str]) -> None:
        """Subscribe every host, then start reading (once)."""
        if self.feed is None or self._tg is None or self._mine:
            return
        for host in hosts:
            self._mine[host] = self.feed.subscribe()
        self._tg.start_soon(self.feed.run)

    @contextlib.asynccontextmanager
    async def of(self, host: str) -> AsyncIterator[ExecIO | None]:
        """`host`'s share (None: nothing to stream), closed on exit."""
        stream = self._mine.pop(host, None)
        if not self.wanted:
            yield None
            return
        try:
            yield ExecIO(stdin=stream, raw=self.raw)
        finally:
            if stream is not None:
                await stream.aclose()

    async def on_hosts(
        self,
        hosts: Sequence[str],
        command: Command,
        *,
        timeout: float | None,
        env: dict[str, str] | None,
    ) -> dict[str, HostResult]:
        """`command` on the hosts themselves (`exec --host-os`), with the streams."""
        assert isinstance(self.pool, SSHPool)  # feeding() refused worker processes
        pool = self.pool
        self.start(hosts)

        async def one(host: str) -> HostResult:
            async with self.of(host) as io:
                return await pool.run(host, command, timeout=timeout, env=env, label="exec", io=io)

        return await fan_out(hosts, one, limit=pool.cluster.concurrency.hosts)
