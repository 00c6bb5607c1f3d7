"""`plan` and `up` agree: every refusal `up` gives from the probed facts, `plan`
(`Cluster.plan`, `cvs plan`) lists, all at once; `up` then refuses with exactly
those reasons and acts on no host. Pure: `Lifecycle.up` runs on the given
states (its lock-and-probe replaced), so no host and no root are needed."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers.docker import LABEL_LIFETIME, managed_labels
from orchestrator.containers.lifecycle import Lifecycle, UpReport
from orchestrator.containers.plan import Plan
from orchestrator.containers.probe import HostState
from orchestrator.errors import PolicyRefused
from orchestrator.events import NullSink
from orchestrator.limits.gpus import GPU

IMG_A = "sha256:" + "a" * 64
IMG_B = "sha256:" + "b" * 64
GI = 1024**3
HOSTS = ("h1", "h2", "h3")
PERSISTENT = {LABEL_LIFETIME: "persistent"}
TWO_GPUS = (GPU(index=0, vendor="nvidia"), GPU(index=1, vendor="nvidia"))


def lifecycle(cfg: ContainerConfig, hosts: tuple[str, ...] = HOSTS) -> Lifecycle:
    cluster = ClusterConfig(name="agree", hosts=[HostSpec(name=h) for h in hosts], container=cfg)
    return Lifecycle(cluster, None, NullSink())  # type: ignore[arg-type]


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
        docker_access="direct",
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


def plan_and_up(lc: Lifecycle, states: dict[str, HostState], **kw: bool) -> tuple[Plan, Any]:
    """(what plan says, what up did: its PolicyRefused, or the plan it acted on)."""
    plan = lc.decide(states, **kw)
    acted: list[Plan] = []

    async def probed(*_: Any, **__: Any) -> dict[str, HostState]:
        return states

    async def execute(plan: Plan, *_: Any) -> UpReport:
        acted.append(plan)
        return UpReport(plan, {})

    lc.lock_and_probe = probed  # type: ignore[method-assign]
    lc._execute = execute  # type: ignore[method-assign]
    try:
        anyio.run(lambda: lc.up(**kw))
    except PolicyRefused as exc:
        return plan, exc
    return plan, acted[0] if acted else None


def cfg(lifetime: str = "per_run", **kw: Any) -> ContainerConfig:
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
        "podman has no `--gpus`",
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
    if draw(st.booleans()):
        extra["pull"] = "never"
    if draw(st.booleans()):
        extra["resources"] = {"memory": "16Gi"}
    if draw(st.booleans()):
        extra["gpus"] = {"count": 2}
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
        )
        for h in HOSTS[:n]
    }
    return config, states, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(cluster_states())
def test_up_refuses_exactly_when_and_why_plan_does(
    case: tuple[ContainerConfig, dict[str, HostState], bool],
) -> None:
    config, states, force = case
    plan, up = plan_and_up(lifecycle(config, tuple(states)), states, force=force)
    if plan.refused:
        assert isinstance(up, PolicyRefused) and up.refusals == plan.refusals
        assert not any(cli_words(r) for r in up.reasons), up.reasons
    else:
        assert isinstance(up, Plan) and dict(up.actions) == dict(plan.actions)
