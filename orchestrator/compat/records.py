"""The run directory of a CVS suite run, laid out as for `cvs run SUITE`.

    runs/<UTC time>-<test>/
      events.jsonl          every event (connections, up, each command, each test)
      logs/NNNN-TEST-CALL/HOST.log   each orch call's output per host
      results.json          our schema; one step per orch call (tolerated: the
                            suite judges outputs), the verdict is pytest's
      junit.xml             pytest's own, one testcase per test function

Under CVS a non-zero exit code is data for the test to judge, so the calls
are recorded with `continue_on_failure` and the run's `ok`/`exit_code` come
from pytest, not from the calls.
"""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.config import ClusterConfig
from orchestrator.errors import ExitCode, restyled
from orchestrator.events import EventSink, Level, Message
from orchestrator.results import HostResult, Status
from orchestrator.suites.records import (
    TAIL_LINES,
    RunOutcome,
    RunRecorder,
    StepHostOutcome,
    StepOutcome,
    plan_rows,
    results_document,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def step_name(seq: int, test: str | None, call: str) -> str:
    """`0007-test_rvs_gst-exec`: ordered, one path component, readable."""
    base = f"{seq:04d}-{test or 'setup'}-{call}"
    return _UNSAFE.sub("_", base)[:120]


class CvsRunRecord:
    """Collects what the orchestrators of one pytest session did."""

    def __init__(self, recorder: RunRecorder, *, test: str, test_file: str, cluster_file: str):
        self.recorder = recorder
        self.sink: EventSink = recorder.events_sink()
        self.outcome = RunOutcome(
            suite=test,
            suite_file=test_file,
            description="CVS test suite on cvs-orchestrator",
            cluster="",
            cluster_file=cluster_file,
            lifetime=None,
            started=datetime.now(UTC),
        )
        self.current_test: str | None = None
        self.refused: str | None = None
        self.setup_error: str | None = None
        self.unreachable = False
        self._seq = 0
        self._lock = threading.Lock()

    def set_cluster(self, cluster: ClusterConfig) -> None:
        self.outcome.cluster = cluster.name
        self.outcome.lifetime = cluster.container.lifetime if cluster.container else None
        # The Slurm job the hosts came from (`hosts_from: slurm`), as our own runs record it.
        self.outcome.slurm_job = cluster.slurm.job_id if cluster.slurm is not None else None

    def add_up(self, report: Any) -> None:
        """The plan rows, and a `setup_containers` step with each host's outcome:
        a host that did not end ready is there with its error (and the run's
        error names it), not only in events.jsonl."""
        self.outcome.plan.update(plan_rows(report))
        for warning in getattr(report.plan, "warnings", []):
            if warning not in self.outcome.warnings:
                self.outcome.warnings.append(warning)
        results: dict[str, HostResult] = {}
        for host, outcome in report.outcomes.items():
            if outcome.ok:
                results[host] = HostResult(host, "ok", 0, stdout=f"{outcome.action.kind}: ready\n")
                continue
            failed = outcome.steps[-1][1] if outcome.steps else None
            status: Status = failed.status if failed is not None and not failed.ok else "failed"
            results[host] = HostResult(
                host,
                status,
                failed.exit_code if failed is not None else None,
                stdout=failed.stdout if failed is not None else "",
                stderr=failed.stderr if failed is not None else "",
                error=outcome.error or "not ready",
            )
        duration = sum(r.duration or 0.0 for o in report.outcomes.values() for _, r in o.steps)
        self.add_call("setup_containers", results, on="host", duration=duration)
        bad = {h: r.error for h, r in results.items() if not r.ok}
        if bad:
            first = next(iter(bad))
            more = f" (and {len(bad) - 1} more host(s))" if len(bad) > 1 else ""
            self.add_setup_error(f"setup_containers failed on {first}: {bad[first]}{more}")

    def add_setup_error(self, text: str) -> None:
        """A set-up that could not be done (not a refusal): in results.json's error."""
        if self.setup_error is None:
            self.setup_error = text
        self.sink.emit(Message(level="error", text=f"set-up failed: {text}"))

    def add_refusal(self, text: str) -> None:
        self.refused = text
        self.sink.emit(Message(level="error", text=f"refused: {text}"))

    def add_call(
        self, call: str, results: dict[str, HostResult], *, on: str, duration: float
    ) -> None:
        with self._lock:
            self._seq += 1
            name = step_name(self._seq, self.current_test, call)
        step = StepOutcome(
            name=name,
            hosts=list(results),
            on=on,
            continue_on_failure=True,
            duration=duration,
        )
        for host, r in results.items():
            self.recorder.write_log(name, r)
            step.results[host] = StepHostOutcome(
                host=host,
                status=r.status,
                exit_code=r.exit_code,
                duration=r.duration,
                tail=r.tail(TAIL_LINES),
                reason=None if r.ok else (r.error or f"exit {r.exit_code}"),
            )
            if not r.reached:
                self.unreachable = True
        self.outcome.steps.append(step)

    def add_test(self, nodeid: str, when: str, outcome: str) -> None:
        level: Level = "info" if outcome in ("passed", "skipped") else "error"
        self.sink.emit(Message(level=level, text=f"{nodeid} {when}: {outcome}"))

    def finish(self, exit_code: int, error: str | None) -> Path:
        """Write results.json with pytest's verdict; close events.jsonl."""
        self.outcome.finished = datetime.now(UTC)
        self.outcome.error = error
        doc = results_document(self.outcome)
        doc.update(
            ok=exit_code == 0,
            exit_code=exit_code,
            error=error,
            run_dir=str(self.recorder.run_dir),
        )
        # Reasons and errors that name the API (errors.Phrase) in the record's words.
        doc = restyled(doc, self.recorder.style)
        path = self.recorder.results_path
        tmp = path.with_name(f".{path.name}.tmp")
        # Owner-only, like the rest of a run directory: outputs may carry secrets.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
        self.recorder.close()
        return path


def pytest_exit_to_ours(code: int, record: CvsRunRecord) -> ExitCode:
    """pytest's exit status -> ours (refused 4, unreachable 3, interrupted 130, usage 2)."""
    if record.refused is not None:
        return ExitCode.REFUSED
    if code == 0:
        return ExitCode.OK
    if code == 2:
        return ExitCode.INTERRUPTED
    if code == 4:
        return ExitCode.USAGE
    if code == 1 and record.unreachable:
        return ExitCode.UNREACHABLE
    return ExitCode.FAILED


def finish_with_pytest_status(record: CvsRunRecord, pytest_status: int) -> ExitCode:
    """Write the record with pytest's verdict in our terms; returns our exit code."""
    ours = pytest_exit_to_ours(pytest_status, record)
    error = None
    if record.refused is not None:
        error = f"refused: {record.refused}"
    elif record.setup_error is not None:
        error = record.setup_error
    elif pytest_status not in (0, 1):
        error = f"pytest exit status {pytest_status}"
    # results.json knows 0/1/3/4/130; a pytest usage error is recorded as 1.
    record.finish(1 if ours == ExitCode.USAGE else int(ours), error)
    return ours
