"""The direct hop of an image spread for real (containers/spread_direct.py,
`container.spread_transport: direct`): the bytes go feeder to receiver over
the hosts' own ssh with a key for this invocation only; cvs carries none of
them. The key's line in authorized_keys, the key files and the lease go on
every exit path; a host its feeder cannot reach loads the image itself
(distribute `auto`) or is fed through cvs (`peers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from clitools import CVS
from labtools import Lab, cvs, explain
from sandboxtools import cmdline, pids_in_netns, wait_until
from spreadtools import FOUR, THREE, image_ids, image_tar, lab, last_json

from orchestrator.api import Cluster
from orchestrator.containers import spread as spread_mod
from orchestrator.events import CollectingSink, ImageProgress, Message
from orchestrator.sandbox import Sandbox, network
from orchestrator.sandbox.users import DOCKER_USER

pytestmark = pytest.mark.sandbox
__all__ = ["image_tar", "lab"]  # fixtures, used by name

HOME = Path(os.path.expanduser(f"~{DOCKER_USER}"))
KEYS = HOME / ".ssh" / "authorized_keys"


def keys_state() -> tuple[bool, bool, str]:
    """(~/.ssh exists, authorized_keys exists, its text) of the login user."""
    ssh = HOME / ".ssh"
    return ssh.exists(), KEYS.exists(), KEYS.read_text() if KEYS.exists() else ""


def bridge_tx(sandbox: Sandbox) -> int:
    """Bytes this machine (cvs) sent onto the sandbox's bridge: host-to-host
    frames are forwarded between ports and never counted here."""
    path = Path(f"/sys/class/net/{network.bridge_name(sandbox.index)}/statistics/tx_bytes")
    return int(path.read_text())


def _direct(argv: list[str]) -> bool:
    """A lease, a fan (the seed's or a forced command's) or a fan's ssh."""
    return any(x == "cvs-spread_lease" or x.endswith("/fan.sh") or x == "cvs-spread" for x in argv)


def leftovers(lab: Lab) -> list[str]:
    """Lease shells, fans, their ssh, key directories: anything a direct spread leaves."""
    found = [str(p) for p in Path("/tmp").glob("cvs-spread.*")]
    for node in lab.sandbox.nodes:
        if node.netns is None:
            continue
        found += [
            f"{node.name}:{pid}:{' '.join(cmdline(pid, retry=False) or [])[:200]}"
            for pid in pids_in_netns(node.netns, _direct)
        ]
    return found


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
    before_keys = keys_state()
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
    assert keys_state() == before_keys
    assert leftovers(lab) == []


def run_up(path: Path, sink: CollectingSink) -> bool:
    async def main() -> bool:
        async with Cluster.open(path, sink=sink) as cluster:
            report = await cluster.up(check=False)
            return report.ok

    return anyio.run(main)


def test_direct_corrupted_bytes_on_one_hop_are_refused_and_fetched_again(
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
    assert run_up(path, sink), [str(e) for e in sink.events if isinstance(e, Message)]
    said = [str(e.text) for e in sink.events if isinstance(e, Message) and e.host == "node3"]
    assert any("refused" in m or "not present after the load" in m for m in said), said
    assert any("fed again" in m for m in said), said
    assert not any(isinstance(e, Message) and e.host == "node2" and e.level == "warning"
                   for e in sink.events), said  # fmt: skip
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}
    assert leftovers(lab) == []


def test_direct_relay_host_killed_mid_spread_its_child_is_fed_from_another_host(
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

    class Killer(CollectingSink):
        def emit(self, event: object) -> None:
            super().emit(event)  # type: ignore[arg-type]
            if (isinstance(event, ImageProgress) and event.host == "node4"
                    and event.done > (1 << 20) and not killed):  # fmt: skip
                subprocess.run([*ipt, "-I", *rule], check=True)
                for pid in pids_in_netns(node2.netns or "", _direct_fan):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    sink = Killer()
    start = time.monotonic()
    try:
        ok = run_up(path, sink)
    finally:
        if killed:
            subprocess.run([*ipt, "-D", *rule], check=False)
    seconds = time.monotonic() - start
    assert killed, "node2's spread processes were not found"
    said = " ".join(str(e.text) for e in sink.events if isinstance(e, Message))
    assert ok, said
    assert "its feeder node2 stalled: no byte for 10s" in said, said
    assert set(image_ids(lab, FOUR, tag).values()) == {image_id}
    assert seconds < 300, seconds  # bounded: the stall cut, not the start budget (900 s)
    assert wait_until(lambda: leftovers(lab) == [], 30), leftovers(lab)


def _direct_fan(argv: list[str]) -> bool:
    """A receiver's part of a direct spread: its fan, tee, load and ssh on."""
    return (
        any(x.endswith("/fan.sh") or x == "cvs-spread" for x in argv)
        or argv[:1] == ["tee"]
        or (argv[-1:] == ["load"])
    )


def _up_with_unreachable(
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
        before_keys = keys_state()
        up = cvs(path, "--json", "up")
    finally:
        subprocess.run([*ipt, "-D", *rule], check=True)
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, hosts, tag).values()) == {image_id}
    assert keys_state() == before_keys
    assert leftovers(lab) == []
    return up


