"""No function in orchestrator/ over 80 lines, none nesting its blocks more
than 4 deep: a newcomer reads one screen at a time (docs/design.md). An
`elif` continues its `if`; a nested function or class starts afresh. No
`getattr` on a name built from a string: a call can be followed to its handler."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"
MAX_LINES = 80
MAX_DEPTH = 4
BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def depth(node: ast.AST, level: int = 0) -> int:
    """How deep `node`'s blocks nest (its own body is level 0)."""
    deepest = level
    for field, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        for child in children:
            if not isinstance(child, ast.AST) or isinstance(child, SCOPES):
                continue
            is_elif = (
                isinstance(node, ast.If)
                and field == "orelse"
                and len(children) == 1
                and isinstance(child, ast.If)
            )
            inner = level + 1 if isinstance(child, BLOCKS) and not is_elif else level
            deepest = max(deepest, depth(child, inner))
    return deepest


@pytest.fixture(autouse=True, scope="module")
def _parsed_only_while_this_module_runs() -> Iterator[None]:
    """The parsed modules are let go after this module's tests: kept to the
    session's end, every later full collection would walk them (the four
    modules' such caches: 1.1 million objects, 0.9 s a collection here)."""
    yield
    modules.cache_clear()
    functions.cache_clear()


@cache
def modules() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package, parsed once for all the checks here."""
    return tuple((path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py")))


@cache
def functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_is_over_80_lines() -> None:
    long = {
        where: (node.end_lineno or node.lineno) - node.lineno + 1
        for where, node in functions()
        if (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_LINES
    }
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_no_function_nests_its_blocks_more_than_4_deep() -> None:
    depths = {where: depth(node) for where, node in functions()}
    deep = {where: d for where, d in depths.items() if d > MAX_DEPTH}
    assert not deep, f"functions nesting more than {MAX_DEPTH} deep: {deep}"


def test_the_depth_counts_blocks_not_elifs() -> None:
    code = (
        "def f(x):\n    if x:\n        for y in x:\n            pass\n    elif x:\n        pass\n"
    )
    (func,) = ast.parse(code).body
    assert depth(func) == 2


def composed_getattrs(tree: ast.AST) -> list[int]:
    """Lines of `getattr(x, "op_" + name)` and the like: an attribute name
    composed from a literal (a +, an f-string, % or .format), which is dispatch
    by string that neither grep nor mypy can follow from a call to its handler."""

    def composed(name: ast.AST) -> bool:
        if isinstance(name, ast.JoinedStr):
            return True
        if isinstance(name, ast.BinOp) and isinstance(name.op, ast.Add | ast.Mod):
            return any(
                (isinstance(side, ast.Constant) and isinstance(side.value, str)) or composed(side)
                for side in (name.left, name.right)
            )
        return (
            isinstance(name, ast.Call)
            and isinstance(name.func, ast.Attribute)
            and name.func.attr == "format"
        )

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and composed(node.args[1])
    ]


def test_no_getattr_dispatches_on_a_composed_name() -> None:
    found = {
        f"{path.relative_to(PACKAGE)}:{line}"
        for path, tree in modules()
        for line in composed_getattrs(tree)
    }
    assert not found, f"getattr on a name built from a string (use a table or a match): {found}"


def test_the_getattr_check_sees_concatenations_and_f_strings() -> None:
    code = (
        'getattr(self, "op_" + method)\n'
        'getattr(self, f"op_{method}")\n'
        'getattr(self, "op_%s" % method)\n'
        'getattr(self, "op_{}".format(method))\n'
        "getattr(self, name)\n"
        'getattr(self, "stdout")\n'
    )
    assert composed_getattrs(ast.parse(code)) == [1, 2, 3, 4]


def test_no_module_imports_traversable_from_importlib_abc() -> None:
    """importlib.abc.Traversable is deprecated since 3.12 and gone in 3.14:
    importlib.resources.abc holds it."""
    found = [
        str(path)
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "importlib.abc"
    ]
    assert found == []


def test_every_directory_of_the_package_is_in_pyprojects_packages() -> None:
    """setuptools leaves out (and warns of) an importable directory missing
    from `packages`, such as suites/templates, whose report.html.j2 `cvs run`
    needs: each directory with files is listed."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    package = root / "orchestrator"
    found = {
        ".".join(d.relative_to(root).parts)
        for d in [package, *package.rglob("*")]
        if d.is_dir()
        and d.name != "__pycache__"
        and any(f.is_file() and not f.name.endswith((".pyc",)) for f in d.iterdir())
    }
    assert found - listed == set()


# ---- imports live at the top of a module, laziness at a few boundaries --------------

# Where imports may wait for first use, each for its callers' start-up time.
LAZY_BOUNDARIES = {
    # The CLI's dispatch: a command's module once it is chosen; cli.common
    # (the config model, pydantic) on the error paths only. `cvs --help`
    # loads neither (tests/test_startup.py).
    "cli/__init__.py",
    # The package's public names, imported on first use: `import orchestrator` is cheap.
    "__init__.py",
    # The API's entry points: each operation (up, cp, status, a command in a
    # container...) imports its modules when called, so `cvs exec --host-os`
    # never loads the lifecycle, copy, probe or docker modules (tests/test_startup.py).
    "api.py",
    # The pytest plugin: every pytest in the environment loads it (entry point
    # pytest11), CVS's runs included; the engine and its SSH stack come in
    # only when a test asks for them.
    "pytest_plugin.py",
    "compat/pytest_engine.py",
    "compat/pytest_child.py",
}

