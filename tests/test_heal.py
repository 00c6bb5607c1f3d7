"""Issue 10/14 acceptance against a real sandbox that the tests may break.

One 3-host sandbox for the module (built once, ~30-60 s): each test breaks
one daemon or key on purpose (a dockerd restart, an sshd stopped, a host key
rotated) and restores it before it ends, also on failure. The session
`sandbox` is never touched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from clitools import cvs_on
from conftest import _built
from gpuroots import AMD, make_device_root
from labtools import Lab, docker, explain

from orchestrator.api import Cluster, ExecFailed, UpFailed
from orchestrator.errors import CvsError
from orchestrator.sandbox import Sandbox
from orchestrator.sync import SyncCluster

THREE = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def breakable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with _built(tmp_path_factory.mktemp("heal") / "sb", hosts=3) as sb:
        yield sb


cvs = partial(cvs_on, timeout=240)


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    found = [d for d in docs if "exit_code" in d]
    assert found, explain(proc)
    return found[-1]


def status_of(sb: Sandbox, host: str, name: str) -> tuple[str, str] | None:
    """(container ID, docker's status word), or None where it is absent."""
    proc = subprocess.run(
        [*sb.docker_argv(host), "inspect", "--type", "container", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        return None
    doc = json.loads(proc.stdout)[0]
    return doc["Id"], doc["State"]["Status"]


@pytest.fixture
def lab(breakable: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(breakable, tmp_path, prefix="cvs-heal")
    try:
        yield lab
    finally:
        for node in breakable.nodes:  # whatever a test stopped comes back
            breakable.start_dockerd(node)
            breakable.start_sshd(node)
        lab.clean()
        lab.clean_locks()


# --- issue 10.1: a node reboot heals ------------------------------------------


def test_persistent_up_heals_a_host_whose_dockerd_restarted_and_keeps_its_overlay(
    lab: Lab, breakable: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent", sshd_port=2441)
    first = cvs(path, "up")
    assert first.returncode == 0, explain(first)
    docker(breakable, "node2", "exec", lab.name, "sh", "-c", "echo kept > /root/keep")
    before = {h: status_of(breakable, h, lab.name) for h in THREE}

    # What a reboot does to the container: dockerd goes away and comes back.
    breakable.stop_dockerd("node2")
    breakable.start_dockerd("node2")
    after_restart = status_of(breakable, "node2", lab.name)
    assert after_restart is not None and after_restart[1] == "exited", after_restart

    plan = cvs(path, "plan")
    assert plan.returncode == 0, explain(plan)
    assert "node2  restart" in plan.stdout and "node1  attach" in plan.stdout, plan.stdout

    up = cvs(path, "--json", "up")

    assert up.returncode == 0, explain(up)
    report = summary(up)
    actions = {h: v["action"] for h, v in report["hosts"].items()}
    assert actions == {"node1": "attach", "node2": "restart", "node3": "attach"}
    assert report["hosts"]["node2"]["steps"].get("restart") == "ok", report
    assert report["hosts"]["node2"]["steps"].get("sshd") == "ok", report
    assert "run" not in report["hosts"]["node2"]["steps"]
    assert any("healing" in w and "node2" in w for w in report["warnings"]), report
    # Same containers (same IDs), all running again, the overlay kept.
    assert {h: status_of(breakable, h, lab.name) for h in THREE} == before
    assert docker(breakable, "node2", "exec", lab.name, "cat", "/root/keep") == "kept"
    # The in-container sshd came back: a peer reaches node2 over it.
    hop = cvs(path, "exec", "--hosts", "node1", "--", "ssh node2 hostname")
    assert hop.returncode == 0 and "node2" in hop.stdout + hop.stderr, explain(hop)


def test_no_launch_names_the_exited_host_and_starts_nothing(lab: Lab, breakable: Sandbox) -> None:
    persistent = lab.cluster(lifetime="persistent")
    assert cvs(persistent, "up").returncode == 0
    breakable.stop_dockerd("node3")
    breakable.start_dockerd("node3")
    no_launch = lab.cluster(lifetime="no_launch")

    up = cvs(no_launch, "up")

    assert up.returncode == 4, explain(up)
    assert "exited on node3" in up.stderr, up.stderr
    assert status_of(breakable, "node3", lab.name)[1] == "exited"  # type: ignore[index]


# --- issue 10.3: failure is loud in the API -------------------------------------

# A port taken before `up` is now refused by the probe (exit 4, nothing
# started); a setup script failing on one host is what leaves it not ready.
FAILS_ON_NODE2 = """#!/bin/sh
if [ "$(hostname)" = node2 ]; then echo "no GPU driver on this node" >&2; exit 7; fi
"""


def test_up_raises_up_failed_with_per_host_reasons_when_one_host_fails_setup(
    lab: Lab, breakable: Sandbox, tmp_path: Path
) -> None:
    script = lab.directory / "setup.sh"
    script.write_text(FAILS_ON_NODE2)
    path = lab.cluster(lifetime="per_run", sshd_port=2442, setup_script=str(script))

    async def up(check: bool) -> Any:
        async with Cluster.open(path) as cluster:
            return await cluster.up(check=check)

    with pytest.raises(UpFailed) as info:
        anyio.run(up, True)
    report = anyio.run(up, False)  # check=False: the report comes back instead

    error = info.value
    assert error.exit_code == 1 and isinstance(error, CvsError)
    node2 = error.report.outcomes["node2"]
    assert not error.report.ok and str(node2.error).startswith("provision: exit code 7")
    assert "up failed on 1 of 3 hosts (node2: provision: exit code 7)" in str(error), str(error)
    assert "\n" not in str(error)
    assert not report.ok and not report.outcomes["node2"].ok
    # per_run rolled the partial start back: nothing is left running.
    assert all(status_of(breakable, h, lab.name) is None for h in THREE)

    # The pytest plugin's `cluster` fixture fails the session with the reasons.
    (tmp_path / "test_uses_cluster.py").write_text(
        "def test_one(cluster):\n    pass\n\ndef test_two(cluster):\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--cvs-orchestrator-cluster", str(path), str(tmp_path / "test_uses_cluster.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, explain(proc)
    assert "cvs: up failed (exit 1):" in proc.stdout, explain(proc)
    assert "node2: cold_start failed at provision" in proc.stdout, explain(proc)
    assert "2 errors" in proc.stdout, explain(proc)
    assert "Traceback" not in proc.stdout


def test_exec_raise_on_failure_raises_exec_failed_naming_hosts(
    lab: Lab, breakable: Sandbox
) -> None:
    path = lab.cluster(lifetime="per_run")
    assert cvs(path, "up").returncode == 0

    def run() -> tuple[dict[str, Any], ExecFailed]:
        with SyncCluster.open(path) as cluster:
            results = cluster.exec('[ "$(hostname)" != node3 ]')
            with pytest.raises(ExecFailed) as info:
                cluster.exec('[ "$(hostname)" != node3 ]', raise_on_failure=True)
            cluster.exec("true", raise_on_failure=True)  # all ok: no error
            return results, info.value

    results, error = run()
    assert [h for h, r in results.items() if not r.ok] == ["node3"]  # default: per host
    assert error.exit_code == 1 and set(error.results) == set(THREE)
    assert "command failed on 1 of 3 hosts: node3: failed (exit 1)" in str(error)


# --- issue 14.3: strict host keys, whatever ~/.ssh/config says -------------------


def test_strict_refuses_a_changed_host_key_even_when_ssh_config_turns_checking_off(
    breakable: Sandbox, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(breakable.known_hosts.read_text())
    (home / ".ssh" / "config").write_text(
        "Host *\n  UserKnownHostsFile none\n  StrictHostKeyChecking no\n"
    )
    doc = yaml.safe_load(breakable.cluster_file.read_text())
    doc["ssh"].pop("known_hosts")  # the default: ~/.ssh/known_hosts of this HOME
    doc["ssh"]["use_ssh_config"] = True
    doc["ssh"]["connect_retries"] = 0
    doc.pop("container")  # commands run on the hosts themselves
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {"HOME": str(home)}

    before = cvs(path, "exec", "--", "echo RAN-$(hostname)", env=env)
    assert before.returncode == 0, explain(before)
    assert "UserKnownHostsFile none" in before.stderr, before.stderr  # reported ...
    assert "StrictHostKeyChecking" in before.stderr, before.stderr

    node2 = breakable.host("node2")
    saved = {p: p.read_bytes() for p in (node2.host_key, node2.host_key.with_suffix(".pub"))}
    try:
        breakable.rotate_host_key("node2")
        after = cvs(path, "exec", "--", "echo RAN-$(hostname)", env=env)
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
        breakable.restart_sshd("node2")

    assert after.returncode == 3, explain(after)  # ... and not obeyed
    assert "RAN-node1" in after.stdout + after.stderr and "RAN-node3" in after.stdout + after.stderr
    assert "RAN-node2" not in after.stdout + after.stderr, explain(after)
    assert "host key" in after.stdout + after.stderr, explain(after)


# --- issue 10.2: expected conditions on live hosts, no traceback -------------------


def test_ssh_agent_absent_and_no_identity_files_is_an_auth_error_per_host(
    breakable: Sandbox, tmp_path: Path
) -> None:
    doc = yaml.safe_load(breakable.cluster_file.read_text())
    doc["ssh"]["identity_files"] = []  # the agent is the only way in, and it is gone
    doc["ssh"]["connect_retries"] = 0
    doc.pop("container")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    home = tmp_path / "home"  # no ~/.ssh/id_* keys to fall back on
    home.mkdir()

    proc = cvs(
        path,
        "exec",
        "--",
        "true",
        env={"SSH_AUTH_SOCK": str(tmp_path / "gone.sock"), "HOME": str(home)},
    )

    assert proc.returncode == 3, explain(proc)
    assert "Traceback" not in proc.stderr
    # Per host, folded (issue 25): each host is named, the error (which names
    # each host's address) is one summary line with the hostlist.
    for host in ("node1", "node2", "node3"):
        assert f"{host} ! " in proc.stderr, explain(proc)
    assert "node[1-3] (3): auth: authentication failed" in proc.stderr, explain(proc)


def test_dockerd_socket_gone_is_reported_per_host_without_traceback(
    lab: Lab, breakable: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    breakable.stop_dockerd("node3")  # the lab fixture starts it again

    status = cvs(path, "status")
    up = cvs(path, "up")
    run_in = cvs(path, "exec", "--", "true")

    for proc in (status, up, run_in):
        assert "Traceback" not in proc.stdout + proc.stderr, explain(proc)
    assert "node3: docker daemon not reachable" in status.stderr, explain(status)
    assert up.returncode == 4 and "node3" in up.stderr, explain(up)  # unknown: never absent
    assert run_in.returncode == 1 and "node3" in run_in.stdout + run_in.stderr, explain(run_in)


def test_status_exits_1_naming_the_host_whose_dockerd_is_down(lab: Lab, breakable: Sandbox) -> None:
    path = lab.cluster(lifetime="persistent")  # no container anywhere: absent is no error
    breakable.stop_dockerd("node3")
    try:
        status = cvs(path, "status")
    finally:
        breakable.start_dockerd("node3")

    assert status.returncode == 1, explain(status)
    named = [line.split(":")[0] for line in status.stderr.splitlines()]
    assert named == ["node3"], explain(status)
    assert "node3: docker daemon not reachable" in status.stderr
    assert [line.split()[0] for line in status.stdout.splitlines()[1:]] == THREE  # every row


def test_status_exits_3_when_a_host_is_unreachable_even_with_another_dockerd_down(
    lab: Lab, breakable: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    breakable.stop_sshd("node1")
    breakable.stop_dockerd("node3")
    try:
        status = cvs(path, "status")
    finally:
        breakable.start_sshd("node1")
        breakable.start_dockerd("node3")

    assert status.returncode == 3, explain(status)  # the worst wins
    assert "node1: " in status.stderr and "node3: docker daemon not reachable" in status.stderr


# --- issue 10.4: user env never widens the GPU subset -------------------------------


def test_user_visible_devices_env_never_widens_the_selected_gpus(
    lab: Lab, breakable: Sandbox, tmp_path: Path
) -> None:
    root = make_device_root({m: AMD for m in range(128, 132)})  # four stand-in GPUs
    try:
        doc = yaml.safe_load(lab.cluster(lifetime="per_run").read_text())
        doc["hosts"] = [{**h, "gpu_device_root": str(root)} for h in doc["hosts"][:1]]
        doc["env"] = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "1"}
        doc["container"]["gpus"] = {"count": 2}
        doc["container"]["env"] = {"NVIDIA_VISIBLE_DEVICES": "all", "ROCR_VISIBLE_DEVICES": "3"}
        path = tmp_path / "gpus.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

        up = cvs(path, "up")
        assert up.returncode == 0, explain(up)
        for key in ("NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES ignored"):
            assert f"env {key}" in up.stderr, up.stderr  # warned about ...
        info = json.loads(docker(breakable, "node1", "inspect", lab.name))[0]
        env = [e for e in info["Config"]["Env"] if "VISIBLE_DEVICES" in e]
        assert env == ["ROCR_VISIBLE_DEVICES=0,1"]  # ... and overridden

        ran = cvs(path, "exec", "-e", "ROCR_VISIBLE_DEVICES=0,1,2,3", "--", "env")
        assert ran.returncode == 0, explain(ran)
        seen = {
            line.split("=", 1)[0].split()[-1]: line.split("=", 1)[1]
            for line in ran.stdout.splitlines()
            if "VISIBLE_DEVICES=" in line
        }
        assert seen == {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"}, ran.stdout
        assert "env CUDA_VISIBLE_DEVICES ignored" in ran.stderr, ran.stderr
        assert "env ROCR_VISIBLE_DEVICES ignored" in ran.stderr, ran.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- issue 10.4: down --force with an unreachable host ------------------------------


def test_down_force_with_an_unreachable_host_says_what_is_left_and_the_next_one_finishes(
    lab: Lab, breakable: Sandbox, tmp_path: Path
) -> None:
    doc = yaml.safe_load(lab.cluster(lifetime="persistent").read_text())
    doc["ssh"]["connect_retries"] = 0
    path = tmp_path / "persistent.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert cvs(path, "up").returncode == 0
    breakable.stop_sshd("node2")  # the lab fixture starts it again

    first = cvs(path, "down", "--force")

    assert first.returncode == 3, explain(first)
    assert "down: removed on 2 host(s); left on 1:" in first.stdout, explain(first)
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("  node2: ")]
    assert f"container {lab.name} may still be there" in line, line
    assert "connection refused" in line, line  # why: the host could not be reached
    assert "rerun `cvs down --force` once the host is reachable" in line, line
    assert [status_of(breakable, h, lab.name) is None for h in THREE] == [True, False, True]

    breakable.start_sshd("node2")
    second = cvs(path, "--json", "down", "--force")

    assert second.returncode == 0, explain(second)
    assert summary(second)["left"] == {}
    assert all(status_of(breakable, h, lab.name) is None for h in THREE)


def test_persistent_up_unpauses_a_paused_container_without_reprovisioning(
    lab: Lab, breakable: Sandbox
) -> None:
    path = lab.cluster(lifetime="persistent")
    assert cvs(path, "up").returncode == 0
    before = {h: status_of(breakable, h, lab.name) for h in THREE}
    docker(breakable, "node3", "pause", lab.name)

    up = cvs(path, "--json", "up")

    assert up.returncode == 0, explain(up)
    report = summary(up)
    assert report["hosts"]["node3"]["action"] == "restart", report
    assert report["hosts"]["node3"]["steps"] == {"restart": "ok", "verify": "ok"}, report
    assert "`docker unpause`" in report["hosts"]["node3"]["reason"]
    assert {h: status_of(breakable, h, lab.name) for h in THREE} == before  # running again


# --- issue 14.6: commands run on exactly the selected hosts --------------------------


def test_exec_runs_on_exactly_the_hosts_a_hostlist_selects(
    breakable: Sandbox, tmp_path: Path
) -> None:
    doc = yaml.safe_load(breakable.cluster_file.read_text())
    doc.pop("container")
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def ran_on(pattern: str) -> set[str]:
        proc = cvs(path, "--json", "exec", "--hosts", pattern, "--", "hostname")
        assert proc.returncode == 0, explain(proc)
        return set(summary(proc)["hosts"])

    assert ran_on("node[1,3]") == {"node1", "node3"}  # commas inside brackets do not split
    assert ran_on("node[2-3]") == {"node2", "node3"}
    assert ran_on("node[1-2],node3") == set(THREE)
    assert ran_on("node?") == set(THREE)
    refused = cvs(path, "exec", "--hosts", "node[1-3,7]", "--", "hostname")
    assert refused.returncode == 2 and "node7" in refused.stderr, explain(refused)
    assert "Traceback" not in refused.stderr
