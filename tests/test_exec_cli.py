"""`cvs exec` and `cvs validate` end to end: the real CLI as a subprocess against
the real sandbox (sshd + dockerd per host).

Leftover remote processes are looked for by network namespace (see
`sandbox_pids`): the sandbox hosts share this machine's process table, and
the login user is shared with every other sandbox on it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clitools import CVS, cvs_in_process, json_lines
from exectools import (
    CLI_ENV,
    NODES,
    containers_up,
    cvs,
    statuses,
    yaml_container,
)
from sandboxtools import cluster_variant, sandbox_pids, wait_until

from orchestrator.sandbox import Sandbox

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def sshd_stopped(sandbox: Sandbox, host: str) -> Iterator[None]:
    try:
        sandbox.stop_sshd(host)
        yield
    finally:
        sandbox.start_sshd(host)


def leftover_pidfiles(sandbox: Sandbox, name: str) -> list[str]:
    """`HOST: FILE` for every exec pidfile in container `name`'s /tmp (listed with
    plain `docker exec`: a `cvs exec` would leave its own there while it runs)."""
    found: list[str] = []
    for host in NODES:
        listing = subprocess.run(
            [*sandbox.docker_argv(host), "exec", name, "ls", "-A", "/tmp"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        found += [f"{host}: {f}" for f in listing.stdout.split() if f.startswith(".cvs-exec-")]
    return found


# -- exec on the host OS -----------------------------------------------------


def test_exec_hostname_on_four_hosts_is_ok_everywhere(sandbox: Sandbox) -> None:
    proc = cvs("exec", "-c", str(sandbox.cluster_file), "--json", "--host-os", "--", "hostname")
    assert proc.returncode == 0, proc.stderr
    _, summary = json_lines(proc.stdout)
    assert summary["ok"] is True
    assert summary["exit_code"] == 0
    assert statuses(summary) == dict.fromkeys(NODES, "ok")
    assert all(r["stdout"].strip() for r in summary["hosts"].values())


def test_exec_plain_output_prefixes_each_line_with_its_host(sandbox: Sandbox) -> None:
    proc = cvs("exec", "-c", str(sandbox.cluster_file), "--host-os", "--", "echo", "hello")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"{h} | hello" for h in NODES]
    assert "4 hosts: 4 ok" in proc.stderr


def test_exec_with_one_sshd_stopped_reports_that_host_unreachable_and_exits_3(
    sandbox: Sandbox,
) -> None:
    with sshd_stopped(sandbox, "node2"):
        proc = cvs("exec", "-c", str(sandbox.cluster_file), "--json", "--host-os", "--", "true")
    assert proc.returncode == 3, proc.stderr
    _, summary = json_lines(proc.stdout)
    assert summary["exit_code"] == 3
    assert statuses(summary) == {
        "node1": "ok",
        "node2": "unreachable",
        "node3": "ok",
        "node4": "ok",
    }
    assert "connection refused" in summary["hosts"]["node2"]["error"]


def test_exec_group_folds_identical_output_under_one_header(sandbox: Sandbox) -> None:
    proc = cvs(
        "exec", "-c", str(sandbox.cluster_file), "--host-os", "--group", "--", "echo", "same"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "node[1-4] (4) ok" in lines
    assert lines.count("same") == 1
    assert not any(" | " in line for line in lines), "output streamed per host despite --group"


def test_exec_timeout_returns_in_about_the_timeout_and_kills_remote_sleeps(
    sandbox: Sandbox,
) -> None:
    sleep = ["sleep", "30"]
    proc = cvs(
        "exec", "-c", str(sandbox.cluster_file), "--json", "--host-os", "--timeout", "2", "--",
        *sleep,
    )  # fmt: skip
    exited = time.time()
    assert proc.returncode == 1, proc.stderr
    events, summary = json_lines(proc.stdout)
    assert statuses(summary) == dict.fromkeys(NODES, "timeout")
    # About the 2 s timeout, far from the 30 s sleep: bounds with a margin a
    # loaded 2-core machine cannot eat (issue 30).
    assert all(2.0 <= r["duration"] < 12.0 for r in summary["hosts"].values())
    # Measured from the first remote start, not from the fork: the CLI's own
    # start-up (imports) grows with the machine's load, not with the timeout.
    first_start = min(e["ts"] for e in events if e["event"] == "CommandStarted")
    assert exited - first_start < 15.0
    assert wait_until(lambda: not sandbox_pids(sandbox, sleep), timeout=1.0), (
        f"left running: {sandbox_pids(sandbox, sleep)}"
    )


def test_exec_in_container_timeout_kills_the_process_inside_the_container(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    container = yaml_container(sandbox, name="cvs-t-exec-timeout")
    cluster = cluster_variant(sandbox, tmp_path, container=container)
    sleep = ["sleep", "30"]
    with containers_up(cluster):
        started = time.monotonic()
        proc = cvs("exec", "-c", str(cluster), "--json", "--timeout", "2", "--", *sleep)
        elapsed = time.monotonic() - started
        assert proc.returncode == 1, proc.stderr
        _, summary = json_lines(proc.stdout)
        assert statuses(summary) == dict.fromkeys(NODES, "timeout")
        assert all(2.0 <= r["duration"] < 8.0 for r in summary["hosts"].values())
        assert elapsed < 20.0
        assert wait_until(lambda: not sandbox_pids(sandbox, sleep), timeout=1.0), (
            f"left running in the containers: {sandbox_pids(sandbox, sleep)}"
        )


def test_exec_in_container_timeout_kills_a_command_that_ignores_term(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    container = yaml_container(sandbox, name="cvs-t-exec-ignores-term")
    cluster = cluster_variant(sandbox, tmp_path, container=container)
    stubborn = ["sh", "-c", "trap '' TERM; sleep 29"]  # sleep inherits the ignored TERM
    sleep = ["sleep", "29"]
    with containers_up(cluster):
        proc = cvs("exec", "-c", str(cluster), "--json", "--timeout", "2", "--", *stubborn)
        assert proc.returncode == 1, proc.stderr
        assert statuses(json_lines(proc.stdout)[1]) == dict.fromkeys(NODES, "timeout")
        assert wait_until(
            lambda: not sandbox_pids(sandbox, stubborn) and not sandbox_pids(sandbox, sleep),
            timeout=1.0,
        ), f"left running: {sandbox_pids(sandbox, stubborn) + sandbox_pids(sandbox, sleep)}"
        assert leftover_pidfiles(sandbox, container["name"]) == []


def test_exec_in_container_leaves_no_pidfile_behind(sandbox: Sandbox, tmp_path: Path) -> None:
    container = yaml_container(sandbox, name="cvs-t-exec-pidfile")
    cluster = cluster_variant(sandbox, tmp_path, container=container)
    with containers_up(cluster):
        plain = cvs("exec", "-c", str(cluster), "--", "true")
        with_env = cvs(
            "exec", "-c", str(cluster), "--json", "-e", "GREETING=hi", "--",
            "sh", "-c", 'echo "$GREETING"; exit 7',
        )  # fmt: skip

        assert plain.returncode == 0, plain.stderr
        assert with_env.returncode == 1, with_env.stderr
        results = json_lines(with_env.stdout)[1]["hosts"].values()
        assert [(r["exit_code"], r["stdout"], r["stderr"]) for r in results] == [
            (7, "hi", "")
        ] * len(NODES)
        assert leftover_pidfiles(sandbox, container["name"]) == []


def test_ctrl_c_exits_130_promptly_and_stops_remote_commands(sandbox: Sandbox) -> None:
    sleep = ["sleep", "100"]
    proc = subprocess.Popen(
        [*CVS, "exec", "-c", str(sandbox.cluster_file),
         "--host-os", "--", *sleep],
        env=CLI_ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        running = wait_until(lambda: len(sandbox_pids(sandbox, sleep)) == 4, timeout=30)
        assert running, f"remote sleeps never started: {proc.poll()=}"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
        assert time.monotonic() - signalled < 8.0  # promptly: the sleeps had 100 s to go
        assert proc.returncode == 130, stderr
        assert "interrupted" in stderr
        assert wait_until(lambda: not sandbox_pids(sandbox, sleep), timeout=1.0), (
            f"left running: {sandbox_pids(sandbox, sleep)}"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- validate ----------------------------------------------------------------


def test_validate_cvs_format_sample_shows_its_hosts() -> None:
    proc = cvs_in_process("validate", "-c", "cluster_samples/cvs_cluster.json", "--no-check-files")
    assert proc.returncode == 0, proc.stderr
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert address in proc.stdout
    assert "ok, 3 hosts" in proc.stderr


def test_validate_sandbox_cluster_file_lists_its_four_hosts(sandbox: Sandbox) -> None:
    proc = cvs("validate", "-c", str(sandbox.cluster_file), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert [h["name"] for h in doc["cluster"]["hosts"]] == NODES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hosts: [node1]\nsshh: {user: x}\n", "sshh"),
        ("hosts: [node1\nssh: {}\n", "cluster.yaml:"),
        ("hosts: []\n", "hosts"),
    ],
    ids=["unknown-key", "yaml-syntax", "empty-hosts"],
)
def test_validate_malformed_file_exits_2_with_one_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    proc = cvs_in_process("validate", "-c", str(path))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and expected in lines[0]
    assert "Traceback" not in proc.stderr
