"""Run records: results.json (against its shipped JSON Schema), junit.xml, run dirs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from orchestrator.events import Message
from orchestrator.results import HostResult
from orchestrator.suites.records import (
    RunOutcome,
    RunRecorder,
    StepHostOutcome,
    StepOutcome,
    default_run_dir,
    junit_xml,
    results_document,
)
from orchestrator.suites.report import write_report

SCHEMA_FILE = Path(__file__).parent.parent / "orchestrator" / "schemas" / "results.schema.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())
T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def validate(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def outcome(steps: list[StepOutcome], **kw: Any) -> RunOutcome:
    base: dict[str, Any] = {
        "suite": "demo",
        "suite_file": "/s/demo.yaml",
        "description": "d",
        "cluster": "lab",
        "cluster_file": "/c/cluster.yaml",
        "lifetime": "per_run",
        "started": T0,
        "finished": T0 + timedelta(seconds=3.5),
        "steps": steps,
    }
    return RunOutcome(**{**base, **kw})


def a_step(name: str, **statuses: str) -> StepOutcome:
    return StepOutcome(
        name=name,
        hosts=list(statuses),
        results={
            h: StepHostOutcome(
                host=h,
                status=s,  # type: ignore[arg-type]
                exit_code=0 if s == "ok" else 1,
                duration=0.25,
                tail="line1\nline2" if s != "skipped" else "",
                reason=None if s == "ok" else f"why {s}",
            )
            for h, s in statuses.items()
        },
    )


# ---- exit codes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "kw", "code"),
    [
        ([a_step("a", n1="ok", n2="ok")], {}, 0),
        ([a_step("a", n1="ok", n2="failed"), a_step("b", n1="skipped", n2="skipped")], {}, 1),
        ([a_step("a", n1="timeout")], {}, 1),
        ([a_step("a", n1="failed", n2="unreachable")], {}, 3),
        ([a_step("a", n1="skipped")], {"refused": True, "error": "refused: x"}, 4),
        ([a_step("a", n1="skipped")], {"up_exit_code": 3, "error": "up failed"}, 3),
        ([a_step("a", n1="skipped")], {"error": "boom"}, 1),
        ([a_step("a", n1="interrupted")], {"interrupted": True}, 130),
        ([a_step("a", n1="ok")], {"warnings": ["stale image"]}, 0),
    ],
)
def test_run_exit_code(steps: list[StepOutcome], kw: dict[str, Any], code: int) -> None:
    run = outcome(steps, **kw)
    assert run.exit_code == code
    assert run.ok is (code == 0)


def test_step_status_from_its_hosts() -> None:
    assert a_step("a", n1="ok", n2="ok").status == "ok"
    assert a_step("a", n1="ok", n2="timeout").status == "failed"
    assert a_step("a", n1="skipped", n2="skipped").status == "skipped"


# ---- results.json ---------------------------------------------------------------------


def test_results_document_validates_and_carries_plan_and_steps() -> None:
    run = outcome(
        [a_step("install", n1="ok", n2="failed"), a_step("check", n1="skipped", n2="skipped")],
        plan={"n1": {"action": "cold_start", "reason": "absent"}},
    )
    doc = results_document(run)
    doc["run_dir"] = "/r"
    validate(doc)
    assert doc["started"] == "2025-03-04T05:06:07Z" and doc["duration"] == 3.5
    assert doc["plan"]["n1"]["action"] == "cold_start"
    assert [s["status"] for s in doc["steps"]] == ["failed", "skipped"]
    assert doc["steps"][0]["hosts"]["n2"] == {
        "status": "failed",
        "ok": False,
        "exit_code": 1,
        "duration": 0.25,
        "reason": "why failed",
        "tail": "line1\nline2",
    }
    assert (doc["ok"], doc["exit_code"]) == (False, 1)


def test_results_schema_rejects_an_unknown_status() -> None:
    doc = results_document(outcome([a_step("a", n1="ok")]))
    doc["run_dir"] = "/r"
    doc["steps"][0]["hosts"]["n1"]["status"] = "great"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


host_status = st.sampled_from(
    ["ok", "failed", "timeout", "unreachable", "auth", "host_key", "skipped", "interrupted"]
)
step_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)
hosts_st = st.lists(
    st.from_regex(r"node[0-9]{1,3}", fullmatch=True), min_size=1, max_size=5, unique=True
)


@st.composite
def runs(draw: st.DrawFn) -> RunOutcome:
    hosts = draw(hosts_st)
    names = draw(st.lists(step_names, min_size=1, max_size=4, unique=True))
    steps = [a_step(n, **{h: draw(host_status) for h in hosts}) for n in names]
    return outcome(
        steps,
        interrupted=draw(st.booleans()),
        refused=draw(st.booleans()),
        lifetime=draw(st.sampled_from(["per_run", "persistent", "no_launch", None])),
        error=draw(st.one_of(st.none(), st.text(max_size=30))),
    )


@settings(max_examples=examples(60), deadline=None)
@given(run=runs())
def test_any_outcome_gives_valid_results_and_one_testcase_per_step_and_host(
    run: RunOutcome,
) -> None:
    doc = results_document(run)
    doc["run_dir"] = "/r"
    validate(doc)
    root = ET.fromstring(junit_xml(run))
    cases = root.findall("./testsuite/testcase")
    expected = [(f"demo.{s.name}", h) for s in run.steps for h in s.results]
    assert [(c.get("classname"), c.get("name")) for c in cases] == expected
    suite = root.find("testsuite")
    assert suite is not None and int(suite.get("tests", "-1")) == len(expected)


# ---- junit.xml ----------------------------------------------------------------------------


def test_junit_maps_statuses_to_failure_error_skipped() -> None:
    run = outcome([a_step("a", n1="ok", n2="failed", n3="timeout", n4="unreachable", n5="skipped")])
    root = ET.fromstring(junit_xml(run))
    suite = root.find("testsuite")
    assert suite is not None
    counts = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": "5", "failures": "2", "errors": "1", "skipped": "1"}
    case = {c.get("name"): c for c in suite.findall("testcase")}
    assert case["n1"].find("failure") is None
    failure = case["n2"].find("failure")
    assert failure is not None and failure.get("message") == "why failed"
    assert failure.text == "line1\nline2"
    timeout = case["n3"].find("failure")
    assert timeout is not None and timeout.get("type") == "timeout"
    error = case["n4"].find("error")
    assert error is not None and error.get("type") == "unreachable"
    assert case["n5"].find("skipped") is not None


def test_junit_survives_control_characters_in_output() -> None:
    step = a_step("a", n1="failed")
    step.results["n1"] = StepHostOutcome(
        host="n1", status="failed", exit_code=1, tail="bell\x07 esc\x1b[31m red", reason="r\x00"
    )
    root = ET.fromstring(junit_xml(outcome([step])))
    failure = root.find("./testsuite/testcase/failure")
    assert failure is not None and failure.text == "bell esc[31m red"


# ---- the run directory ----------------------------------------------------------------------


def test_default_run_dir_is_utc_time_then_suite() -> None:
    local = T0.astimezone(timezone(timedelta(hours=-7)))
    assert default_run_dir("test_demo", local) == Path("runs/20250304T050607Z-test_demo")


def test_unique_run_dir_gets_a_suffix_when_taken(tmp_path: Path) -> None:
    first = RunRecorder.create(tmp_path / "r", unique=True)
    second = RunRecorder.create(tmp_path / "r", unique=True)
    assert first.run_dir == tmp_path / "r" and second.run_dir == tmp_path / "r-2"
    assert (second.run_dir / "logs").is_dir()


def test_recorder_writes_logs_events_results_and_junit(tmp_path: Path) -> None:
    rec = RunRecorder.create(tmp_path / "run")
    sink = rec.events_sink()
    sink.emit(Message(level="info", text="hello"))
    result = HostResult(
        host="n1", status="timeout", exit_code=None, stdout="out\n", stderr="err", error="timed out"
    )
    log = rec.write_log("install", result)
    rec.finish(outcome([a_step("install", n1="timeout")]), report=write_report)
    rec.close()
    assert log == tmp_path / "run" / "logs" / "install" / "n1.log"
    assert log.read_text() == "out\nerr\n[cvs] timeout: timed out\n"
    events = [json.loads(line) for line in rec.events_path.read_text().splitlines()]
    assert events[0]["event"] == "Message" and events[0]["text"] == "hello"
    doc = json.loads(rec.results_path.read_text())
    validate(doc)
    assert doc["run_dir"] == str(rec.run_dir)
    ET.parse(rec.junit_path)
    assert not list(rec.run_dir.glob(".*.tmp"))
