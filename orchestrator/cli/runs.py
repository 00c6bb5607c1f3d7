"""`cvs runs` (past suite runs, newest first) and `cvs runs show RUN`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.cli.common import write_json_result
from orchestrator.errors import ExitCode, UsageError
from orchestrator.suites.records import RunOutcome, outcome_from_document
from orchestrator.suites.report import (
    failure_report,
    plain_table,
    run_hosts,
    skipped_note,
    summary_rows,
    verdict,
    verdict_word,
)

# How a run directory's name starts (suites/records.py, run_dir).
_NAME_STAMP = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class PastRun:
    """One run directory: its outcome, or why it has none (still running, crashed)."""

    path: Path
    outcome: RunOutcome | None
    problem: str | None = None

    @property
    def sort_key(self) -> tuple[str, str]:
        # One form for both, or a killed run's name sorts above every run with
        # results: the start time from results.json, else from the directory's
        # name (run dirs are named by their UTC start, `20250304T050607Z-suite`).
        if self.outcome is not None:
            stamp = self.outcome.started.strftime(_NAME_STAMP)
        else:
            stamp = self.path.name.split("-", 1)[0]
        return (stamp, self.path.name)


def read_run(path: Path) -> PastRun:
    results = path / "results.json"
    if not results.is_file():
        return PastRun(path, None, "no results.json (still running, or the run was killed)")
    try:
        return PastRun(path, outcome_from_document(json.loads(results.read_text("utf-8"))))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return PastRun(path, None, f"unreadable results.json: {type(exc).__name__}: {exc}")


def find_runs(base: Path) -> list[PastRun]:
    """Run directories under `base` (those with a results.json or a logs/ dir), newest first."""
    if not base.is_dir():
        return []
    found = [
        read_run(d)
        for d in base.iterdir()
        if d.is_dir() and ((d / "results.json").exists() or (d / "logs").is_dir())
    ]
    return sorted(found, key=lambda r: r.sort_key, reverse=True)


def host_counts(outcome: RunOutcome) -> tuple[int, int]:
    """(hosts where some step ran and every step was ok or skipped after
    it, hosts where some step was not ok). A host where no step ran (the
    run was refused, `up` failed) is neither: nothing was ok there."""
    bad = {
        h for s in outcome.steps for h, r in s.results.items() if r.status not in ("ok", "skipped")
    }
    ran = {h for s in outcome.steps for h, r in s.results.items() if r.status == "ok"}
    hosts = run_hosts(outcome)
    return len([h for h in hosts if h in ran and h not in bad]), len(bad)


def _row(run: PastRun) -> dict[str, Any]:
    if run.outcome is None:
        return {"path": str(run.path), "suite": None, "problem": run.problem}
    o = run.outcome
    ok, failed = host_counts(o)
    return {
        "suite": o.suite,
        "started": o.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "outcome": verdict_word(o),
        "exit_code": int(o.exit_code),
        "hosts_ok": ok,
        "hosts_failed": failed,
        "path": str(run.path),
    }


def cmd_runs(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    if getattr(args, "runs_command", None) == "show":
        return _show(args, base)
    runs = find_runs(base)
    rows = [_row(r) for r in runs]
    if args.json:
        write_json_result(args, ok=True, exit_code=ExitCode.OK, runs=rows)
        return ExitCode.OK
    if not rows:
        sys.stderr.write(f"no runs under {base}/ (cvs run SUITE writes them there)\n")
        return ExitCode.OK
    table = [
        [
            r["suite"],
            r["started"],
            f"{r['outcome']} ({r['exit_code']})",
            str(r["hosts_ok"]),
            str(r["hosts_failed"]),
            r["path"],
        ]
        if r["suite"] is not None
        else ["?", "-", r["problem"], "-", "-", r["path"]]
        for r in rows
    ]
    sys.stdout.write(plain_table(["suite", "started", "outcome", "ok", "failed", "path"], table))
    return ExitCode.OK


def resolve_run(base: Path, ref: str) -> Path:
    """RUN as a path, a name under `base`, or `latest`; UsageError naming what was tried."""
    if ref == "latest":
        runs = find_runs(base)
        if not runs:
            raise UsageError(f"cvs runs show latest: no runs under {base}/")
        return runs[0].path
    for candidate in (Path(ref), base / ref):
        if candidate.is_dir():
            return candidate
    raise UsageError(f"cvs runs show: no run {ref!r} (not a directory, nor under {base}/)")


def _show(args: argparse.Namespace, base: Path) -> int:
    path = resolve_run(base, args.run)
    run = read_run(path)
    if run.outcome is None:
        raise UsageError(f"{path}: {run.problem}")
    o = run.outcome
    if args.json:
        # This command's success at the top (it read the run); the run's own
        # verdict, its `ok` and `exit_code` among them, under `run`.
        doc = json.loads((path / "results.json").read_text("utf-8"))
        write_json_result(args, ok=True, exit_code=ExitCode.OK, run=doc)
        return ExitCode.OK
    out = sys.stdout
    out.write(f"suite:    {o.suite} ({o.suite_file})\n")
    out.write(f"cluster:  {o.cluster} ({o.cluster_file}), lifetime {o.lifetime or '-'}\n")
    if o.image:
        ids = sorted(set(o.image_ids.values()))
        out.write(f"image:    {o.image}{' ' + ', '.join(ids) if ids else ''}\n")
    out.write(f"started:  {o.started.strftime('%Y-%m-%dT%H:%M:%SZ')}\n")
    header, rows = summary_rows(o)
    out.write(plain_table(header, rows))
    out.write(failure_report(o))
    out.write(skipped_note(o))
    for w in o.warnings:
        out.write(f"warning: {w}\n")
    out.write(verdict(o) + "\n")
    report = path / "report.html"
    if report.is_file():
        out.write(f"report:   {report}\n")
    return ExitCode.OK
