"""Issues 9, 14 and 10: locks by intent and exact ownership, on the real sandbox.

Concurrency is tested with real `cvs` processes (python -m orchestrator),
against real sshd and dockerd; nothing is mocked. Two hosts keep it quick.
"""

from __future__ import annotations

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
from labtools import Lab, cvs, explain, inspect, wait_for_holders

from orchestrator.api import Cluster
from orchestrator.containers.labels import LABEL_INVOCATION, LABEL_LIFETIME
from orchestrator.containers.rollback import roll_back
from orchestrator.sandbox import Sandbox

TWO = ["node1", "node2"]


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


def start(path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CI": "1"}
    return subprocess.Popen(
        [*CVS, "-c", str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def lock_dirs(name: str) -> list[Path]:
    return sorted(Path("/tmp").glob(f"cvs-{name}-*.lock"))


def suite(directory: Path, name: str, run: str) -> Path:
    path = directory / f"{name}.yaml"
    doc = {"name": name, "steps": [{"name": "work", "run": run, "timeout": 60}]}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_lock_directories_are_gone_once_no_one_holds_them(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert lock_dirs(lab.name) == []
    down = cvs(path, "down", "--force")
    assert down.returncode == 0, explain(down)
    assert lock_dirs(lab.name) == []


def test_runs_share_persistent_containers_and_a_replacement_waits_naming_them(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    assert cvs(path, "up").returncode == 0
    stamp = "date +%s.%N; sleep 8; date +%s.%N"
    execs = [start(path, "exec", "--", stamp) for _ in range(2)]
    wait_for_holders(lab.name, TWO, count=2)

    waiting = start(path, "down", "--force")
    refused = cvs(path, "down", "--force", "--no-wait")
    results = [finish(p) for p in execs]
    rc, out, err = finish(waiting)
    err = out + err  # cvs's own messages, wherever the sink puts them

    # Both execs ran to the end (nothing removed their containers) and overlapped.
    assert [r[0] for r in results] == [0, 0], results
    spans = [[float(x) for x in r[1].split() if x[:1].isdigit()] for r in results]
    assert spans[0][0] < spans[1][-1] and spans[1][0] < spans[0][-1], spans
    assert refused.returncode == 4, explain(refused)
    assert "held" in refused.stderr and "exec" in refused.stderr
    assert rc == 0, err
    assert "waiting for the lock" in err and "exec" in err, err
    assert all(inspect(sandbox, h, lab.name) is None for h in TWO)


@pytest.mark.parametrize("second_starts", ["during_the_first_up", "during_the_first_steps"])
def test_two_per_run_runs_of_one_cluster_take_turns(
    lab: Lab, tmp_path: Path, second_starts: str
) -> None:
    path = lab.cluster(lifetime="per_run", hosts=TWO)
    # Each run marks its container and checks, after a while, that the mark is
    # still its own: a shared or replaced container fails the step (or kills it).
    check = 'echo "$0" > /tmp/owner; sleep 5; [ "$(cat /tmp/owner)" = "$0" ]'
    first = suite(tmp_path, "first", f"sh -c '{check}' first")
    second = suite(tmp_path, "second", f"sh -c '{check}' second")

    a = start(path, "run", str(first), "--run-dir", str(tmp_path / "a"))
    wait_for_holders(lab.name, TWO)  # the first run's up holds the locks
    if second_starts == "during_the_first_steps":
        marked = [*lab.sandbox.docker_argv("node1"), "exec", lab.name, "test", "-f", "/tmp/owner"]
        deadline = time.monotonic() + 90
        while subprocess.run(marked, capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the first run's step never started"
            time.sleep(0.3)
    b = start(path, "run", str(second), "--run-dir", str(tmp_path / "b"))
    rc_a, out_a, err_a = finish(a)
    rc_b, out_b, err_b = finish(b)

    assert rc_a == 0, out_a + err_a
    assert rc_b == 0, out_b + err_b
    said = out_b + err_b
    assert "waiting for the lock" in said and "run first" in said, said
    assert all(inspect(lab.sandbox, h, lab.name) is None for h in TWO)


def test_no_wait_run_refuses_while_another_run_holds_the_hosts(lab: Lab, tmp_path: Path) -> None:
    path = lab.cluster(lifetime="per_run", hosts=TWO)
    a = start(
        path, "run", str(suite(tmp_path, "slow", "sleep 5")), "--run-dir", str(tmp_path / "a")
    )
    wait_for_holders(lab.name, TWO)
    b = cvs(path, "run", str(suite(tmp_path, "eager", "true")), "--no-wait", "--run-dir",
            str(tmp_path / "b"))  # fmt: skip
    rc_a, out_a, err_a = finish(a)
    assert b.returncode == 4, explain(b)
    assert rc_a == 0, out_a + err_a


def test_a_killed_cvs_process_leaves_no_lock_behind(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    assert cvs(path, "up").returncode == 0
    holder = start(path, "exec", "--", "sleep 60")
    wait_for_holders(lab.name, TWO)
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=30)

    deadline = time.monotonic() + 20
    while True:
        down = cvs(path, "down", "--force", "--no-wait")
        if down.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert down.returncode == 0, explain(down)


def test_a_per_run_file_never_removes_the_persistent_container_of_another_file(
    lab: Lab, sandbox: Sandbox
) -> None:
    # Two files that both leave `name` at its default: one persistent, one per_run.
    files = []
    for lifetime in ("persistent", "per_run"):
        path = lab.cluster(lifetime=lifetime, hosts=TWO)
        doc = yaml.safe_load(path.read_text())
        doc.pop("name", None)
        path.write_text(yaml.safe_dump(doc))
        files.append(path)
    persistent, per_run = files
    assert cvs(persistent, "up").returncode == 0
    labels = inspect(sandbox, "node1", lab.name)["Config"]["Labels"]  # type: ignore[index]
    assert labels[LABEL_LIFETIME] == "persistent"

    down = cvs(per_run, "down", "--force")
    up = cvs(per_run, "up", "--force")

    assert all(inspect(sandbox, h, lab.name) is not None for h in TWO)
    assert "persistent" in down.stderr, explain(down)
    assert up.returncode == 4 and "persistent" in up.stderr, explain(up)


def test_rollback_removes_only_containers_this_invocation_started(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"])

    async def main() -> None:
        async with Cluster.open(path) as cluster:
            lc = cluster._lifecycle()
            states = await lc.probe_all()
            # A foreign container under our name appears after the probe.
            image = lc.cfg.image
            subprocess.run(
                [*sandbox.docker_argv("node1"), "run", "-d", "--name", lab.name, image,
                 "sleep", "infinity"],
                check=True, capture_output=True,
            )  # fmt: skip
            await roll_back(lc.steps, lc.invocation, ["node1"], states, "test")

    anyio.run(main)
    doc = inspect(sandbox, "node1", lab.name)
    assert doc is not None and LABEL_INVOCATION not in (doc["Config"]["Labels"] or {})


def test_a_host_without_flock_is_refused_naming_it(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sb = make_sandbox(1)
    node = sb.nodes[0]
    # The host's PATH: every command of this machine except flock.
    bin_dir = Path(tempfile.mkdtemp(prefix="cvs-noflock-", dir="/tmp"))
    try:
        bin_dir.chmod(0o755)
        for directory in ("/usr/local/bin", "/usr/bin", "/usr/sbin"):
            for tool in Path(directory).iterdir():
                link = bin_dir / tool.name
                if tool.name != "flock" and not link.exists():
                    link.symlink_to(tool)
        sb.set_sshd_option(node, "SetEnv", f"DOCKER_HOST={node.docker_host} PATH={bin_dir}")

        up = cvs(sb.cluster_file, "up")

        assert up.returncode == 4, explain(up)
        assert "node1" in up.stderr and "flock" in up.stderr, explain(up)
        assert inspect(sb, "node1", "cvs-sandbox") is None
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


def test_a_second_cluster_wanting_a_taken_sshd_port_is_refused_before_starting(
    lab: Lab, sandbox: Sandbox
) -> None:
    sshd = {"port": 2291, "enabled": True}
    first = lab.cluster(lifetime="persistent", hosts=["node1"], sshd=sshd)
    up = cvs(first, "up")
    assert up.returncode == 0, explain(up)
    other = f"{lab.name}-b"
    second = lab.cluster(lifetime="persistent", hosts=["node1"], sshd=sshd)
    doc = yaml.safe_load(second.read_text())
    doc["name"], doc["container"]["name"] = "other-cluster", other
    second.write_text(yaml.safe_dump(doc))
    try:
        refused = cvs(second, "up")

        assert refused.returncode == 4, explain(refused)
        text = refused.stdout + refused.stderr
        assert "2291" in text and lab.name in text and "node1" in text, text
        assert f"cluster {yaml.safe_load(first.read_text())['name']}" in text, text
        assert inspect(sandbox, "node1", other) is None
    finally:
        subprocess.run([*sandbox.docker_argv("node1"), "rm", "-f", other], capture_output=True)


def test_a_reader_that_stops_reading_does_not_keep_the_locks(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    assert cvs(path, "up").returncode == 0
    # Far more output than a pipe holds, into a pipe nobody reads yet.
    flood = start(path, "--json", "exec", "--", "seq 300000")
    try:
        wait_for_holders(lab.name, TWO)
        deadline = time.monotonic() + 90
        while any(Path(f"/tmp/cvs-{lab.name}-{h}.lock").exists() for h in TWO):
            assert time.monotonic() < deadline, "the exec kept its locks while its reader slept"
            time.sleep(0.2)
        assert flood.poll() is None  # still there: its output waits for the reader

        down = cvs(path, "down", "--force", "--no-wait")

        assert down.returncode == 0, explain(down)
    finally:
        rc, out, _ = finish(flood)
    assert rc == 0 and out.count("\n") > 300000


def test_ctrl_c_during_a_cold_start_removes_only_what_this_invocation_started(
    lab: Lab, sandbox: Sandbox, tmp_path: Path
) -> None:
    # Another cluster's persistent container lives on node1 under a name of its own.
    bystander = lab.cluster(lifetime="persistent", hosts=["node1"])
    doc = yaml.safe_load(bystander.read_text())
    doc["name"], doc["container"]["name"] = "bystander", f"{lab.name}-keep"
    bystander.write_text(yaml.safe_dump(doc))
    slow = tmp_path / "slow-setup.sh"
    slow.write_text("#!/bin/sh\nsleep 120\n")
    path = lab.cluster(lifetime="per_run", hosts=TWO, setup_script=str(slow))
    try:
        assert cvs(bystander, "up").returncode == 0
        proc = start(path, "up")
        deadline = time.monotonic() + 90
        while any(inspect(sandbox, h, lab.name) is None for h in TWO):
            assert time.monotonic() < deadline and proc.poll() is None, finish(proc)
            time.sleep(0.2)

        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        code, _, err = finish(proc, timeout=120)

        assert code == 130, err
        assert "Traceback" not in err, err
        assert all(inspect(sandbox, h, lab.name) is None for h in TWO), err
        assert inspect(sandbox, "node1", f"{lab.name}-keep") is not None
        assert lock_dirs(lab.name) == []
    finally:
        subprocess.run(
            [*sandbox.docker_argv("node1"), "rm", "-f", f"{lab.name}-keep"],
            capture_output=True, check=False,
        )  # fmt: skip
