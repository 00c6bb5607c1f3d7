"""The seam between what runs on a host and how it gets there.

Everything above this layer (the lifecycle, the locks, provisioning) decides
*what* to run, as argv or shell text, and reads back a `HostResult` or a held
process's output; `HostRunner` is all it needs of *how*. `SSHPool`
implements it over one asyncssh connection per host; a scripted fake
(`orchestrator/testing.py`, shipped with the package) implements it too,
so rollback, the barrier, lock conversion, timeouts and partial failures
are tested without root or hosts, the way
httpx's `MockTransport` stands in for `HTTPTransport` behind one
`BaseTransport`. The fake adds tests; everything that crosses SSH or touches
docker is still tested on the sandbox.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from orchestrator.results import HostResult

# An argv list (quoted once with shlex.join) or shell text.
Command = str | Sequence[str]


class HostRunner(Protocol):
    """Run commands on the cluster's hosts (SSHPool's public surface)."""

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
        """Run `command` on `host` and wait for it: never raises for the
        host's sake (unreachable, failed, timed out: the result says)."""
        ...

    async def run_many(
        self,
        commands: Mapping[str, Command],
        *,
        timeout: float | None = None,
        input: str | None = None,
        env: dict[str, str] | None = None,
        label: str | None = None,
        limit: int | None = None,
    ) -> dict[str, HostResult]:
        """`commands[host]` on each of its hosts, concurrently (at most `limit`
        at once; by default the runner's own bound), results in the mapping's
        order. Never raises for a host's sake, as `run`."""
        ...

    def held_process(
        self, host: str, command: Command, *, encoding: str | None = "utf-8"
    ) -> AbstractAsyncContextManager[Any]:
        """A remote process kept running while the block runs (a lock
        holder, a copy's stream): `.stdout.readline()`, `.stdin.write()`,
        `.stderr.read()`, `.wait()`. Raises ConnectError when the host is not
        reached; on exit its stdin is closed."""
        ...
