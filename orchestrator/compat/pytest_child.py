"""`python -m orchestrator.compat.pytest_child SPEC`: the pytest half of `cvs run TEST`.

A fresh interpreter in which nothing of ours but this module and the engine's
hooks (which import only pytest) is loaded when pytest starts: CVS's
`pytest.ini`, conftest.py files and warning filters see what they see under
CVS's own `cvs run`. The run record is made in the engine's pytest_configure,
after pytest has read its configuration; the engine's SSH stack is imported
only when a suite first asks for an orchestrator.

SPEC is JSON from compat/runner.py (paths and pytest's argv; nothing secret).
The summary (or, with --json, the result line) is written here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import nullcontext, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .records import CvsRunRecord

CHILD_MODULE = "orchestrator.compat.pytest_child"
USAGE = 2


class ChildSpec(TypedDict):
    test: str  # as the user named it, for messages
    stem: str
    test_file: str
    cluster_file: str
    run_dir: str
    existing: list[str] | None  # entries of a --run-dir that was there before
    json: bool
    log_file: str
    html: str | None
    pytest_args: list[str]


def _discard(run_dir: Path, *, keep: set[str] | None) -> None:
    """Remove the run directory (None: it was made for this run), or what was
    made in it besides the entries in `keep` (a directory the user gave)."""
    if keep is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in set(os.listdir(run_dir)) - keep:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _record(spec: ChildSpec) -> CvsRunRecord:
    from orchestrator.suites.records import RunRecorder

    from .records import CvsRunRecord

    return CvsRunRecord(
        RunRecorder(Path(spec["run_dir"])),
        test=spec["stem"],
        test_file=spec["test_file"],
        cluster_file=spec["cluster_file"],
    )


def run(spec: ChildSpec) -> int:
    import pytest

    from .pytest_engine import CvsEngine

    run_dir = Path(spec["run_dir"])
    engine = CvsEngine(record_factory=lambda _config: _record(spec))
    # With --json, stdout carries only our JSON line: pytest's report goes to stderr.
    report_to = redirect_stdout(sys.stderr) if spec["json"] else nullcontext()
    with report_to:
        code = int(pytest.main(spec["pytest_args"], plugins=[engine]))
    if code == pytest.ExitCode.USAGE_ERROR and not engine.created:
        # pytest refused the arguments before anything ran (a mistyped option
        # passed through): bad input changes nothing, so no run record either.
        if engine.record is not None:
            engine.record.recorder.close()
        existing = spec["existing"]
        _discard(run_dir, keep=None if existing is None else set(existing))
        message = (
            f"cvs run {spec['test']}: pytest refused the arguments (its message is above); "
            "nothing was run"
        )
        sys.stderr.write(f"cvs: {message}\n")
        if spec["json"]:
            doc = {"command": "run", "ok": False, "exit_code": USAGE, "error": message}
            sys.stdout.write(json.dumps(doc) + "\n")
        return USAGE
    from .records import finish_with_pytest_status

    record = engine.record if engine.record is not None else _record(spec)
    ours = finish_with_pytest_status(record, code)
    _summary(spec, record, int(ours))
    return int(ours)


def _summary(spec: ChildSpec, record: CvsRunRecord, ours: int) -> None:
    recorder = record.recorder
    error = record.outcome.error
    files: dict[str, Any] = {
        "run_dir": str(recorder.run_dir),
        "events": str(recorder.events_path),
        "logs": str(recorder.run_dir / "logs"),
        "results": str(recorder.results_path),
        "junit": str(recorder.junit_path),
        "log_file": spec["log_file"],
    }
    if spec["html"]:
        files["html"] = spec["html"]
    out = sys.stdout
    if spec["json"]:
        doc = {"ok": ours == 0, "exit_code": ours, "test": spec["stem"], "files": files}
        out.write(json.dumps(doc) + "\n")
    else:
        seconds = (datetime.now(UTC) - record.outcome.started).total_seconds()
        word = {0: "ok", 3: "host unreachable", 4: "refused", 130: "interrupted"}.get(
            ours, "failed"
        )
        out.write(f"{spec['stem']}: {word} (exit {ours}) in {seconds:.1f}s")
        out.write(f": {error}\n" if error else "\n")
        for label, path in files.items():
            out.write(f"{label + ':':9} {path}\n")
    out.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(f"usage: python -m {CHILD_MODULE} SPEC (run by `cvs run TEST`)\n")
        return USAGE
    spec: ChildSpec = json.loads(argv[0])
    return run(spec)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
