"""`cvs run TEST [FUNCTION...] --cluster_file C --config_file T [...] [PYTEST ARGS]`.

TEST is found the way CVS finds it: a module `TEST.py` anywhere under the
`cvs.tests` package or under the test directories of the CVS extensions CVS's
own discovery (`cvs.extension`) finds (conftest.py and `_private` modules are
not tests), or a path to a test file. It runs through pytest (in a child
interpreter that has loaded nothing of ours when pytest starts), with our
engine in place of CVS's orchestrators and a run directory written as for
`cvs run SUITE`. Arguments cvs run does
not know are pytest's, as under CVS.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from orchestrator.errors import UsageError
from orchestrator.suites.records import RunRecorder, default_run_dir

from .config import cluster_from_files
from .pytest_child import CHILD_MODULE, ChildSpec

CVS_TESTS_PACKAGE = "cvs.tests"
CVS_EXTENSION_MODULE = "cvs.extension"
# Where CVS's extension discovery looks, for the message when a test is not found.
CVS_EXTENSION_SOURCES = (
    "entry points cvs.extensions, `cvs extension --plug`, $CVS_EXTENSION_PKG_NAMES, "
    "an extension.ini in the cvs package"
)

# pytest-html's own options, CVS's `--self-contained-html` among them.
HTML_OPTIONS = ("--self-contained-html", "--css")

# Options cvs run passes itself: a second value would point CVS's conftest at other
# files, or move pytest's report away from the run directory that records the run.
OWN_PYTEST_OPTIONS = {
    "--cluster_file": "give it once, as cvs run's own option",
    "--config_file": "give it once, as cvs run's own option",
    "--junitxml": "the run directory's junit.xml is pytest's (choose it with --run-dir)",
    "--junit-xml": "the run directory's junit.xml is pytest's (choose it with --run-dir)",
    "--html": "use cvs run's own --html",
    "--log-file": "use cvs run's own --log-file",
    "--confcutdir": "cvs run sets it so that CVS's conftest.py files load",
}


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


def cvs_extension_tests_dirs() -> list[tuple[str, Path]]:
    """(extension, directory) for each test directory of the CVS extensions that CVS's
    own discovery finds; none with a CVS from before extensions."""
    try:
        module = importlib.import_module(CVS_EXTENSION_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name in (CVS_EXTENSION_MODULE, "cvs"):
            return []
        raise
    try:
        entries = module.ExtensionConfig().get_tests_dirs()
    except Exception as exc:  # CVS's code: its failure is named, not a traceback
        raise UsageError(
            f"cvs run: CVS's extension discovery ({CVS_EXTENSION_MODULE}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    found = []
    for entry in entries:
        # CVS yields (module path, directory) before multi-extension support and
        # (extension, module path, directory) since.
        found.append((str(entry[0]), Path(entry[-1])))
    return found


def find_cvs_test(name: str) -> Path:
    """The file of CVS test `name` (or `name` itself when it is a path to a .py file).

    Searched: the `cvs.tests` package, then each CVS extension's test directories.
    Found in more than one of them is an error naming each: running the wrong
    module on a cluster is not a guess to make.
    """
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"cvs run {name}: no such test file")
        return path.resolve()
    filename = f"{name}.py"
    places = [(CVS_TESTS_PACKAGE, d) for d in cvs_tests_dirs()] + cvs_extension_tests_dirs()
    found: list[Path] = []
    if _is_test_module(filename):
        for _, base in places:
            match = _first_in_tree(base, filename)
            if match is not None and match not in found:
                found.append(match)
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError(
            f"cvs run {name}: {filename} is in more than one place "
            f"({', '.join(str(p) for p in found)}): give the test file's path"
        )
    where = "; ".join(
        f"{label}: {base}" + ("" if base.is_dir() else " (missing)") for label, base in places
    )
    if not any(label != CVS_TESTS_PACKAGE for label, _ in places):
        where += f"; no CVS extensions found ({CVS_EXTENSION_SOURCES})"
    raise UsageError(f"cvs run {name}: no CVS test module {filename} under {where}")


def _first_in_tree(base: Path, filename: str) -> Path | None:
    for root, subdirs, files in os.walk(base):
        subdirs.sort()
        if filename in files:
            return (Path(root) / filename).resolve()
    return None


def checked_pytest_args(args: Sequence[str]) -> list[str]:
    """Extra pytest arguments as argv words; UsageError for what cvs run sets itself."""
    if isinstance(args, str):
        raise UsageError("cvs run: pytest arguments are a list of argv words, not one string")
    out = []
    for arg in args:
        if not isinstance(arg, str) or "\0" in arg:
            raise UsageError(f"cvs run: pytest argument {arg!r}: not an argv word")
        option = arg.split("=", 1)[0]
        if option in OWN_PYTEST_OPTIONS:
            raise UsageError(f"cvs run: {option}: {OWN_PYTEST_OPTIONS[option]}")
        out.append(arg)
    return out


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
    extra: Sequence[str] = (),
) -> list[str]:
    args = [f"{test_file}::{f}" for f in functions] or [str(test_file)]
    args += [f"--cluster_file={cluster_file}", f"--config_file={config_file}"]
    args += [f"--junitxml={junit}", "-p", "no:cacheprovider"]
    root = cvs_package_root()
    if root is not None and test_file.is_relative_to(root):
        # Load cvs/conftest.py and cvs/tests/conftest.py above the test, as in a checkout.
        args.append(f"--confcutdir={root}")
    if html:
        args += [f"--html={html}", "--self-contained-html"]
    if log_file:
        args.append(f"--log-file={log_file}")
    # Last, as CVS puts them: an option given twice is pytest's last one.
    args += extra
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
    extra_pytest_args: Sequence[str] = (),
) -> int:
    """Run CVS test module `test` through pytest on our engine; our exit code.

    Everything that can be refused is checked here (exit 2, nothing run); the
    run itself is pytest in a child interpreter (compat/pytest_child.py) that
    has imported nothing of ours but pytest when pytest starts. In this
    process anyio, asyncssh and the CLI's stream wrappers are loaded already,
    and pytest reacts to modules imported before it: it warns that it cannot
    rewrite them, and to warn it parses the suite's `pytest.ini` warning
    filters, which CVS's cannot pass (`ignore:...:BrokenPipeError`, exit 2).
    The child sees what CVS's own `cvs run` gives pytest.
    """
    if not test:
        raise UsageError("cvs run: name a CVS test (cvs run TEST --cluster_file C --config_file T)")
    if not cluster_file or not config_file:
        raise UsageError(f"cvs run {test}: a CVS test needs both --cluster_file and --config_file")
    cluster_file, config_file = os.path.abspath(cluster_file), os.path.abspath(config_file)
    cluster_from_files(cluster_file, config_file)  # a bad file is exit 2 before anything runs
    extra = checked_pytest_args(extra_pytest_args)
    test_file = find_cvs_test(test)
    wants_html = html or next((a for a in extra if a.split("=", 1)[0] in HTML_OPTIONS), None)
    if wants_html and importlib.util.find_spec("pytest_html") is None:
        # Checked here, not left to pytest: its usage error would come after the run
        # directory was made. Our report.html is no stand-in: it shows calls, not tests.
        option = "--html" if html else str(wants_html).split("=", 1)[0]
        raise UsageError(
            f"cvs run {option}: pytest-html is not installed here (pip install pytest-html); "
            "nothing was run"
        )
    stem = test_file.stem
    # What was there before, so that a refused start takes away only its own files.
    existing = sorted(os.listdir(run_dir)) if run_dir and Path(run_dir).is_dir() else None
    if run_dir:
        recorder = RunRecorder.create(Path(run_dir))
    else:
        recorder = RunRecorder.create(default_run_dir(stem), unique=True)
    recorder.close()  # the child writes into it
    log_file = log_file or str(recorder.run_dir / f"{stem}.log")
    for report in (html, log_file):
        if report:
            Path(report).parent.mkdir(parents=True, exist_ok=True)
    args = pytest_args(
        test_file,
        functions,
        cluster_file=cluster_file,
        config_file=config_file,
        junit=recorder.junit_path,
        html=html,
        log_file=log_file,
        extra=extra,
    )
    spec: ChildSpec = {
        "test": test,
        "stem": stem,
        "test_file": str(test_file),
        "cluster_file": cluster_file,
        "run_dir": str(recorder.run_dir),
        "existing": existing,
        "json": json_output,
        "log_file": log_file,
        "html": html,
        "pytest_args": args,
    }
    for stream in (out, sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    return run_child(spec)


def run_child(spec: ChildSpec) -> int:
    """`python -m orchestrator.compat.pytest_child SPEC`, on this terminal; its exit code.

    Ctrl-C reaches the child too (same process group): pytest stops, the engine
    tears down and records the interruption. This process waits for that
    instead of leaving it half-done.
    """
    argv = [sys.executable, "-m", CHILD_MODULE, json.dumps(spec)]
    proc = subprocess.Popen(argv)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue
