"""A `gpus` subset is not defeated by devices or privileged that expose every GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.config import ConfigError, cluster_from_data, load_cluster
from orchestrator.config.gpu_devices import exposes_all_gpus

SAMPLES = Path(__file__).resolve().parents[1] / "cluster_samples"


def load(container: dict[str, object]) -> object:
    data = {"hosts": ["a"], "container": {"image": "x", **container}}
    return cluster_from_data(data, "c.yaml", Path("/tmp"), check_files=False)


@pytest.mark.parametrize(
    ("path", "exposes"),
    [
        ("/dev/dri", True),
        ("/dev/dri/", True),
        ("/dev/dri/renderD128", True),
        ("/dev/dri/card0", True),
        ("/dev/dri/by-path/pci-0000:c1:00.0-render", True),
        ("/dev/nvidia0", True),
        ("/dev/nvidia7", True),
        ("/dev", True),
        ("/dev/kfd", False),
        ("/dev/nvidiactl", False),
        ("/dev/nvidia-uvm", False),
        ("/dev/infiniband", False),
        ("/dev/infiniband/uverbs0", False),
        ("/dev/fuse", False),
        ("/dev/drifter", False),
    ],
)
def test_which_device_paths_expose_every_gpu(path: str, exposes: bool) -> None:
    assert exposes_all_gpus(path) is exposes


@pytest.mark.parametrize(
    ("container", "key"),
    [
        ({"devices": ["/dev/kfd", "/dev/dri"]}, r"container\.devices\[1\]: '/dev/dri'"),
        ({"devices": ["/dev/dri/renderD129:/dev/dri/renderD128"]}, r"container\.devices\[0\]"),
        ({"devices": ["/dev/nvidia0"]}, r"container\.devices\[0\]"),
        ({"privileged": True}, r"container\.privileged: privileged: true"),
        ({"extra_args": ["--privileged"]}, r"container\.extra_args\[0\]"),
        ({"extra_args": ["--device=/dev/dri"]}, r"container\.extra_args\[0\]"),
    ],
)
def test_gpu_request_next_to_all_gpu_access_is_refused_naming_the_key(
    container: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError, match=key + r".*gpus\.allow_all_devices: true"):
        load({"gpus": {"count": 2}, **container})


@pytest.mark.parametrize("gpus", [None, "all", {"count": 2, "allow_all_devices": True}])
def test_all_gpu_access_is_fine_without_a_subset_or_with_the_opt_out(gpus: object) -> None:
    load({"gpus": gpus, "devices": ["/dev/kfd", "/dev/dri"], "privileged": True})


def test_subset_with_control_nodes_only_loads() -> None:
    load({"gpus": {"count": 1}, "devices": ["/dev/kfd", "/dev/nvidiactl", "/dev/infiniband"]})


def test_the_documented_sample_holds_its_gpu_subset() -> None:
    cluster = load_cluster(SAMPLES / "two_node.yaml", check_files=False)
    assert cluster.container is not None and cluster.container.gpus is not None
    assert not any(exposes_all_gpus(d) for d in cluster.container.devices)


@given(st.integers(min_value=0, max_value=4096))
def test_every_render_card_and_nvidia_node_exposes(n: int) -> None:
    for path in (f"/dev/dri/renderD{n}", f"/dev/dri/card{n}", f"/dev/nvidia{n}"):
        assert exposes_all_gpus(path)
