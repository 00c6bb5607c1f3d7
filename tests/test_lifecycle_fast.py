"""The lifecycle's rollback, barrier, lock and partial-failure paths on scripted
hosts (tests/scripted.py, behind the HostRunner seam): no root, no sandbox.
The same paths run for real in test_lifecycle.py, test_locks.py and
test_images.py; these pin the decisions fast."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from scripted import IMAGE_ID, ScriptedHosts, probe_output

from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers.lifecycle import Lifecycle
from orchestrator.containers.outcome import UpReport
from orchestrator.errors import PolicyRefused
from orchestrator.events import NullSink

HOSTS = ["h1", "h2", "h3"]
CID = "c" * 64
OTHER_ID = "sha256:" + "b" * 64


def lifecycle(hosts: ScriptedHosts, lifetime: str = "per_run", **container: Any) -> Lifecycle:
    cfg = ContainerConfig(
        image="img:1", name="ctr", lifetime=lifetime, sshd={"enabled": False}, **container
    )
    cluster = ClusterConfig(name="fast", hosts=[HostSpec(name=h) for h in HOSTS], container=cfg)
    return Lifecycle(cluster, hosts, NullSink())


def started_hosts(**probe: Any) -> ScriptedHosts:
    """Hosts without the container, where `docker run` and the checks succeed."""
    hosts = ScriptedHosts({h: probe_output(**probe) for h in HOSTS})
    hosts.answer("run", lambda host, text: (0, CID + "\n", ""))
    hosts.answer("verify", lambda host, text: (0, "true\n", ""))
    hosts.succeed("pull", "setup", "rollback")
    return hosts


def up(lc: Lifecycle, **kw: Any) -> UpReport:
    async def main() -> UpReport:
        try:
            return await lc.up(**kw)
        finally:
            await lc.locks.release()

    return anyio.run(main)


def test_a_failed_run_on_one_host_rolls_back_what_this_attempt_started() -> None:
    hosts = ScriptedHosts({h: probe_output() for h in HOSTS})
    hosts.answer("run", lambda host, text: (125, "", "no space left") if host == "h2" else None)
    hosts.answer("run", lambda host, text: (0, CID + "\n", ""))
    hosts.answer("verify", lambda host, text: (0, "true\n", ""))
    hosts.succeed("setup", "rollback")
    lc = lifecycle(hosts)
    report = up(lc)
    assert not report.ok and "no space left" in (report.outcomes["h2"].error or "")
    rollbacks = [(h, text) for h, label, text in hosts.calls if label == "rollback"]
    assert sorted(h for h, _ in rollbacks) == HOSTS
    # Only what this invocation started: by its label, never by name alone.
    assert all(lc.invocation in text for _, text in rollbacks)


def test_a_setup_script_failing_on_one_host_of_a_persistent_cold_start_removes_nothing() -> None:
    hosts = started_hosts()
    hosts.answer("setup", lambda host, text: (1, "", "apt failed") if host == "h3" else None)
    report = up(lifecycle(hosts, "persistent"))
    assert [h for h, o in report.outcomes.items() if not o.ok] == ["h3"]
    assert "rollback" not in hosts.labels() and "remove" not in hosts.labels()
    # The others are provisioned; the next `up` provisions h3 again (no marker).
    assert all("setup" in hosts.labels(h) for h in HOSTS)


def test_the_barrier_refuses_a_tag_that_differs_after_the_pull_and_says_what_changed() -> None:
    hosts = started_hosts(image_id=None)  # not on any host: pulled first
    hosts.answer(
        "image",
        lambda host, text: (0, f'[{{"Id": "{OTHER_ID if host == "h3" else IMAGE_ID}"}}]', ""),
    )
    with pytest.raises(PolicyRefused) as refused:
        up(lifecycle(hosts, distribute="registry"))  # every host pulls (no spread)
    (refusal,) = refused.value.refusals
    assert refusal.kind == "tag_identity" and "different images" in refusal.reason
    # What the pull did is said, as data and in the message: not "nothing changed".
    assert refused.value.changed == ["image img:1 pulled on h1, h2, h3 (left in place)"]
    assert "no container was started; done before: image img:1 pulled" in str(refused.value)
    assert "run" not in hosts.labels()


def test_a_busy_lock_without_waiting_refuses_and_releases_every_lock_taken() -> None:
    hosts = started_hosts()
    hosts.lock["h2"] = "@@cvs:holder bob@box pid 7: run nightly\n@@cvs:lock busy\n"
    with pytest.raises(PolicyRefused) as refused:
        up(lifecycle(hosts), wait=False)
    (busy,) = refused.value.refusals
    assert busy.kind == "lock_busy" and busy.hosts == ("h2",)
    assert "bob@box pid 7: run nightly" in busy.reason
    assert [o.name for w in busy.ways_out for o in w.options] == ["wait"]
    assert all(p.closed for p in hosts.held)
    assert "run" not in hosts.labels()


def test_a_change_takes_the_locks_exclusively_then_converts_them_to_shared() -> None:
    hosts = started_hosts()
    lc = lifecycle(hosts)

    async def main() -> None:
        report = await lc.up()
        assert report.ok
        modes = [p.mode for p in hosts.held]
        # Shared to look, exclusive to act, under a second probe.
        assert modes == ["s"] * 3 + ["x"] * 3
        assert all(p.stdin.written == ["shared\n"] for p in hosts.held[3:])
        assert all(p.closed for p in hosts.held[:3])
        assert lc.locks.mode == "shared" and sorted(lc.facts.ready) == HOSTS
        await lc.locks.release()

    anyio.run(main)
    assert all(p.closed for p in hosts.held)


def test_the_invocation_holds_what_up_probed_and_forgets_ready_hosts_with_their_locks() -> None:
    hosts = started_hosts()
    lc = lifecycle(hosts)

    async def main() -> None:
        await lc.up()
        # The last probe (the exclusive one) is the invocation's, not the locks'.
        assert sorted(lc.facts.states) == HOSTS
        assert all(s.container == "absent" for s in lc.facts.states.values())
        await lc.locks.release(["h1"])
        assert sorted(lc.facts.ready) == ["h2", "h3"]  # h1's container may be replaced now
        await lc.locks.release()
        assert lc.facts.ready == {}

    anyio.run(main)


def test_forks_one_acts_on_one_host_at_a_time() -> None:
    hosts = started_hosts()
    lc = lifecycle(hosts)
    lc.cluster = lc.cluster.model_copy(
        update={"concurrency": lc.cluster.concurrency.model_copy(update={"hosts": 1})}
    )
    report = up(lc)
    assert report.ok
    steps = [(h, label) for h, label, _ in hosts.calls if label in ("run", "setup", "verify")]
    # One host's pipeline ends before the next one's begins.
    hosts_in_order = [h for h, _ in steps]
    assert hosts_in_order == sorted(hosts_in_order, key=HOSTS.index)


def test_without_a_limit_the_hosts_pipelines_interleave() -> None:
    hosts = started_hosts()
    assert up(lifecycle(hosts)).ok
    order = [h for h, label, _ in hosts.calls if label in ("run", "setup", "verify")]
    assert order != sorted(order, key=HOSTS.index)


def test_a_pull_failing_on_one_host_reports_no_host_ready_and_starts_nothing() -> None:
    hosts = started_hosts(image_id=None)  # not on any host: each pulls first
    hosts.answer("pull", lambda host, text: (1, "", "manifest unknown") if host == "h2" else None)
    hosts.answer("image", lambda host, text: (0, f'[{{"Id": "{IMAGE_ID}"}}]', ""))
    report = up(lifecycle(hosts, "persistent", distribute="registry"))  # every host pulls
    assert "run" not in hosts.labels()
    assert report.ready == []
    for host in ("h1", "h3"):
        # Its image arrived, but nothing was started there: never `ok`.
        assert (
            report.outcomes[host].summary == "cold_start NOT STARTED: the cold start failed on h2"
        )
    assert str(report.outcomes["h2"].summary).startswith("cold_start FAILED at pull")


def test_a_held_back_hosts_summary_reads_the_why_field_not_the_error_text() -> None:
    from orchestrator.containers.outcome import HostOutcome
    from orchestrator.containers.plan.model import HostAction

    outcome = HostOutcome("h1", HostAction("cold_start", "none present"))
    outcome.hold_back("not started: said by a peer")
    assert outcome.held_back == "not started: said by a peer"
    # the why whole, even when it reads like the error's own prefix
    assert outcome.summary == "cold_start NOT STARTED: not started: said by a peer"
