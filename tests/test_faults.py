"""Issue 22 on a real sandbox: the faults real clusters have, made for real.

One 3-host sandbox for the module. Each test makes one fault on one host (a
memory cap a step outgrows, a container stopped under a step, a dockerd
stopped or frozen with SIGSTOP, a full filesystem under dockerd's data root,
a registry that accepts and never answers, a host's packets dropped) and
undoes it in a `finally`, also when the test fails: SIGCONT, dockerd started
again, umount, iptables -D, the stalling server closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import CVS, last_json
from clitools import cvs as run_cvs
from conftest import _built
from labtools import Lab, docker, explain
from sandboxtools import silent_server

from orchestrator.sandbox import Sandbox
from orchestrator.sandbox.network import gateway_address

NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with _built(tmp_path_factory.mktemp("faults") / "sb", hosts=3) as sb:
        yield sb


def cvs_sub(
    cluster: Path, *args: str, timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`cvs SUBCOMMAND -c cluster ...`: the cluster file after the subcommand, as users write it."""
    return run_cvs(*args[:1], "-c", str(cluster), *args[1:], timeout=timeout, cwd=cwd)


@pytest.fixture
def lab(faulty: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(
        faulty,
        tmp_path,
        prefix="cvs-fault",
        base={"sshd": {"enabled": False}, "runtime_timeout": 5},
    )
    try:
        yield lab
    finally:
        for node in faulty.nodes:  # whatever a test stopped comes back
            faulty.start_dockerd(node)
        lab.clean()
        lab.clean_locks()


def write_suite(directory: Path, name: str, steps: list[dict[str, Any]]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "steps": steps}))
    return path


