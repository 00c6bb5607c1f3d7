"""One invocation's probed facts (one `Cluster`: one `cvs` command, one API
session), held in one place and asked by whoever needs them: what the last
probe under the locks found (Lifecycle records it), the runtime on each host
whose container this invocation's `up` left running (while its lock is held),
and each container's exec facts, read once (containers/sshexec.py asks).

HostLocks only locks: it says which hosts it let go (`let_go`), and what an
`up` left ready there is no longer vouched for.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    # Annotations only: `cvs exec` imports this module, not the probe's.
    from orchestrator.containers.probe import HostState
    from orchestrator.containers.route import ExecFacts
    from orchestrator.remote.runtime import ContainerRuntime


def new_invocation_id() -> str:
    """Labels what one invocation starts, so it removes exactly that and no more."""
    return uuid.uuid4().hex[:16]


class Invocation:
    """This invocation's id and the facts it probed, per host."""

    def __init__(self, invocation_id: str | None = None) -> None:
        self.id = invocation_id or new_invocation_id()
        # What the last probe under the locks found, per host.
        self.states: dict[str, HostState] = {}
        # Host -> how to reach the runtime there, for hosts whose container an
        # `up` under this invocation's locks left running: while they are
        # held, nothing can replace it.
        self.ready: dict[str, ContainerRuntime] = {}
        # Host -> the container's exec facts (None: unreadable), read once.
        self._exec_facts: dict[str, ExecFacts | None] = {}
        self._reading: dict[str, anyio.Lock] = {}

    def probed(self, states: Mapping[str, HostState]) -> None:
        """The states the last probe under the locks found (replacing the last's)."""
        self.states = dict(states)

    def let_go(self, hosts: Sequence[str]) -> None:
        """The locks of `hosts` were released: an `up`'s containers there may
        be replaced from now on."""
        for host in hosts:
            self.ready.pop(host, None)

    def known(self, host: str, facts: ExecFacts | None) -> None:
        """Exec facts read under this invocation's lock (the probe's inspect):
        no inspect of their own for this host."""
        if facts is not None and host not in self._exec_facts:
            self._exec_facts[host] = facts

    async def exec_facts(
        self, host: str, read: Callable[[], Awaitable[ExecFacts | None]]
    ) -> ExecFacts | None:
        """The container's exec facts, `read` once per invocation (concurrent
        askers wait for the one read)."""
        if host not in self._exec_facts:
            async with self._reading.setdefault(host, anyio.Lock()):
                if host not in self._exec_facts:
                    self._exec_facts[host] = await read()
        return self._exec_facts[host]

    def reread(self, host: str, facts: ExecFacts) -> None:
        """Exec facts read again (the container restarted since): they replace the old."""
        self._exec_facts[host] = facts
