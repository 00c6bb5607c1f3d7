"""Issue 3 acceptance: the container lifecycle against the real sandbox.

Every scenario runs against real OpenSSH sshd and a real dockerd per host
(the session `sandbox`), through the real CLI (`python -m orchestrator`
subprocesses with CI=1) where the point is about the CLI, else through
`orchestrator.api.Cluster`. Each test gets its own container name (other
modules share the sandbox and use `cvs-sandbox`) and removes its containers
and image tags from every host afterwards, also on failure.

The in-container sshd is switched off except where a scenario is about it:
it costs a provisioning round per host and would need a port of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest
from clitools import CVS, last_json
from labtools import CLI_TIMEOUT, THREE, Lab, cvs, docker, explain, inspect

from orchestrator.api import Cluster
from orchestrator.cli import build_parser
from orchestrator.containers.labels import LABEL_OWNER
from orchestrator.events import CollectingSink, CommandStarted
from orchestrator.sandbox import BASE_TAG, NO_DOCKER_USER, SSHD_TAG, SUDO_USER, Sandbox

# --- helpers ---------------------------------------------------------------


def cvs_json(cluster_file: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`cvs --json ...`: the exit code and the result document."""
    proc = cvs(cluster_file, "--json", *args)
    return proc.returncode, last_json(proc)


def identities(sandbox: Sandbox, hosts: list[str], name: str) -> dict[str, tuple[str, str] | None]:
    """host -> (container ID, start time), or None where there is no container."""
    out: dict[str, tuple[str, str] | None] = {}
    for host in hosts:
        doc = inspect(sandbox, host, name)
        out[host] = None if doc is None else (doc["Id"], doc["State"]["StartedAt"])
    return out


def running(sandbox: Sandbox, host: str, name: str) -> bool:
    doc = inspect(sandbox, host, name)
    return doc is not None and doc["State"]["Running"] is True


def bring_up(path: Path) -> None:
    """Setup, not the point under test: `up` in-process (no interpreter start-up)."""

    async def main() -> Any:
        async with Cluster.open(path) as cluster:
            return await cluster.up()

    report = anyio.run(main)
    assert report.ok, report.to_dict()


def in_container(sandbox: Sandbox, host: str, name: str, script: str) -> str:
    return docker(sandbox, host, "exec", name, "sh", "-c", script)


def run_steps(report: dict[str, Any]) -> int:
    """How many `docker run` steps an `up --json` report says it took."""
    return sum("run" in h["steps"] for h in report["hosts"].values())


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


