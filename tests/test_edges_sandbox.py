"""Issue 30 on a real sandbox: honest at the edges.

One 3-host sandbox for the module (real OpenSSH, one dockerd per host). Each
test uses a container name of its own and removes it afterwards, also on
failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from clitools import CVS, cvs_on, explain, last_json
from conftest import _built
from labtools import Lab, docker
from sandboxtools import silent_server

from orchestrator.sandbox import Sandbox
from orchestrator.sandbox.network import gateway_address

NODES = ["node1", "node2", "node3"]
# `edges` builds a sandbox: every test here is a sandbox test (`-m "not sandbox"` skips them).
pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with _built(tmp_path_factory.mktemp("edges") / "sb", hosts=3) as sb:
        yield sb


@pytest.fixture
def lab(edges: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(edges, tmp_path, prefix="cvs-edge", base={"docker_timeout": 10})
    try:
        yield lab
    finally:
        lab.clean()
        lab.clean_locks()


# --- finding 1: causes only from evidence ------------------------------------------


def exec_error(cluster: Path, command: str) -> str:
    proc = cvs_on(cluster, "exec", "--hosts", "node1", "--json", "--", command)
    assert proc.returncode == 1, explain(proc)
    error = last_json(proc)["hosts"]["node1"]["error"]
    assert isinstance(error, str)
    return error


def test_exit_255_a_kill_and_a_real_restart_get_three_different_true_answers(lab: Lab) -> None:
    cluster = lab.container_file(sshd={"enabled": False})
    assert cvs_on(cluster, "up").returncode == 0
    # At once after the start: the container started a moment before each command.
    plain = exec_error(cluster, "exit 255")
    killed = exec_error(cluster, "kill -9 $$")

    def restart() -> None:
        # Once the command runs in the container (its pidfile is there), not
        # after a guessed delay: a loaded machine starts the CLI late.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = docker(
                lab.sb, "node1", "exec", lab.name, "sh", "-c", "ls /tmp/.cvs-exec-*.pid || true"
            )
            if ".pid" in found:
                break
            time.sleep(0.3)
        time.sleep(1)
        docker(lab.sb, "node1", "restart", "-t", "1", lab.name)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        restarted = exec_error(cluster, "sleep 30")
    finally:
        thread.join()
    assert plain == "exit code 255", plain
    assert killed == (
        "exit code 137: what a shell reports for a process killed by signal 9 (SIGKILL); "
        "the container kept running (not restarted, not stopped)"
    ), killed
    assert restarted.startswith(
        "exit code 137: the container restarted while the command ran (docker started it again"
    ), restarted
    # The diagnosis removed the pidfile the killed command left behind.
    left = docker(lab.sb, "node1", "exec", lab.name, "sh", "-c", "ls /tmp/.cvs-exec-* || true")
    assert ".pid" not in left, left


# --- finding 9: nothing left running on a host after a bounded step gives up ---------


def processes_naming(text: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if text in line and "ps -eo" not in line]


def test_a_login_that_stalls_leaves_no_runtime_login_running_on_any_host(lab: Lab) -> None:
    password = Path(f"/tmp/{lab.name}-registry-pass")  # readable by the hosts' login user
    password.write_text("secret\n")
    password.chmod(0o644)
    gateway = gateway_address(lab.sb.index)
    with contextlib.ExitStack() as stack:
        stack.callback(password.unlink, missing_ok=True)
        port = stack.enter_context(silent_server(gateway))
        cluster = lab.container_file(
            image=f"{gateway}:{port}/cvs/stalled:1",
            start_timeout=5,
            sshd={"enabled": False},
            registry={"username": "bot", "password_file": str(password)},
        )
        proc = cvs_on(cluster, "up", "--json")
        assert proc.returncode == 1, explain(proc)
        assert "login did not finish within container.start_timeout" in proc.stdout, explain(proc)
        # The hosts share this machine's process table: each host's login ran here.
        time.sleep(1)  # what a KILL left is reaped by then
        left = processes_naming(f"login --username bot --password-stdin {gateway}:{port}")
    assert left == [], left


# --- finding 2: --hosts never makes a partial persistent set -------------------------


def test_hosts_never_starts_a_missing_member_alone_unless_healing_and_it_ends_like_the_others(
    lab: Lab,
) -> None:
    cluster = lab.container_file(start_timeout=120)
    assert cvs_on(cluster, "up").returncode == 0
    docker(lab.sb, "node3", "rm", "-f", lab.name)
    plan = cvs_on(cluster, "plan", "--hosts", "node3")
    up = cvs_on(cluster, "up", "--hosts", "node3")
    assert plan.returncode == up.returncode == 4, explain(plan) + explain(up)
    for proc in (plan, up):
        assert "not present and resumable on every host" in proc.stderr, explain(proc)
        assert "rerun with --force" not in proc.stderr, explain(proc)
        assert "rerun with --heal" in proc.stderr, explain(proc)
    assert "(`cvs up --force`)" in up.stderr, explain(up)
    assert docker(lab.sb, "node3", "ps", "-aq", "--filter", f"name=^/{lab.name}$") == ""

    # Said explicitly, --heal starts it there alone, like the others: provisioned,
    # sshd listening, its peers reach it.
    healed = cvs_on(cluster, "up", "--hosts", "node3", "--heal")
    assert healed.returncode == 0, explain(healed)
    assert "node3: cold_start ok (run, provision, sshd, verify)" in healed.stdout, explain(healed)
    rows = last_json(cvs_on(cluster, "status", "--json"))["hosts"]
    assert all(rows[h]["sshd"] == "listening" for h in NODES), rows
    assert all(rows[h]["provisioned"] == "yes" for h in NODES), rows
    ssh = cvs_on(cluster, "exec", "--hosts", "node1", "--", "ssh", "node3", "hostname")
    assert ssh.returncode == 0, explain(ssh)

    # A member stopped (a reboot) is resumed on the chosen host alone, like the others.
    docker(lab.sb, "node3", "stop", "-t", "1", lab.name)
    healed = cvs_on(cluster, "up", "--hosts", "node3")
    assert healed.returncode == 0, explain(healed)
    assert "up: 1/1 hosts ready" in healed.stdout, explain(healed)
    rows = last_json(cvs_on(cluster, "status", "--json"))["hosts"]
    assert all(rows[h]["sshd"] == "listening" for h in NODES), rows
    # Peers reach it: node1's container logs in to node3's sshd with the cluster's key.
    ssh = cvs_on(cluster, "exec", "--hosts", "node1", "--", "ssh", "node3", "hostname")
    assert ssh.returncode == 0, explain(ssh)

    down = cvs_on(cluster, "down", "--force", "--hosts", "node3")
    assert down.returncode == 0, explain(down)
    assert "nothing left anywhere" not in down.stdout, explain(down)
    assert "down: removed on 1 of the 1 chosen host(s)" in down.stdout, explain(down)
    assert "not looked at (outside --hosts): node[1-2]" in down.stdout, explain(down)


# --- finding 3: two overlapping --hosts invocations never wait on each other ---------


def test_two_overlapping_hosts_subsets_changing_containers_both_finish(lab: Lab) -> None:
    cluster = lab.container_file(sshd={"enabled": False}, start_timeout=90)
    assert cvs_on(cluster, "up").returncode == 0
    procs = [
        subprocess.Popen(
            [*CVS, "up", "-c", str(cluster), "--reprovision", *extra],
            env={**os.environ, "CI": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for extra in ([], ["--hosts", "node2,node3"], ["--hosts", "node3,node1"])
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    codes = [p.returncode for p in procs]
    # A deadlock would end in a lock timeout (exit 4, "still held after waiting 90s").
    assert codes == [0, 0, 0], "\n".join(o + e for o, e in outs)


# --- finding 6: an image that does not exist is named -------------------------------


def test_up_names_an_image_the_registry_does_not_have_as_not_found(lab: Lab) -> None:
    with lab.sb.registry() as reg:
        image = reg.ref("cvs/no-such-image", "1")
        cluster = lab.container_file(
            image=image,
            sshd={"enabled": False},
            registry={"username": reg.username, "password_file": str(reg.password_file)},
        )
        plan = cvs_on(cluster, "plan")
        up = cvs_on(cluster, "up")
    assert plan.returncode == 0, explain(plan)
    assert f"image {image} is on none of node1, node2, node3: up pulls it from" in plan.stderr
    assert up.returncode == 1, explain(up)
    # The image spread (container.distribute: auto): node1 alone asks the
    # registry; the others were to get it from node1, and say so.
    summary = [line for line in up.stdout.splitlines() if "cold_start" in line]
    assert sorted(summary) == [
        f"node1: cold_start FAILED at pull: image {image} not found: {reg.address} has "
        f"no such image or tag (manifest for {image} not found: manifest unknown: manifest "
        "unknown)",
        "node[2-3] (2): cold_start NOT STARTED: the cold start failed on node1",
    ], explain(up)


# --- finding 11: cvs shell on a container that is not there -------------------------


def test_shell_on_an_absent_container_says_so_and_exits_1(lab: Lab) -> None:
    cluster = lab.container_file()
    proc = cvs_on(cluster, "shell", "node2", input="")
    assert proc.returncode == 1, explain(proc)
    assert proc.stderr.strip() == (
        f"cvs: container {lab.name} is not running on node2 (run `cvs up`)"
    ), explain(proc)


# --- finding 8: the CLI's words in `cvs run`'s console and results.json -------------


def test_a_step_whose_container_stopped_tells_cvs_up_in_the_console_and_results(
    lab: Lab,
) -> None:
    cluster = lab.container_file(sshd={"enabled": False})
    assert cvs_on(cluster, "up").returncode == 0
    suite = lab.directory / "nap.yaml"
    # The step runs until node3's container is stopped and the test wakes the
    # others (a fixed `sleep 60` made the test a minute long for nothing), 120 s at most.
    nap = "i=0; until [ -e /tmp/cvs-wake ] || [ $i -ge 600 ]; do sleep 0.2; i=$((i+1)); done"
    suite.write_text(yaml.safe_dump({"name": "nap", "steps": [{"name": "nap", "run": nap}]}))
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
        deadline = time.monotonic() + 120
        while '"step": "nap", "status": "started"' not in (
            events.read_text() if events.exists() else ""
        ):
            assert proc.poll() is None, "cvs run ended before the step started: " + "".join(
                proc.communicate()
            )
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.2)
        time.sleep(2)
        docker(lab.sb, "node3", "stop", "-t", "1", lab.name)
        for host in ("node1", "node2"):
            docker(lab.sb, host, "exec", lab.name, "touch", "/tmp/cvs-wake")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    reason = json.loads((run_dir / "results.json").read_text())["steps"][0]["hosts"]["node3"][
        "reason"
    ]
    for text in (reason, out):
        assert "`cvs up` starts it again" in text, text
        assert "up()" not in text, text
