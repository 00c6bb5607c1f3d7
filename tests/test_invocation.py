"""The invocation's probed facts (containers/invocation.py): read once, held
in one place, forgotten with the locks that vouched for them."""

from __future__ import annotations

from dataclasses import replace

import anyio

from orchestrator.containers.invocation import Invocation
from orchestrator.containers.route import ExecFacts
from orchestrator.remote.runtime import ContainerRuntime

FACTS = ExecFacts(
    container_id="c" * 64,
    running=True,
    started_at="2026-01-01T00:00:00Z",
    user="",
    workdir="/",
    env=(),
    hostname="h1",
    network_mode="host",
    addresses=(),
    sshd_port=2222,
)


def test_concurrent_askers_share_one_read_of_a_containers_exec_facts() -> None:
    invocation = Invocation()
    reads: list[str] = []

    async def read() -> ExecFacts:
        reads.append("h1")
        await anyio.sleep(0.01)
        return FACTS

    async def main() -> list[ExecFacts | None]:
        got: list[ExecFacts | None] = []

        async def ask() -> None:
            got.append(await invocation.exec_facts("h1", read))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
        return got

    assert anyio.run(main) == [FACTS] * 5
    assert reads == ["h1"]


def test_facts_the_probe_read_are_not_read_again_and_a_reread_replaces_them() -> None:
    invocation = Invocation()
    invocation.known("h1", FACTS)

    async def never() -> ExecFacts | None:
        raise AssertionError("read again")

    assert anyio.run(invocation.exec_facts, "h1", never) == FACTS
    later = replace(FACTS, started_at="2026-01-02T00:00:00Z")
    invocation.reread("h1", later)
    assert anyio.run(invocation.exec_facts, "h1", never) == later


def test_letting_go_of_a_hosts_lock_forgets_that_its_container_was_left_ready() -> None:
    invocation = Invocation("0f" * 8)
    runtime = ContainerRuntime("direct", "docker")
    invocation.ready = {"h1": runtime, "h2": runtime}
    invocation.let_go(["h1"])
    assert invocation.id == "0f" * 8 and invocation.ready == {"h2": runtime}