def channels_per_host(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count SSH channels opened, per sandbox host, from now on.

    A channel is one remote command, so one round trip: every exec and every
    held process (the locked probe) opens one. `create_process` and `run`
    go through `create_session` too, so nothing is missed.
    """
    by_address = {h.address: h.name for h in sandbox.hosts}
    counts: Counter[str] = Counter()
    original = asyncssh.SSHClientConnection.create_session

    async def counting(self: asyncssh.SSHClientConnection, *args: Any, **kwargs: Any) -> Any:
        peer = self.get_extra_info("peername")
        counts[by_address.get(peer[0] if peer else "", "?")] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_session", counting)
    return counts


# --- 1. persistent: cold start, survives down, attach in one round trip ----


def test_persistent_cold_start_then_attach_keeps_container_and_costs_one_round_trip(
    lab: Lab, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = lab.cluster(lifetime="persistent", sshd_port=2431)

    rc, first = cvs_json(path, "up")
    assert rc == 0, first
    assert {h: v["action"] for h, v in first["hosts"].items()} == dict.fromkeys(THREE, "cold_start")
    assert run_steps(first) == 3
    assert all(v["steps"].get("sshd") == "ok" for v in first["hosts"].values()), first
    before = identities(sandbox, THREE, lab.name)

    wrote = cvs(path, "exec", "--", "echo data > /root/keep")
    assert wrote.returncode == 0, explain(wrote)
    down = cvs(path, "down")
    assert down.returncode == 0, explain(down)
    assert "persistent: kept" in down.stdout  # the result: stdout (docs/cli-output.md)
    assert identities(sandbox, THREE, lab.name) == before

    # The attach `up`, through the API so its SSH channels can be counted.
    counts = channels_per_host(sandbox, monkeypatch)
    sink = CollectingSink()

    async def attach() -> Any:
        async with Cluster.open(path, sink=sink) as cluster:
            return await cluster.up()

    since = docker(sandbox, "node1", "info", "--format", "{{json .SystemTime}}").strip('"')
    report = anyio.run(attach)
    assert report.ok and report.exit_code == 0
    assert {h: o.action.kind for h, o in report.outcomes.items()} == dict.fromkeys(THREE, "attach")
    assert all(o.steps == [] for o in report.outcomes.values())
    # Probe + decide + act with nothing to do: the locked probe is the only
    # round trip per host.
    assert dict(counts) == dict.fromkeys(THREE, 1)
    # ... and it never entered a container (no steps: provisioned and sshd
    # listening were known): both came from the host, the provisioning record
    # and the container's socket table.
    until = docker(sandbox, "node1", "info", "--format", "{{json .SystemTime}}").strip('"')
    for host in THREE:
        execs = docker(
            sandbox,
            host,
            "events",
            "--since",
            since,
            "--until",
            until,
            "--filter",
            "event=exec_create",
            "--format",
            "{{.Action}}",
        )
        assert execs == "", (host, execs)
    started = [e for e in sink.events if isinstance(e, CommandStarted)]
    assert sorted((e.host, e.label) for e in started) == [(h, "held") for h in THREE]

    assert identities(sandbox, THREE, lab.name) == before
    read = cvs(path, "exec", "--", "cat /root/keep")
    assert read.returncode == 0, explain(read)
    assert read.stdout.count("data") == 3


# --- 2. partial persistent set -----------------------------------------------


def test_persistent_up_refuses_when_one_of_three_containers_is_missing(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    bring_up(path)
    docker(sandbox, "node2", "rm", "-f", lab.name)
    before = identities(sandbox, THREE, lab.name)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "running: node1, node3" in up.stderr, up.stderr
    assert "absent: node2" in up.stderr, up.stderr
    assert identities(sandbox, THREE, lab.name) == before
    assert before["node2"] is None


def test_plan_prints_action_and_reason_per_host_and_exits_4_when_refused(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    ok = cvs(path, "plan")
    assert ok.returncode == 0, explain(ok)
    for host in THREE:
        assert f"{host}  cold_start persistent: absent everywhere, cold start" in ok.stdout

    docker(sandbox, "node3", "run", "-d", "--name", lab.name, BASE_TAG, "sleep", "infinity")
    refused = cvs(path, "plan")

    assert refused.returncode == 4, explain(refused)
    lines = {line.split()[0]: line for line in refused.stdout.splitlines()[1:]}
    assert set(lines) == set(THREE)
    assert "absent" in lines["node1"] and "not created by cvs" in lines["node3"]
    assert "refused:" in refused.stderr and "node3" in refused.stderr
    assert inspect(sandbox, "node1", lab.name) is None  # a dry run changes nothing


# --- 3. all stopped -> restart keeps the overlay -----------------------------


def test_persistent_up_restarts_stopped_containers_and_keeps_their_files(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent", sshd_port=2432)
    bring_up(path)
    for host in THREE:
        in_container(sandbox, host, lab.name, "echo kept > /root/keep")
    ids = {h: v[0] for h, v in identities(sandbox, THREE, lab.name).items() if v}
    for host in THREE:
        docker(sandbox, host, "stop", "-t", "1", lab.name)

    rc, report = cvs_json(path, "up")

    assert rc == 0, report
    for host in THREE:
        assert report["hosts"][host]["action"] == "restart"
        assert report["hosts"][host]["steps"].get("restart") == "ok"
        assert report["hosts"][host]["steps"].get("sshd") == "ok"
        assert running(sandbox, host, lab.name)
    assert run_steps(report) == 0
    assert {h: v[0] for h, v in identities(sandbox, THREE, lab.name).items() if v} == ids
    assert [in_container(sandbox, h, lab.name, "cat /root/keep") for h in THREE] == ["kept"] * 3


# --- 4. image identity ------------------------------------------------------


def test_persistent_up_refuses_image_skew_listing_host_and_image_id(
    lab: Lab, sandbox: Sandbox
) -> None:
    tag = f"cvs-skew-{lab.name[-8:]}:test"
    for host in THREE:
        lab.tag(host, SSHD_TAG, tag)
    path = lab.cluster(lifetime="persistent", image=tag)
    bring_up(path)
    # node1's container is recreated (same labels, so still ours) from an
    # image the same tag now names there alone: same tag, different IDs.
    labels = inspect(sandbox, "node1", lab.name)["Config"]["Labels"]  # type: ignore[index]
    skewed = sandbox.import_skewed_image("node1", tag)
    docker(sandbox, "node1", "rm", "-f", lab.name)
    label_args = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
    docker(sandbox, "node1", "run", "-d", "--name", lab.name, "--network", "host",
           *label_args, tag, "sleep", "infinity")  # fmt: skip
    normal = sandbox.image_id("node2", tag)
    assert skewed != normal
    before = identities(sandbox, THREE, lab.name)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "image skew" in up.stderr
    short = {i.removeprefix("sha256:")[:12] for i in (skewed, normal)}
    assert all(s in up.stderr for s in short), up.stderr
    assert f"{skewed.removeprefix('sha256:')[:12]} on node1" in up.stderr
    assert f"{normal.removeprefix('sha256:')[:12]} on node2, node3" in up.stderr
    assert identities(sandbox, THREE, lab.name) == before


def test_cold_start_refuses_when_the_tag_names_different_images_across_hosts(
    lab: Lab, sandbox: Sandbox
) -> None:
    tag = f"cvs-skew-{lab.name[-8:]}:cold"
    lab.tags.append(tag)
    skewed = sandbox.import_skewed_image("node1", tag)
    for host in ("node2", "node3"):
        lab.tag(host, SSHD_TAG, tag)
    path = lab.cluster(lifetime="persistent", image=tag)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "resolves to different images" in up.stderr
    assert skewed.removeprefix("sha256:")[:12] in up.stderr
    assert identities(sandbox, THREE, lab.name) == dict.fromkeys(THREE)


def test_persistent_up_warns_about_stale_containers_with_rebuild_command_and_attaches(
    lab: Lab, sandbox: Sandbox
) -> None:
    tag = f"cvs-stale-{lab.name[-8:]}:test"
    for host in THREE:
        lab.tag(host, SSHD_TAG, tag)
    path = lab.cluster(lifetime="persistent", image=tag)
    bring_up(path)
    before = identities(sandbox, THREE, lab.name)
    for host in THREE:
        docker(sandbox, host, "tag", BASE_TAG, tag)  # the tag moves on after the start

    up = cvs(path, "up")

    assert up.returncode == 0, explain(up)
    assert "warning: stale:" in up.stderr, up.stderr
    assert "node1, node2, node3" in up.stderr
    assert "cvs down --force && cvs up" in up.stderr
    assert up.stdout.count("attach ok") == 3, up.stdout
    assert identities(sandbox, THREE, lab.name) == before
    status = cvs_json(path, "status")[1]
    assert [r["stale"] for r in status["hosts"].values()] == [True, True, True]


# --- 5. a host's dockerd down -------------------------------------------------


def test_persistent_up_refuses_and_removes_nothing_when_one_dockerd_is_down(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    bring_up(path)
    before = identities(sandbox, THREE, lab.name)
    sandbox.stop_dockerd("node2")
    try:
        up = cvs(path, "up")
        after = identities(sandbox, ["node1", "node3"], lab.name)
    finally:
        sandbox.start_dockerd("node2")

    assert up.returncode == 4, explain(up)
    assert "node2" in up.stderr and "docker daemon not reachable" in up.stderr, up.stderr
    assert after == {h: before[h] for h in ("node1", "node3")}
    # dockerd's shutdown stopped node2's container; nothing removed it.
    doc = inspect(sandbox, "node2", lab.name)
    assert doc is not None and doc["Id"] == before["node2"][0]  # type: ignore[index]


# --- 6. per_run ------------------------------------------------------------


def test_per_run_up_then_down_leaves_no_container(lab: Lab, sandbox: Sandbox) -> None:
    path = lab.cluster(lifetime="per_run")
    rc, report = cvs_json(path, "up")
    assert rc == 0, report
    assert run_steps(report) == 3
    for host in THREE:
        doc = inspect(sandbox, host, lab.name)
        assert doc is not None and LABEL_OWNER in doc["Config"]["Labels"]

    down = cvs(path, "down")

    assert down.returncode == 0, explain(down)
    assert identities(sandbox, THREE, lab.name) == dict.fromkeys(THREE)


def test_per_run_never_removes_a_foreign_same_named_container_without_force(
    lab: Lab, sandbox: Sandbox
) -> None:
    docker(sandbox, "node1", "run", "-d", "--name", lab.name, BASE_TAG, "sleep", "infinity")
    foreign = identities(sandbox, ["node1"], lab.name)["node1"]
    path = lab.cluster(lifetime="per_run")

    plan_rc, plan = cvs_json(path, "plan")
    up = cvs(path, "up")
    down = cvs(path, "down")

    assert plan_rc == 4 and any("not created by cvs" in r for r in plan["refused"]), plan
    assert up.returncode == 4, explain(up)
    assert "node1" in up.stderr and "--force" in up.stderr
    assert down.returncode == 0, explain(down)
    assert "not created by cvs" in down.stdout + down.stderr
    assert identities(sandbox, THREE, lab.name) == {"node1": foreign, "node2": None, "node3": None}

    forced = cvs(path, "down", "--force")

    assert forced.returncode == 0, explain(forced)
    assert inspect(sandbox, "node1", lab.name) is None


# --- 7. no_launch ------------------------------------------------------------


def test_no_launch_refuses_when_nothing_runs_and_starts_nothing(lab: Lab, sandbox: Sandbox) -> None:
    path = lab.cluster(lifetime="no_launch")

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "no_launch never starts containers" in up.stderr
    assert identities(sandbox, THREE, lab.name) == dict.fromkeys(THREE)


def test_no_launch_verifies_running_containers_without_docker_run(
    lab: Lab, sandbox: Sandbox
) -> None:
    for host in THREE:
        docker(sandbox, host, "run", "-d", "--name", lab.name, BASE_TAG, "sleep", "infinity")
    before = identities(sandbox, THREE, lab.name)
    path = lab.cluster(lifetime="no_launch", image=BASE_TAG)

    rc, report = cvs_json(path, "up")
    down = cvs(path, "down", "--force")

    assert rc == 0, report
    assert {h: v["action"] for h, v in report["hosts"].items()} == dict.fromkeys(THREE, "verify")
    assert all(v["steps"] == {} for v in report["hosts"].values())
    assert down.returncode == 0, explain(down)
    assert identities(sandbox, THREE, lab.name) == before


# --- 8. two `cvs up` at once -------------------------------------------------


def test_two_concurrent_persistent_ups_cold_start_exactly_once(lab: Lab, sandbox: Sandbox) -> None:
    path = lab.cluster(lifetime="persistent")
    env = {**os.environ, "CI": "1"}
    argv = [*CVS, "-c", str(path), "--json", "up"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=CLI_TIMEOUT) for p in procs]
    reports = [last_json(out) for out, _ in outputs]

    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum(run_steps(r) for r in reports) == 3
    actions = sorted(tuple(sorted({v["action"] for v in r["hosts"].values()})) for r in reports)
    assert actions == [("attach",), ("cold_start",)]
    first = identities(sandbox, THREE, lab.name)
    assert all(first.values())
    bring_up(path)
    assert identities(sandbox, THREE, lab.name) == first


# --- 9. docker access: group, sudo -n, neither -----------------------------------


def test_login_user_in_docker_group_uses_docker_without_sudo(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run")
    assert [r["docker"] for r in cvs_json(path, "status")[1]["hosts"].values()] == ["direct"] * 3


def test_login_user_with_only_passwordless_sudo_works_through_sudo(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="per_run", user=SUDO_USER)
    assert [r["docker"] for r in cvs_json(path, "status")[1]["hosts"].values()] == ["sudo"] * 3

    rc, report = cvs_json(path, "up")

    assert rc == 0, report
    assert all(running(sandbox, h, lab.name) for h in THREE)
    assert cvs(path, "down").returncode == 0
    assert identities(sandbox, THREE, lab.name) == dict.fromkeys(THREE)


def test_login_user_without_docker_access_gets_a_per_host_error_naming_the_fix(
    lab: Lab, sandbox: Sandbox
) -> None:
    path = lab.cluster(lifetime="per_run", user=NO_DOCKER_USER)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    for host in THREE:
        assert f"{host}: no docker access" in up.stderr, up.stderr
    assert "docker group" in up.stderr and "sudo" in up.stderr
    assert identities(sandbox, THREE, lab.name) == dict.fromkeys(THREE)


def test_status_exits_1_naming_every_host_when_the_login_user_has_no_access_to_docker(
    lab: Lab,
) -> None:
    path = lab.cluster(lifetime="per_run", user=NO_DOCKER_USER)

    status = cvs(path, "status")

    assert status.returncode == 1, explain(status)
    for host in THREE:
        assert f"{host}: no docker access" in status.stderr, explain(status)


# --- 10. legacy keys -------------------------------------------------------------


@pytest.mark.parametrize("key", ["enabled", "launch"])
def test_legacy_container_key_exits_2_with_migration_message(lab: Lab, key: str) -> None:
    path = lab.cluster(lifetime="per_run", **{key: True})

    up = cvs(path, "up")

    assert up.returncode == 2, explain(up)
    assert f"legacy key 'container.{key}'" in up.stderr
    assert "container.lifetime" in up.stderr and "persistent" in up.stderr


# --- the command line ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-c", "c.yaml", "--json", "up"],
        ["up", "-c", "c.yaml", "--json"],
        ["-c", "other.yaml", "up", "-c", "c.yaml", "--json"],
    ],
)
def test_global_options_count_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.cluster, args.json, args.verbose) == ("c.yaml", True, False)


# --- status ---------------------------------------------------------------------


def test_status_shows_a_row_per_host_with_the_lifecycle_columns(lab: Lab, sandbox: Sandbox) -> None:
    # sshd off, on a port of its own: nothing in the host's netns listens there.
    path = lab.cluster(lifetime="per_run", sshd={"enabled": False, "port": 2433})
    bring_up(path)
    image = sandbox.image_id("node1", SSHD_TAG).removeprefix("sha256:")[:12]

    status = cvs(path, "status", "-o", "wide")

    assert status.returncode == 0, explain(status)
    header, *rows = status.stdout.splitlines()
    assert header.split()[:8] == [
        "host", "reachable", "docker", "state", "image", "tag", "stale", "sshd",
    ]  # fmt: skip
    assert [r.split()[:8] for r in rows] == [
        # sshd is disabled for this cluster: the column says so rather than "down".
        [h, "yes", "direct", "running", image, image, "no", "off"]
        for h in THREE
    ]


def test_status_exits_0_when_containers_are_absent_or_stopped(lab: Lab, sandbox: Sandbox) -> None:
    path = lab.cluster(lifetime="per_run")
    bring_up(path)
    docker(sandbox, "node1", "stop", "-t", "1", lab.name)
    docker(sandbox, "node2", "rm", "-f", lab.name)

    rc, status = cvs_json(path, "status")

    assert rc == 0 and status["ok"] is True, status
    states = {host: row["state"] for host, row in status["hosts"].items()}
    assert states == {"node1": "exited", "node2": "absent", "node3": "running"}


# --- the benchmark script ---------------------------------------------------------


def test_attach_benchmark_reports_one_round_trip_per_host(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent")
    bench = Path(__file__).resolve().parents[1] / "bench" / "attach.py"
    # One timed run, no wait for a quiet machine (up to 60 s): what is
    # asserted is the round trips, not the timing.
    quick = ("--runs", "1", "--settle", "0")

    proc = subprocess.run(
        [sys.executable, str(bench), "--cluster", str(path), "--json", *quick],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env={**os.environ, "CI": "1"},
        check=False,
    )

    assert proc.returncode == 0, explain(proc)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["round_trips"] == dict.fromkeys(THREE, 1)
    assert result["actions"] == dict.fromkeys(THREE, "attach")


# --- locks across login users ---------------------------------------------------


@pytest.fixture
def protected_regular() -> Iterator[None]:
    """fs.protected_regular=2 for the test (many distributions set it), restored after."""
    knob = Path("/proc/sys/fs/protected_regular")
    if not knob.exists():
        pytest.skip("this kernel has no fs.protected_regular")
    before = knob.read_text().strip()
    knob.write_text("2")
    try:
        yield
    finally:
        knob.write_text(before)


def test_second_login_user_takes_the_lock_first_user_created(
    lab: Lab, protected_regular: None
) -> None:
    # `cvs` creates the per-host locks; `cvssudo` must still be able to take
    # them for the same container (a lock *file* in sticky /tmp could not be
    # opened for create by another user under protected_regular).
    first = cvs(lab.cluster(lifetime="persistent", hosts=["node1"]), "up")
    assert first.returncode == 0, explain(first)

    second = cvs(lab.cluster(lifetime="persistent", hosts=["node1"], user="cvssudo"), "up")

    assert second.returncode == 0, explain(second)
    assert "attach" in second.stdout