# Function-level imports elsewhere: (file, module) -> why. Each site says why
# in a comment too.
LAZY_EXCEPTIONS = {
    ("cli/common.py", "orchestrator.render.live"): "rich, for the live view on a terminal only",
    ("cli/exec.py", "orchestrator.render.live"): "rich, for --group on a terminal only",
    ("cli/cluster.py", "orchestrator.render.live"): "rich, for the status table on a terminal",
    ("cli/files.py", "rich.console"): "rich, for cp's progress bar on a terminal only",
    ("cli/files.py", "rich.progress"): "rich, for cp's progress bar on a terminal only",
    ("cli/run.py", "rich.console"): "rich, for the run's table on a terminal only",
    ("cli/run.py", "rich.table"): "rich, for the run's table on a terminal only",
    ("cli/run.py", "orchestrator.compat.runner"): "`cvs run TEST` (CVS's pytest tests): a mode",
    ("cli/run.py", "orchestrator.suites.runner"): "a suite run's SSH stack: not for --list",
    ("cli/writer.py", "tempfile"): "7 ms of every piped start: only once output spills",
    ("containers/exec.py", "orchestrator.containers.argv"): "not for `cvs exec --host-os`",
    ("containers/exec.py", "orchestrator.remote.runtime"): "not for `cvs exec --host-os`",
    ("config/hostlist.py", "ClusterShell.NodeSet"): "30 ms: only when a list is folded",
    ("config/documents.py", "difflib"): "only for a misspelt key (tests/test_startup.py)",
    ("config/cvs_json.py", "difflib"): "only for a misspelt key (tests/test_startup.py)",
    ("ssh/libsearch.py", "asyncssh"): "imported inside the patched find_library's window",
    ("sandbox/registry.py", "crypt"): "Python 3.13 has no crypt: only a registry's htpasswd",
}


def lazy_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each import inside a function (at any depth): a
    module-level `if TYPE_CHECKING:`, `try:` or `with` block does not count."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(tree, False)
    return found


def test_imports_wait_for_first_use_only_at_the_boundaries() -> None:
    """A function-level import outside LAZY_BOUNDARIES and LAZY_EXCEPTIONS:
    move it to the top of its module (an import cycle it was hiding is fixed
    by moving the shared thing down a layer), or, when it keeps a module off
    a start-up that tests/test_startup.py pins, add it there with why."""
    found = [
        f"{where}:{line} {module}"
        for path, tree in modules()
        if (where := str(path.relative_to(PACKAGE))) not in LAZY_BOUNDARIES
        for line, module in lazy_imports(tree)
        if (where, module) not in LAZY_EXCEPTIONS
    ]
    assert found == [], found


def test_every_lazy_exception_is_still_one() -> None:
    seen = {
        (str(path.relative_to(PACKAGE)), module)
        for path, tree in modules()
        for _, module in lazy_imports(tree)
    }
    assert set(LAZY_EXCEPTIONS) - seen == set()
    assert {p for p in LAZY_BOUNDARIES if not (PACKAGE / p).is_file()} == set()


# In api.py, imports wait at the operations (its public functions and
# methods) and at these private gates only, each shared by several operations.
API_GATES = {
    "_runner": "Cluster.open's worker processes (pickle, frames): a fleet only",
    "_lifecycle": "every container operation's lifecycle, locks and probe",
    "_guard_gpu_env": "limits, for a container's environment only (up, exec)",
    "_explain": "causes (argv, limits) for a failed command in a container only",
}


def lazy_imports_by_function(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level function or method name -> the modules it imports inside."""
    found: dict[str, list[str]] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                wrapper = ast.Module(body=[member], type_ignores=[])
                modules = [module for _, module in lazy_imports(wrapper)]
                if modules:
                    found.setdefault(member.name, []).extend(modules)
    return found


def test_the_api_imports_lazily_only_at_its_operations_and_gates() -> None:
    """A private helper of api.py importing on its own hides a module's
    weight from the operation that pays it: import at the top of api.py when
    `cvs exec --host-os` may load it (tests/test_startup.py), else at the
    operation, or name the helper a gate here, with why."""
    tree = dict((str(p.relative_to(PACKAGE)), t) for p, t in modules())["api.py"]
    private = {
        name: found
        for name, found in lazy_imports_by_function(tree).items()
        if name.startswith("_") and not name.startswith("__") and name not in API_GATES
    }
    assert private == {}
    assert set(API_GATES) <= set(lazy_imports_by_function(tree))


def test_the_lazy_import_check_sees_methods_and_nested_functions_only() -> None:
    code = (
        "import os\n"
        "if TYPE_CHECKING:\n    import rich\n"
        "try:\n    import shtab\nexcept ImportError:\n    shtab = None\n"
        "def f():\n    import json\n"
        "class C:\n    def m(self):\n        def g():\n            from .x import y\n"
        "async def h():\n    from a.b import c\n"
    )
    assert lazy_imports(ast.parse(code)) == [(9, "json"), (13, ".x"), (15, "a.b")]


def test_no_task_is_started_outside_a_task_group() -> None:
    """A task outlives whoever started it unless a task group owns it (the
    pool's background group, a fan-out's): no `create_task`/`ensure_future`."""
    found = {
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("create_task", "ensure_future")
    }
    assert not found, f"a task no task group owns: {found}"
