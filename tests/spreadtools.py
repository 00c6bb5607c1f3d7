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
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import yaml
from clitools import CVS
from labtools import Lab, cvs, docker, explain
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
# under sudo): a load TERMed or killed leaves the copy there.
PODMAN_TEMP = Path("/var/tmp")


def podman_copies(since: float) -> set[Path]:
    """podman's stdin copies written since `since` (time.time())."""
    found = set()
    for p in PODMAN_TEMP.glob("podman*"):
        with contextlib.suppress(FileNotFoundError):
            if p.is_file() and p.stat().st_mtime >= since:
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
        found += [str(p) for p in sorted(podman_copies(since) - spared)]
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
    proc = subprocess.Popen([*CVS, "-c", str(path), "up"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CI": "1"})  # fmt: skip
    try:
        assert wait_until(lambda: "cvs-spread-" in keys_state(lab)[2], timeout=180), "no key line"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
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
