"""`cvs run SUITE` and `cvs run --list` .

Exit codes (docs/design.md): 0 every step ok on every host, 1 a step failed, 2 bad
suite or cluster file, 3 some host unreachable, 4 refused by the lifetime
policy, 130 interrupted (Ctrl-C, or stdout's reader went away). The run
directory is written in every case that got as far as starting the run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import IO, TypedDict

import anyio

from orchestrator.cli.common import (
    CLI_STYLE,
    cluster_path,
    load,
    make_sink,
    tell_stdout_closed,
    while_stdout_is_read,
    write_json_result,
)
from orchestrator.errors import ExitCode, UsageError, restyled
from orchestrator.events import TeeSink
from orchestrator.suites.model import SHIPPED_PACKAGE, find_suite, list_suites, load_suite
from orchestrator.suites.records import RunOutcome, RunRecorder, default_run_dir, results_document
from orchestrator.suites.report import (
    failure_report,
    plain_table,
    skipped_note,
    summary_rows,
    verdict,
)


def _check_suite_args(args: argparse.Namespace) -> None:
    """A suite run takes none of a CVS test's arguments, and needs a suite."""
    if args.pytest_args:
        raise UsageError(
            f"cvs run: unrecognized arguments: {shlex.join(args.pytest_args)} (pytest "
            "arguments are for CVS tests, with --cluster_file and --config_file)"
        )
    if args.function or args.html or args.log_file:
        raise UsageError(
            "cvs run: FUNCTION, --html and --log-file are for CVS tests "
            "(with --cluster_file and --config_file)"
        )
    if not args.suite:
        raise UsageError("cvs run: name a suite (cvs run SUITE), or list them with cvs run --list")


def cmd_run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.cluster_file is not None or args.config_file is not None:
        # A mode of its own (CVS's pytest tests): its modules only when chosen.
        from orchestrator.compat.runner import run_cvs_test

        return run_cvs_test(
            args.suite or "",
            args.function,
            cluster_file=args.cluster_file,
            config_file=args.config_file,
            html=args.html,
            log_file=args.log_file,
            run_dir=args.run_dir,
            json_output=args.json,
            extra_pytest_args=args.pytest_args,
        )
    _check_suite_args(args)
    # Only a suite run needs the SSH stack (`cvs run TEST` hands over to pytest,
    # `--list` reads files): imported here, a third of a second off the others.
    from orchestrator.suites.runner import new_outcome, resolve_step_hosts, run_suite

    ref = find_suite(args.suite)
    suite = load_suite(ref.path)
    cluster_file = Path(os.path.abspath(cluster_path(args)))
    cluster = load(args)
    resolve_step_hosts(suite, cluster)  # a bad `hosts:` is exit 2 before anything starts
    if args.run_dir:
        recorder = RunRecorder.create(Path(args.run_dir))
    else:
        recorder = RunRecorder.create(default_run_dir(suite.name), unique=True)
    outcome = new_outcome(suite, cluster, str(cluster_file))
    recorder.style = CLI_STYLE  # the record in the words of whoever ran it
    screen = make_sink(args, cluster=cluster)
    sink = TeeSink(screen, recorder.events_sink())

    async def main() -> RunOutcome | None:
        # Whoever reads our stdout went away (`| head -1`): stop the run as Ctrl-C
        # would (steps killed, per_run containers removed, locks released, the
        # record says interrupted) instead of running on unread.
        async with while_stdout_is_read(screen):
            return await run_suite(
                suite,
                cluster,
                sink=sink,
                recorder=recorder,
                cluster_file=str(cluster_file),
                outcome=outcome,
                wait=not args.no_wait,
            )
        return None

    try:
        finished = anyio.run(main)
    except KeyboardInterrupt:
        outcome.interrupted = True
        finished = outcome
    finally:
        sink.close()
        recorder.close()
    if finished is None:
        # Nothing more on stdout (nobody reads it), not even the --json result line.
        tell_stdout_closed(f"run stopped (record: {recorder.run_dir})")
        return ExitCode.INTERRUPTED
    if args.json:
        doc = {**results_document(outcome), "run_dir": str(recorder.run_dir)}
        doc["files"] = _paths(recorder)
        if recorder.failure is not None:
            doc["error"] = str(recorder.failure)
        write_json_result(args, **doc)
    else:
        print_report(restyled(outcome, CLI_STYLE), recorder, sys.stdout)
    if recorder.failure is not None:
        sys.stderr.write(f"cvs: {recorder.failure}\n")
    return outcome.exit_code


def _paths(recorder: RunRecorder) -> dict[str, str]:
    return {
        "run_dir": str(recorder.run_dir),
        "events": str(recorder.events_path),
        "logs": str(recorder.run_dir / "logs"),
        "results": str(recorder.results_path),
        "junit": str(recorder.junit_path),
        "report": str(recorder.report_path),
    }


# ---- the report at the end ----------------------------------------------------------


def print_report(outcome: RunOutcome, recorder: RunRecorder, out: IO[str]) -> None:
    header, rows = summary_rows(outcome)
    failures = failure_report(outcome)
    tty = hasattr(out, "isatty") and out.isatty()
    if tty:
        # rich only on a terminal: a piped report never loads it.
        from rich.console import Console
        from rich.table import Table

        console = Console(file=out)
        table = Table(title=f"{outcome.suite} on {outcome.cluster}", title_justify="left")
        for column in header:
            table.add_column(column)
        styles = {"ok": "green", "skipped": "dim"}
        for row in rows:
            table.add_row(
                row[0], *[f"[{styles.get(c, 'red')}]{c}[/]" if c != "-" else c for c in row[1:]]
            )
        console.print(table)
        if failures:
            console.print(failures, style="red", markup=False, highlight=False, end="")
    else:
        out.write(plain_table(header, rows))
        out.write(failures)
    out.write(skipped_note(outcome))
    for w in outcome.warnings:
        out.write(f"warning: {w}\n")
    out.write(verdict(outcome) + "\n")
    for label, path in _paths(recorder).items():
        out.write(f"{label + ':':9} {path}\n")
    out.flush()


class _SuiteEntry(TypedDict):
    """One suite in `cvs run --list` (also its `--json` shape)."""

    name: str
    description: str
    source: str
    path: str
    shadowed: bool
    error: str | None


def _list(args: argparse.Namespace) -> int:
    refs = list_suites()
    seen: set[str] = set()
    entries: list[_SuiteEntry] = []
    for ref in refs:
        try:
            description = load_suite(ref.path).description
            problem = None
        except Exception as exc:  # a broken file is listed with why, not hidden
            description, problem = "", str(exc)
        entries.append(
            {
                "name": ref.name,
                "description": description,
                "source": ref.origin,
                "path": str(ref.path),
                "shadowed": ref.name in seen,
                "error": problem,
            }
        )
        seen.add(ref.name)
    if args.json:
        write_json_result(args, ok=True, exit_code=ExitCode.OK, suites=entries)
        return ExitCode.OK
    if not entries:
        sys.stdout.write(
            f"no suites found (looked in ./suites, $CVS_SUITES_PATH, {SHIPPED_PACKAGE})\n"
        )
        return ExitCode.OK
    rows = []
    for e in entries:
        note = " (shadowed)" if e["shadowed"] else ""
        note += f" (broken: {e['error']})" if e["error"] else ""
        rows.append([e["name"], e["description"] + note, f"{e['source']}: {e['path']}"])
    sys.stdout.write(plain_table(["name", "description", "source"], rows))
    return ExitCode.OK
