"""Messages name the cluster's runtime: a podman host is never told about docker.

Pure parts, table by table: the hang and cause texts (remote/runtime.py,
containers/causes.py), the planner's refusals and warnings, the run-error
hints; and remote/diagnose.sh under dash with a stand-in `podman` on PATH
(it must ask podman, and format podman's times as one word). The hung-podman
case end to end is in tests/test_podman.py.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from plan_states import cfg, host, states

from orchestrator import remote
from orchestrator.config import load_cluster
from orchestrator.containers.causes import (
    ContainerFacts,
    container_cause,
    diagnosis_command,
    hung_cause,
    read_diagnosis,
)
from orchestrator.containers.hints import hint_for
from orchestrator.containers.plan.images import check_tag_identity
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.remote.runtime import ContainerRuntime, runtime_hung

NOW = 1_800_000_000.0
DOCKER_WORD = re.compile(r"\bdocker", re.IGNORECASE)


def never_says_docker(text: str) -> bool:
    # container.runtime_timeout is the setting's name, the same on both runtimes.
    return not DOCKER_WORD.search(text.replace("container.runtime_timeout", ""))


def test_a_hung_podman_is_named_with_the_bound_and_where_to_look() -> None:
    text = runtime_hung("podman", 5, "the probe")

    assert text.startswith(
        "podman did not answer within container.runtime_timeout (5s) on the probe"
    )
    assert "podman has no daemon" in text and "storage lock" in text
    assert never_says_docker(text), text


def test_a_hung_docker_keeps_its_words() -> None:
    assert runtime_hung("docker", 5, "the probe") == (
        "docker did not answer within container.runtime_timeout (5s) on the probe: the "
        "container runtime on this host is hung or overloaded (is dockerd stopped or frozen?)"
    )


CAUSES = [
    ContainerFacts(now=NOW, error="Cannot connect to the Docker daemon at unix:///x"),
    ContainerFacts(now=NOW, error="Error: something else"),
    ContainerFacts(now=NOW, container_id="a" * 64, status="exited", oom_killed=True),
    ContainerFacts(
        now=NOW,
        container_id="a" * 64,
        status="running",
        started_at=NOW - 5,
        pidfile_left=True,
        command_started=NOW - 20,
    ),
]


@pytest.mark.parametrize("facts", CAUSES)
def test_what_happened_to_a_podman_container_is_said_in_podmans_name(
    facts: ContainerFacts,
) -> None:
    docker_cause = container_cause(facts, elapsed=30)
    podman_cause = container_cause(facts, elapsed=30, runtime="podman")

    assert docker_cause is not None and "docker" in docker_cause
    assert podman_cause is not None and "podman" in podman_cause
    assert never_says_docker(str(podman_cause).replace(str(facts.error), "")), podman_cause


def test_a_podman_diagnosis_that_hung_or_said_nothing_names_podman() -> None:
    assert read_diagnosis("", "podman").error == "no answer from podman"
    assert read_diagnosis("now 1\nerror \n", "podman").error == "podman failed"
    hung = hung_cause(5, "podman")
    assert hung.startswith("podman did not answer within container.runtime_timeout (5s)")
    assert never_says_docker(hung), hung


def test_the_diagnosis_asks_the_hosts_runtime() -> None:
    podman = ContainerRuntime("sudo", "podman")
    rootless = ContainerRuntime("direct", "podman", rootless=True)

    assert diagnosis_command("ctr", podman)[-2:] == ["--podman", "ctr"]
    assert diagnosis_command("ctr", rootless)[-2:] == ["--podman-rootless", "ctr"]
    assert diagnosis_command("ctr", ContainerRuntime("direct"))[-2:] == ["cvs-diagnose", "ctr"]
    assert diagnosis_command("ctr")[-2:] == ["cvs-diagnose", "ctr"]


FAKE_PODMAN = """#!/bin/sh
# A stand-in podman: records its argv, answers like podman 4.3 would.
printf '%s\\n' "$@" > "$STATE_FILE"
echo "{ID} exited false 137 2027-01-15T08:00:00.123456789Z 2027-01-15T08:00:30.000000000+01:00 0"
"""


def diagnose_with(
    tmp_path: Path, stand_in: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """remote/diagnose.sh ARGS under dash, as root on a podman host (plain
    podman, no sudo, as the access rule says), with `stand_in` as podman;
    the stand-in may write to $STATE_FILE (returned)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(stand_in.replace("{ID}", "a" * 64))
    fake.chmod(0o755)
    state = tmp_path / "state"
    proc = subprocess.run(
        ["dash", "-c", remote.program("diagnose"), "cvs-diagnose", "--podman-rootless", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE_FILE": str(state)},
    )
    return proc, state


def test_diagnose_sh_on_a_podman_host_asks_podman_for_one_word_times(tmp_path: Path) -> None:
    proc, args_file = diagnose_with(tmp_path, FAKE_PODMAN, "ctr")

    assert proc.returncode == 0, proc.stderr
    asked = args_file.read_text().splitlines()
    assert asked[:3] == ["inspect", "--type", "container"] and asked[-1] == "ctr"
    template = asked[4]
    assert '{{.State.StartedAt.Format "2006-01-02T15:04:05.000000000Z07:00"}}' in template
    facts = read_diagnosis(proc.stdout, "podman")
    assert facts.status == "exited" and facts.exit_code == 137
    assert facts.started_at is not None and facts.finished_at is not None


STALE_PODMAN = """#!/bin/sh
# A stand-in podman whose first inspect still says "running" (the runtime has
# not yet recorded the stop the kernel already made) and which cannot start a
# process in the container; its next inspect says exited.
case $1 in
  exec) echo "Error: container state improper" >&2; exit 125 ;;
esac
n=$(cat "$STATE_FILE" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE_FILE"
if [ "$n" -eq 0 ]; then state=running; else state=exited; fi
echo "{ID} $state false 137 2027-01-15T08:00:00.123456789Z 2027-01-15T08:00:30.000000000Z 0"
"""


def test_diagnose_sh_looks_again_when_running_is_stale_and_nothing_starts_in_it(
    tmp_path: Path,
) -> None:
    proc, _ = diagnose_with(tmp_path, STALE_PODMAN, "ctr", "/tmp/cvs-run-1.pid")

    assert proc.returncode == 0, proc.stderr
    facts = read_diagnosis(proc.stdout, "podman")
    assert facts.status == "exited", proc.stdout
    assert facts.pidfile_left is None  # nothing was read in a container that is not running
    cause = container_cause(facts, elapsed=5.0, runtime="podman", exit_code=137)
    assert cause is not None and "kept running" not in str(cause)
    assert "stopped" in str(cause)


# --- the planner ---------------------------------------------------------------------


def podman_host(name: str, container: str | None, **kw: object) -> object:
    return replace(host(name, container, **kw), runtime_name="podman")  # type: ignore[arg-type]


def test_a_podman_host_of_unknown_state_is_told_how_to_reach_podman() -> None:
    plan = decide_plan(
        cfg("persistent", runtime="podman"),
        states(host("n1", "running"), host("n2", None)),
    )

    text = " ".join(w.text for r in plan.refusals for w in r.ways_out)
    assert plan.refused and "podman installed" in text and "sudo -n podman" in text
    assert never_says_docker(text), text


def test_a_rootless_podman_host_of_unknown_state_is_told_about_the_login_users_podman() -> None:
    plan = decide_plan(
        cfg("persistent", runtime="podman", rootless=True),
        states(host("n1", "running"), host("n2", None)),
    )

    text = " ".join(w.text for r in plan.refusals for w in r.ways_out)
    assert "the login user's own podman" in text and never_says_docker(text), text


def test_podman_restart_and_healing_name_podmans_verbs() -> None:
    plan = decide_plan(
        cfg("persistent", runtime="podman"),
        states(host("n1", "running"), host("n2", "exited")),
    )

    assert plan.actions["n2"].kind == "restart"
    assert "`podman start`" in plan.actions["n2"].reason
    healing = [w for w in plan.warnings if w.startswith("healing")]
    assert healing and all(never_says_docker(w) for w in healing), plan.warnings


def test_podman_refusals_name_podmans_verbs() -> None:
    unreadable = decide_plan(
        cfg("persistent", runtime="podman"),
        states(host("n1", "running"), host("n2", "running", readable=False)),
    )
    partial = decide_plan(
        cfg("persistent", runtime="podman"),
        states(host("n1", "running"), host("n2", "absent")),
    )
    missing = decide_plan(
        cfg("per_run", runtime="podman", pull="never"),
        states(host("n1", "absent", tag=None), host("n2", "absent")),
    )
    skew = check_tag_identity(
        {
            "n1": replace(host("n1", "absent"), runtime_name="podman"),
            "n2": replace(host("n2", "absent", tag="sha256:" + "b" * 64), runtime_name="podman"),
        }
    )

    for plan in (unreadable, partial, missing):
        assert plan.refused
        ways = " ".join(w.text for r in plan.refusals for w in r.ways_out)
        assert "podman" in ways and never_says_docker(ways), ways
    ways = " ".join(w.text for r in skew for w in r.ways_out)
    assert "`podman save`" in ways and never_says_docker(ways), ways


# --- run-error hints -----------------------------------------------------------------

PODMAN_CLUSTER = """\
hosts: [node1]
container:
  image: img:1
  runtime: podman
  privileged: true
  devices: [/dev/kfd, /dev/nonexist]
  cap_add: [SYS_PTRACE, BOGUS]
  group_add: [video, render]
  ulimits:
    memlock: -1
  shm_size: 1000T
  extra_args: [--runtime, nvidia]
"""

# Refusals in podman's shape ("Error: " and runc's own words, which the rules
# match): the hint is the same setting's, in podman's name.
PODMAN_ERRORS = [
    "Error: runc: runc create failed: unable to start container process: error during "
    "container init: error setting rlimits for ready process: error setting rlimit type 8: "
    "operation not permitted: OCI permission denied",
    "Error: unable to find group render: no matching entries in group file",
    "Error: runc: runc create failed: unable to start container process: unable to apply "
    "caps: operation not permitted: OCI permission denied",
    'Error: unknown capability "CAP_BOGUS"',
    "Error: stat /dev/nonexist: no such file or directory: no such device /dev/nonexist",
    "Error: invalid size: shm size too large",
    "Error: unknown or invalid runtime name: nvidia",
]


@pytest.mark.parametrize("error", PODMAN_ERRORS)
def test_a_podman_run_error_hint_speaks_of_podman(tmp_path: Path, error: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(PODMAN_CLUSTER)
    container = load_cluster(path, check_files=False).container

    hint = hint_for(error, container)

    assert hint is not None, error
    assert "podman" in hint.fix and never_says_docker(hint.fix), hint.fix


def test_podmans_own_nofile_maximum_is_named_when_only_another_ulimit_was_set(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "hosts: [node1]\ncontainer:\n  image: img:1\n  runtime: podman\n"
        "  ulimits:\n    memlock: 8388608\n"
    )
    container = load_cluster(path, check_files=False).container
    # What this machine printed for a CVS file's `ulimit: [memlock=8388608]` on podman.
    error = (
        "Error: runc: runc create failed: unable to start container process: error during "
        "container init: error setting rlimits for ready process: error setting rlimit type 7: "
        "operation not permitted: OCI permission denied"
    )

    hint = hint_for(error, container)

    assert hint is not None and hint.key == "container.ulimits", hint
    assert "podman raises nofile to its maximum" in hint.fix and "ulimits.nofile" in hint.fix


def test_the_status_tables_access_column_is_named_for_the_clusters_runtime() -> None:
    import io

    from orchestrator.containers.status import HostStatus
    from orchestrator.render.live import print_status_table

    def row(runtime: str) -> HostStatus:
        return HostStatus(
            "n1", True, "sudo", "running", None, None, "off", "yes", None, runtime=runtime
        )

    tables = {}
    for runtime in ("docker", "podman"):
        out = io.StringIO()
        print_status_table([row(runtime)], wide=True, plain=True, out=out)
        tables[runtime] = out.getvalue().splitlines()[0].split()

    assert tables["docker"][:3] == ["host", "reachable", "docker"]
    assert tables["podman"][:3] == ["host", "reachable", "podman"]
    assert row("podman").to_dict()["docker"] == "sudo"  # the --json key stays
