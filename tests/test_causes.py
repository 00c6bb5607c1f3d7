"""Issue 22, the pure parts: causes read from docker's facts and a command's
output, and an `up` report after a rollback. The real faults are in
tests/test_faults.py; these pin the decisions table by table."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from outcomes import failing_outcome

from orchestrator.containers.causes import (
    OOM_LINE,
    ContainerFacts,
    container_cause,
    output_cause,
    peers_cause,
    pull_cause,
    read_diagnosis,
    wants_diagnosis,
    with_cause,
)
from orchestrator.containers.exec import launches_mpi
from orchestrator.containers.outcome import HostOutcome, UpReport
from orchestrator.containers.plan.model import HostAction, Plan
from orchestrator.results import HostResult
from orchestrator.suites.model import Step
from orchestrator.suites.records import StepOutcome
from orchestrator.suites.runner import judge

NOW = 1_800_000_000.0


def facts(**kw: object) -> ContainerFacts:
    base: dict[str, object] = {
        "now": NOW,
        "container_id": "a" * 64,
        "status": "running",
        "started_at": NOW - 3600,
    }
    return ContainerFacts(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (facts(), None),
        (
            facts(started_at=NOW - 5, pidfile_left=True, command_started=NOW - 20),
            "the container restarted while the command ran",
        ),
        (facts(status="exited", exit_code=137, finished_at=NOW - 1), "stopped while the command"),
        (facts(status="exited", oom_killed=True), "out-of-memory killer (docker: OOMKilled)"),
        (facts(status="exited", finished_at=NOW - 3600), "the container stopped (now exited"),
        (
            ContainerFacts(now=NOW, error="Cannot connect to the Docker daemon at unix:///x"),
            "the container runtime went away",
        ),
        (
            ContainerFacts(now=NOW, error="Error: No such container: c"),
            "removed while the command ran",
        ),
    ],
)
def test_container_cause_names_what_happened_to_the_container(
    given: ContainerFacts, expected: str | None
) -> None:
    cause = container_cause(given, elapsed=30)
    if expected is None:
        assert cause is None
    else:
        assert cause is not None and expected in cause, cause


@pytest.mark.parametrize(
    ("given", "code"),
    [
        # Started a second before the command; the command removed its pidfile.
        (facts(started_at=NOW - 2, pidfile_left=False, command_started=None), 255),
        (facts(started_at=NOW - 2, pidfile_left=False, command_started=None), 137),
        # The pidfile left behind, but the container started before the command.
        (facts(started_at=NOW - 30, pidfile_left=True, command_started=NOW - 20), 255),
        # Nothing read in the container (an older host, exec refused).
        (facts(started_at=NOW - 5), 137),
    ],
)
def test_no_restart_is_said_without_the_evidence_of_one(given: ContainerFacts, code: int) -> None:
    cause = container_cause(given, elapsed=30, exit_code=code)
    assert cause is None or "restarted while" not in cause, cause


def test_an_exit_code_past_128_is_named_as_a_signal_only_beside_the_containers_facts() -> None:
    kept = facts(started_at=NOW - 3600, pidfile_left=False)
    assert container_cause(kept, elapsed=30, exit_code=255) is None
    said = container_cause(kept, elapsed=30, exit_code=137)
    assert said == (
        "what a shell reports for a process killed by signal 9 (SIGKILL); "
        "the container kept running (not restarted, not stopped)"
    )


def test_read_diagnosis_reads_the_pidfile_line() -> None:
    state = "state " + "a" * 64 + " running false 0 2027-01-15T08:00:00Z 0001-01-01T00:00:00Z 0"
    left = read_diagnosis(f"now 1800000000\n{state}\npidfile left 1799999990.25\n")
    assert left.pidfile_left is True and left.command_started == 1799999990.25
    busybox = read_diagnosis(f"now 1\n{state}\npidfile left 1799999990\n")
    assert busybox.command_started == 1799999990.0
    gone = read_diagnosis(f"now 1\n{state}\npidfile gone\n")
    assert gone.pidfile_left is False and gone.command_started is None
    assert read_diagnosis(f"now 1\n{state}\n").pidfile_left is None


def test_read_diagnosis_parses_docker_times_and_flags() -> None:
    text = (
        "now 1800000000\n"
        f"state {'b' * 64} exited true 137 2027-01-15T08:00:00.123456789Z "
        "2027-01-15T08:00:30Z 2\n"
    )
    got = read_diagnosis(text)
    assert got.status == "exited" and got.oom_killed and got.exit_code == 137
    assert got.restarts == 2 and got.now == NOW
    assert got.finished_at is not None and got.started_at is not None
    assert got.finished_at - got.started_at == pytest.approx(29.876, abs=0.01)


def test_read_diagnosis_of_a_never_finished_container_has_no_finish_time() -> None:
    got = read_diagnosis(
        f"now 1\nstate {'c' * 64} running false 0 2027-01-15T08:00:00Z 0001-01-01T00:00:00Z 0\n"
    )
    assert got.finished_at is None and got.status == "running"


def test_read_diagnosis_of_garbage_says_docker_did_not_answer() -> None:
    assert read_diagnosis("").error == "no answer from docker"


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (f"Killed\n{OOM_LINE} memory cgroup oom_kill 0 -> 1\n", "out-of-memory killer"),
        ("cp: error writing 'x': No space left on device\n", "the disk is full"),
        ("plain failure\n", None),
    ],
)
def test_output_cause_reads_the_wrapper_line_and_enospc(stderr: str, expected: str | None) -> None:
    cause = output_cause("", stderr)
    assert (cause is None) if expected is None else (cause is not None and expected in cause)


@pytest.mark.parametrize(
    ("status", "code", "wanted"),
    [("failed", 137, True), ("failed", 125, True), ("failed", None, True), ("failed", 1, False),
     ("ok", 0, False), ("timeout", None, False), ("unreachable", None, False)],
)  # fmt: skip
def test_only_kills_and_docker_failures_are_worth_a_diagnosis(
    status: str, code: int | None, wanted: bool
) -> None:
    assert wants_diagnosis(HostResult("h", status, code)) is wanted  # type: ignore[arg-type]


def test_a_step_reason_names_the_cause_after_the_code() -> None:
    result = with_cause(
        HostResult("h", "failed", 137, error="exit code 137"), "killed by the out-of-memory killer"
    )
    step = Step.model_validate({"name": "alloc", "run": "x"})
    judged = judge(step, result)
    assert judged.reason == "exit 137, expected 0: killed by the out-of-memory killer"


def test_with_cause_keeps_the_cause_as_a_field_of_its_own() -> None:
    result = with_cause(HostResult("h", "failed", 137, error="exit code 137"), "OOM")
    assert result.cause == "OOM"
    assert str(result.error) == "exit code 137: OOM"  # the line still says it after the code


def test_a_step_reason_reads_the_cause_field_not_the_error_text() -> None:
    # An error that merely reads like `exit code N: ...` is not taken apart: it
    # is said whole, and the cause comes from the field alone.
    step = Step.model_validate({"name": "alloc", "run": "x"})
    worded = HostResult("h", "failed", 3, error="exit code 3: made up by the command")
    assert judge(step, worded).reason == "exit 3, expected 0: exit code 3: made up by the command"
    bare = HostResult("h", "failed", 3, error="exit code 3")
    assert judge(step, bare).reason == "exit 3, expected 0"  # the code, not twice
    caused = HostResult("h", "failed", 3, error="anything", cause="the cause")
    assert judge(step, caused).reason == "exit 3, expected 0: the cause"


def test_a_failed_steps_event_detail_is_the_reason_and_a_timeout_says_so() -> None:
    from orchestrator.suites.runner import step_detail

    step = Step.model_validate({"name": "alloc", "run": "x", "timeout": 5})
    failed = judge(step, HostResult("h", "failed", 3, error="exit code 3"))
    assert step_detail(failed) == "exit 3, expected 0"  # the event's status says "failed"
    timed_out = judge(step, HostResult("h", "timeout", None, error="timed out"))
    assert step_detail(timed_out) == "timeout: timed out after 5s"
    assert step_detail(judge(step, HostResult("h", "ok", 0))) == ""


def test_the_console_shows_a_failed_steps_detail_whole() -> None:
    from orchestrator.events import HostStep, PlainSink

    sink = PlainSink(io.StringIO())
    line = sink.render(HostStep(host="h", step="pull", status="failed", detail="failed: x"))
    assert line == "h - pull: failed - failed: x"  # nothing taken off the host's words


# --- point 6: an up report after a rollback ------------------------------------------


def rolled_back_report() -> UpReport:
    ok = HostResult("h", "ok", 0)
    outcomes = {h: HostOutcome(h, HostAction("cold_start", "none present")) for h in "abc"}
    for o in outcomes.values():
        o.steps.append(("run", ok))
    outcomes["b"].fail("run", HostResult("b", "failed", 125, error="exit code 125"), "exit 125")
    for h in ("a", "c"):
        outcomes[h].roll_back("the cold start failed on b")
    plan = Plan("persistent", {h: o.action for h, o in outcomes.items()})
    return UpReport(plan, outcomes)


def test_hosts_a_rollback_undid_are_not_ready_and_say_why() -> None:
    report = rolled_back_report()
    assert report.ready == [] and not report.ok
    assert report.outcomes["a"].summary == ("cold_start ROLLED BACK: the cold start failed on b")
    assert str(report.outcomes["b"].summary).startswith("cold_start FAILED at run: exit 125")


def test_the_json_of_a_rolled_back_up_agrees_with_the_console() -> None:
    doc = UpReport.to_dict(rolled_back_report())
    assert doc["ok"] is False and doc["ready"] == 0
    assert str(doc["error"]).startswith("up: 0/3 hosts ready; b: run: exit 125")
    assert "rolled back on a, c" in doc["error"]
    assert doc["hosts"]["a"]["ok"] is False
    assert doc["hosts"]["a"]["rolled_back"] == "the cold start failed on b"
    assert {h: o["state"] for h, o in doc["hosts"].items()} == {
        "a": "rolled_back",
        "b": "failed",
        "c": "rolled_back",
    }


def test_a_failure_whose_words_read_like_a_rollback_is_still_a_failure() -> None:
    # The state is data: no renderer parses the error text for it.
    outcome = HostOutcome("a", HostAction("cold_start", "none present"))
    outcome.fail("rolled back", HostResult("a", "failed", 1, error="exit 1"), "exit 1")
    outcome.roll_back("the cold start failed on b")
    assert outcome.state == "failed"
    assert str(outcome.summary).startswith("cold_start FAILED at rolled back: exit 1")
    report = UpReport(Plan("persistent", {"a": outcome.action}), {"a": outcome})
    assert "rolled back on" not in (report.error or "")


def test_a_step_reason_keeps_the_causes_call_for_the_clis_words(tmp_path: Path) -> None:
    """Issue 30, finding 8: the cause's `up()` was sliced into plain text, so
    `cvs run`'s console and results.json said `up()` where the CLI says `cvs up`."""
    from orchestrator.cli.common import CLI_STYLE
    from orchestrator.cli.run import print_report
    from orchestrator.errors import restyled
    from orchestrator.suites.records import RunRecorder
    from orchestrator.suites.report import write_report

    stopped = facts(status="exited", exit_code=137, finished_at=NOW - 1)
    cause = container_cause(stopped, elapsed=30)
    result = with_cause(HostResult("node2", "failed", exit_code=137, error="exit code 137"), cause)
    judged = judge(Step.model_validate({"name": "nap", "run": "sleep 60"}), result)
    assert "`up()` starts it again" in str(judged.reason or "")  # the API's words, for the API
    outcome = replace(
        failing_outcome(),
        steps=[StepOutcome(name="nap", hosts=["node2"], results={"node2": judged})],
    )
    recorder = RunRecorder.create(tmp_path / "run")
    recorder.style = CLI_STYLE  # as `cvs run` sets it
    recorder.finish(outcome, report=write_report)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    reason = saved["steps"][0]["hosts"]["node2"]["reason"]
    console = io.StringIO()
    print_report(restyled(outcome, CLI_STYLE), recorder, console)
    for text in (reason, console.getvalue()):
        assert "`cvs up` starts it again, keeping its overlay" in text, text
        assert "up()" not in text, text


