"""`cvs run TEST [FUNCTION...] --cluster_file C --config_file T [--html R] [--log-file L]`.

TEST is found the way CVS finds it: a module `TEST.py` anywhere under the
`cvs.tests` package (conftest.py and `_private` modules are not tests), or a
path to a test file. It runs through pytest in this process, as CVS's own
`cvs run` does, with our engine in place of CVS's orchestrators and a run
directory written as for `cvs run SUITE`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from contextlib import nullcontext, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from orchestrator.errors import UsageError
from orchestrator.suites.records import RunRecorder, default_run_dir

from .config import cluster_from_files
from .pytest_engine import CvsEngine
from .records import CvsRunRecord, finish_with_pytest_status

CVS_TESTS_PACKAGE = "cvs.tests"


def _is_test_module(filename: str) -> bool:
    # CVS's rule (list_plugin): .py files but __init__, conftest and _private helpers.
    return (
        filename.endswith(".py")
        and filename not in ("__init__.py", "conftest.py")
        and not filename.startswith("_")
    )


def cvs_tests_dirs() -> list[Path]:
    """The directories of the installed `cvs.tests` package; UsageError when CVS is absent."""
    try:
        package = importlib.import_module(CVS_TESTS_PACKAGE)
    except ImportError:
        raise UsageError(
            "cvs run: CVS is not importable here (no cvs.tests package): install CVS into "
            "this environment (pip install -e CVS_CHECKOUT), or give the test file's path"
        ) from None
    return [Path(p) for p in getattr(package, "__path__", [])]


def find_cvs_test(name: str) -> Path:
    """The file of CVS test `name` (or `name` itself when it is a path to a .py file)."""
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"cvs run {name}: no such test file")
        return path.resolve()
    dirs = cvs_tests_dirs()
    for base in dirs:
        for root, subdirs, files in os.walk(base):
            subdirs.sort()
            if f"{name}.py" in files and _is_test_module(f"{name}.py"):
                return (Path(root) / f"{name}.py").resolve()
    where = ", ".join(str(d) for d in dirs) or CVS_TESTS_PACKAGE
    raise UsageError(f"cvs run {name}: no CVS test module {name}.py under {where}")


def cvs_package_root() -> Path | None:
    """The directory holding the `cvs` package, whose conftest.py files pytest must load."""
    spec = importlib.util.find_spec("cvs")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def pytest_args(
    test_file: Path,
    functions: list[str],
    *,
    cluster_file: str,
    config_file: str,
    junit: Path,
    html: str | None,
    log_file: str | None,
) -> list[str]:
    args = [f"{test_file}::{f}" for f in functions] or [str(test_file)]
    args += [f"--cluster_file={cluster_file}", f"--config_file={config_file}"]
    args += [f"--junitxml={junit}", "-p", "no:cacheprovider"]
    # In-process, anyio is imported before pytest starts: nothing to rewrite there.
    args += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    root = cvs_package_root()
    if root is not None and test_file.is_relative_to(root):
        # Load cvs/conftest.py and cvs/tests/conftest.py above the test, as in a checkout.
        args.append(f"--confcutdir={root}")
    if html:
        args += [f"--html={html}", "--self-contained-html"]
    if log_file:
        args.append(f"--log-file={log_file}")
    return args


def run_cvs_test(
    test: str,
    functions: list[str],
    *,
    cluster_file: str | None,
    config_file: str | None,
    html: str | None = None,
    log_file: str | None = None,
    run_dir: str | None = None,
    json_output: bool = False,
    out: IO[str] | None = None,
) -> int:
    """Run CVS test module `test` through pytest on our engine; our exit code."""
    import pytest

    out = out or sys.stdout
    if not test:
        raise UsageError("cvs run: name a CVS test (cvs run TEST --cluster_file C --config_file T)")
    if not cluster_file or not config_file:
        raise UsageError(f"cvs run {test}: a CVS test needs both --cluster_file and --config_file")
    cluster_file, config_file = os.path.abspath(cluster_file), os.path.abspath(config_file)
    cluster_from_files(cluster_file, config_file)  # a bad file is exit 2 before anything runs
    test_file = find_cvs_test(test)
    if html and importlib.util.find_spec("pytest_html") is None:
        raise UsageError("cvs run --html: needs the pytest-html plugin (pip install pytest-html)")
    stem = test_file.stem
    if run_dir:
        recorder = RunRecorder.create(Path(run_dir))
    else:
        recorder = RunRecorder.create(default_run_dir(stem), unique=True)
    log_file = log_file or str(recorder.run_dir / f"{stem}.log")
    for report in (html, log_file):
        if report:
            Path(report).parent.mkdir(parents=True, exist_ok=True)
    record = CvsRunRecord(recorder, test=stem, test_file=str(test_file), cluster_file=cluster_file)
    args = pytest_args(
        test_file,
        functions,
        cluster_file=cluster_file,
        config_file=config_file,
        junit=recorder.junit_path,
        html=html,
        log_file=log_file,
    )
    # With --json, stdout carries only our JSON line: pytest's report goes to stderr.
    report_to = redirect_stdout(sys.stderr) if json_output else nullcontext()
    with report_to:
        code = int(pytest.main(args, plugins=[CvsEngine(record)]))
    ours = finish_with_pytest_status(record, code)
    error = record.outcome.error
    files = {
        "run_dir": str(recorder.run_dir),
        "events": str(recorder.events_path),
        "logs": str(recorder.run_dir / "logs"),
        "results": str(recorder.results_path),
        "junit": str(recorder.junit_path),
        "log_file": log_file,
    }
    if html:
        files["html"] = html
    if json_output:
        doc = {"ok": ours == 0, "exit_code": int(ours), "test": stem, "files": files}
        out.write(json.dumps(doc) + "\n")
    else:
        seconds = (datetime.now(UTC) - record.outcome.started).total_seconds()
        word = {0: "ok", 3: "host unreachable", 4: "refused", 130: "interrupted"}.get(
            int(ours), "failed"
        )
        out.write(f"{stem}: {word} (exit {int(ours)}) in {seconds:.1f}s")
        out.write(f": {error}\n" if error else "\n")
        for label, path in files.items():
            out.write(f"{label + ':':9} {path}\n")
    out.flush()
    return int(ours)