def wait_for(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# --- points 4 and 5: causes, not just codes -----------------------------------------

# A shell that holds 200 MB in a variable: far past a 64 MiB cap (no swap here).
GREEDY = "a=$(head -c 200000000 /dev/zero | tr '\\0' x); echo ${#a}"


def test_a_step_killed_by_the_oom_killer_says_out_of_memory_in_exec_and_the_run_record(
    lab: Lab,
) -> None:
    cluster = lab.container_file(resources={"memory": "64Mi"})
    assert cvs_sub(cluster, "up").returncode == 0
    proc = cvs_sub(cluster, "exec", "--hosts", "node2", "--json", "--", GREEDY)
    assert proc.returncode == 1, explain(proc)
    result = last_json(proc)["hosts"]["node2"]
    assert result["exit_code"] == 137, result
    assert "out-of-memory killer" in result["error"], result
    plain = cvs_sub(cluster, "exec", "--hosts", "node2", "--", GREEDY)
    assert "out-of-memory killer" in plain.stderr, explain(plain)

    suite = write_suite(lab.directory, "greedy", [{"name": "alloc", "run": GREEDY}])
    run_dir = lab.directory / "run"
    run = cvs_sub(cluster, "run", str(suite), "--run-dir", str(run_dir), cwd=lab.directory)
    assert run.returncode == 1, explain(run)
    assert "alloc on node1: failed: exit 137, expected 0: killed by the out-of-memory" in (
        run.stdout + run.stderr
    ), explain(run)
    doc = json.loads((run_dir / "results.json").read_text())
    reasons = {h: r["reason"] for h, r in doc["steps"][0]["hosts"].items()}
    assert all("out-of-memory killer" in reasons[h] for h in NODES), reasons
    junit = ET.parse(run_dir / "junit.xml").getroot()
    messages = [f.get("message") or "" for f in junit.iter("failure")]
    assert len(messages) == 3 and all("out-of-memory killer" in m for m in messages), messages


# A step that runs until the test wakes it (`wake`), or 120 s at most.
NAP_UNTIL_WOKEN = (
    "i=0; until [ -e /tmp/cvs-wake ] || [ $i -ge 600 ]; do sleep 0.2; i=$((i+1)); done"
)


def wake(lab: Lab, hosts: list[str]) -> None:
    """End `NAP_UNTIL_WOKEN` in our container on `hosts` (exit 0 there)."""
    for host in hosts:
        docker(lab.sb, host, "exec", lab.name, "touch", "/tmp/cvs-wake")


def test_a_container_stopped_under_a_step_is_named_in_the_run_record(lab: Lab) -> None:
    cluster = lab.container_file()
    assert cvs_sub(cluster, "up").returncode == 0
    # The step waits for a file the test makes once node3's container is stopped
    # (a fixed `sleep 60` made the test a minute long for nothing).
    suite = write_suite(lab.directory, "long", [{"name": "nap", "run": NAP_UNTIL_WOKEN}])
    run_dir = lab.directory / "run"
    proc = subprocess.Popen(
        [*CVS, "run", "-c", str(cluster), str(suite), "--run-dir", str(run_dir)],
        cwd=lab.directory,
        env={**os.environ, "CI": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        events = run_dir / "events.jsonl"
        wait_for(
            lambda: (
                '"step": "nap", "status": "started"'
                in (events.read_text() if events.exists() else "")
            ),
            120,
            "the step to start",
        )
        time.sleep(2)
        docker(lab.sb, "node3", "stop", "-t", "1", lab.name)
        wake(lab, ["node1", "node2"])
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    doc = json.loads((run_dir / "results.json").read_text())
    results = doc["steps"][0]["hosts"]
    assert results["node3"]["status"] == "failed", results
    assert "the container stopped while the command ran" in results["node3"]["reason"], results
    assert "the container stopped while the command ran" in out + err
    assert results["node1"]["status"] == results["node2"]["status"] == "ok", results


def test_the_runtime_going_away_under_exec_is_named_and_the_others_finish(lab: Lab) -> None:
    cluster = lab.container_file()
    assert cvs_sub(cluster, "up").returncode == 0
    proc = subprocess.Popen(
        [*CVS, "exec", "-c", str(cluster), "--json", "--", "sleep 15"],
        env={**os.environ, "CI": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(5)
        lab.sb.stop_dockerd("node2")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lab.sb.start_dockerd("node2")
    assert proc.returncode == 1, out + err
    hosts = last_json(out)["hosts"]
    assert hosts["node1"]["ok"] and hosts["node3"]["ok"], hosts
    error = hosts["node2"]["error"]
    assert "container runtime went away" in error or "container stopped" in error, error


# --- point 6: a report never says ok for what no longer exists ----------------------


@contextlib.contextmanager
def full_filesystem_under(path: Path, work: Path) -> Iterator[None]:
    """A small ext4, filled, mounted over `path` (never `/`): what `docker run`
    writes there fails with ENOSPC. Unmounted and removed afterwards."""
    image = work / "full.img"
    subprocess.run(["truncate", "-s", "4M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True)
    try:
        for block in ("64k", "1k"):  # to the last block
            filler = path / f"filler-{block}"
            subprocess.run(
                ["dd", "if=/dev/zero", f"of={filler}", f"bs={block}"],
                capture_output=True,
                check=False,
            )
        os.sync()
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        image.unlink(missing_ok=True)


def test_a_full_disk_on_one_host_rolls_back_and_no_host_is_reported_ready(lab: Lab) -> None:
    cluster = lab.container_file()
    node2 = lab.sb.host("node2")
    # Where `docker run` writes a new container's files on node2.
    with full_filesystem_under(node2.data_root / "containers", lab.directory):
        proc = cvs_sub(cluster, "up")
        as_json = cvs_sub(cluster, "up", "--json")
    assert proc.returncode == 1, explain(proc)
    err = proc.stdout + proc.stderr  # results on stdout, progress on stderr
    assert "no space left on device" in err.lower(), err
    # The two hosts rolled back for the same reason: one folded line names both.
    assert "node[1,3] (2): cold_start ROLLED BACK: the cold start failed on node2" in err, err
    for host in ("node1", "node3"):
        assert f"{host}: cold_start ok" not in err, err
    assert "up: 0/3 hosts ready" in err, err
    doc = last_json(as_json)
    assert doc["ok"] is False and doc["error"], doc
    assert doc["ready"] == 0
    for host in ("node1", "node3"):
        assert doc["hosts"][host]["ok"] is False, doc
        assert "node2" in doc["hosts"][host]["rolled_back"], doc
    for host in NODES:
        assert docker(lab.sb, host, "ps", "-aq", "--filter", f"name=^{lab.name}$") == ""


# --- point 2: a frozen container runtime --------------------------------------------


@contextlib.contextmanager
def frozen_dockerd(sb: Sandbox, host: str) -> Iterator[None]:
    pid = sb.host(host).dockerd_pid
    assert pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def timed(cluster: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = cvs_sub(cluster, *args, timeout=120)
    return proc, time.monotonic() - start


BOUND = "docker did not answer within container.runtime_timeout (5s)"


def test_a_frozen_dockerd_bounds_status_exec_up_and_down_naming_the_host(lab: Lab) -> None:
    cluster = lab.container_file()
    assert cvs_sub(cluster, "up").returncode == 0
    # Generous against this shared 2-core machine; the bound itself is 5 s.
    limit = 5 + 20
    with frozen_dockerd(lab.sb, "node2"):
        status, t_status = timed(cluster, "status")
        execd, t_exec = timed(cluster, "exec", "--json", "--", "hostname")
        up, t_up = timed(cluster, "up")
        down, t_down = timed(cluster, "down", "--force")
        lock_left = lab.lock_dir("node2").exists()
    print(
        f"frozen dockerd: status {t_status:.1f}s exec {t_exec:.1f}s up {t_up:.1f}s "
        f"down --force {t_down:.1f}s"
    )
    assert status.returncode == 1 and t_status < limit, explain(status)
    assert "node2" in status.stderr and BOUND in status.stderr, explain(status)
    assert execd.returncode == 1 and t_exec < limit, explain(execd)
    hosts = last_json(execd)["hosts"]
    assert hosts["node1"]["ok"] and hosts["node3"]["ok"], hosts
    assert BOUND in hosts["node2"]["error"], hosts
    assert up.returncode == 4 and t_up < limit, explain(up)
    assert "node2" in up.stderr and BOUND in up.stderr, explain(up)
    assert down.returncode == 3 or down.returncode == 1, explain(down)
    assert t_down < limit and "node2" in down.stderr, explain(down)
    assert docker(lab.sb, "node1", "ps", "-aq", "--filter", f"name=^{lab.name}$") == ""
    assert not lock_left, "a lock directory stayed behind on node2 while dockerd was frozen"


def test_a_killed_up_on_a_frozen_dockerd_leaves_no_lock_directory(lab: Lab) -> None:
    cluster = lab.container_file()
    with frozen_dockerd(lab.sb, "node2"):
        proc = subprocess.Popen(
            [*CVS, "up", "-c", str(cluster)],
            env={**os.environ, "CI": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: lab.lock_dir("node2").exists(), 60, "node2's lock")
            time.sleep(1)
        finally:
            proc.kill()
            proc.wait()
    # Once the daemon answers again, nothing of the dead invocation is left.
    wait_for(lambda: not lab.lock_dir("node2").exists(), 30, "node2's lock directory to go")


# --- point 3: start_timeout covers login, pull and load together -------------------


def test_a_registry_that_stalls_is_bounded_by_start_timeout_with_the_error_set(
    lab: Lab,
) -> None:
    # Where the hosts' login user can read it (pytest's tmp dirs are 0700).
    password = Path(f"/tmp/{lab.name}-registry-pass")
    password.write_text("secret\n")
    password.chmod(0o644)
    gateway = gateway_address(lab.sb.index)
    with contextlib.ExitStack() as stack:
        stack.callback(password.unlink, missing_ok=True)
        port = stack.enter_context(silent_server(gateway))
        cluster = lab.container_file(
            image=f"{gateway}:{port}/cvs/stalled:1",
            start_timeout=8,
            registry={"username": "bot", "password_file": str(password)},
        )
        start = time.monotonic()
        proc = cvs_sub(cluster, "up", "--json", timeout=120)
        took = time.monotonic() - start
    print(f"stalled registry: up took {took:.1f}s with start_timeout 8")
    assert proc.returncode == 1, explain(proc)
    doc = last_json(proc)
    assert doc["error"] and "start_timeout (8s, for login and pull together)" in doc["error"], doc
    assert took < 8 + 15, took


# --- point 1: a lock never outlives its invocation by more than its lease ----------


@contextlib.contextmanager
def silent_network(sb: Sandbox, host: str) -> Iterator[None]:
    """The host's SSH packets dropped in its namespace (no RST, no FIN: a hung
    switch port). The rules are removed afterwards, also on failure."""
    h = sb.host(host)
    assert h.netns
    rules = [
        ["INPUT", "-p", "tcp", "--dport", str(h.port), "-j", "DROP"],
        ["OUTPUT", "-p", "tcp", "--sport", str(h.port), "-j", "DROP"],
    ]
    added: list[list[str]] = []
    try:
        for rule in rules:
            subprocess.run(["ip", "netns", "exec", h.netns, "iptables", "-A", *rule], check=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run(["ip", "netns", "exec", h.netns, "iptables", "-D", *rule], check=False)


def lock_free(path: Path) -> bool:
    """Nobody holds the lock (its directory is gone, or flock -xn gets it)."""
    if not path.exists():
        return True
    probe = subprocess.run(["flock", "-xn", str(path), "true"], capture_output=True, check=False)
    return probe.returncode == 0


def test_a_lock_held_over_a_silent_network_is_freed_within_its_lease(lab: Lab) -> None:
    from orchestrator.containers.locks import LEASE_SECONDS, RENEW_SECONDS

    cluster = lab.container_file()
    assert cvs_sub(cluster, "up").returncode == 0
    proc = subprocess.Popen(
        [*CVS, "exec", "-c", str(cluster), "--", "sleep 60"],
        env={**os.environ, "CI": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lock = lab.lock_dir("node2")
    try:
        wait_for(lambda: not lock_free(lock), 60, "the exec's lock on node2")
        time.sleep(2)
        with silent_network(lab.sb, "node2"):
            dropped = time.monotonic()
            wait_for(lambda: lock_free(lock), LEASE_SECONDS + RENEW_SECONDS + 30, "the lease")
            freed = time.monotonic() - dropped
            print(f"silent network: node2's lock freed {freed:.1f}s after the drop")
            # Ours gives up too, the invocation long dead on our side:
            proc.kill()
            proc.wait()
        # Within the lease of the last renewal, which came before the drop
        # (plus the poll's and a loaded machine's slack).
        assert freed <= LEASE_SECONDS + 3, freed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The network is back and the dead invocation's holders are gone: both a
    # --no-wait and a waiting invocation see the lock free on every host.
    wait_for(lambda: all(lock_free(lab.lock_dir(h)) for h in NODES), 30, "the other locks")
    down = cvs_sub(cluster, "down", "--force", "--no-wait")
    assert down.returncode == 0, explain(down)
    assert not lock.exists()


# --- point 8: an interrupted provisioning does not run twice at once ---------------

# Says `overlap` when it starts while an earlier run of itself still runs.
SLOW_SETUP = """#!/bin/sh
old=$(cat /var/tmp/cvs-setup.pid 2>/dev/null)
if [ -n "$old" ] && kill -0 "$old" 2>/dev/null; then echo overlap >> /var/tmp/cvs-setup.log; fi
echo $$ > /var/tmp/cvs-setup.pid
echo "start $$" >> /var/tmp/cvs-setup.log
sleep 12
echo "end $$" >> /var/tmp/cvs-setup.log
"""


def test_an_up_after_one_killed_mid_provisioning_stops_the_old_setup_script_first(
    lab: Lab,
) -> None:
    script = lab.directory / "setup.sh"
    script.write_text(SLOW_SETUP)
    cluster = lab.container_file(setup_script=str(script))
    proc = subprocess.Popen(
        [*CVS, "up", "-c", str(cluster)],
        env={**os.environ, "CI": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        started: set[str] = set()
        deadline = time.monotonic() + 120
        while len(started) < 3 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if "provision: started" in line:
                started.add(line.split()[0])
        assert started == set(NODES), started
        time.sleep(3)
    finally:
        proc.kill()
        proc.wait()
    again = cvs_sub(cluster, "up")
    assert again.returncode == 0, explain(again)
    assert "stopped a setup script still running from an interrupted" in again.stderr, explain(
        again
    )
    for host in NODES:
        log = docker(lab.sb, host, "exec", lab.name, "cat", "/var/tmp/cvs-setup.log")
        events = log.split("\n")
        # The killed run's script was stopped before the new one started (it
        # never ended on its own), and the new one ran to its end.
        assert "overlap" not in events, (host, events)
        assert [e.split()[0] for e in events] == ["start", "start", "end"], (host, events)
