"""The runtime seam as pure logic: how each runtime is reached and spelled,
what the probe's podman output means, what rootless can and cannot cap."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator import remote
from orchestrator.config import ContainerConfig
from orchestrator.config.rootless import rootless_notes
from orchestrator.containers.argv import remove_started_by_command
from orchestrator.containers.exec import container_command
from orchestrator.containers.inspection import (
    ContainerLimits,
    parse_container_inspect,
    parse_image_inspect,
    runtime_limits,
)
from orchestrator.containers.probe import parse_probe_output, probe_argv
from orchestrator.limits.resources import EffectiveResources
from orchestrator.limits.rootless import rootless_cap_refusal
from orchestrator.remote.runtime import ContainerRuntime as Runtime

HEX = "a" * 64
IMG = "b" * 64


@pytest.mark.parametrize(
    ("runtime", "prefix"),
    [
        (Runtime("direct", "docker"), ["docker"]),
        (Runtime("sudo", "docker"), ["sudo", "-n", "docker"]),
        (Runtime("direct", "podman"), ["podman"]),
        (Runtime("sudo", "podman"), ["sudo", "-n", "podman"]),
        (Runtime("direct", "podman", rootless=True), ["podman"]),
    ],
)
def test_each_runtime_and_access_has_one_prefix(runtime, prefix):
    assert runtime.prefix == prefix


def test_rootless_is_podman_without_sudo_only():
    with pytest.raises(ValueError, match="no sudo"):
        Runtime("sudo", "podman", rootless=True)
    with pytest.raises(ValueError, match="no sudo"):
        Runtime("direct", "docker", rootless=True)


def test_names_are_filtered_the_way_each_runtime_prints_them():
    assert Runtime(None, "docker").name_filter("c") == "name=^/c$"
    assert Runtime(None, "podman").name_filter("c") == "name=^c$"
    text = remove_started_by_command(
        ["sudo", "-n", "podman"], "c", "0123456789abcdef", name_filter="name=^c$"
    )
    assert "--filter 'name=^c$'" in text and "sudo -n podman ps" in text


def _access(tmp_path, flag: list[str], uid: str) -> str:
    """What remote/access.sh decides, with `id -u` answering `uid`."""
    (tmp_path / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (tmp_path / "id").chmod(0o755)
    script = (
        remote.source("access") + 'cvs_runtime "$1"; cvs_docker_order; echo "$cvs_rt $cvs_order"'
    )
    out = subprocess.run(
        ["sh", "-c", script, "t", *(flag or [""])],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "DOCKER_HOST": "tcp://x:1"},
        check=True,
    )
    return out.stdout.strip()


def test_rootful_podman_is_plain_only_for_root_never_the_users_rootless_store(tmp_path):
    assert _access(tmp_path, ["--podman"], "1001") == "podman sudo"
    assert _access(tmp_path, ["--podman"], "0") == "podman direct"
    assert _access(tmp_path, ["--podman-rootless"], "1001") == "podman direct"
    assert _access(tmp_path, [], "1001") == "docker direct sudo"


def test_docker_hosts_get_the_programs_exactly_as_before():
    # No runtime flag for docker: runtime.sh and probe.sh see the arguments
    # they always did.
    tail = ["inspect", "-f", "{{.Image}}", "c"]
    assert Runtime().read(tail) == remote.argv("runtime", "read", *tail)
    assert len(probe_argv(None, "c", sshd_port=2224, marker_path="/m")) == 11


def test_a_podman_exec_never_falls_back_to_docker():
    cmd = container_command("c", "true", runtime=Runtime.unprobed("podman"))
    assert "cvs-runtime --podman running c" in cmd.script
    assert "cvs-runtime --podman read exec" in cmd.kill
    known = container_command("c", "true", runtime=Runtime("sudo", "podman"))
    assert "exec sudo -n podman exec" in known.script


def test_podman_image_ids_read_as_docker_prints_them():
    container = {"Id": HEX, "Name": "c", "Image": IMG, "State": {"Status": "running"}}
    assert parse_container_inspect(json.dumps(container)).image_id == f"sha256:{IMG}"
    image = {"Id": IMG, "RepoDigests": [], "RepoTags": ["localhost/x:1"]}
    assert parse_image_inspect(json.dumps(image)).id == f"sha256:{IMG}"


@pytest.mark.parametrize(("status", "state"), [("stopped", "exited"), ("configured", "exited")])
def test_podmans_own_words_for_a_stopped_container_mean_exited(status, state):
    doc = {"Id": HEX, "Name": "c", "Image": IMG, "State": {"Status": status, "Running": False}}
    assert parse_container_inspect(json.dumps(doc)).state == state


def test_podmans_default_limits_read_as_unset():
    got = runtime_limits("podman", ContainerLimits(pids_limit=2048, shm_size=65536000))
    assert (got.pids_limit, got.shm_size) == (None, 64 * 1024**2)
    assert runtime_limits("podman", ContainerLimits(pids_limit=300)).pids_limit == 300
    assert runtime_limits("docker", ContainerLimits(pids_limit=2048)).pids_limit == 2048


def _podman_probe_output(*, container: bool, cgroup: str | None = None) -> str:
    obj = {"Id": HEX, "Name": "c", "Image": IMG, "State": {"Status": "running", "Running": True}}
    image = {"Id": IMG, "RootFS": {}, "RepoDigests": []}
    lines = ["@@cvs:probe 3", "@@cvs:runtime podman rootless", "@@cvs:args c img:1"]
    if cgroup:
        lines.append(f"@@cvs:cgroup {cgroup}")
    lines.append("@@cvs:section inspect.direct 0 raw")
    if container:
        lines.append("J " + json.dumps(obj))
    else:
        lines.append("E Error: No such object: c")
    lines += ["J " + json.dumps(image), "@@cvs:end inspect.direct", "@@cvs:done"]
    return "\n".join(lines) + "\n"


def test_a_podman_probe_says_which_runtime_answered_and_how():
    state = parse_probe_output("n1", 0, _podman_probe_output(container=True, cgroup="v1"), "")
    assert state.runtime == Runtime("direct", "podman", rootless=True)
    assert state.runtime.prefix == ["podman"]
    assert state.container == "running" and state.container_image_id == f"sha256:{IMG}"
    assert state.tag_image_id == f"sha256:{IMG}"
    assert state.cgroup == "v1"


def test_cgroup_controllers_from_a_host_are_kept_only_when_they_look_like_names():
    text = _podman_probe_output(container=False, cgroup="v2 cpu memory $(rm) pids")
    state = parse_probe_output("n1", 0, text, "")
    assert state.container == "absent"
    assert state.cgroup_controllers == ("cpu", "memory", "pids")


def test_a_docker_cluster_on_a_podman_host_is_refused_naming_both():
    text = "\n".join(
        [
            "@@cvs:probe 3",
            "@@cvs:runtime docker rootful",
            "@@cvs:args c",
            "@@cvs:section inspect.direct 1 raw",
            "E Cannot connect to the Docker daemon at unix:///x.sock",
            "@@cvs:end inspect.direct",
            "@@cvs:other podman",
            "@@cvs:done",
        ]
    )
    state = parse_probe_output("n1", 0, text, "")
    assert not state.known
    assert state.error is not None
    assert state.error_kind == "daemon_down"  # docker's own verdict, unchanged
    assert state.error.startswith("docker daemon not reachable")
    assert "this host has podman" in state.error and "container.runtime: podman" in state.error


def test_a_podman_cluster_on_a_docker_only_host_is_refused_naming_both():
    # The sandbox cannot build this host (podman is installed machine-wide):
    # the probe's own output for it, as remote/probe.sh prints it.
    text = "\n".join(
        [
            "@@cvs:probe 3",
            "@@cvs:runtime podman rootful",
            "@@cvs:args c",
            "@@cvs:section inspect.sudo 1 raw",  # sudo's exit code, not the shell's 127
            "E sudo: podman: command not found",
            "@@cvs:end inspect.sudo",
            "@@cvs:other docker",
            "@@cvs:done",
        ]
    )
    state = parse_probe_output("n1", 0, text, "")
    assert not state.known
    assert state.error is not None and state.error_kind == "no_runtime"
    assert state.error.startswith("podman is not installed or not on PATH")
    assert "this host has docker" in state.error and "container.runtime: docker" in state.error


def test_no_sudo_for_podman_names_the_fix():
    text = "\n".join(
        [
            "@@cvs:probe 3",
            "@@cvs:runtime podman rootful",
            "@@cvs:args c",
            "@@cvs:section inspect.sudo 1 raw",
            "E sudo: a password is required",
            "@@cvs:end inspect.sudo",
            "@@cvs:done",
        ]
    )
    state = parse_probe_output("n1", 0, text, "")
    assert state.error_kind == "no_access"
    assert "passwordless `sudo -n podman`" in (state.error or "")


def test_a_rootless_podman_probe_names_its_runtime_and_parses_as_sh(tmp_path):
    argv = probe_argv(
        ContainerConfig(image="img:1", runtime="podman"),
        "c",
        sshd_port=2224,
        marker_path="/var/lib/cvs/provisioned",
        runtime=Runtime.unprobed("podman", rootless=True),
    )
    assert argv[-1] == "--podman-rootless"
    (tmp_path / "probe.sh").write_text(argv[2])
    checked = subprocess.run(["sh", "-n", str(tmp_path / "probe.sh")], capture_output=True)
    assert checked.returncode == 0, checked.stderr


EFF = EffectiveResources(memory_bytes=256 * 1024**2, pids=100)


@pytest.mark.parametrize(
    ("cgroup", "controllers", "says"),
    [
        ("v1", (), "cannot apply resources.memory, resources.pids on cgroups v1"),
        ("v2", ("cpu",), "has no memory, pids controller"),
        (None, (), "cgroup version is unknown"),
    ],
)
def test_rootless_caps_a_host_cannot_apply_are_refused(cgroup, controllers, says):
    why = rootless_cap_refusal("n1", EFF, cgroup, controllers)
    assert why is not None and says in why and why.startswith("host n1:")


def test_rootless_caps_with_delegated_controllers_pass():
    assert rootless_cap_refusal("n1", EFF, "v2", ("cpu", "memory", "pids")) is None
    assert rootless_cap_refusal("n1", EffectiveResources(), "v1", ()) is None


def test_validate_says_what_rootless_cannot_give():
    cfg = ContainerConfig(
        image="img:1",
        runtime="podman",
        rootless=True,
        resources={"memory": "1Gi"},
        ulimits={"memlock": -1},
        cap_add=["IPC_LOCK", "SYS_PTRACE"],
        devices=["/dev/kfd"],
    )
    notes = rootless_notes(cfg)
    assert any("resources.memory" in n and "cgroups v1" in n for n in notes)
    assert any("ulimits.memlock=-1" in n for n in notes)
    assert any("cap_add IPC_LOCK" in n and "SYS_PTRACE" not in n for n in notes)
    assert any("keep-groups" in n and "crun" in n for n in notes)
    assert any("ipc: host needs /dev/mqueue" in n for n in notes)
    assert rootless_notes(ContainerConfig(image="img:1", runtime="podman")) == []


PODMAN_STAND_IN = f"""
case "$1 $2" in
  "container inspect") echo "Error: inspecting object: no such container $5" >&2; exit 125 ;;
  "image inspect") echo 'J {{"Id": "{IMG}", "RootFS": {{}}, "RepoDigests": []}}' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def _bin(tmp_path, **scripts: str) -> dict[str, str]:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (d / name).write_text("#!/bin/sh\n" + body)
        (d / name).chmod(0o755)
    return {"PATH": f"{d}:/usr/bin:/bin", "HOME": str(tmp_path)}


