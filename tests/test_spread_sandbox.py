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
from clitools import CVS
from labtools import Lab, cvs, docker, explain, inspect
from sandboxtools import pids_in_netns, wait_until
from spreadtools import FOUR, THREE, image_ids, image_tar, lab, last_json, run_up

from orchestrator import remote
from orchestrator.containers import spread as spread_mod
from orchestrator.events import CollectingSink, ImageProgress, Message
from orchestrator.sandbox import SSHD_TAG, Sandbox
from orchestrator.sandbox.registry import SandboxRegistry

__all__ = ["image_tar", "lab"]  # fixtures, used by name


def _spreading(argv: list[str]) -> bool:
    """A spread's program, its tee, or the runtime CLI's load or save."""
    return (
        any(a.startswith("cvs-spread_") for a in argv)
        or argv[:2] == ["tee", "/dev/fd/3"]
        or argv[-1:] == ["load"]
        or "save" in argv
    )


def spread_processes(lab: Lab) -> list[int]:
    """Anything of a spread still running on any host (a load, a save)."""
    found: list[int] = []
    for node in lab.sandbox.nodes:
        if node.netns is None:
            continue
        found += pids_in_netns(node.netns, _spreading)
    return found


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


@contextlib.contextmanager
def small_disk(directory: Path, size: int) -> Iterator[None]:
    """`directory` (a host's dockerd data-root, dockerd running) seen as a
    filesystem with `size` bytes free: an overlay whose lower layer is the
    directory itself (nothing copied, everything still there) and whose upper
    layer is a tmpfs of `size`. df (the spread's free-space check) reads the
    upper's statfs. Unmounted, and its tmpfs with it, on every exit path."""
    scratch = Path(tempfile.mkdtemp(prefix="cvs-small-disk-"))
    mounted: list[Path] = []
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(scratch)],
                       check=True)  # fmt: skip
        mounted.append(scratch)
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        options = f"lowerdir={directory},upperdir={scratch}/upper,workdir={scratch}/work"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(directory)],
                       check=True)  # fmt: skip
        mounted.append(directory)
        yield
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", str(path)], check=False)
        scratch.rmdir()


@contextlib.contextmanager
def searchable(path: Path) -> Iterator[None]:
    """`path`'s parents searchable by anyone (the login user's df must reach
    the root it reads; pytest's tmp dirs are root's, closed): restored after."""
    parents = [p for p in path.parents if p != Path("/")]
    modes = {p: p.stat().st_mode & 0o7777 for p in parents}
    try:
        for p, mode in modes.items():
            p.chmod(mode | 0o001)
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_host_short_of_space_is_named_before_any_byte_moves(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, _ = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar)
    )
    size = int(docker(lab.sandbox, "node1", "image", "inspect", "-f", "{{.Size}}", SSHD_TAG))
    root = next(n for n in lab.sandbox.nodes if n.name == "node3").data_root
    moved: list[str] = []
    monkeypatch.setattr(
        spread_mod.Spread, "mangle", staticmethod(lambda h, c, o: moved.append(h) or c)
    )
    sink = CollectingSink()
    # node3's dockerd stores images on a filesystem with half the image free
    # (the spread asks for twice it: the image and its unpacking).
    with searchable(root), small_disk(root, size // 2):
        assert free_bytes(root) < size  # (the tmpfs rounds up to pages)
        assert not run_up(path, sink)
    assert free_bytes(root) > 10 * size  # the mount is gone

    errors = [e for e in sink.events if isinstance(e, Message) and e.level == "error"]
    assert [e.host for e in errors if "not enough space" in str(e.text)] == ["node3"], errors
    said = next(str(e.text) for e in errors if e.host == "node3")
    assert "free space in the runtime's root directory" in said, said
    # Named before any byte moved anywhere, and nothing ever moved to node3.
    first_error = sink.events.index(errors[0])
    progress = [i for i, e in enumerate(sink.events) if isinstance(e, ImageProgress)]
    assert all(i > first_error for i in progress)
    assert "node3" not in moved
    assert not any(isinstance(e, ImageProgress) and e.host == "node3" for e in sink.events)
    assert image_ids(lab, ["node3"], tag) == {"node3": ""}
    assert all(inspect(lab.sandbox, h, lab.name) is None for h in THREE)


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
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar)
    )
    proc = subprocess.Popen(
        [*CVS, "-c", str(path), "--json", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CI": "1"},
    )
    try:
        # Mid-spread: the first progress event of a receiver.
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"ImageProgress"' in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert wait_until(lambda: spread_processes(lab) == [], 30), spread_processes(lab)
    ids = image_ids(lab, FOUR[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids  # nothing partial, nothing wrong
    up = cvs(path, "up")  # and the next `up` works
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}


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
    proc = subprocess.Popen(
        [*CVS, "-c", str(path), "--json", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "CI": "1"},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"ImageProgress"' in line:
                break
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
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
