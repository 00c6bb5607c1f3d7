"""`plan` and `up` agree: every refusal `up` gives from the probed facts, `plan`
(`Cluster.plan`, `cvs plan`) lists, all at once; `up` then refuses with exactly
those reasons and acts on no host. And where the plan refuses nothing, `up`
acts on it (the real `Lifecycle._execute`: prepare, barrier, pipelines) on
scripted hosts (tests/scripted.py) that answer every step as a healthy host
would, and ends with every host ready, refusing only what it learned while
acting: a tag that resolves differently after a pull or load, GPUs the probe
had not listed (`ACTING`). Only the lock-and-probe round trip is replaced by
the given states (the probe's parsing is tested in test_probe.py and on the
sandbox); no host and no root are needed.

The check catches a lifecycle that decides on its own:
`test_a_lifecycle_refusing_what_the_plan_did_not_fails_the_check` breaks
`up` on purpose (its barrier refuses a GPU request the plan had accepted) and
shows `assert_up_agrees` failing on it, as it failed before the plan made
the CDI decisions (`up` refused `cdi: always` on docker 20.10 after pulling,
while `cvs plan` said it would start).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples
from scripted import ScriptedHosts

from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers.labels import LABEL_LIFETIME, managed_labels
from orchestrator.containers.lifecycle import Lifecycle
from orchestrator.containers.outcome import UpReport
from orchestrator.containers.plan.model import Plan
from orchestrator.containers.probe import HostState
from orchestrator.errors import PolicyRefused, Refusal
from orchestrator.events import NullSink
from orchestrator.limits.gpus import GPU

IMG_A = "sha256:" + "a" * 64
IMG_B = "sha256:" + "b" * 64
GI = 1024**3
HOSTS = ("h1", "h2", "h3")
PERSISTENT = {LABEL_LIFETIME: "persistent"}
STATE_DIR = tempfile.mkdtemp(prefix="cvs-agree-")
# Made at import (the cases share its keys); gone when the run ends.
atexit.register(shutil.rmtree, STATE_DIR, ignore_errors=True)
TWO_GPUS = (GPU(index=0, vendor="nvidia"), GPU(index=1, vendor="nvidia"))


def lifecycle(cfg: ContainerConfig, hosts: tuple[str, ...] = HOSTS) -> Lifecycle:
    cluster = ClusterConfig(
        name="agree",
        hosts=[HostSpec(name=h) for h in hosts],
        container=cfg,
        state_dir=STATE_DIR,  # the cluster's keys, made once for every case
    )
    return Lifecycle(cluster, healthy_hosts(hosts), NullSink())


def healthy_hosts(hosts: tuple[str, ...]) -> ScriptedHosts:
    """Hosts where every step `up` takes succeeds: a pull or load leaves the
    tag resolving to IMG_A everywhere, `docker run` prints an ID, the
    container runs."""
    scripted = ScriptedHosts({h: "" for h in hosts})
    scripted.answer("image", lambda host, text: (0, f'[{{"Id": "{IMG_A}"}}]', ""))
    scripted.answer("run", lambda host, text: (0, "c" * 64 + "\n", ""))
    scripted.answer("verify", lambda host, text: (0, "true\n", ""))
    # What else a healthy host answers with success and no output (anything
    # not listed fails the test: tests/scripted.py).
    scripted.succeed("login", "pull", "load", "remove", "restart", "adopt", "setup", "sshd")
    scripted.succeed("gpus", "version", "rollback")
    # The head's check that every peer's sshd answers (containers/mpi.py).
    peers_ok = "".join(f"peer-ok {h}\n" for h in hosts)
    scripted.answer("peers", lambda host, text: (0, peers_ok, ""))
    return scripted


def state(
    host: str,
    container: str | None = "absent",
    *,
    ours: bool = True,
    tag: str | None = IMG_A,
    image: str = IMG_A,
    memory: int | None = 64 * GI,
    port_busy: bool | None = None,
    labels: dict[str, str] | None = None,
    gpus: tuple[GPU, ...] | None = None,
    runtime_version: str | None = None,
) -> HostState:
    if container is None:
        return HostState(host=host, error="docker daemon not reachable", error_kind="daemon_down")
    present = container != "absent"
    return HostState(
        host=host,
        access="direct",
        container=container,  # type: ignore[arg-type]
        container_status=container if present else None,
        container_id=("c" * 63 + host[-1]) if present else None,
        container_image_id=image if present else None,
        labels=(labels or managed_labels("agree")) if present and ours else {},
        tag_image_id=tag,
        cpu_count=8,
        memory_total=memory,
        sshd_listening=True if container == "running" else None,
        provision_marker=None,
        sshd_port_busy=port_busy,
        gpus=gpus,
        runtime_version=runtime_version,
    )


def plan_and_up(
    lc: Lifecycle, states: dict[str, HostState], **kw: bool
) -> tuple[Plan, PolicyRefused | UpReport]:
    """(what plan says, what up did: its PolicyRefused, or its report after
    acting on the scripted hosts)."""
    plan = lc.decide(states, **kw)

    async def probed(*_: Any, **__: Any) -> dict[str, HostState]:
        return states

    lc.lock_and_probe = probed  # type: ignore[method-assign]

    async def main() -> UpReport:
        try:
            return await lc.up(**kw)
        finally:
            await lc.locks.release()

    try:
        return plan, anyio.run(main)
    except PolicyRefused as exc:
        return plan, exc


# What `up` may refuse after a plan that refused nothing: only what it learns
# while acting, and only where it could not be known before.
ACTING = {"tag_identity", "tag_missing", "tag_unreadable", "tag_unknown", "gpus", "cdi"}


def assert_up_agrees(plan: Plan, up: PolicyRefused | UpReport) -> None:
    """`up` refused with the plan's refusals, or acted on the plan and ended
    with every host ready, or refused only what acting taught it: a tag after
    a pull or load, GPUs the probe had not listed."""
    if plan.refused:
        assert isinstance(up, PolicyRefused), f"the plan refused, up did not: {plan.reasons}"
        assert up.refusals == plan.refusals
        assert not any(cli_words(r) for r in up.reasons), up.reasons
        return
    if isinstance(up, PolicyRefused):
        fetched = any(a.image_step is not None for a in plan.actions.values())
        for refusal in up.refusals:
            learned = (refusal.kind.startswith("tag_") and fetched) or (
                refusal.kind in ("gpus", "cdi")
                and bool(refusal.hosts)
                and all(plan.actions[h].gpus is None for h in refusal.hosts)
            )
            assert refusal.kind in ACTING and learned, (
                f"up refused what the plan accepted: {refusal.kind}: {refusal.reason}"
            )
        return
    assert dict(up.plan.actions) == dict(plan.actions)
    not_ready = {h: o.error for h, o in up.outcomes.items() if not o.ok}
    assert not not_ready, f"up failed on healthy hosts the plan accepted: {not_ready}"


def cfg(lifetime: str = "per_run", **kw: Any) -> ContainerConfig:
    # Every host pulls for itself: the spread's streams are not scripted here
    # (tests/test_spread_sandbox.py runs them on the sandbox).
    kw.setdefault("distribute", "registry")
    return ContainerConfig(image="img:1", name="ctr", lifetime=lifetime, **kw)


REFUSALS: dict[str, tuple[ContainerConfig, dict[str, HostState], str]] = {
    "unknown state": (cfg(), {"h1": state("h1", None), "h2": state("h2")}, "cannot tell"),
    "foreign container": (
        cfg(),
        {"h1": state("h1", "running", ours=False), "h2": state("h2")},
        "not created by cvs",
    ),
    "persistent container under per_run": (
        cfg(),
        {
            "h1": state(
                "h1", "running", labels={**managed_labels("agree"), LABEL_LIFETIME: "persistent"}
            )
        },
        "persistent",
    ),
    "persistent, not on every host": (
        cfg("persistent"),
        {"h1": state("h1", "running"), "h2": state("h2")},
        "not present and resumable",
    ),
    "image skew": (
        cfg("persistent"),
        {"h1": state("h1", "running"), "h2": state("h2", "running", image=IMG_B)},
        "image skew",
    ),
    "tag resolves differently": (
        cfg(),
        {"h1": state("h1"), "h2": state("h2", tag=IMG_B)},
        "different images",
    ),
    "memory beyond the host": (
        cfg(resources={"memory": "100Gi"}),
        {"h1": state("h1"), "h2": state("h2", memory=8 * GI)},
        "more than the host has",
    ),
    "pull never, image missing": (
        cfg(pull="never"),
        {"h1": state("h1"), "h2": state("h2", tag=None)},
        "pull is 'never'",
    ),
    "sshd port taken": (
        cfg(network="host"),
        {"h1": state("h1", port_busy=True), "h2": state("h2")},
        "already in use",
    ),
    "GPU request a host cannot meet": (
        cfg(gpus={"count": 2}),
        {"h1": state("h1", gpus=TWO_GPUS), "h2": state("h2", gpus=TWO_GPUS[:1])},
        "cannot be satisfied",
    ),
    "CDI always on a docker without CDI": (
        cfg(gpus={"count": 1}, cdi="always"),
        {"h1": state("h1", gpus=TWO_GPUS, runtime_version="20.10.24+dfsg1")},
        "has no CDI",
    ),
    "NVIDIA GPUs on podman without CDI specs": (
        cfg(gpus={"count": 1}, runtime="podman"),
        {"h1": state("h1", gpus=TWO_GPUS)},
        "only through CDI",
    ),
    "no_launch, not running": (
        cfg("no_launch"),
        {"h1": state("h1", "running"), "h2": state("h2")},
        "no_launch",
    ),
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_plan_lists_the_refusal_and_up_gives_the_same_without_acting(kind: str) -> None:
    config, states, words = REFUSALS[kind]
    plan, up = plan_and_up(lifecycle(config, tuple(states)), states)
    assert plan.refused and any(words in r for r in plan.reasons), plan.reasons
    assert isinstance(up, PolicyRefused), up
    assert up.refusals == plan.refusals
    assert not any(cli_words(r) for r in plan.reasons), plan.reasons  # the API's words
    assert_up_agrees(plan, up)


def cli_words(text: str) -> bool:
    """Whether `text` tells a Python caller about flags or `cvs` commands."""
    return " --" in text or "`cvs " in text


def test_plan_lists_every_refusal_at_once() -> None:
    # What took four `up` attempts to learn, one plan lists.
    config = cfg(pull="never", resources={"memory": "100Gi"})
    states = {
        "h1": state("h1", "running", ours=False),
        "h2": state("h2", tag=None),
        "h3": state("h3", memory=8 * GI),
    }
    plan, up = plan_and_up(lifecycle(config), states)
    text = "\n".join(plan.reasons)
    assert "not created by cvs" in text
    assert "pull is 'never'" in text and "h2" in text
    assert "h3: memory" in text
    assert isinstance(up, PolicyRefused) and up.refusals == plan.refusals


CONTAINERS = st.sampled_from(["absent", "running", "exited", "paused", "dead", None])


@st.composite
def cluster_states(draw: st.DrawFn) -> tuple[ContainerConfig, dict[str, HostState], bool]:
    lifetime = draw(st.sampled_from(["per_run", "persistent", "no_launch"]))
    extra: dict[str, Any] = {}
    extra["pull"] = draw(st.sampled_from(["missing", "never", "always"]))
    if draw(st.booleans()):
        extra["resources"] = {"memory": "16Gi"}
    if draw(st.booleans()):
        extra["gpus"] = {"count": 2}
        extra["cdi"] = draw(st.sampled_from(["auto", "always", "never"]))
    config = cfg(lifetime, **extra)
    n = draw(st.integers(min_value=1, max_value=3))
    states = {
        h: state(
            h,
            draw(CONTAINERS),
            ours=draw(st.booleans()),
            tag=draw(st.sampled_from([IMG_A, IMG_B, None])),
            image=draw(st.sampled_from([IMG_A, IMG_B])),
            memory=draw(st.sampled_from([8 * GI, 64 * GI, None])),
            gpus=draw(st.sampled_from([None, (), TWO_GPUS[:1], TWO_GPUS])),
            runtime_version=draw(st.sampled_from([None, "20.10.24", "27.1.0"])),
        )
        for h in HOSTS[:n]
    }
    return config, states, draw(st.booleans())


@settings(max_examples=examples(150), deadline=None)
@given(cluster_states())
def test_up_refuses_exactly_when_and_why_plan_does_and_otherwise_acts_on_it(
    case: tuple[ContainerConfig, dict[str, HostState], bool],
) -> None:
    config, states, force = case
    plan, up = plan_and_up(lifecycle(config, tuple(states)), states, force=force)
    assert_up_agrees(plan, up)


def test_up_acts_on_an_accepted_plan_with_its_gpus_and_cdi_devices() -> None:
    config = cfg(gpus={"count": 1}, cdi="auto", runtime="podman")
    states = {"h1": state("h1", gpus=TWO_GPUS)}
    lc = lifecycle(config, ("h1",))
    plan, up = plan_and_up(lc, states)
    # NVIDIA GPUs on podman without CDI specs: the plan refuses; up the same.
    assert_up_agrees(plan, up)
    assert isinstance(up, PolicyRefused) and [r.kind for r in up.refusals] == ["cdi"]

    config = cfg(gpus={"count": 1})
    lc = lifecycle(config, ("h1",))
    plan, up = plan_and_up(lc, states)
    assert_up_agrees(plan, up)
    assert isinstance(up, UpReport) and up.ok
    scripted = lc.pool
    assert isinstance(scripted, ScriptedHosts)
    (run,) = [text for _, label, text in scripted.calls if label == "run"]
    assert "--gpus '\"device=0\"'" in run, run


def test_a_lifecycle_refusing_what_the_plan_did_not_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deliberately broken `up`: its barrier decides the GPUs again and
    refuses on its own (as `up` did with CDI before the plan made that
    decision). The agreement check must fail on it."""
    import orchestrator.containers.barrier as barrier_module

    def refuse(cluster: Any, cfg: Any, host: str, action: Any, prepared: Any) -> Refusal:
        return Refusal("cdi", f"{host}: decided while acting", (host,))

    monkeypatch.setattr(barrier_module, "gpu_choice", refuse)
    config = cfg(gpus={"count": 1})
    states = {"h1": state("h1", gpus=TWO_GPUS)}
    plan, up = plan_and_up(lifecycle(config, ("h1",)), states)
    assert not plan.refused and isinstance(up, PolicyRefused)
    with pytest.raises(AssertionError, match="up refused what the plan accepted: cdi"):
        assert_up_agrees(plan, up)