def _run_probe(env: dict[str, str], runtime: Runtime):
    cfg = ContainerConfig(image="img:1", runtime="podman", rootless=runtime.rootless)
    argv = probe_argv(cfg, "c", sshd_port=2224, marker_path="/m", runtime=runtime)
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return parse_probe_output("h", out.returncode, out.stdout, out.stderr)


def test_the_real_probe_reaches_rootless_podman_plainly_and_reports_cgroups(tmp_path):
    env = _bin(tmp_path, podman=PODMAN_STAND_IN)

    state = _run_probe(env, Runtime.unprobed("podman", rootless=True))

    assert state.runtime == Runtime("direct", "podman", rootless=True)
    assert state.container == "absent" and state.tag_image_id == f"sha256:{IMG}"
    assert state.cgroup in ("v1", "v2")


def test_the_real_probe_reaches_rootful_podman_through_sudo_when_not_root(tmp_path):
    env = _bin(
        tmp_path,
        podman=PODMAN_STAND_IN,
        id="echo 1001\n",
        sudo='[ "$1" = -n ] && shift; exec "$@"\n',
    )

    state = _run_probe(env, Runtime.unprobed("podman"))

    assert state.runtime == Runtime("sudo", "podman")
    assert state.container == "absent" and state.cgroup is None


def test_the_plan_lists_a_rootless_cap_refusal_before_anything_starts():
    from orchestrator.containers.plan.lifetimes import decide_plan
    from orchestrator.containers.probe import HostState

    cfg = ContainerConfig(image="img:1", runtime="podman", rootless=True, lifetime="per_run")
    state = HostState(
        "n1",
        access="direct",
        container="absent",
        runtime_name="podman",
        rootless=True,
        cgroup="v1",
        tag_image_id=f"sha256:{IMG}",
    )

    plan = decide_plan(cfg, {"n1": state}, resources={"n1": EFF})

    assert plan.refused
    assert [r.kind for r in plan.refusals] == ["rootless_caps"]
    assert plan.refusals[0].hosts == ("n1",)