@pytest.mark.parametrize(
    ("image", "output", "expected"),
    [
        (
            "reg.example:5000/team/img:9",
            "Error response from daemon: manifest for reg.example:5000/team/img:9 not found: "
            "manifest unknown: manifest unknown\n",
            "image reg.example:5000/team/img:9 not found: reg.example:5000 has no such image",
        ),
        (
            "cvs-sandbox:shhd",
            "Error response from daemon: pull access denied for cvs-sandbox, repository does "
            "not exist or may require 'docker login': denied: requested access to the resource "
            "is denied\n",
            "image cvs-sandbox:shhd not found: docker.io has no such image or tag",
        ),
        (
            "reg.example/img:1",
            'Error response from daemon: Head "https://reg.example/v2/img/manifests/1": '
            "unauthorized: authentication required\n",
            "reg.example refused image reg.example/img:1",
        ),
        (
            "cvs-sandbox:shhd",
            'Error response from daemon: Get "https://registry-1.docker.io/v2/": dial tcp: '
            "lookup registry-1.docker.io: no such host\n",
            "image cvs-sandbox:shhd is not on the host, and docker.io was not reached to pull it",
        ),
    ],
    ids=["manifest-unknown", "hub-denied", "unauthorized", "unreached"],
)
def test_a_failed_pull_names_the_image_and_what_the_registry_said(
    image: str, output: str, expected: str
) -> None:
    said = pull_cause(image, output)
    assert said.startswith(expected), said
    assert "Error response from daemon" not in said, said


