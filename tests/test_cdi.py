"""CDI as pure logic: specs read as facts, GPUs paired with CDI devices by
their nodes, the choice between CDI and device nodes, the runtime's argv."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.config import ContainerConfig, GPURequest
from orchestrator.config.gpu_devices import gpu_subset_problems
from orchestrator.containers.labels import config_hash
from orchestrator.limits.cdi import (
    CDIDevice,
    CDIError,
    SpecFile,
    cdi_devices_for,
    cdi_run_args,
    describe_devices,
    parse_spec,
    parse_specs,
    runtime_cdi_problem,
    use_cdi,
)
from orchestrator.limits.gpus import GPU, GPUSelection, select_gpus

AMD_SPEC = """
cdiVersion: "0.5.0"
kind: amd.com/gpu
containerEdits:
  deviceNodes:
    - path: /dev/kfd
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD128
  - name: "1"
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD129
          hostPath: /dev/dri/renderD129
      env: ["ROCR_VISIBLE_DEVICES=1"]
  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/dri/renderD128
        - path: /dev/dri/renderD129
"""


def _amd(index: int, name: str = "MI300X", memory: int | None = 192 * 1024**3) -> GPU:
    return GPU(
        vendor="amd",
        index=index,
        name=name,
        memory_bytes=memory,
        render_node=f"/dev/dri/renderD{128 + index}",
    )


def _nvidia(index: int) -> GPU:
    return GPU(vendor="nvidia", index=index, uuid=f"GPU-{index}", name="H100", memory_bytes=80)


def test_a_spec_yields_its_devices_with_common_and_own_nodes():
    devices = parse_spec(AMD_SPEC, "/etc/cdi/amd.yaml")
    assert [d.qualified for d in devices] == ["amd.com/gpu=0", "amd.com/gpu=1", "amd.com/gpu=all"]
    assert devices[0].host_nodes == ("/dev/kfd", "/dev/dri/renderD128")
    assert devices[1].env == ("ROCR_VISIBLE_DEVICES",)
    assert devices[1].spec_file == "/etc/cdi/amd.yaml"


def test_a_json_spec_reads_the_same():
    text = (
        '{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", '
        '"containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]}'
    )
    (device,) = parse_spec(text)
    assert (device.qualified, device.host_nodes) == ("nvidia.com/gpu=0", ("/dev/nvidia0",))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2]", "expected a mapping"),
        ('cdiVersion: "0.5.0"\nkind: gpu\ndevices: [{name: "0"}]', "is not vendor.tld/class"),
        ('kind: amd.com/gpu\ndevices: [{name: "0"}]', "no cdiVersion"),
        ('cdiVersion: "0.5.0"\nkind: amd.com/gpu\ndevices: []', "no devices"),
        ('cdiVersion: "0.5.0"\nkind: amd.com/gpu\ndevices: [{name: "a b"}]', "not a CDI device"),
        (
            'cdiVersion: "0.5.0"\nkind: amd.com/gpu\ndevices: '
            '[{name: "0", containerEdits: {deviceNodes: [{path: "rel"}]}}]',
            "no absolute path",
        ),
        ("kind: [", "not YAML or JSON"),
    ],
)
def test_a_malformed_spec_is_an_error_naming_the_file(text, says):
    with pytest.raises(CDIError, match=says) as err:
        parse_spec(text, "/etc/cdi/x.yaml")
    assert "/etc/cdi/x.yaml" in str(err.value)


def test_a_bad_spec_is_reported_and_the_good_ones_kept():
    devices, problems = parse_specs(
        [SpecFile("/etc/cdi/amd.yaml", AMD_SPEC), SpecFile("/etc/cdi/bad.yaml", "[1]")]
    )
    assert len(devices) == 3
    assert problems == ["/etc/cdi/bad.yaml: expected a mapping with cdiVersion, kind, devices"]


def test_a_device_defined_in_two_specs_is_used_from_neither():
    devices, problems = parse_specs(
        [SpecFile("/etc/cdi/a.yaml", AMD_SPEC), SpecFile("/var/run/cdi/b.yaml", AMD_SPEC)]
    )
    assert devices == []
    assert len(problems) == 3 and "defined more than once" in problems[0]


AMD_DEVICES = parse_spec(AMD_SPEC)


@pytest.mark.parametrize(
    ("inventory", "request_", "want"),
    [
        # count: the lowest-indexed matching GPUs, each its own one-GPU device
        ([_amd(0), _amd(1)], GPURequest(count=1), ["amd.com/gpu=0"]),
        ([_amd(0), _amd(1)], GPURequest(count=2), ["amd.com/gpu=0", "amd.com/gpu=1"]),
        # type and memory pick GPU 1 only: CDI name 1, never `all`
        ([_amd(0, "MI250"), _amd(1)], GPURequest(type="MI300"), ["amd.com/gpu=1"]),
        (
            [_amd(0, memory=64 * 1024**3), _amd(1)],
            GPURequest(min_memory="128Gi"),
            ["amd.com/gpu=1"],
        ),
        # all: every GPU, still one device each (the `all` device is not a GPU)
        ([_amd(0), _amd(1)], "all", ["amd.com/gpu=0", "amd.com/gpu=1"]),
    ],
)
def test_selection_rules_are_todays_and_each_gpu_gets_its_own_cdi_device(inventory, request_, want):
    selection = select_gpus(inventory, request_)
    assert isinstance(selection, GPUSelection)
    paired = cdi_devices_for(selection, AMD_DEVICES)
    assert not isinstance(paired, str)
    assert [d.qualified for d in paired] == want


def test_a_gpu_no_single_device_covers_is_named():
    selection = GPUSelection("amd", (_amd(2),))
    why = cdi_devices_for(selection, AMD_DEVICES)
    assert why == "no CDI device of kind amd.com/gpu adds exactly GPU 2's node /dev/dri/renderD130"


def test_a_device_that_adds_a_second_gpus_node_is_never_chosen():
    wide = CDIDevice("amd.com/gpu", "0", ("/dev/dri/renderD128", "/dev/dri/renderD129"))
    assert isinstance(cdi_devices_for(GPUSelection("amd", (_amd(0),)), [wide]), str)


def test_a_device_of_another_vendors_kind_is_not_an_amd_gpu():
    other = CDIDevice("example.com/gpu", "0", ("/dev/dri/renderD128",))
    assert isinstance(cdi_devices_for(GPUSelection("amd", (_amd(0),)), [other]), str)


def test_nvidia_gpus_pair_by_their_nvidia_n_node():
    spec = CDIDevice("nvidia.com/gpu", "GPU-1", ("/dev/nvidiactl", "/dev/nvidia1"))
    paired = cdi_devices_for(GPUSelection("nvidia", (_nvidia(1),)), [spec])
    assert not isinstance(paired, str)
    assert describe_devices(paired) == "nvidia.com/gpu=GPU-1"


SEL = GPUSelection("amd", (_amd(0), _amd(1)))


@pytest.mark.parametrize(
    ("mode", "runtime", "version", "devices", "want"),
    [
        ("never", "podman", None, AMD_DEVICES, None),
        ("auto", "podman", "4.3.1", AMD_DEVICES, ["amd.com/gpu=0", "amd.com/gpu=1"]),
        # auto never moves docker off device nodes: docker behaviour unchanged
        ("auto", "docker", "27.1.0", AMD_DEVICES, None),
        ("auto", "podman", "4.3.1", [], None),  # no spec covers them: device nodes
        ("always", "docker", "27.1.0", AMD_DEVICES, ["amd.com/gpu=0", "amd.com/gpu=1"]),
        ("always", "docker", "25.0.3", AMD_DEVICES, ["amd.com/gpu=0", "amd.com/gpu=1"]),
    ],
)
def test_when_cvs_uses_cdi(mode, runtime, version, devices, want):
    got = use_cdi(mode, runtime, version, SEL, devices)
    assert (None if got is None else [d.qualified for d in got]) == want  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("runtime", "version", "says"),
    [
        ("docker", "20.10.24+dfsg1", "docker 20.10 has no CDI"),
        ("docker", None, "docker's version is unknown"),
    ],
)
def test_cdi_always_on_a_docker_without_cdi_refuses_with_the_fix(runtime, version, says):
    got = use_cdi("always", runtime, version, SEL, AMD_DEVICES)
    assert isinstance(got, str) and says in got
    if version:
        assert "container.cdi: never" in got


def test_cdi_always_without_a_covering_spec_refuses():
    got = use_cdi("always", "podman", "4.3.1", SEL, [])
    assert isinstance(got, str) and got.startswith("container.cdi: always, but no CDI device")


def test_podman_always_takes_cdi():
    assert runtime_cdi_problem("podman", "4.3.1") is None


def test_the_argv_is_one_device_flag_per_gpu():
    assert cdi_run_args(AMD_DEVICES[:2]) == [
        "--device",
        "amd.com/gpu=0",
        "--device",
        "amd.com/gpu=1",
    ]
    assert describe_devices(AMD_DEVICES[:2]) == "amd.com/gpu=0,1"


def test_the_container_numbers_cdi_gpus_from_zero():
    # Visible devices are the container's view: GPU 1 on the host is 0 inside.
    selection = GPUSelection("amd", (_amd(1),))
    assert selection.env() == {"ROCR_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize(
    "devices", [["amd.com/gpu=all"], ["nvidia.com/gpu=0"], ["amd.com/gpu=0:1"]]
)
def test_a_cdi_gpu_device_next_to_a_request_is_refused(devices):
    cfg = ContainerConfig(image="img:1", devices=devices, gpus=GPURequest(count=1))
    (problem,) = gpu_subset_problems(cfg)
    assert problem[0] == ["container", "devices", 0]


def test_a_cdi_gpu_in_extra_args_next_to_a_request_is_refused():
    cfg = ContainerConfig(
        image="img:1", extra_args=["--device=amd.com/gpu=all"], gpus=GPURequest(count=1)
    )
    assert [p[0] for p in gpu_subset_problems(cfg)] == [["container", "extra_args", 0]]


def test_rootless_docker_is_refused_at_load():
    with pytest.raises(ValidationError, match="rootless: true needs runtime: podman"):
        ContainerConfig(image="img:1", rootless=True)


def test_the_new_keys_at_their_defaults_keep_a_docker_containers_hash():
    plain = ContainerConfig(image="img:1")
    assert config_hash(plain) == config_hash(ContainerConfig(image="img:1", runtime="docker"))
    assert config_hash(plain) != config_hash(ContainerConfig(image="img:1", runtime="podman"))
