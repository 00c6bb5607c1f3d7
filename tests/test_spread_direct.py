"""The direct hop of an image spread for real (containers/spread_direct.py,
`container.spread_transport: direct`): the bytes go feeder to receiver over
the hosts' own ssh with a key for this invocation only; cvs carries none of
them. The key's line in authorized_keys, the key files and the lease go on
every exit path; a host its feeder cannot reach loads the image itself
(distribute `auto`) or is fed through cvs (`peers`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from labtools import Lab, cvs, explain
from spreadtools import (
    FOUR,
    auto_unreachable_host_is_named_and_loads_image_tar_itself,
    auto_unreachable_relay_host_loads_itself_its_child_is_fed_through_cvs,
    corrupted_direct_hop_is_refused_and_fetched_again,
    ctrl_c_mid_spread_exits_130_and_leaves_nothing,
    image_ids,
    image_tar,
    keys_state,
    lab,
    last_json,
    leftovers,
    peers_unreachable_host_is_named_and_fed_through_cvs,
    relay_host_killed_its_child_is_fed_from_another_host,
    sigkill_of_cvs_mid_spread_leaves_nothing,
)

from orchestrator.sandbox import Sandbox, network

pytestmark = pytest.mark.sandbox
__all__ = ["image_tar", "lab"]  # fixtures, used by name


def bridge_tx(sandbox: Sandbox) -> int:
    """Bytes this machine (cvs) sent onto the sandbox's bridge: host-to-host
    frames are forwarded between ports and never counted here."""
    path = Path(f"/sys/class/net/{network.bridge_name(sandbox.index)}/statistics/tx_bytes")
    return int(path.read_text())


def test_direct_spread_to_four_hosts_sends_no_image_bytes_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    size = tar.stat().st_size
    path = lab.cluster(
        lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar), spread_transport="direct"
    )
    plan = cvs(path, "plan")
    assert "transport: direct" in plan.stdout, explain(plan)
    before_keys = keys_state(lab)
    before_tx = bridge_tx(lab.sandbox)
    up = cvs(path, "--json", "up")
    sent = bridge_tx(lab.sandbox) - before_tx
    assert up.returncode == 0, explain(up)
    hosts = last_json(up)["hosts"]
    for host in FOUR[1:]:
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps.get("spread") == "ok" and "load" not in steps, (host, steps)
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
    # The relay would send 3 x the image; direct sends commands only.
    assert sent < size * 0.2, (sent, size)
    assert "not reached host to host" not in up.stdout, explain(up)
    # Progress on direct edges: each receiver's lease reads its own count.
    events = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
    progress = [e for e in events if e.get("event") == "ImageProgress"]
    assert {e["host"] for e in progress} == set(FOUR[1:]), progress[:3]
    assert all(e["total"] > 0 and 0 < e["done"] <= e["total"] * 1.1 for e in progress), progress
    assert max(e["done"] for e in progress if e["host"] == "node4") > size // 2, progress
    assert keys_state(lab) == before_keys
    assert leftovers(lab) == []


def test_direct_corrupted_bytes_on_one_hop_are_refused_and_fetched_again(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupted_direct_hop_is_refused_and_fetched_again(lab, image_tar, monkeypatch)


def test_direct_relay_host_killed_mid_spread_its_child_is_fed_from_another_host(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    relay_host_killed_its_child_is_fed_from_another_host(lab, image_tar)


def test_direct_spread_auto_unreachable_host_is_named_and_loads_image_tar_itself(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    auto_unreachable_host_is_named_and_loads_image_tar_itself(lab, image_tar)


def test_direct_spread_auto_unreachable_relay_host_loads_itself_its_child_is_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    auto_unreachable_relay_host_loads_itself_its_child_is_fed_through_cvs(lab, image_tar)


def test_direct_spread_peers_unreachable_host_is_named_and_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    peers_unreachable_host_is_named_and_fed_through_cvs(lab, image_tar)


def test_direct_spread_sigkill_of_cvs_leaves_no_key_no_file_no_process(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    sigkill_of_cvs_mid_spread_leaves_nothing(lab, image_tar)


def test_direct_spread_ctrl_c_exits_130_and_removes_keys_files_and_processes(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    ctrl_c_mid_spread_exits_130_and_leaves_nothing(lab, image_tar)
