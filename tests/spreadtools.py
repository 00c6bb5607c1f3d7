"""What the image-spread sandbox tests share (tests/test_spread_sandbox.py,
tests/test_spread_direct.py, tests/test_spread_podman.py): host lists, the
lab fixture, an image tar no host has, readers of image IDs and `--json`
results, what a direct spread may leave on the hosts, and the bodies of the
fault scenarios the docker and podman modules both run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import yaml
from clitools import CVS
from labtools import Lab, cvs, docker, explain, inspect
from sandboxtools import cmdline, pids_in_netns, wait_until

from orchestrator.api import Cluster
from orchestrator.containers import spread as spread_mod
from orchestrator.events import CollectingSink, ImageProgress, Message
from orchestrator.sandbox import SSHD_TAG, Sandbox

FOUR = ["node1", "node2", "node3", "node4"]
THREE = FOUR[:3]


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


@pytest.fixture
def image_tar(sandbox: Sandbox, lab: Lab) -> Iterator[tuple[str, Path, str]]:
    """(tag no host has, a `docker save` tar of it every host reads, its image ID)."""
    with saved_image(lab) as saved:
        yield saved


@contextlib.contextmanager
def saved_image(lab: Lab, host: str = "node4") -> Iterator[tuple[str, Path, str]]:
    """(tag no host has, a saved tar of it every host reads, its image ID), by
    `host`'s runtime: podman's as a docker-archive (whose load keeps the
    image ID), under localhost/ (podman's name for an unqualified local tag)."""
    podman = lab.runtime == "podman"
    tag = f"{'localhost/' if podman else ''}cvs-spread/{lab.name}:1"
    directory = Path(tempfile.mkdtemp(prefix="cvs-spread-"))
    directory.chmod(0o755)
    tar = directory / "image.tar"
    fmt = ["--format", "docker-archive"] if podman else []
    docker(lab.sandbox, host, "tag", SSHD_TAG, tag)
    try:
        docker(lab.sandbox, host, "save", *fmt, "-o", str(tar), tag)
        image_id = docker(lab.sandbox, host, "image", "inspect", "-f", "{{.Id}}", tag).strip()
    finally:
        docker(lab.sandbox, host, "rmi", tag, check=False)
    tar.chmod(0o644)
    lab.tags.append(tag)
    try:
        yield tag, tar, image_id
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def image_ids(lab: Lab, hosts: list[str], tag: str) -> dict[str, str]:
    return {
        h: docker(lab.sandbox, h, "image", "inspect", "-f", "{{.Id}}", tag, check=False).strip()
        for h in hosts
    }


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    docs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert docs, explain(proc)
    return docs[-1]


def run_up(path: Path, sink: CollectingSink) -> bool:
    async def main() -> bool:
        async with Cluster.open(path, sink=sink) as cluster:
            report = await cluster.up(check=False)
            return report.ok

    return anyio.run(main)


def up_signalled_mid_stream(
    path: Path, sig: signal.Signals, at_progress: Callable[[], None] | None = None
) -> tuple[int, str]:
    """`cvs --json up` sent `sig` at its first receiver's count (mid-stream;
    `at_progress` runs just before): (its exit status, its stderr)."""
    proc = subprocess.Popen([*CVS, "-c", str(path), "--json", "up"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CI": "1"})  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"ImageProgress"' in line:
                break
        if at_progress is not None:
            at_progress()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def authorized_keys(lab: Lab) -> Path:
    """The cluster file's login user's authorized_keys (the sandbox's hosts
    share this machine's homes): docker's user, or podman's sudo user."""
    user = yaml.safe_load(lab.sandbox.cluster_file.read_text())["ssh"]["user"]
    return Path(os.path.expanduser(f"~{user}")) / ".ssh" / "authorized_keys"


def keys_state(lab: Lab) -> tuple[bool, bool, str]:
    """(~/.ssh exists, authorized_keys exists, its text) of the login user."""
    keys = authorized_keys(lab)
    return keys.parent.exists(), keys.exists(), keys.read_text() if keys.exists() else ""


def _direct(argv: list[str]) -> bool:
    """A lease, a fan (the seed's or a forced command's) or a fan's ssh."""
    return any(x == "cvs-spread_lease" or x.endswith("/fan.sh") or x == "cvs-spread" for x in argv)


def direct_fan(argv: list[str]) -> bool:
    """A receiver's part of a direct spread: its fan, tee, load and ssh on."""
    return (
        any(x.endswith("/fan.sh") or x == "cvs-spread" for x in argv)
        or argv[:1] == ["tee"]
        or (argv[-1:] == ["load"])
    )


# Where podman (4.x) copies an archive it loads from stdin (its TMPDIR, unset
# under sudo; podmanNNN), and where a save to stdout keeps its fifo
# (pipeDirNNN/saveio) and a copy of each layer (NNN): a load or save TERMed
# or killed leaves them there.
PODMAN_TEMP = Path("/var/tmp")


def _podman_temp(p: Path) -> bool:
    name = p.name
    return name.isdigit() or (
        (name.startswith("podman") or name.startswith("pipeDir")) and name[-1:].isdigit()
    )


def podman_temp_files(since: float) -> set[Path]:
    """podman's load copies and save temp files written since `since` (time.time())."""
    found = set()
    for p in PODMAN_TEMP.iterdir():
        with contextlib.suppress(FileNotFoundError):
            if _podman_temp(p) and p.stat().st_mtime >= since:
                found.add(p)
    return found


def leftovers(
    lab: Lab, since: float | None = None, spared: frozenset[Path] = frozenset()
) -> list[str]:
    """Lease shells, fans, their ssh, key directories (and what a load wrote
    in them): anything a direct spread leaves; on podman hosts, with `since`,
    also the copies of archives its loads left (but `spared`'s)."""
    found = [str(p) for p in Path("/tmp").glob("cvs-spread.*")]
    for node in lab.sandbox.nodes:
        if node.netns is None:
            continue
        found += [
            f"{node.name}:{pid}:{' '.join(cmdline(pid, retry=False) or [])[:200]}"
            for pid in pids_in_netns(node.netns, _direct)
        ]
    if lab.runtime == "podman" and since is not None:
        found += [str(p) for p in sorted(podman_temp_files(since) - spared)]
    return found


def open_copies(pid: int) -> set[Path]:
    """podman's stdin copies that process `pid` has open."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = Path(os.readlink(fd))
                if target.parent == PODMAN_TEMP and target.name.startswith("podman"):
                    found.add(target)
    return found


@contextlib.contextmanager
def small_disk(directory: Path, size: int, *, keep: bool = True) -> Iterator[None]:
    """`directory` (a host's dockerd data-root, dockerd running) seen as a
    filesystem with `size` bytes free: an overlay whose lower layer is the
    directory itself (nothing copied, everything still there) and whose upper
    layer is a tmpfs of `size`. df (the spread's free-space check) reads the
    upper's statfs. Unmounted, and its tmpfs with it, on every exit path.

    `keep=False`: the tmpfs itself over `directory`, whose files are hidden
    while it is mounted (podman's overlay driver refuses a graph root on
    overlayfs; an empty store is what a host without the image has anyway)."""
    scratch = Path(tempfile.mkdtemp(prefix="cvs-small-disk-"))
    mounted: list[Path] = []
    try:
        tmpfs = str(scratch if keep else directory)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", tmpfs],
                       check=True)  # fmt: skip
        if not keep:
            mounted.append(directory)
            yield
            return
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


def host_short_of_space_is_named_before_any_byte_moves(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, _ = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar)
    )
    size = int(docker(lab.sandbox, "node1", "image", "inspect", "-f", "{{.Size}}", SSHD_TAG))
    node3 = next(n for n in lab.sandbox.nodes if n.name == "node3")
    root = node3.podman_root if lab.runtime == "podman" else node3.data_root
    moved: list[str] = []
    monkeypatch.setattr(
        spread_mod.Spread, "mangle", staticmethod(lambda h, c, o: moved.append(h) or c)
    )
    sink = CollectingSink()
    # node3's runtime stores images on a filesystem with half the image free
    # (the spread asks for twice it: the image and its unpacking).
    with searchable(root), small_disk(root, size // 2, keep=lab.runtime != "podman"):
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


def relay_ctrl_c_mid_spread_leaves_no_partial_image_and_no_process(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        spread_transport="relay", lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar)
    )
    since = time.time()
    rc, err = up_signalled_mid_stream(path, signal.SIGINT)
    assert rc == 130, err

    def left() -> list[str]:
        """Spread processes, and anything else a spread leaves (podman's temp files)."""
        return [str(p) for p in spread_processes(lab)] + leftovers(lab, since)

    assert wait_until(lambda: left() == [], 30), left()
    ids = image_ids(lab, FOUR[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids  # nothing partial, nothing wrong
    up = cvs(path, "up")  # and the next `up` works
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}


# The fault scenarios of a direct spread (the default transport), one body
# for docker (tests/test_spread_direct.py) and podman (tests/test_spread_podman.py).


def corrupted_direct_hop_is_refused_and_fetched_again(
    lab: Lab, image_tar: tuple[str, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar))

    def corrupt(host: str, load: list[str]) -> list[str]:
        # node3's direct hop: every "0" arrives as "1" (the tar headers' octal
        # fields and checksums, the config's digest: the hosts hold the
        # layers already, so a load skips their bytes); the second round
        # (through cvs) is clean.
        if host != "node3":
            return load
        return ["sh", "-c", 'tr 0 1 | "$@"', "sh", *load]

    monkeypatch.setattr(spread_mod.Spread, "direct_load", staticmethod(corrupt))
    sink = CollectingSink()
    since = time.time()
    assert run_up(path, sink), [str(e) for e in sink.events if isinstance(e, Message)]
    said = [str(e.text) for e in sink.events if isinstance(e, Message) and e.host == "node3"]
    assert any("refused" in m or "not present after the load" in m for m in said), said
    assert any("fed again" in m for m in said), said
    assert not any(isinstance(e, Message) and e.host == "node2" and e.level == "warning"
                   for e in sink.events), said  # fmt: skip
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}
    assert wait_until(lambda: leftovers(lab, since) == [], 30), leftovers(lab, since)


def relay_host_killed_its_child_is_fed_from_another_host(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    # The stall bound is container.runtime_timeout: 10 s here.
    path = lab.cluster(
        lifetime="persistent", hosts=FOUR, image=tag, image_tar=str(tar), runtime_timeout=10
    )
    node2, node4 = (next(n for n in lab.sandbox.nodes if n.name == x) for x in ("node2", "node4"))
    assert node2.netns is not None
    # node2 feeds node4 (the tree: node1 -> node2, node3; node2 -> node4).
    # Once node4 has 1 MiB, node2 dies as a host does: no FIN reaches node4
    # (its packets to node4 dropped), and its spread's processes are gone.
    rule = ["OUTPUT", "-d", node4.address, "-j", "DROP"]
    ipt = ["ip", "netns", "exec", node2.netns, "iptables"]
    killed: list[int] = []
    # What node2's load had open when it was killed (podman's copy of the
    # stream): the test's own doing, as a dead host's disk would keep it.
    abandoned: set[Path] = set()

    class Killer(CollectingSink):
        def emit(self, event: object) -> None:
            super().emit(event)  # type: ignore[arg-type]
            if (isinstance(event, ImageProgress) and event.host == "node4"
                    and event.done > (1 << 20) and not killed):  # fmt: skip
                subprocess.run([*ipt, "-I", *rule], check=True)
                for pid in pids_in_netns(node2.netns or "", direct_fan):
                    abandoned.update(open_copies(pid))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    sink = Killer()
    start, since = time.monotonic(), time.time()
    try:
        ok = run_up(path, sink)
    finally:
        if killed:
            subprocess.run([*ipt, "-D", *rule], check=False)
    seconds = time.monotonic() - start
    try:
        assert killed, "node2's spread processes were not found"
        said = " ".join(str(e.text) for e in sink.events if isinstance(e, Message))
        assert ok, said
        assert "its feeder node2 stalled: no byte for 10s" in said, said
        assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
        assert seconds < 300, seconds  # bounded: the stall cut, not the start budget (900 s)
        # node4's load, cut when its feeder stalled, leaves no copy behind.
        spared = frozenset(abandoned)
        assert wait_until(lambda: leftovers(lab, since, spared) == [], 30), leftovers(
            lab, since, spared
        )
    finally:
        for copy in abandoned:
            copy.unlink(missing_ok=True)


def sigkill_of_cvs_mid_spread_leaves_nothing(lab: Lab, image_tar: tuple[str, Path, str]) -> None:
    """SIGKILL of cvs once a key line of its spread is in authorized_keys:
    no key, no file, no process, no partial image; the next `up` works."""
    tag, tar, image_id = image_tar
    path = lab.cluster(
        lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar), spread_transport="direct"
    )
    before_keys, since = keys_state(lab), time.time()
    proc = subprocess.Popen([*CVS, "-c", str(path), "up"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        # Mid-spread: a key line of this spread is in authorized_keys.
        assert wait_until(lambda: "cvs-spread-" in keys_state(lab)[2], timeout=180), "no key line"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    start = time.monotonic()
    gone = wait_until(
        lambda: keys_state(lab) == before_keys and not leftovers(lab, since), timeout=60
    )
    assert gone, (keys_state(lab), leftovers(lab, since))
    assert time.monotonic() - start < 60
    ids = image_ids(lab, THREE[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids  # nothing partial, nothing wrong
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}


def ctrl_c_mid_spread_exits_130_and_leaves_nothing(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar), spread_transport="direct"
    )
    before_keys, since = keys_state(lab), time.time()

    def key_line_is_in() -> None:  # mid-stream: the seed's save is running
        assert "cvs-spread-" in keys_state(lab)[2], "no key line"

    rc, err = up_signalled_mid_stream(path, signal.SIGINT, key_line_is_in)
    assert rc == 130, err
    # Cleanup by cvs itself (its leases' channels close): no wait for a bound.
    gone = wait_until(
        lambda: keys_state(lab) == before_keys and not leftovers(lab, since), timeout=30
    )
    assert gone, (keys_state(lab), leftovers(lab, since))
    ids = image_ids(lab, THREE[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}


# Hosts that cannot reach each other (a direct spread: the default transport).


def up_with_unreachable(
    lab: Lab,
    image_tar: tuple[str, Path, str],
    hosts: list[str],
    blocked: str,
    **container: str,
) -> subprocess.CompletedProcess[str]:
    """`cvs --json up` on `hosts` (node1 seeds and feeds node2 and node3;
    node2 feeds node4) while node1 cannot open a connection to `blocked`'s
    sshd; cvs still can."""
    tag, tar, image_id = image_tar
    path = lab.cluster(
        lifetime="persistent", hosts=hosts, image=tag, image_tar=str(tar), **container
    )
    node1, target = (next(n for n in lab.sandbox.nodes if n.name == x) for x in ("node1", blocked))
    assert node1.netns is not None
    rule = [
        "OUTPUT",
        "-d",
        target.address,
        "-p",
        "tcp",
        "--dport",
        str(target.port),
        "-j",
        "REJECT",
    ]
    ipt = ["ip", "netns", "exec", node1.netns, "iptables"]
    subprocess.run([*ipt, "-I", *rule], check=True)
    try:
        before_keys, since = keys_state(lab), time.time()
        up = cvs(path, "--json", "up")
    finally:
        subprocess.run([*ipt, "-D", *rule], check=True)
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, hosts, tag).values()) == {image_id}
    assert keys_state(lab) == before_keys
    assert leftovers(lab, since) == []
    return up


def auto_unreachable_host_is_named_and_loads_image_tar_itself(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    # distribute: auto (the default): "else registry" for a host its feeder cannot reach.
    up = up_with_unreachable(lab, image_tar, THREE, "node3")
    said = "not reachable from node1 (no sshd answer): loads image_tar itself"
    assert said in up.stdout, explain(up)
    assert "not reached host to host" not in up.stdout, explain(up)
    hosts = last_json(up)["hosts"]
    steps = hosts["node3"]["steps"]  # type: ignore[index]
    assert steps.get("load") == "ok" and "spread" not in steps, steps
    steps = hosts["node2"]["steps"]  # type: ignore[index]
    assert steps.get("spread") == "ok" and "load" not in steps, steps


def auto_unreachable_relay_host_loads_itself_its_child_is_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    up = up_with_unreachable(lab, image_tar, FOUR, "node2")
    said = "not reachable from node1 (no sshd answer): loads image_tar itself"
    assert said in up.stdout, explain(up)
    assert "its feeder node2 gets the image on its own" in up.stdout, explain(up)
    hosts = last_json(up)["hosts"]
    steps = hosts["node2"]["steps"]  # type: ignore[index]
    assert steps.get("load") == "ok" and "spread" not in steps, steps
    for host in ("node3", "node4"):  # node3 host to host, node4 through cvs
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps.get("spread") == "ok" and "load" not in steps, (host, steps)


def peers_unreachable_host_is_named_and_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    up = up_with_unreachable(lab, image_tar, THREE, "node3", distribute="peers")
    assert "node1 cannot reach it" in up.stdout, explain(up)
    assert "not reached host to host" in up.stdout, explain(up)
    steps = last_json(up)["hosts"]["node3"]["steps"]  # type: ignore[index]
    assert steps.get("spread") == "ok" and "load" not in steps, steps
