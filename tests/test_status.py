"""`cvs status`'s exit code from the probed hosts (pure): the worst that applies.

The same cases against the real sandbox (a dockerd stopped, an sshd stopped, no
docker access, containers absent or stopped) are in tests/test_heal.py and
tests/test_lifecycle.py.
"""

from __future__ import annotations

import pytest

from orchestrator.containers.probe import HostState, parse_probe_output
from orchestrator.containers.status import HostStatus, host_status, status_exit_code
from orchestrator.errors import ExitCode
from orchestrator.limits.resources import EffectiveResources


def row(state: HostState) -> HostStatus:
    return host_status(
        state,
        resources=EffectiveResources(),
        sshd_wanted=False,
        script_sha256="a" * 64,
        config_hash="h",
    )


HEALTHY = HostState(host="node1", access="direct", container="running")


@pytest.mark.parametrize("container", ["running", "exited", "other", "absent"])
def test_a_container_in_any_state_docker_reported_exits_0(container: str) -> None:
    state = HostState(host="node2", access="sudo", container=container)  # type: ignore[arg-type]
    assert status_exit_code([row(HEALTHY), row(state)]) == ExitCode.OK


@pytest.mark.parametrize(
    "state",
    [
        HostState(host="node2", error="docker daemon not reachable", error_kind="daemon_down"),
        HostState(host="node2", access="none", error="no docker", error_kind="no_runtime"),
        HostState(host="node2", access="none", error="no access", error_kind="no_access"),
        parse_probe_output("node2", 0, "@@cvs:probe 3\nnot a frame\n", ""),
    ],
    ids=["daemon_down", "no_runtime", "no_access", "garbled"],
)
def test_a_reached_host_whose_docker_state_is_unknown_exits_1(state: HostState) -> None:
    assert state.reachable and not state.known  # what the probe makes of it
    assert status_exit_code([row(HEALTHY), row(state)]) == ExitCode.FAILED


def test_an_unreachable_host_exits_3_even_next_to_a_dockerd_down() -> None:
    unreachable = HostState.unreachable("node2", "connection refused")
    down = HostState(host="node3", error="docker daemon not reachable", error_kind="daemon_down")
    rows = [row(HEALTHY), row(unreachable), row(down)]
    assert status_exit_code(rows) == ExitCode.UNREACHABLE


def test_what_could_not_be_probed_is_null_never_a_guess() -> None:
    """Issue 25: an unreachable host used to read `stale: false`,
    `provisioned: "no"`, `drift: []` and `"-"`/`"?"` strings."""
    unreachable = HostState(host="node3", reachable=False, error="connect timed out")
    doc = row(unreachable).to_dict()
    assert doc == {
        "host": "node3",
        "reachable": False,
        "access": None,
        "docker": None,  # deprecated: "access"
        "state": "unknown",
        "image": None,
        "tag": None,
        "stale": None,
        "sshd": None,
        "provisioned": None,
        "limits": EffectiveResources().describe(),
        "drift": None,
        "error": "connect timed out",
        "init": None,
    }


def test_a_container_made_without_an_init_is_noted_one_made_with_it_is_not() -> None:
    old = HostState(
        host="node1", access="direct", container="running", container_id="c1", init=False
    )
    new = HostState(
        host="node1", access="direct", container="running", container_id="c1", init=True
    )
    assert (row(old).to_dict()["init"], row(new).to_dict()["init"]) == (False, True)
    assert "without an init" in (row(old).init_note() or "")
    assert row(new).init_note() is None


def test_a_probed_host_without_a_container_says_so_not_unknown() -> None:
    doc = row(HostState(host="node2", access="direct", container="absent")).to_dict()
    assert (doc["stale"], doc["provisioned"], doc["drift"], doc["image"]) == (False, "no", [], None)


def test_a_question_mark_for_an_exited_container_comes_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 30: `?` with no reason for an exited container."""
    from orchestrator.cli.common import CLI_STYLE
    from orchestrator.render import print_status_lines

    exited = HostState(host="node3", access="direct", container="exited", container_status="exited")
    rows = [
        host_status(
            s,
            resources=EffectiveResources(),
            sshd_wanted=True,
            script_sha256="a" * 64,
            config_hash="h",
        )
        for s in (HEALTHY, exited)
    ]
    print_status_lines(rows, wide=True, style=CLI_STYLE)
    out, err = capsys.readouterr()
    table = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert "?" in table["node3"], out
    (reason,) = [line for line in err.splitlines() if line.startswith("node3: ")]
    assert "not known while the container is exited (`cvs up` starts it again)" in reason, err


def test_the_old_docker_names_still_read_and_say_they_are_deprecated() -> None:
    state = HostState(host="n1", access="sudo", container="absent")
    with pytest.warns(DeprecationWarning, match="HostState.access"):
        assert state.docker_access == "sudo"
    status = row(state)
    with pytest.warns(DeprecationWarning, match="HostStatus.access"):
        assert status.docker == "sudo"
    assert status.to_dict()["docker"] == status.to_dict()["access"] == "sudo"
