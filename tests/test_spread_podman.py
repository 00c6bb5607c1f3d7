"""The image spread with rootful podman hosts (containers/spread.py): the
archive is a docker-archive, whose load keeps the image ID; and the faults
as on docker (tests/test_spread_direct.py, tests/test_spread_sandbox.py:
the bodies are tests/spreadtools.py's): a corrupted hop, a relay host
killed, SIGKILL and Ctrl-C of cvs (direct, and relay: podman's copy of a
cut stream in /var/tmp goes too), a host short of space, hosts that cannot
reach each other. The registry-seeded spread (one pull) is
tests/test_sandbox_registry.py's.

One sandbox for the module whose four nodes run podman (as tests/test_podman.py
builds it); the image is the sandbox's sshd image under a tag no host has;
every test's containers and tags go before and after it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import Lab, cvs, explain
from spreadtools import (
    THREE,
    auto_unreachable_host_is_named_and_loads_image_tar_itself,
    corrupted_direct_hop_is_refused_and_fetched_again,
    ctrl_c_mid_spread_exits_130_and_leaves_nothing,
    host_short_of_space_is_named_before_any_byte_moves,
    image_ids,
    last_json,
    peers_unreachable_host_is_named_and_fed_through_cvs,
    relay_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process,
    relay_host_killed_its_child_is_fed_from_another_host,
    saved_image,
    sigkill_of_cvs_mid_spread_leaves_nothing,
)

from orchestrator.sandbox import Sandbox, sandbox_down, sandbox_up

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def podman_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root")
    if shutil.which("podman") is None:
        pytest.skip("podman hosts need podman (apt-get install podman uidmap)")
    directory = tmp_path_factory.mktemp("podman-spread") / "sb"
    try:
        yield sandbox_up(directory, hosts=4, runtime="podman")
    finally:
        sandbox_down(directory)


@pytest.fixture
def lab(podman_sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(podman_sandbox, tmp_path, prefix="cvs-sp")
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


@pytest.fixture
def image_tar(lab: Lab) -> Iterator[tuple[str, Path, str]]:
    """(tag no host has, a docker-archive of it every host reads, its image ID)."""
    with saved_image(lab, "node3") as saved:
        yield saved


@pytest.mark.parametrize("transport", ["relay", "direct"])
def test_podman_spread_keeps_the_image_id_on_every_host(
    lab: Lab, image_tar: tuple[str, Path, str], transport: str
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        lifetime="per_run", hosts=THREE, image=tag, image_tar=str(tar), spread_transport=transport
    )
    plan = cvs(path, "plan", timeout=240)
    assert "node1 -> node2, node3" in plan.stdout, explain(plan)
    up = cvs(path, "--json", "up", timeout=240)
    assert up.returncode == 0, explain(up)
    assert "not reached host to host" not in up.stdout, explain(up)
    assert "image not received" not in up.stdout, explain(up)  # no second round
    hosts = last_json(up)["hosts"]
    assert hosts["node1"]["steps"]["load"] == "ok", hosts["node1"]  # type: ignore[index]
    events = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
    progress = {e["host"] for e in events if e.get("event") == "ImageProgress"}
    assert progress == set(THREE[1:]), progress  # direct: each receiver's own count
    for host in THREE[1:]:
        assert hosts[host]["steps"].get("spread") == "ok", hosts[host]  # type: ignore[index]
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}


def test_podman_direct_corrupted_bytes_on_one_hop_are_refused_and_fetched_again(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupted_direct_hop_is_refused_and_fetched_again(lab, image_tar, monkeypatch)


def test_podman_direct_relay_host_killed_mid_spread_its_child_is_fed_from_another_host(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    relay_host_killed_its_child_is_fed_from_another_host(lab, image_tar)


def test_podman_direct_sigkill_of_cvs_mid_spread_leaves_nothing_and_the_next_up_works(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    sigkill_of_cvs_mid_spread_leaves_nothing(lab, image_tar)


def test_podman_direct_ctrl_c_mid_spread_exits_130_and_leaves_nothing(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    ctrl_c_mid_spread_exits_130_and_leaves_nothing(lab, image_tar)


def test_podman_host_short_of_space_is_named_before_any_byte_moves(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host_short_of_space_is_named_before_any_byte_moves(lab, image_tar, monkeypatch)


def test_podman_direct_auto_unreachable_host_is_named_and_loads_image_tar_itself(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    auto_unreachable_host_is_named_and_loads_image_tar_itself(lab, image_tar)


def test_podman_direct_peers_unreachable_host_is_named_and_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    peers_unreachable_host_is_named_and_fed_through_cvs(lab, image_tar)


def test_podman_relay_ctrl_c_mid_spread_exits_130_and_leaves_no_process_and_no_copy(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    relay_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process(lab, image_tar)
