"""Issue 30, finding 3: two invocations never wait on each other, whatever
their `--hosts` subsets.

The hosts here are a model of flock(1) shared by two `HostLocks` (the lock
program's frames, exclusive locks, a waiting take that blocks until the lock
is free or its wait runs out), and the interleaving that deadlocked a
head-first order is forced: a third holder keeps node2 and node3 busy until
both invocations have seen them busy, and A's waiting take of node2 is held
back until B holds node2, so that A holds node1 and node3 and waits for node2
while B holds node2 and wants node3. The real locks over SSH are in
tests/test_edges_sandbox.py (two overlapping `cvs up --hosts`).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

from orchestrator.containers.locks import HostLocks
from orchestrator.errors import PolicyRefused
from orchestrator.events import NullSink
from orchestrator.ssh.seam import HeldRequest


class _Out:
    def __init__(self, lines: Callable[[], Awaitable[str]]) -> None:
        self._lines = lines

    async def readline(self) -> str:
        return await self._lines()

    async def read(self) -> str:
        return ""


class _In:
    def write(self, data: str) -> None:
        pass

    def write_eof(self) -> None:
        pass


class FlockModel:
    """Exclusive host locks shared by every pool made from it."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}  # host -> who holds it
        self.freed = anyio.Event()
        self.tries: list[tuple[str, str, str]] = []  # (who, host, wait)
        # (who, host) -> what a waiting take waits for before it tries (at most 1 s:
        # an order that never makes it true must not hang the test).
        self.hold_back: dict[tuple[str, str], Callable[[], bool]] = {}

    def free(self, host: str, who: str) -> None:
        if self.owner.get(host) == who:
            del self.owner[host]
            self.freed.set()
            self.freed = anyio.Event()

    def pool(self, who: str) -> Any:
        model = self

        class Pool:
            @contextlib.asynccontextmanager
            async def held_process(self, host: str, held: HeldRequest) -> AsyncIterator[Any]:
                argv = shlex.split(held.text)  # sh -c LOCK cvs-lock PATH MODE WAIT DESC LEASE
                wait = argv[6]
                model.tries.append((who, host, wait))
                sent = False

                async def lines() -> str:
                    nonlocal sent
                    if sent:
                        return ""
                    sent = True
                    if wait == "no":
                        if host in model.owner:
                            return "@@cvs:lock busy\n"
                        model.owner[host] = who
                        return "@@cvs:lock held x\n"
                    until = model.hold_back.get((who, host))
                    with anyio.move_on_after(1):
                        while until is not None and not until():
                            await anyio.sleep(0.001)
                    with anyio.move_on_after(float(wait)):
                        while host in model.owner:
                            await model.freed.wait()
                        model.owner[host] = who
                        return "@@cvs:lock held x\n"
                    return "@@cvs:lock timeout\n"

                try:
                    yield type("P", (), {"stdout": _Out(lines), "stdin": _In()})()
                finally:
                    model.free(host, who)

        return Pool()


def locks(model: FlockModel, who: str, head: str) -> HostLocks:
    return HostLocks(model.pool(who), NullSink(), "ctr", head=head, wait_seconds=5)


def test_overlapping_host_subsets_with_different_heads_both_get_their_locks() -> None:
    anyio.run(_overlapping)


async def _overlapping() -> None:
    model = FlockModel()
    a = locks(model, "A", head="node1")  # a plain `up`
    b = locks(model, "B", head="node2")  # `up --hosts node2,node3`
    model.owner.update({"node2": "C", "node3": "C"})  # a third invocation, briefly
    # A takes node3 before B asks for it, and asks for node2 once B holds it.
    model.hold_back[("A", "node2")] = lambda: model.owner.get("node2") == "B"
    model.hold_back[("B", "node3")] = lambda: model.owner.get("node3") == "A"
    got: dict[str, list[str]] = {}
    refused: dict[str, PolicyRefused] = {}

    async def take(name: str, hl: HostLocks, hosts: list[str]) -> None:
        try:
            await hl.acquire(hosts, "exclusive")
        except PolicyRefused as exc:
            refused[name] = exc
            return
        got[name] = sorted(hl.hosts)
        await anyio.sleep(0.01)
        await hl.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, "A", a, ["node1", "node2", "node3"])
        tg.start_soon(take, "B", b, ["node2", "node3"])
        # Both have seen node2 busy before C lets go.
        while not {("A", "node2", "no"), ("B", "node2", "no")} <= set(model.tries):
            await anyio.sleep(0.001)
        model.free("node2", "C")
        model.free("node3", "C")
    assert refused == {}, {k: str(v) for k, v in refused.items()}
    assert got == {"A": ["node1", "node2", "node3"], "B": ["node2", "node3"]}


def test_a_waiting_invocation_holds_no_host_that_sorts_after_the_one_it_waits_for() -> None:
    anyio.run(_waiting_holds_nothing_after)


async def _waiting_holds_nothing_after() -> None:
    model = FlockModel()
    a = locks(model, "A", head="node3")
    model.owner["node2"] = "C"
    seen: list[set[str]] = []
    model.hold_back[("A", "node2")] = lambda: bool(seen)

    async def take() -> None:
        await a.acquire(["node3", "node1", "node2"], "exclusive")

    async with anyio.create_task_group() as tg:
        tg.start_soon(take)
        while ("A", "node2", "5") not in model.tries:
            await anyio.sleep(0.001)
        seen.append({h for h, who in model.owner.items() if who == "A"})
        model.free("node2", "C")
    assert seen == [{"node1"}]  # node3 was let go while it waited on node2
    assert sorted(a.hosts) == ["node1", "node2", "node3"]
    await a.release()
