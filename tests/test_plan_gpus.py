"""The plan makes the GPU and CDI decisions `up` acts on, from probed facts:
which GPUs, whether they go through CDI, and the refusals of either (kinds
`gpus` and `cdi`), listed by `cvs plan` before anything is pulled. Pure: decide_plan
on given states (test_remote.py runs the real probe for the one fact this
adds, the daemon's version)."""

from __future__ import annotations

from orchestrator.config import ContainerConfig
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.probe import HostState
from orchestrator.limits.cdi import SpecFile
from orchestrator.limits.gpus import GPU

IMG = "sha256:" + "a" * 64
NVIDIA = (GPU(index=0, vendor="nvidia"), GPU(index=1, vendor="nvidia"))
SPEC = SpecFile(
    "/etc/cdi/nvidia.yaml",
    "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
    + "".join(
        f"  - name: '{i}'\n    containerEdits:\n"
        f"      deviceNodes:\n        - path: /dev/nvidia{i}\n"
        for i in range(2)
    ),
)


def launching(
    host: str, *, version: str | None = None, specs: tuple[SpecFile, ...] = ()
) -> HostState:
    return HostState(
        host=host,
        access="direct",
        container="absent",
        tag_image_id=IMG,
        gpus=NVIDIA,
        cdi_specs=specs,
        runtime_version=version,
    )


def cfg(**kw: object) -> ContainerConfig:
    return ContainerConfig(image="img:1", name="ctr", lifetime="per_run", **kw)


def test_cdi_always_on_a_docker_before_25_is_refused_by_the_plan_with_kind_cdi() -> None:
    plan = decide_plan(
        cfg(gpus={"count": 1}, cdi="always"),
        {"h1": launching("h1", version="20.10.24+dfsg1", specs=(SPEC,))},
    )
    assert plan.refused
    (refusal,) = plan.refusals
    assert refusal.kind == "cdi" and refusal.hosts == ("h1",)
    assert "docker 20.10 has no CDI" in refusal.reason


def test_the_plan_carries_the_gpus_and_the_cdi_devices_up_runs_with() -> None:
    plan = decide_plan(
        cfg(gpus={"count": 1}, cdi="always"),
        {"h1": launching("h1", version="27.1.0", specs=(SPEC,))},
    )
    action = plan.actions["h1"]
    assert not plan.refused and action.gpus is not None
    assert [g.index for g in action.gpus.gpus] == [0]
    assert action.cdi is not None and [d.qualified for d in action.cdi] == ["nvidia.com/gpu=0"]


def test_nvidia_gpus_on_podman_without_cdi_specs_are_refused_by_the_plan() -> None:
    plan = decide_plan(cfg(gpus={"count": 1}, runtime="podman"), {"h1": launching("h1")})
    assert [r.kind for r in plan.refusals] == ["cdi"]
    assert "only through CDI" in plan.refusals[0].reason


def test_the_image_step_is_the_plans() -> None:
    absent = HostState(host="h1", access="direct", container="absent")
    present = HostState(host="h2", access="direct", container="absent", tag_image_id=IMG)
    plan = decide_plan(
        cfg(registry={"username": "u", "password_file": "/p"}), {"h1": absent, "h2": present}
    )
    assert (plan.actions["h1"].image_step, plan.actions["h1"].login) == ("pull", True)
    assert (plan.actions["h2"].image_step, plan.actions["h2"].login) == (None, False)
    always = decide_plan(cfg(pull="always"), {"h2": present})
    assert always.actions["h2"].image_step == "pull"
