"""`cvs runs` and `cvs runs show`: past runs read back from their results.json."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from outcomes import T0, failing_outcome

from orchestrator.cli import main
from orchestrator.suites.records import RunRecorder, results_document
from orchestrator.suites.report import write_report


def make_runs(base: Path) -> None:
    RunRecorder.create(base / "20250304T050607Z-test_x").finish(
        failing_outcome(), report=write_report
    )
    ok = failing_outcome(suite="install_x", started=T0 + timedelta(hours=1))
    ok.finished = ok.started + timedelta(seconds=2)
    ok.steps = ok.steps[:1]
    RunRecorder.create(base / "20250304T060607Z-install_x").finish(ok, report=write_report)
    (base / "20250304T070000Z-killed" / "logs").mkdir(parents=True)


def test_runs_lists_newest_first_with_outcome_and_host_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_runs(tmp_path)
    assert main(["runs", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["suite", "started", "outcome", "ok", "failed", "path"]
    assert "killed" in lines[1] and "no results.json" in lines[1]
    assert lines[2].split()[:5] == ["install_x", "2025-03-04T06:06:07Z", "ok", "(0)", "2"]
    assert lines[3].split()[:6] == ["test_x", "2025-03-04T05:06:07Z", "failed", "(1)", "1", "1"]


def test_runs_json_lists_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_runs(tmp_path)
    assert main(["runs", "--dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["suite"] for r in doc["runs"]] == [None, "install_x", "test_x"]


def test_runs_show_latest_prints_the_table_failures_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_runs(tmp_path)
    assert main(["runs", "show", "20250304T050607Z-test_x", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "check on node2: failed: exit 3, expected 0" in out
    assert "test_x: failed (exit 1)" in out
    assert "skipped: after (step 'check' failed)\n" in out  # a skipped step says why
    assert f"report:   {tmp_path / '20250304T050607Z-test_x' / 'report.html'}" in out


def test_results_json_round_trips_through_runs_show(tmp_path: Path) -> None:
    outcome = failing_outcome()
    RunRecorder.create(tmp_path / "r").finish(outcome, report=write_report)
    from orchestrator.suites.records import outcome_from_document

    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    again = results_document(outcome_from_document(doc))
    assert again == {k: v for k, v in doc.items() if k != "run_dir"}


def test_runs_show_unknown_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--dir", str(tmp_path), "show", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_runs_show_gives_the_duration_the_live_summary_gave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25: a 0.3 s run that crossed a second boundary read 1.0 s in `runs show`."""
    from orchestrator.suites.report import verdict

    outcome = failing_outcome(started=T0 + timedelta(microseconds=900_000))
    outcome.finished = outcome.started + timedelta(seconds=0.3)
    live = verdict(outcome)
    assert " in 0.3s" in live
    RunRecorder.create(tmp_path / "20250304T050607Z-test_x").finish(outcome, report=write_report)
    assert main(["runs", "show", "latest", "--dir", str(tmp_path)]) == 0
    assert live in capsys.readouterr().out


def test_runs_show_json_keeps_the_runs_verdict_apart_from_this_commands_success(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: a failed run read back fine is `ok: true, exit_code: 0` at the
    top (this command), its own verdict under `run`."""
    make_runs(tmp_path)
    assert main(["runs", "show", "20250304T050607Z-test_x", "--dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["command"], doc["ok"], doc["exit_code"], doc["error"]) == ("runs", True, 0, None)
    assert (doc["run"]["ok"], doc["run"]["exit_code"]) == (False, 1), doc["run"]


def test_an_older_killed_run_is_listed_below_newer_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_runs(tmp_path)  # runs started at 05:06:07 and 06:06:07, killed at 07:00
    (tmp_path / "20250304T040000Z-killed_earlier" / "logs").mkdir(parents=True)
    assert main(["runs", "--dir", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [Path(r["path"]).name.split("-", 1)[1] for r in doc["runs"]]
    assert names == ["killed", "install_x", "test_x", "killed_earlier"]


def test_a_refused_run_is_listed_refused_with_no_host_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = failing_outcome(suite="refused_x")
    refused.refused, refused.error = True, "refused: persistent containers run there"
    for step in refused.steps:  # as the runner records a refusal (skipped_step)
        step.results = {
            h: replace(r, status="skipped", exit_code=None, reason="refused")
            for h, r in step.results.items()
        }
    RunRecorder.create(tmp_path / "20250304T050607Z-refused_x").finish(refused, report=write_report)
    assert main(["runs", "--dir", str(tmp_path)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:6] == ["refused_x", "2025-03-04T05:06:07Z", "refused", "(4)", "0", "0"]
