"""Real images on the real sandbox: non-root images, rollback, adoption.

Each test has its own container name (the `lab` fixture of test_lifecycle)
and removes what it made from every host, also on failure.
"""

from __future__ import annotations

import os
import pwd
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import yaml
from labtools import Lab, cvs, docker, explain, inspect

from orchestrator.api import Cluster
from orchestrator.config import load_cluster
from orchestrator.containers.outcome import UpReport
from orchestrator.errors import CvsError, PolicyRefused
from orchestrator.events import CollectingSink, Event, HostStep, Message, TeeSink
from orchestrator.sandbox import (
    DOCKER_USER,
    IMAGE_USER,
    SSHD_TAG,
    USER_TAG,
    Sandbox,
    ensure_user_image,
)

TWO = ["node1", "node2"]


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


def free_port() -> int:
    # Per-host network namespaces, but other tests share them: a port of our own.
    return random.randint(21000, 29000)


@pytest.fixture
def user_image(sandbox: Sandbox) -> Iterator[str]:
    """USER_TAG (USER cvsuser) loaded on node1 and node2, removed afterwards."""
    tar = ensure_user_image(lambda _: None)
    for host in TWO:
        sandbox.load_image(host, tar)
    try:
        yield USER_TAG
    finally:
        for host in TWO:
            docker(sandbox, host, "rmi", USER_TAG, check=False)


def test_non_root_image_is_provisioned_as_root_and_runs_commands_as_its_user(
    lab: Lab, user_image: str
) -> None:
    path = lab.cluster(lifetime="per_run", hosts=TWO, image=user_image, sshd_port=free_port())
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert "no resource caps" in up.stderr
    # Commands run as the image's USER, in its WORKDIR...
    who = cvs(path, "exec", "--", "echo $(id -un) $(pwd)")
    assert who.returncode == 0, explain(who)
    assert who.stdout.count(f"{IMAGE_USER} /home/{IMAGE_USER}") == 2, who.stdout
    # ...unless -u / -w say otherwise (and -e sets the environment).
    root = cvs(
        path,
        "exec",
        "-u",
        "root",
        "-w",
        "/tmp",
        "-e",
        "GREETING=hi",
        "--",
        "echo $(id -un) $(pwd) $GREETING",
    )
    assert root.returncode == 0, explain(root)
    assert root.stdout.count("root /tmp hi") == 2, root.stdout
    # The setup script ran as root: its marker is in /var/lib/cvs.
    assert docker(lab.sandbox, "node1", "exec", lab.name, "cat", "/var/lib/cvs/provisioned")
    # mpirun-style: the image's user reaches the peer container's sshd as itself.
    hop = cvs(path, "exec", "--hosts", "node1", "--", "ssh node2 'echo $(id -un)@$(hostname)'")
    assert hop.returncode == 0, explain(hop)
    assert f"{IMAGE_USER}@" in hop.stdout
    down = cvs(path, "down")
    assert down.returncode == 0, explain(down)


def test_no_caps_warning_is_an_api_event(lab: Lab) -> None:
    path = lab.cluster(lifetime="no_launch", hosts=["node1"])
    sink = CollectingSink()

    async def main() -> None:
        async with Cluster.open(path, sink=sink) as cluster:
            with pytest.raises(PolicyRefused):
                await cluster.up()  # nothing runs there: refused, after the warning

    anyio.run(main)
    texts = [e.text for e in sink.events if isinstance(e, Message) and e.level == "warning"]
    assert "no resource caps: containers may take the whole host" in texts