def test_direct_spread_auto_unreachable_host_is_named_and_loads_image_tar_itself(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    # distribute: auto (the default): "else registry" for a host its feeder cannot reach.
    up = _up_with_unreachable(lab, image_tar, THREE, "node3")
    said = "not reachable from node1 (no sshd answer): loads image_tar itself"
    assert said in up.stdout, explain(up)
    assert "not reached host to host" not in up.stdout, explain(up)
    hosts = last_json(up)["hosts"]
    steps = hosts["node3"]["steps"]  # type: ignore[index]
    assert steps.get("load") == "ok" and "spread" not in steps, steps
    steps = hosts["node2"]["steps"]  # type: ignore[index]
    assert steps.get("spread") == "ok" and "load" not in steps, steps


def test_direct_spread_auto_unreachable_relay_host_loads_itself_its_child_is_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    up = _up_with_unreachable(lab, image_tar, FOUR, "node2")
    said = "not reachable from node1 (no sshd answer): loads image_tar itself"
    assert said in up.stdout, explain(up)
    assert "its feeder node2 gets the image on its own" in up.stdout, explain(up)
    hosts = last_json(up)["hosts"]
    steps = hosts["node2"]["steps"]  # type: ignore[index]
    assert steps.get("load") == "ok" and "spread" not in steps, steps
    for host in ("node3", "node4"):  # node3 host to host, node4 through cvs
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps.get("spread") == "ok" and "load" not in steps, (host, steps)


def test_direct_spread_peers_unreachable_host_is_named_and_fed_through_cvs(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    up = _up_with_unreachable(lab, image_tar, THREE, "node3", distribute="peers")
    assert "node1 cannot reach it" in up.stdout, explain(up)
    assert "not reached host to host" in up.stdout, explain(up)
    steps = last_json(up)["hosts"]["node3"]["steps"]  # type: ignore[index]
    assert steps.get("spread") == "ok" and "load" not in steps, steps


def test_direct_spread_sigkill_of_cvs_leaves_no_key_no_file_no_process(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, _ = image_tar
    path = lab.cluster(
        lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar), spread_transport="direct"
    )
    before_keys = keys_state()
    proc = subprocess.Popen([*CVS, "-c", str(path), "up"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        # Mid-spread: a key line of this spread is in authorized_keys.
        assert wait_until(lambda: "cvs-spread-" in keys_state()[2], timeout=180), "no key line"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    start = time.monotonic()
    gone = wait_until(lambda: keys_state() == before_keys and not leftovers(lab), timeout=60)
    assert gone, (keys_state(), leftovers(lab))
    assert time.monotonic() - start < 60
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)


def test_direct_spread_ctrl_c_exits_130_and_removes_keys_files_and_processes(
    lab: Lab, image_tar: tuple[str, Path, str]
) -> None:
    tag, tar, image_id = image_tar
    path = lab.cluster(
        lifetime="persistent", hosts=THREE, image=tag, image_tar=str(tar), spread_transport="direct"
    )
    before_keys = keys_state()
    proc = subprocess.Popen([*CVS, "-c", str(path), "up"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CI": "1"})  # fmt: skip
    try:
        assert wait_until(lambda: "cvs-spread-" in keys_state()[2], timeout=180), "no key line"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    # Cleanup by cvs itself (its leases' channels close): no wait for a bound.
    assert wait_until(lambda: keys_state() == before_keys and not leftovers(lab), timeout=30), (
        keys_state(),
        leftovers(lab),
    )
    ids = image_ids(lab, THREE[1:], tag)
    assert all(i in ("", image_id) for i in ids.values()), ids
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert set(image_ids(lab, THREE, tag).values()) == {image_id}
