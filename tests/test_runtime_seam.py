"""One runtime seam: what differs between docker and podman (rootful,
rootless) is a method or a field of `ContainerRuntime`
(orchestrator/remote/runtime.py); nothing else branches on the runtime's
name, but for the few places below, each with its reason."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"
RUNTIMES = {"docker", "podman"}

# file -> (how many branches on a runtime's name it may hold, why).
ALLOWED: dict[str, tuple[int, str]] = {
    "remote/runtime.py": (99, "the seam itself"),
    "config/model.py": (
        2,
        "the config layer is below the seam: rootless and registry_tls_verify need podman",
    ),
    "config/rootless.py": (1, "the config layer is below the seam: rootless podman's checks"),
    "config/cvs_json.py": (2, "CVS's JSON names the runtime: read, below the seam"),
    "containers/probe.py": (
        2,
        "the probe's frames name the runtime it reached (read there), and its access "
        "failures are each runtime's own prose (what to install, start or grant)",
    ),
    "cli/sandbox.py": (2, "`cvs sandbox` flags: the sandbox is a developer tool of its own"),
}


def _branches_on_a_runtime_name(tree: ast.AST) -> list[int]:
    """Lines comparing with "docker" or "podman" (==, !=, in)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if isinstance(node.ops[0], ast.In | ast.NotIn):
            operands = node.comparators  # `"docker" in text`: a search, not a branch
        names = set()
        for operand in operands:
            if isinstance(operand, ast.Constant) and isinstance(operand.value, str):
                names.add(operand.value)
            elif isinstance(operand, ast.Tuple | ast.Set | ast.List):
                names |= {e.value for e in operand.elts if isinstance(e, ast.Constant)}
        if names & RUNTIMES:
            lines.append(node.lineno)
    return lines


@pytest.fixture(autouse=True, scope="module")
def _parsed_only_while_this_module_runs() -> Iterator[None]:
    """The parsed modules are let go after this module's tests: kept to the
    session's end, every later full collection would walk them (the four
    modules' such caches: 1.1 million objects, 0.9 s a collection here)."""
    yield
    _tree.cache_clear()


@cache  # the checks here walk every module: each parsed once
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def test_nothing_outside_the_runtime_seam_branches_on_the_runtimes_name() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("sandbox/"):
            continue  # the sandbox stands alone (it builds docker and podman hosts)
        lines = _branches_on_a_runtime_name(_tree(path))
        allowed = ALLOWED.get(rel, (0, ""))[0]
        if len(lines) > allowed:
            found[rel] = lines
    assert not found, (
        f"branches on the runtime's name outside remote/runtime.py: {found}; make the "
        "difference a ContainerRuntime property or method"
    )


def test_the_allow_list_holds_only_what_is_still_there() -> None:
    for rel, (count, _) in ALLOWED.items():
        if rel == "remote/runtime.py":
            continue
        lines = _branches_on_a_runtime_name(_tree(PACKAGE / rel))
        assert len(lines) == count, f"{rel}: {lines} (allowed {count}): update ALLOWED"


def _mappings_keyed_by_a_runtime_name(tree: ast.AST) -> list[int]:
    """Lines of a dict literal (or `dict(docker=...)`) keyed by runtime
    names: both of them, or nothing else (a table by runtime name is a branch
    on it). A record with one field called "docker" (status's deprecated JSON
    key) is not such a table."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            keys = {kw.arg for kw in node.keywords} if node.func.id == "dict" else set()
        else:
            continue
        named = keys & RUNTIMES
        if named and (named == RUNTIMES or keys <= RUNTIMES):
            lines.append(node.lineno)
    return lines


# file -> why a mapping keyed by a runtime's name is in place there.
MAPPINGS_ALLOWED = {
    "remote/runtime.py": "the seam itself",
}


def test_no_mapping_outside_the_runtime_seam_is_keyed_by_the_runtimes_name() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("sandbox/") or rel in MAPPINGS_ALLOWED:
            continue  # the sandbox stands alone (it builds docker and podman hosts)
        lines = _mappings_keyed_by_a_runtime_name(_tree(path))
        if lines:
            found[rel] = lines
    assert not found, (
        f"mappings keyed by the runtime's name outside remote/runtime.py: {found}; make "
        "the value a ContainerRuntime property"
    )


def test_a_mapping_keyed_by_a_runtime_name_is_found() -> None:
    tree = ast.parse(
        'EXIT = {"docker": 126, "podman": 127}\nW = dict(podman=1)\n'
        'ROW = {"host": 1, "docker": 2}\n'
    )
    assert _mappings_keyed_by_a_runtime_name(tree) == [1, 2]


# Remote side: the shell programs ask lib access.sh (cvs_runtime_frame,
# cvs_inspect, cvs_time_format, cvs_other_runtime, cvs_docker_order) instead
# of testing which runtime they run under.
SHELL_SEAM = {"access.sh", "podman.sh"}


def test_no_shell_program_tests_the_runtime_outside_its_library() -> None:
    found = []
    for path in sorted((PACKAGE / "remote").glob("*.sh")):
        if path.name in SHELL_SEAM:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"$cvs_rt" =' in code or '"$cvs_rt" !=' in code or "case $cvs_rt" in code:
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, f"runtime tests outside lib access.sh: {found}"