def test_pytest_fixture_reports_the_no_caps_warning(lab: Lab, tmp_path: Path) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"])
    test_file = tmp_path / "test_fleet.py"
    test_file.write_text("def test_fleet(cluster):\n    assert cluster.exec('true')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file),
         "--cvs-orchestrator-cluster", str(path), "-W", "default::UserWarning"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CvsWarning: cvs: no resource caps" in proc.stdout


# --- rollback ----------------------------------------------------------------

THREE = ["node1", "node2", "node3"]


class Squatter:
    """A foreign `docker run` on one host takes the container's name between
    the locked probe and our `docker run` there: exactly when node2's run step
    starts (emit runs synchronously, before that step's command is sent)."""

    def __init__(self, sandbox: Sandbox, host: str, name: str) -> None:
        self.sandbox, self.host, self.name = sandbox, host, name
        self.foreign_id: str | None = None

    def emit(self, event: Event) -> None:
        if (
            isinstance(event, HostStep)
            and (event.host, event.step, event.status) == (self.host, "run", "started")
            and self.foreign_id is None
        ):
            self.foreign_id = docker(
                self.sandbox,
                self.host,
                "run",
                "-d",
                "--name",
                self.name,
                SSHD_TAG,
                "sleep",
                "infinity",
            )

    def close(self) -> None:
        pass


def test_failed_docker_run_on_one_host_rolls_back_only_this_attempts_containers(
    lab: Lab,
) -> None:
    path = lab.cluster(lifetime="persistent", hosts=THREE)
    squatter = Squatter(lab.sandbox, "node2", lab.name)
    seen = CollectingSink()

    async def main() -> UpReport:
        async with Cluster.open(path, sink=TeeSink(seen, squatter)) as cluster:
            try:
                return await cluster.up()
            except CvsError as exc:  # an API that raises on failure carries the report
                return exc.report  # type: ignore[attr-defined,no-any-return]

    report = anyio.run(main)
    assert not report.ok
    made = {h: report.outcomes[h].container_id for h in ("node1", "node3")}
    assert all(made.values()), made  # the run succeeded there...
    for host in ("node1", "node3"):  # ...and what it made is gone
        assert inspect(lab.sandbox, host, lab.name) is None, host
    # The foreign container that held the name on node2 survives, untouched.
    foreign = inspect(lab.sandbox, "node2", lab.name)
    assert foreign is not None and foreign["Id"] == squatter.foreign_id
    assert foreign["State"]["Running"] and not foreign["Config"]["Labels"]
    # The message names the host and the cause.
    error = str(report.outcomes["node2"].error or "")
    assert error.startswith("run:") and "already in use" in error, error
    warnings = [e.text for e in seen.events if isinstance(e, Message) and e.level == "warning"]
    assert any("cold start failed on node2" in w for w in warnings), warnings


# --- capacity ----------------------------------------------------------------


def test_memory_beyond_the_host_is_refused_before_anything_starts(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"], resources={"memory": "64Ti"})
    up = cvs(path, "up")
    assert up.returncode == 4, explain(up)
    assert "node1: memory 64Ti is more than the host has" in up.stderr
    assert inspect(lab.sandbox, "node1", lab.name) is None


def test_cpus_beyond_the_host_are_clamped_with_a_warning(lab: Lab) -> None:
    cpus = os.cpu_count() or 1
    path = lab.cluster(lifetime="per_run", hosts=["node1"], resources={"cpus": cpus + 62})
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    assert f"clamped to {cpus}" in up.stderr
    doc = inspect(lab.sandbox, "node1", lab.name)
    assert doc is not None and doc["HostConfig"]["NanoCpus"] == cpus * 10**9


# --- adopt -------------------------------------------------------------------


def test_adopt_takes_over_containers_started_the_way_cvs_starts_them(lab: Lab) -> None:
    home = Path(pwd.getpwnam(DOCKER_USER).pw_dir)
    made: dict[str, str] = {}
    for host in THREE:  # CVS's own `docker run`: same name, no cvs labels
        made[host] = docker(
            lab.sandbox, host, "run", "-d", "--name", lab.name, "--network", "host",
            "--ipc", "host", SSHD_TAG, "sleep", "infinity",
        )  # fmt: skip
    records = [home / ".local/state/cvs/adopted" / cid for cid in made.values()]
    try:
        path = lab.cluster(lifetime="persistent", hosts=THREE, sshd_port=free_port())
        refused = cvs(path, "up")
        assert refused.returncode == 4, explain(refused)
        assert "--adopt" in refused.stderr
        adopted = cvs(path, "up", "--adopt")
        assert adopted.returncode == 0, explain(adopted)
        for host in THREE:
            doc = inspect(lab.sandbox, host, lab.name)
            assert doc is not None and doc["Id"] == made[host]  # kept, not replaced
            marker = docker(lab.sandbox, host, "exec", lab.name, "cat", "/var/lib/cvs/provisioned")
            assert len(marker) == 64
        cluster_name = load_cluster(path).name
        assert [r.read_text().strip() for r in records] == [cluster_name] * 3
        # The next invocation attaches without --adopt: the record makes them ours.
        again = cvs(path, "--json", "up")
        assert again.returncode == 0, explain(again)
        assert '"action": "attach"' in again.stdout and '"run"' not in again.stdout
        hop = cvs(path, "exec", "--hosts", "node1", "--", "ssh node3 true && echo hop-ok")
        assert "hop-ok" in hop.stdout, explain(hop)
        # Owned now: `down --force` removes them (by ID), as for containers cvs started.
        down = cvs(path, "down", "--force")
        assert down.returncode == 0, explain(down)
        assert all(inspect(lab.sandbox, h, lab.name) is None for h in THREE)
    finally:
        for record in records:
            record.unlink(missing_ok=True)


# --- suite steps: workdir and user; the no-caps warning on `run` --------------


def test_run_steps_take_workdir_and_user_and_warn_about_missing_caps(
    lab: Lab, tmp_path: Path
) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"])
    suite = tmp_path / "where.yaml"
    suite.write_text(
        "name: where\n"
        "steps:\n"
        "  - name: where\n"
        '    run: echo "$(id -un) $(pwd)"\n'
        "    workdir: /var/tmp\n"
        "    user: nobody\n"
        "    expect: {stdout: '^nobody /var/tmp$'}\n"
    )
    run = cvs(path, "run", str(suite), "--run-dir", str(tmp_path / "run"))
    assert run.returncode == 0, explain(run)
    assert "no resource caps" in run.stdout + run.stderr


def test_container_user_sets_who_commands_run_as_and_u_overrides_it(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run", hosts=["node1"])
    doc = yaml.safe_load(path.read_text())
    doc["container"]["user"] = "nobody"
    path.write_text(yaml.safe_dump(doc))
    assert cvs(path, "up").returncode == 0
    assert cvs(path, "exec", "--", "id -un").stdout.strip().endswith("nobody")
    assert cvs(path, "exec", "-u", "root", "--", "id -un").stdout.strip().endswith("root")
