"""GPU discovery parsing, selection, vendor flags and env."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.config import GPURequest
from orchestrator.limits.gpus import (
    GPU,
    MARKER,
    GPUError,
    GPUSelection,
    Unsatisfiable,
    discovery_argv,
    parse_discovery,
    select_gpus,
)

GI = 1024**3
MI = 1024**2


def _output(**sections: str) -> str:
    """A discovery output with the given sections (names with '_' for '-')."""
    parts = [f"\n{MARKER} {name.replace('_', '-')}\n{body}" for name, body in sections.items()]
    return "".join(parts) + f"\n{MARKER} end\n"


def _amd(index: int, name: str = "AMD Instinct MI300X", memory: int | None = 192 * GI) -> GPU:
    return GPU("amd", index, None, name, memory, f"/dev/dri/renderD{128 + index}", None)


def _nv(index: int, name: str = "NVIDIA H100 80GB HBM3", memory: int | None = 80 * GI) -> GPU:
    return GPU("nvidia", index, f"GPU-{index:04d}", name, memory, None, None)


# ------------------------------------------------------------------ parsing

NVIDIA_SMI = """\
0, GPU-1a2b3c4d-0000-1111-2222-333344445555, NVIDIA A100-SXM4-80GB, 81920, 00000000:07:00.0
1, GPU-5e6f7a8b-0000-1111-2222-333344445555, NVIDIA A100-SXM4-80GB, 81920, 00000000:0F:00.0
"""


def test_nvidia_smi_csv_rows_become_nvidia_gpus():
    gpus = parse_discovery(_output(kfd="", render="", nvidia_smi=NVIDIA_SMI))
    assert gpus == [
        GPU(
            "nvidia",
            0,
            "GPU-1a2b3c4d-0000-1111-2222-333344445555",
            "NVIDIA A100-SXM4-80GB",
            81920 * MI,
            None,
            "0000:07:00.0",
        ),
        GPU(
            "nvidia",
            1,
            "GPU-5e6f7a8b-0000-1111-2222-333344445555",
            "NVIDIA A100-SXM4-80GB",
            81920 * MI,
            None,
            "0000:0f:00.0",
        ),
    ]


def test_nvidia_smi_failure_text_and_unknown_memory_are_tolerated():
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
        "0, GPU-x, Tesla T4, [N/A], 00000000:3B:00.0\n"
    )
    (gpu,) = parse_discovery(_output(nvidia_smi=text))
    assert (gpu.name, gpu.memory_bytes, gpu.uuid) == ("Tesla T4", None, "GPU-x")


AMD_SMI_NEW = json.dumps(
    {
        "gpu_data": [
            {
                "gpu": i,
                "asic": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002"},
                "bus": {"bdf": f"0000:{bus}:00.0"},
                "vram": {"type": "HBM3", "size": {"value": 196592, "unit": "MB"}},
            }
            for i, bus in enumerate(["0c", "22"])
        ]
    },
    indent=4,
)
AMD_SMI_OLD = json.dumps(
    [
        {
            "gpu": 0,
            "asic": {"market_name": "AMD Instinct MI250X / MI250"},
            "bus": {"bdf": "0000:c1:00.0"},
            "vram": {"type": "HBM", "size": "65520 MB"},
        }
    ]
)


def test_amd_smi_json_enriches_render_nodes_matched_by_pci_address():
    # Render nodes listed in the other order from amd-smi: the PCI address decides.
    render = "/dev/dri/renderD128 0000:22:00.0 0x1002\n/dev/dri/renderD136 0000:0c:00.0 0x1002\n"
    gpus = parse_discovery(
        _output(kfd="/dev/kfd", render=render, amd_smi="WARNING: noise\n" + AMD_SMI_NEW)
    )
    assert [(g.index, g.render_node, g.pci_bus) for g in gpus] == [
        (0, "/dev/dri/renderD128", "0000:22:00.0"),
        (1, "/dev/dri/renderD136", "0000:0c:00.0"),
    ]
    assert {g.name for g in gpus} == {"AMD Instinct MI300X"}
    assert {g.memory_bytes for g in gpus} == {196592 * MI}


def test_old_amd_smi_string_sizes_pair_by_order_without_sysfs():
    (gpu,) = parse_discovery(
        _output(kfd="/dev/kfd", render="/dev/dri/renderD128 - -\n", amd_smi=AMD_SMI_OLD)
    )
    assert (gpu.name, gpu.memory_bytes, gpu.pci_bus) == (
        "AMD Instinct MI250X / MI250",
        65520 * MI,
        "0000:c1:00.0",
    )


def test_rocm_smi_json_is_the_fallback_source():
    rocm = json.dumps(
        {
            "card0": {
                "Card Series": "AMD Instinct MI210",
                "Card Model": "0x740f",
                "VRAM Total Memory (B)": "68702699520",
                "PCI Bus": "0000:03:00.0",
            }
        }
    )
    (gpu,) = parse_discovery(
        _output(kfd="/dev/kfd", render="/dev/dri/renderD128 0000:03:00.0 0x1002\n", rocm_smi=rocm)
    )
    assert (gpu.name, gpu.memory_bytes) == ("AMD Instinct MI210", 68702699520)


def test_render_nodes_without_smi_are_amd_gpus_of_unknown_type_and_memory():
    render = "/dev/dri/renderD128 - -\n/dev/dri/renderD129 - -\n"
    gpus = parse_discovery(_output(kfd="/dev/kfd", render=render))
    assert gpus == [
        GPU("amd", 0, None, "", None, "/dev/dri/renderD128", None),
        GPU("amd", 1, None, "", None, "/dev/dri/renderD129", None),
    ]


def test_render_nodes_without_kfd_are_not_amd_gpus():
    assert parse_discovery(_output(kfd="", render="/dev/dri/renderD128 - -\n")) == []


def test_non_amd_render_nodes_do_not_make_an_nvidia_host_mixed():
    out = _output(
        kfd="/dev/kfd",
        render="/dev/dri/renderD128 0000:07:00.0 0x10de\n",
        nvidia_smi=NVIDIA_SMI,
    )
    assert {g.vendor for g in parse_discovery(out)} == {"nvidia"}


def test_empty_output_means_no_gpus():
    assert parse_discovery("") == []


# ---------------------------------------------------- discovery run with sh


@pytest.fixture
def device_root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    root = tmp_path / "root with space"
    (root / "dev" / "dri").mkdir(parents=True)
    # /dev/null's numbers: harmless if anything ever opens them.
    for node in ("dev/kfd", "dev/dri/renderD128", "dev/dri/renderD129"):
        os.mknod(root / node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (root / "dev" / "dri" / "card0").touch()  # not a render node
    (root / "dev" / "dri" / "renderD200").touch()  # not a character device
    return root


def _run_discovery(root: Path, path: str) -> str:
    return subprocess.run(
        discovery_argv(device_root=str(root)),
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": path},
        timeout=30,
    ).stdout


def test_discovery_program_finds_stand_in_device_nodes(device_root: Path):
    gpus = parse_discovery(_run_discovery(device_root, "/usr/bin:/bin"))
    assert [(g.vendor, g.index, g.render_node) for g in gpus] == [
        ("amd", 0, f"{device_root}/dev/dri/renderD128"),
        ("amd", 1, f"{device_root}/dev/dri/renderD129"),
    ]


def test_discovery_program_runs_nvidia_smi_when_on_path(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(NVIDIA_SMI.rstrip())}\n")
    fake.chmod(0o755)
    gpus = parse_discovery(_run_discovery(tmp_path / "empty", f"{bin_dir}:/usr/bin:/bin"))
    assert [(g.vendor, g.index) for g in gpus] == [("nvidia", 0), ("nvidia", 1)]


# ---------------------------------------------------------------- selection

MIXED_AMD = [
    _amd(0, "AMD Instinct MI250X", 64 * GI),
    _amd(1, "AMD Instinct MI300X", 192 * GI),
    _amd(2, "AMD Instinct MI250X", 64 * GI),
    _amd(3, "AMD Instinct MI300X", 192 * GI),
    _amd(4, "", None),
]


@pytest.mark.parametrize(
    ("inventory", "request_", "expected"),
    [
        (MIXED_AMD, None, []),
        ([], None, []),
        (MIXED_AMD, "all", [0, 1, 2, 3, 4]),
        (MIXED_AMD, GPURequest(count=2), [0, 1]),
        (MIXED_AMD, GPURequest(count=5), [0, 1, 2, 3, 4]),
        (MIXED_AMD, GPURequest(type="mi300x"), [1, 3]),
        (MIXED_AMD, GPURequest(count=1, type="MI300X"), [1]),
        (MIXED_AMD, GPURequest(count=2, type="MI250"), [0, 2]),
        (MIXED_AMD, GPURequest(min_memory="100G"), [1, 3]),
        (MIXED_AMD, GPURequest(count=3, min_memory="64Gi"), [0, 1, 2]),
        (MIXED_AMD, GPURequest(count=1, type="instinct", min_memory="128G"), [1]),
        (list(reversed(MIXED_AMD)), GPURequest(count=2), [0, 1]),
        ([_nv(1), _nv(0)], "all", [0, 1]),
    ],
)
def test_selection_takes_lowest_indexed_matching_gpus(inventory, request_, expected):
    selection = select_gpus(inventory, request_)
    assert isinstance(selection, GPUSelection)
    assert [g.index for g in selection.gpus] == expected


@pytest.mark.parametrize(
    ("inventory", "request_", "says"),
    [
        ([], "all", "no GPUs found"),
        ([], GPURequest(count=1), "needs 1, found none matching"),
        (MIXED_AMD, GPURequest(count=6), "needs 6, found 5 matching"),
        (MIXED_AMD, GPURequest(count=3, type="MI300X"), "needs 3, found 2 matching"),
        (MIXED_AMD, GPURequest(type="H100"), "needs 1, found none matching"),
        (MIXED_AMD, GPURequest(min_memory="256G"), "needs 1, found none matching"),
    ],
)
def test_unsatisfiable_request_is_refused_with_reason(inventory, request_, says):
    result = select_gpus(inventory, request_)
    assert isinstance(result, Unsatisfiable)
    assert says in result.message("gpu01")


def test_unsatisfiable_message_names_host_request_and_inventory():
    result = select_gpus(MIXED_AMD, GPURequest(count=3, type="MI300X", min_memory="128G"))
    assert isinstance(result, Unsatisfiable)
    assert result.message("gpu01") == (
        "gpu01: GPU request {count: 3, type: MI300X, min_memory: 128G} cannot be "
        "satisfied: needs 3, found 2 matching; the host has 5 amd GPU(s): "
        "2x AMD Instinct MI250X (64Gi), 2x AMD Instinct MI300X (192Gi), "
        "1x unknown type (unknown memory)"
    )


def test_bad_min_memory_is_refused_by_the_model():
    with pytest.raises(ValidationError) as info:
        GPURequest(min_memory="lots")
    assert info.value.errors()[0]["loc"] == ("min_memory",)


def test_unvalidated_bad_min_memory_still_names_the_key():
    with pytest.raises(GPUError, match=r"^gpus\.min_memory: "):
        select_gpus(MIXED_AMD, GPURequest.model_construct(min_memory="lots"))


names_st = st.sampled_from(["AMD Instinct MI300X", "AMD Instinct MI250X", "Radeon PRO W7900", ""])
inventory_st = st.lists(
    st.tuples(names_st, st.none() | st.integers(min_value=1, max_value=256)),
    max_size=12,
).map(lambda specs: [_amd(i, n, None if m is None else m * GI) for i, (n, m) in enumerate(specs)])
request_st = st.builds(
    GPURequest,
    count=st.none() | st.integers(min_value=1, max_value=12),
    type=st.none() | st.sampled_from(["mi300", "MI250X", "instinct", "w7900"]),
    min_memory=st.none() | st.integers(min_value=1, max_value=256).map(lambda m: f"{m}Gi"),
)


@given(st.randoms(use_true_random=False), inventory_st, request_st)
def test_selection_properties(rnd, inventory, request):
    shuffled = list(inventory)
    rnd.shuffle(shuffled)
    result = select_gpus(shuffled, request)
    min_memory = None if request.min_memory is None else int(request.min_memory[:-2]) * GI

    def fits(g: GPU) -> bool:
        return (request.type is None or request.type.lower() in g.name.lower()) and (
            min_memory is None or (g.memory_bytes is not None and g.memory_bytes >= min_memory)
        )

    matching = [g for g in inventory if fits(g)]
    if isinstance(result, Unsatisfiable):
        assert len(matching) < (request.count or 1)
        return
    chosen = list(result.gpus)
    assert len(chosen) == (request.count or len(matching))
    assert all(fits(g) for g in chosen)
    assert all(g in inventory for g in chosen)
    assert [g.index for g in chosen] == sorted(g.index for g in chosen)
    # Lowest indices first: nothing matching was skipped for a later device.
    assert chosen == matching[: len(chosen)]


# ------------------------------------------------------------ flags and env


def test_nvidia_selection_passes_uuids_as_one_quoted_argv_element():
    selection = select_gpus([_nv(0), _nv(1), _nv(2)], GPURequest(count=2))
    assert selection.docker_args("nvidia") == ["--gpus", '"device=GPU-0000,GPU-0001"']
    assert selection.env() == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_nvidia_selection_renumbers_from_zero():
    selection = select_gpus([_nv(0), _nv(3, "Tesla T4")], GPURequest(type="t4"))
    assert selection.docker_args() == ["--gpus", '"device=GPU-0003"']
    assert selection.env()["CUDA_VISIBLE_DEVICES"] == "0"


def test_amd_selection_passes_kfd_and_selected_render_nodes_only():
    selection = select_gpus(MIXED_AMD, GPURequest(type="MI300X"))
    assert selection.docker_args("amd") == [
        "--device", "/dev/kfd",
        "--device", "/dev/dri/renderD129",
        "--device", "/dev/dri/renderD131",
    ]  # fmt: skip
    assert selection.env() == {"ROCR_VISIBLE_DEVICES": "0,1"}


def test_amd_nodes_under_a_device_root_map_to_their_real_paths_inside():
    gpu = GPU("amd", 0, render_node="/tmp/sb/dev/dri/renderD130")
    selection = select_gpus([gpu], "all")
    assert selection.docker_args() == [
        "--device", "/tmp/sb/dev/kfd:/dev/kfd",
        "--device", "/tmp/sb/dev/dri/renderD130:/dev/dri/renderD130",
    ]  # fmt: skip


def test_no_gpus_requested_gives_no_flags_and_no_env():
    selection = select_gpus(MIXED_AMD, None)
    assert (selection.docker_args(), selection.env()) == ([], {})


def test_amd_env_never_sets_hip_visible_devices():
    assert "HIP_VISIBLE_DEVICES" not in select_gpus(MIXED_AMD, "all").env()


# ------------------------------------------------------------ vendor errors

VENDOR_ERROR = r"a host must have GPUs of exactly one known vendor \(amd, nvidia\)"


def test_mixed_vendors_refuse_selection():
    with pytest.raises(GPUError, match=VENDOR_ERROR):
        select_gpus([_amd(0), _nv(1)], "all")


def test_unknown_vendor_gpu_cannot_be_made():
    with pytest.raises(GPUError, match=VENDOR_ERROR):
        GPU("intel", 0)  # type: ignore[arg-type]


def test_unknown_vendor_in_docker_args_is_the_same_error():
    with pytest.raises(GPUError, match=VENDOR_ERROR):
        select_gpus([_nv(0)], "all").docker_args("intel")


def test_vendor_mismatch_in_docker_args_is_the_same_error():
    with pytest.raises(GPUError, match=VENDOR_ERROR):
        select_gpus([_nv(0)], "all").docker_args("amd")


def test_selection_with_unknown_vendor_fails_in_env_too():
    with pytest.raises(GPUError, match=VENDOR_ERROR):
        GPUSelection("intel", (_nv(0),)).env()  # type: ignore[arg-type]


# --- user env can never widen the selection (issue 10.4) ------------------------

from orchestrator.config import GPURequest  # noqa: E402
from orchestrator.limits.gpus import guard_visible_devices  # noqa: E402

TWO = GPURequest(count=2)


@pytest.mark.parametrize(
    ("key", "value", "kept"),
    [
        ("HIP_VISIBLE_DEVICES", "0,1,2,3", False),  # wider than the two selected
        ("CUDA_VISIBLE_DEVICES", "7", False),
        ("ROCR_VISIBLE_DEVICES", "0,1,2", False),
        ("GPU_DEVICE_ORDINAL", "2", False),
        ("NVIDIA_VISIBLE_DEVICES", "all", False),  # the runtime would expose every GPU
        ("NVIDIA_VISIBLE_DEVICES", "0", False),
        ("CUDA_VISIBLE_DEVICES", "GPU-5d2c", False),  # a UUID: not an ordinal
        ("HIP_VISIBLE_DEVICES", "1", True),  # narrows within 0..1
        ("ROCR_VISIBLE_DEVICES", "0,1", True),
        ("CUDA_VISIBLE_DEVICES", " 0 ", True),
        ("HIP_VISIBLE_DEVICES", "0\n2", False),
        ("NCCL_DEBUG", "WARN", True),  # not a visibility variable
    ],
)
def test_visibility_env_is_kept_only_when_it_narrows(key: str, value: str, kept: bool) -> None:
    env, warnings = guard_visible_devices({key: value, "A": "b"}, TWO, count=2)
    assert (key in env) is kept
    assert env["A"] == "b"
    assert len(warnings) == (0 if kept else 1)
    if warnings:
        assert key in warnings[0] and "ignored" in warnings[0]


def test_without_a_subset_request_env_is_untouched() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "HIP_VISIBLE_DEVICES": "0,1,2,3"}
    assert guard_visible_devices(env, None, count=None) == (env, [])
    assert guard_visible_devices(env, "all", count=None) == (env, [])


def test_unknown_count_removes_every_visibility_variable() -> None:
    env, warnings = guard_visible_devices(
        {"HIP_VISIBLE_DEVICES": "0"}, GPURequest(type="MI300X"), count=None
    )
    assert env == {} and len(warnings) == 1


@given(
    value=st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=6).map(
        lambda xs: ",".join(map(str, xs))
    ),
    count=st.integers(min_value=1, max_value=8),
    key=st.sampled_from(["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]),
)
def test_a_kept_value_never_names_an_ordinal_outside_the_selection(
    value: str, count: int, key: str
) -> None:
    env, _ = guard_visible_devices({key: value}, GPURequest(count=count), count=count)
    if key in env:
        assert all(int(i) < count for i in env[key].split(","))


def test_run_argv_drops_container_env_that_would_widen_the_selection() -> None:
    from orchestrator.config import ContainerConfig
    from orchestrator.containers.argv import run_argv, run_env_file
    from orchestrator.limits.gpus import GPU, GPUSelection

    gpus = GPUSelection(
        "amd",
        tuple(
            GPU(index=i, vendor="amd", render_node=f"/dev/dri/renderD{128 + i}") for i in range(2)
        ),
    )
    cfg = ContainerConfig(
        image="img:1",
        gpus={"count": 2},
        env={"HIP_VISIBLE_DEVICES": "0,1,2,3", "NVIDIA_VISIBLE_DEVICES": "all", "X": "1"},
    )
    argv = run_argv(["docker"], cfg, "c", {}, gpus=gpus)
    env = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert env == ["ROCR_VISIBLE_DEVICES=0,1"]
    # container.env (after Open MPI's run-as-root pair): over stdin, not argv.
    assert run_env_file(cfg, gpus) == (
        "OMPI_ALLOW_RUN_AS_ROOT=1\nOMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\nX=1\n"
    )
