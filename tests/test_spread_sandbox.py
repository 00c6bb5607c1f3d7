"""The image spread for real (containers/spread.py): one host loads
`image_tar` (or pulls) once, the others get the image host to host through
the coordinator's SSH connections (`spread_transport: relay`, set in every
cluster file here: the default is `direct`, tests/test_spread_direct.py),
checked by image ID; the faults.

The image is the sandbox's sshd image under a tag no host has (small: CI's
budget), saved to a tar every host can read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import Lab, cvs, docker, explain, inspect
from sandboxtools import pids_in_netns, wait_until
from spreadtools import (
    FOUR,
    THREE,
    host_short_of_space_is_named_before_any_byte_moves,
    image_ids,
    image_tar,
    lab,
    last_json,
    relay_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process,
    run_up,
    small_disk,
    spread_processes,
    up_signalled_mid_stream,
)

from orchestrator import remote
from orchestrator.containers import spread as spread_mod
from orchestrator.events import CollectingSink, Message
from orchestrator.sandbox import SSHD_TAG, Sandbox
from orchestrator.sandbox.registry import SandboxRegistry

__all__ = ["image_tar", "lab"]  # fixtures, used by name


def test_spread_to_four_hosts_loads_once_and_ends_with_equal_image_ids(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar)
    )
    plan = cvs(path, "plan")
    assert plan.returncode == 0, explain(plan)
    # The tree the plan shows (K = 2 for 3 receivers): node1 loads, feeds
    # node2 and node3; node2 passes the bytes on to node4.
    assert "image: peers" in plan.stdout and "node1 loads image_tar" in plan.stdout, plan.stdout
    assert "node1 -> node2, node3" in plan.stdout and "node2 -> node4" in plan.stdout
    up = cvs(path, "--json", "up")
    assert up.returncode == 0, explain(up)
    hosts = last_json(up)["hosts"]
    assert hosts["node1"]["steps"]["load"] == "ok"  # type: ignore[index]
    for host in FOUR[1:]:
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps.get("spread") == "ok" and "load" not in steps and "pull" not in steps, steps
        assert inspect(lab.sandbox, host, lab.name)["State"]["Running"]  # type: ignore[index]
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
    events = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
    progress = [e for e in events if e.get("event") == "ImageProgress"]
    assert {e["host"] for e in progress} == set(FOUR[1:]), progress[:3]
    assert all(e["total"] > 0 and e["done"] <= e["total"] * 1.1 for e in progress)
    assert spread_processes(lab) == []


def test_distribute_registry_loads_on_every_host(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay",
        lifetime="persistent",
        hosts=THREE,
        image=tag,
        image_tar=str(tar),
        distribute="registry",
    )
    plan = cvs(path, "plan")
    assert "image: registry (container.distribute: registry); fetches: 3" in plan.stdout
    up = cvs(path, "--json", "up")
    assert up.returncode == 0, explain(up)
    for host, entry in last_json(up)["hosts"].items():  # type: ignore[union-attr]
        assert entry["steps"]["load"] == "ok" and "spread" not in entry["steps"], (host, entry)
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}


def test_corrupted_bytes_on_one_hop_are_refused_and_fetched_again(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar)
    )

    def flip(host: str, chunk: bytes, offset: int) -> bytes:
        # Every byte past the first 64 KiB inverted on the way to node3 only.
        if host != "node3" or offset + len(chunk) <= 65536:
            return chunk
        return bytes(b ^ 0xFF for b in chunk)

    monkeypatch.setattr(spread_mod.Spread, "mangle", staticmethod(flip))
    sink = CollectingSink()
    assert run_up(path, sink), [str(e) for e in sink.events if isinstance(e, Message)]
    said = [e for e in sink.events if isinstance(e, Message) and e.host == "node3"]
    assert any("refused" in str(m.text) for m in said), said
    assert any("fed again" in str(m.text) or "own pull or load" in str(m.text) for m in said)
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}


def test_a_relay_killed_mid_spread_its_child_is_fed_from_another_host(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar)
    )
    node2 = next(n for n in lab.sandbox.nodes if n.name == "node2")
    killed: list[int] = []

    def kill_relay(host: str, chunk: bytes, offset: int) -> bytes:
        # node2 relays to node4: once node4 has 1 MiB, the relay dies (its
        # load and the tee passing the bytes on, by pid, in node2's netns).
        if host == "node4" and offset > (1 << 20) and not killed and node2.netns:
            for pid in pids_in_netns(node2.netns, lambda a: "cvs-spread_load" in " ".join(a)):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return chunk

    monkeypatch.setattr(spread_mod.Spread, "mangle", staticmethod(kill_relay))
    sink = CollectingSink()
    start = time.monotonic()
    ok = run_up(path, sink)
    seconds = time.monotonic() - start
    assert killed, "the relay's processes were not found"
    assert ok, [str(e.text) for e in sink.events if isinstance(e, Message)]
    said = " ".join(str(e.text) for e in sink.events if isinstance(e, Message))
    assert "fed again from a host that has it" in said, said
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
    assert seconds < 300, seconds  # bounded: no wait for the dead relay's timeouts
    assert spread_processes(lab) == []


def test_a_host_short_of_space_is_named_before_any_byte_moves(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host_short_of_space_is_named_before_any_byte_moves(lab, image_tar, monkeypatch)


@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a filesystem: needs root")
def test_a_root_of_its_own_behind_a_closed_parent_is_not_known_rather_than_the_parents() -> None:
    closed = Path(tempfile.mkdtemp(prefix="cvs-closed-"))  # 0700, root's
    root = closed / "docker"
    root.mkdir()
    script = (Path(remote.__file__).parent / "spread_space.sh").read_text()
    try:
        with small_disk(root, 1 << 20):
            # The login user (nobody) cannot reach `root`; df reads `/tmp`,
            # another filesystem than `root`'s.
            out = subprocess.run(
                ["sudo", "-n", "-u", "nobody", "sh", "-s", "--", "echo", str(root)],
                input=script, capture_output=True, text=True, check=False,
            )  # fmt: skip
    finally:
        shutil.rmtree(closed)

    assert out.returncode == 0 and out.stdout == "", out
    assert "its free space is not known" in out.stderr, out


def test_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    relay_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process(lab, image_tar)


PUSHER = "node4"  # pushes the image; the test uses node1..node3


@pytest.fixture
def registry_image(sandbox: Sandbox, lab: Lab) -> Iterator[tuple[SandboxRegistry, str]]:
    """(the sandbox registry, an image there no host has).

    The bytes the registry serves are not read here: the sandbox hosts hold
    the sshd image's layers already, so a pull fetches only the manifest and
    config (bench/image_fanout.py measures bytes on a registry of its own)."""
    with sandbox.registry() as reg:
        ref = reg.ref(f"cvs-spread/{lab.name}", "1")
        login = [*sandbox.docker_argv(PUSHER), "login", "-u", reg.username, "--password-stdin"]
        subprocess.run(
            [*login, reg.address], input=reg.password, text=True, check=True, capture_output=True
        )
        docker(sandbox, PUSHER, "tag", SSHD_TAG, ref)
        try:
            docker(sandbox, PUSHER, "push", "-q", ref)
        finally:
            docker(sandbox, PUSHER, "rmi", ref, check=False)
            docker(sandbox, PUSHER, "logout", reg.address, check=False)
        lab.tags.append(ref)
        yield reg, ref


def test_spread_from_the_registry_pulls_once(
    lab: Lab, registry_image: tuple[SandboxRegistry, str]
) -> None:
    reg, ref = registry_image
    credentials = {"username": reg.username, "password_file": str(reg.password_file)}
    path = lab.cluster(
        spread_transport="relay", lifetime="per_run", hosts=THREE, image=ref, registry=credentials
    )
    plan = cvs(path, "plan")
    assert "node1 pulls" in plan.stdout and "fetches: 1 (registry mode: 3)" in plan.stdout
    up = cvs(path, "--json", "up")
    assert up.returncode == 0, explain(up)
    hosts = last_json(up)["hosts"]
    assert hosts["node1"]["steps"]["pull"] == "ok"  # type: ignore[index]
    for host in THREE[1:]:
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps.get("spread") == "ok" and "pull" not in steps, steps
    ids = image_ids(lab, THREE, ref)
    assert len(set(ids.values())) == 1 and "" not in ids.values(), ids


def test_sigkill_of_cvs_mid_spread_leaves_nothing_on_the_hosts(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="per_run", hosts=FOUR, image=tag, image_tar=str(tar)
    )
    rc, _ = up_signalled_mid_stream(path, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    # Its channels closed with it: the loads read a cut archive, the save lost its reader.
    assert wait_until(lambda: spread_processes(lab) == [], 60), spread_processes(lab)
    ids = image_ids(lab, FOUR[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}


def test_a_stalled_relay_is_cut_off_within_the_bound_and_its_child_fed_again(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, image_id = image_tar
    # The stall bound is container.runtime_timeout: 10 s here.
    path = lab.cluster(
        spread_transport="relay",
        lifetime="per_run",
        hosts=FOUR,
        image=tag,
        image_tar=str(tar),
        runtime_timeout=10,
    )
    node2 = next(n for n in lab.sandbox.nodes if n.name == "node2")
    stopped: list[int] = []

    def stall_relay(host: str, chunk: bytes, offset: int) -> bytes:
        # node2 relays to node4: once node4 has 1 MiB, node2's tee (what
        # passes the bytes on, and feeds its own load) stops dead.
        if host == "node4" and offset > (1 << 20) and not stopped and node2.netns:
            for pid in pids_in_netns(node2.netns, lambda a: a[:2] == ["tee", "/dev/fd/3"]):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        return chunk

    monkeypatch.setattr(spread_mod.Spread, "mangle", staticmethod(stall_relay))
    sink = CollectingSink()
    start = time.monotonic()
    try:
        ok = run_up(path, sink)
    finally:
        for pid in stopped:  # whatever cvs left of it (it should have KILLed it)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    seconds = time.monotonic() - start
    assert stopped, "the relay's tee was not found"
    said = " ".join(str(e.text) for e in sink.events if isinstance(e, Message))
    assert ok, said
    assert "its feeder node2 stalled: no byte for 10s" in said, said
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
    assert seconds < 300, seconds
    assert wait_until(lambda: spread_processes(lab) == [], 30), spread_processes(lab)