# --- after a failed MPI job: which peer's container ended (issue 42, item 4) --------


def test_a_peer_whose_container_exited_during_the_job_is_named_with_its_state() -> None:
    peers: dict[str, ContainerFacts | None] = {
        "node1": facts(),
        "node2": facts(status="exited", exit_code=137, finished_at=NOW - 1),
        "node3": facts(),
    }
    assert peers_cause(peers, elapsed=30) == (
        "an MPI peer's container ended: node2: its container exited while the job ran "
        "(docker: state exited, exit code 137, OOMKilled false)"
    )


def test_an_oom_killed_peer_says_so_and_a_removed_one_is_gone() -> None:
    peers: dict[str, ContainerFacts | None] = {
        "a": facts(status="exited", exit_code=137, oom_killed=True, finished_at=NOW - 1),
        "b": ContainerFacts(now=NOW, error="Error: No such container: cvs-x"),
    }
    text = str(peers_cause(peers, elapsed=30, runtime="podman"))
    assert (
        "a: its container exited while the job ran (podman: state exited, exit code 137, "
        "OOMKilled true)"
    ) in text
    assert "b: its container is gone (podman: no such container)" in text


def test_a_peer_stopped_before_the_job_is_not_said_to_have_died_during_it() -> None:
    peers: dict[str, ContainerFacts | None] = {
        "a": facts(status="exited", exit_code=0, finished_at=NOW - 3600)
    }
    assert "a: its container is not running (docker: state exited, exit code 0" in str(
        peers_cause(peers, elapsed=30)
    )


@pytest.mark.parametrize(
    "peers",
    [
        {"a": facts(), "b": facts()},
        {"a": facts(), "b": None},  # not reached: no evidence, no name
        {"a": facts(), "b": ContainerFacts(now=NOW, error="Cannot connect to the Docker daemon")},
    ],
)
def test_no_peer_is_named_without_evidence_that_its_container_ended(
    peers: dict[str, ContainerFacts | None],
) -> None:
    assert peers_cause(peers, elapsed=30) is None


@pytest.mark.parametrize(
    ("command", "mpi"),
    [
        ("mpirun -np 3 hostname", True),
        (["/usr/bin/mpiexec", "-n", "2", "true"], True),
        ("cd /x && mpirun -np 2 ./a.out | tee log", True),
        (["sh", "-c", "mpirun -np 2 true"], True),
        ("echo mpirun-like; ls", False),
        ("hostname", False),
    ],
)
def test_an_mpi_launch_is_told_by_a_word_of_the_command(
    command: str | list[str], mpi: bool
) -> None:
    assert launches_mpi(command) is mpi
