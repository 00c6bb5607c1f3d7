"""The test suite's own shape: one way to run the CLI, one Lab, no test module importing another.

A newcomer reads `clitools.cvs` once; a test module that imports another drags
that module's fixtures and sandbox into its own collection. Shared helpers
live in non-test modules (clitools.py, conftest.py, ...).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox import sandbox_up

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {p.stem for p in TESTS.glob("test_*.py")}
THIS = Path(__file__).name


@pytest.fixture(autouse=True, scope="module")
def _parsed_only_while_this_module_runs() -> Iterator[None]:
    """The parsed modules are let go after this module's tests: kept to the
    session's end, every later full collection would walk them (the four
    modules' such caches: 1.1 million objects, 0.9 s a collection here)."""
    yield
    _tree.cache_clear()


@cache  # every check walks every test module: parsed once
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported_test_modules(path: Path) -> set[str]:
    """Test modules `path` imports: `test_x`, `tests.test_x`, `from tests import test_x`."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
            if node.module == "tests":
                names += [alias.name for alias in node.names]
        for name in names:
            last = name.removeprefix("tests.")
            if last in TEST_MODULES:
                found.add(last)
    return found


def defines_cvs(path: Path) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "cvs"
        for node in ast.walk(_tree(path))
    )


def defines_lab(path: Path) -> bool:
    return any(
        isinstance(node, ast.ClassDef) and node.name == "Lab" for node in ast.walk(_tree(path))
    )


def test_no_test_module_imports_another() -> None:
    offenders = {
        p.name: sorted(imported_test_modules(p))
        for p in sorted(TESTS.glob("test_*.py"))
        if imported_test_modules(p)
    }
    assert not offenders, (
        f"test modules importing test modules: {offenders}; "
        "move what they share into a helper module (clitools.py) or conftest.py"
    )


def test_no_test_module_defines_its_own_cvs() -> None:
    offenders = sorted(p.name for p in TESTS.glob("test_*.py") if defines_cvs(p))
    assert not offenders, f"{offenders} define their own cvs(); use clitools.cvs or cvs_on"


def test_no_test_module_defines_its_own_lab() -> None:
    offenders = sorted(p.name for p in TESTS.glob("test_*.py") if defines_lab(p))
    assert not offenders, f"{offenders} define their own Lab; use (or extend) labtools.Lab"


def test_the_check_sees_both_import_spellings(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("from test_lifecycle import cvs\nimport tests.test_exec_cli\n")
    assert imported_test_modules(sample) == {"test_lifecycle", "test_exec_cli"}


def test_a_test_without_the_sandbox_mark_cannot_build_one(tmp_path: Path) -> None:
    # conftest's guard: the fast subset (`-m "not sandbox"`) builds no sandbox.
    if os.geteuid() != 0:
        pytest.skip("sandbox_up refuses non-root before it would build anything")
    try:
        with pytest.raises(AssertionError, match="builds a sandbox without the sandbox mark"):
            sandbox_up(tmp_path / "sb", hosts=1)
    except SandboxError as exc:  # this machine lacks a tool: it stops before building too
        pytest.skip(str(exc))
    assert not any((tmp_path / "sb").glob("*"))


def test_no_test_module_spells_the_cli_command_itself() -> None:
    """`[sys.executable, "-m", "orchestrator", ...]` lives in clitools (CVS, cvs)."""
    spelled = 'sys.executable, "-m", "orchestrator"'
    offenders = sorted(
        p.name for p in TESTS.glob("test_*.py") if p.name != THIS and spelled in p.read_text()
    )
    assert not offenders, f"{offenders} spell the CLI; use clitools.cvs or clitools.CVS"
