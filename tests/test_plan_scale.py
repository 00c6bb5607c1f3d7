"""`cvs plan --hosts node0001` on a 5000-host file (issue 42, item 11): the
plan is decided over every host (containers/subset.py), so every host is
probed once, and what cvs itself does with the answers grows linearly with
the fleet. Scripted hosts (orchestrator/testing.py): no SSH, no sandbox; the
fan-out over real sshds is bench/fanout.py's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from scripted import ScriptedHosts, probe_output

from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers.lifecycle import Lifecycle
from orchestrator.containers.plan.model import Plan
from orchestrator.errors import ConnectError
from orchestrator.events import NullSink
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.transport import SSHPool

UNREACHABLE = (255, "", "ssh: connect to host: Name or service not known")


def names(count: int) -> list[str]:
    return [f"node{n:04d}" for n in range(1, count + 1)]


def fleet(count: int, lifetime: str) -> tuple[Lifecycle, ScriptedHosts]:
    """`count` hosts; only node0001 answers its probe, the others do not exist."""
    hosts = ScriptedHosts({})
    hosts.answer("probe", lambda host, text: None if host == "node0001" else UNREACHABLE)
    hosts.answer("probe", lambda host, text: (0, probe_output(), ""))
    cfg = ContainerConfig(image="img:1", name="ctr", lifetime=lifetime, sshd={"enabled": False})
    cluster = ClusterConfig(
        name="big", hosts=[HostSpec(name=h) for h in names(count)], container=cfg
    )
    return Lifecycle(cluster, hosts, NullSink()), hosts


def plan_one(lc: Lifecycle) -> Plan:
    async def main() -> Plan:
        return lc.decide_for(await lc.probe_all(), ["node0001"], False, False, False, False)

    return anyio.run(main)


def test_a_one_host_plan_probes_each_host_once_and_acts_on_that_host() -> None:
    lc, hosts = fleet(5000, "per_run")
    plan = plan_one(lc)
    assert [label for _, label, _ in hosts.calls] == ["probe"] * 5000
    assert len({host for host, _, _ in hosts.calls}) == 5000
    assert list(plan.actions) == ["node0001"] and plan.actions["node0001"].kind == "cold_start"


def test_a_one_host_persistent_plan_next_to_unreadable_hosts_is_refused_for_them() -> None:
    lc, _ = fleet(2000, "persistent")
    plan = plan_one(lc)
    assert plan.refused and "node0002" in str(plan.refusals[0].hosts)


def cpu_seconds(count: int) -> float:
    best = float("inf")
    for _ in range(2):
        lc, _ = fleet(count, "persistent")
        start = time.process_time()
        plan_one(lc)
        best = min(best, time.process_time() - start)
    return best


def test_a_one_host_plan_grows_linearly_with_the_fleet() -> None:
    # 10 times the hosts: measured 10.8 times the CPU here, and 26 times with a
    # scan of the host list per host put back (the last round's quadratic
    # lookup). CPU time, the best of two: the machine's load moves wall time.
    small, large = cpu_seconds(500), cpu_seconds(5000)
    assert large < 18 * small, (small, large)


# -- the connects' name resolution (orchestrator/ssh/resolver.py) ---------------

FAKE_DOMAIN = ".cvs-test.invalid"


class SlowResolver:
    """socket.getaddrinfo for names under FAKE_DOMAIN: each answer takes
    `seconds` and is "not known", as a resolver that must ask a DNS server.
    Nothing leaves the machine: any other name is resolved as a numeric
    address only (AI_NUMERICHOST), never looked up."""

    def __init__(self, real: Callable[..., Any], seconds: float) -> None:
        self.real, self.seconds = real, seconds
        self.lock = threading.Lock()
        self.calls = self.now = self.widest = 0

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if not (isinstance(host, str) and host.endswith(FAKE_DOMAIN)):
            return self.real(host, port, 0, 0, 0, socket.AI_NUMERICHOST)
        with self.lock:
            self.calls += 1
            self.now += 1
            self.widest = max(self.widest, self.now)
        try:
            time.sleep(self.seconds)
        finally:
            with self.lock:
                self.now -= 1
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_names_that_do_not_resolve_are_resolved_as_wide_as_the_connects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The last round's regression: every connect resolved in asyncio's
    # default executor, 6 threads on 2 cores, so 5000 names the resolver
    # cannot answer queued behind 6 lookups at a time (minutes). Counted, not
    # timed: how many lookups were in flight at once, and one per host.
    resolver = SlowResolver(socket.getaddrinfo, seconds=0.05)
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    hosts = [f"n{n:04d}{FAKE_DOMAIN}" for n in range(400)]
    cluster = ClusterConfig.model_validate(
        {
            "name": "unresolved",
            "hosts": [{"name": h} for h in hosts],
            "ssh": {"host_key_policy": "off", "use_ssh_config": False, "user": "nobody"},
        }
    )

    async def main() -> dict[str, ConnectError | None]:
        async with SSHPool(cluster) as pool:
            return await fan_out(hosts, pool.connect, limit=cluster.concurrency.hosts)

    failures = list(anyio.run(main).values())
    assert all(f is not None and "not known" in f.message for f in failures), failures[:3]
    assert resolver.calls == len(hosts)  # a name that does not resolve is not retried
    assert resolver.widest >= 32, resolver.widest  # 6 before: the default executor
