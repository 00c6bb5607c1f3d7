"""No CLI words below the CLI: what the core says names its API's options,
parameters and calls as data (errors.Option, Param, Call in an errors.Phrase
or a Refusal); a Python caller reads keyword arguments and calls, the CLI
user flags and `cvs` commands, from the same sentence."""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from clitools import cvs
from plan_states import cfg, host, states

from orchestrator.api import select_hosts
from orchestrator.cli.common import _FLAGS, _PARAMS, CLI_STYLE, cli_reasons, cli_text
from orchestrator.cli.parser import build_parser
from orchestrator.config import ConfigError, load_cluster
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.errors import (
    Call,
    HostSelectionError,
    Option,
    Param,
    Phrase,
    restyled,
)
from orchestrator.events import JsonLinesSink, Message, PlainSink

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"

# Modules below the CLI that may spell CLI words, and why. Nothing else may.
ALLOWED: dict[str, tuple[set[str], str]] = {
    "compat/runner.py": (
        {"*"},
        "the `cvs run TEST` command itself (CVS's command line): only cli/run.py calls it, "
        "with that command line's words, and its messages are about them",
    ),
    "compat/pytest_child.py": ({"*"}, "the child process of `cvs run TEST`"),
    "compat/config.py": (
        {"--cluster_file", "--config_file"},
        "CVS's own pytest options (its conftest.py registers them): the names a CVS suite's "
        "files are given by, under pytest as under `cvs run`",
    ),
    "limits/gpus.py": (
        {"--json", "--gpus"},
        "amd-smi's and rocm-smi's argv, run on the hosts; docker's own --gpus flag",
    ),
    "containers/jobend.py": ({"--mpi"}, "srun's own --mpi flag, in the holder step's argv"),
}
# The sandbox is a developer's tool with one caller, `cvs sandbox` (and tests):
# its messages are that command's.
CLI_ONLY_PACKAGES = ("cli", "sandbox")


@cache
def cli_words() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Our CLI's long flags, and `cvs COMMAND` for each of its commands."""
    flags: set[str] = set()
    commands: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    commands.add(name)
                    walk(sub)
            else:
                flags.update(o for o in action.option_strings if o.startswith("--"))

    walk(build_parser())
    flags -= {"--help", "--version"}
    assert {"--force", "--adopt", "--hosts", "--run-dir"} <= flags
    assert {"up", "down", "status", "validate"} <= commands
    by_length = sorted(flags, key=len, reverse=True)
    flag_re = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, by_length)) + r")(?![\w-])")
    command_re = re.compile(r"\bcvs (" + "|".join(sorted(commands)) + r")\b")
    return flag_re, command_re


def _strings(tree: ast.Module) -> list[ast.Constant]:
    """Every str literal but docstrings (f-strings' literal parts included)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


@pytest.fixture(autouse=True, scope="module")
def _parsed_only_while_this_module_runs() -> Iterator[None]:
    """The parsed modules are let go after this module's tests: kept to the
    session's end, every later full collection would walk them (the four
    modules' such caches: 1.1 million objects, 0.9 s a collection here)."""
    yield
    core_modules.cache_clear()


@cache
def core_modules() -> tuple[tuple[str, ast.Module], ...]:
    """(path under the package, parsed) of every module below the CLI."""
    return tuple(
        (p.relative_to(PACKAGE).as_posix(), ast.parse(p.read_text()))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] not in CLI_ONLY_PACKAGES
    )


def test_no_module_below_the_cli_spells_a_cli_flag_or_command() -> None:
    flag_re, command_re = cli_words()
    found = []
    for rel, tree in core_modules():
        allowed = ALLOWED.get(rel, (set(), ""))[0]
        for node in _strings(tree):
            for match in [*flag_re.finditer(node.value), *command_re.finditer(node.value)]:
                if "*" not in allowed and match.group(0) not in allowed:
                    found.append(f"{rel}:{node.lineno}: {match.group(0)!r} in {node.value!r}")
    assert not found, "CLI words below the CLI (say them as errors.Phrase parts):\n" + "\n".join(
        found
    )


def test_the_cli_only_modules_allowed_their_words_have_only_the_cli_as_a_caller() -> None:
    # compat/runner.py is `cvs run TEST` (it starts compat/pytest_child.py):
    # were anything below the CLI to call it, its words would reach an API user.
    callers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if "runner" not in text and "pytest_child" not in text:
            continue  # no import of either can be in it: not parsed (the slow part)
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if node.level:  # relative: from the importing module's package
                package = rel.split("/")[: -node.level]
                module = ".".join(["orchestrator", *package, module])
            if module in ("orchestrator.compat.runner", "orchestrator.compat.pytest_child"):
                callers.add(rel)
    assert callers == {"cli/run.py", "compat/runner.py"}, callers


def test_the_lint_finds_a_flag_and_a_command_in_plain_text() -> None:
    # The scan above would see what it is for.
    flag_re, command_re = cli_words()
    source = (
        'def f(y):\n    """--force in a docstring"""\n    return f"run `cvs down` or --force{y}"\n'
    )
    tree = ast.parse(source)
    words = [m.group(0) for n in _strings(tree) for m in flag_re.finditer(n.value)]
    words += [m.group(0) for n in _strings(tree) for m in command_re.finditer(n.value)]
    assert sorted(words) == ["--force", "cvs down"]
    assert not flag_re.search("docker run --env-file x --group-add y")


def _named(kind: str) -> set[str]:
    """The first argument of every `Option(...)` / `Param(...)` the core writes."""
    names = set()
    for _, tree in core_modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == kind
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return names


def test_every_option_and_parameter_the_core_names_has_a_flag() -> None:
    options = _named("Option")
    assert {"force", "adopt", "reprovision", "wait"} <= options
    assert options <= {name for name, _ in _FLAGS}
    params = _named("Param")
    assert {"hosts", "hosts_from", "run_dir"} <= params
    assert params <= set(_PARAMS)


# ---- one sentence, two audiences ------------------------------------------------


def test_a_phrase_reads_as_api_words_and_renders_as_flags_for_the_cli() -> None:
    said = Phrase(
        Option("force"),
        ": replacing it; else ",
        (Call("down", (Option("force"),)), Call("up")),
        ", or pass ",
        Param("run_dir"),
    )
    assert said == (
        "force=True: replacing it; else `down(force=True)` then `up()`, or pass run_dir"
    )
    assert cli_text(said) == (
        "--force: replacing it; else `cvs down --force && cvs up`, or pass --run-dir"
    )
    assert cli_text(Phrase("a ", Phrase(Option("wait", False)), " b")) == "a --no-wait b"
    assert cli_text(Phrase(Option("wait"))) == "without --no-wait"
    assert cli_text("plain text") == "plain text"


def test_restyling_renders_phrases_inside_reports_and_leaves_the_original() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", "running", ours=False)), adopt=True)
    (warning,) = [w for w in plan.warnings if "taking over" in w]
    shown = restyled(plan, CLI_STYLE)
    assert any(str(w).startswith("--adopt: taking over") for w in shown.warnings)
    assert str(warning).startswith("adopt=True: taking over")  # the API's plan is unchanged
    assert restyled({"w": [warning], "n": 3}, CLI_STYLE)["w"][0].startswith("--adopt")


def test_a_warning_reaches_a_python_caller_as_keywords_and_the_cli_user_as_flags() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", "running", ours=False)), adopt=True)
    warning = next(w for w in plan.warnings if "taking over" in w)
    event = Message(level="warning", text=warning)
    # The API's event, as a program collecting events or the pytest plugin reads it.
    assert str(event.text).startswith("adopt=True: taking over") and "--adopt" not in event.text
    # The CLI's sinks (it sets their style): the text one and --json's.
    text, lines = io.StringIO(), io.StringIO()
    plain = PlainSink(text)
    plain.style = CLI_STYLE
    plain.emit(event)
    as_json = JsonLinesSink(lines)
    as_json.style = CLI_STYLE
    as_json.emit(event)
    assert "--adopt: taking over" in text.getvalue() and "adopt=True" not in text.getvalue()
    assert json.loads(lines.getvalue())["text"].startswith("--adopt: taking over")


def test_a_refusal_reaches_a_python_caller_as_keywords_and_the_cli_user_as_flags() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", "running", ours=False)))
    assert plan.refused
    (api,) = plan.reasons
    (cli,) = cli_reasons(plan.refusals)
    assert "call again with force=True" in api and "--force" not in api
    assert "rerun with --force" in cli and "force=True" not in cli


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_a_host_selection_error_names_the_parameter_or_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: c\nhosts: [node1, node2]\n")
    with pytest.raises(HostSelectionError) as exc:
        select_hosts(load_cluster(path), "node9")
    assert str(exc.value).startswith("hosts 'node9': ")
    proc = cvs("exec", "--hosts", "node9", "--", "true", cluster=path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("cvs: --hosts 'node9': "), proc.stderr


def test_a_config_error_names_the_parameter_for_a_python_caller(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: c\nhosts: [node1]\n")
    with pytest.raises(ConfigError) as exc:
        load_cluster(path, hosts_from="pbs")
    assert str(exc.value).startswith("hosts_from 'pbs': unknown host source")
    assert cli_text(exc.value.args[0]).startswith("--hosts-from 'pbs': unknown host source")


# --- losing a Phrase's parts is a type error, or fails loudly ----------------------


def test_a_phrase_is_not_a_str_so_text_operations_cannot_drop_its_parts() -> None:
    phrase = Phrase(Option("force"), ": replacing it")
    assert not isinstance(phrase, str)
    assert phrase == "force=True: replacing it" and "replacing" in phrase  # read as API words
    with pytest.raises(TypeError):
        phrase + "!"  # type: ignore[operator]
    with pytest.raises(TypeError):
        phrase[:5]  # type: ignore[index]
    assert f"{phrase}" == "force=True: replacing it"  # the API's words (see the check below)
    assert cli_text(Phrase("warning: ", phrase)) == "warning: --force: replacing it"


def test_mypy_finds_the_operations_that_would_drop_a_phrases_parts(tmp_path: Path) -> None:
    from mypy import api as mypy_api

    snippet = tmp_path / "drop.py"
    snippet.write_text(
        "from orchestrator.errors import Option, Phrase, Text\n"
        "from orchestrator.results import HostResult\n"
        "def first(text: Text) -> str:\n"
        "    return text.splitlines()[0]\n"
        "def more(text: Text) -> Text:\n"
        "    return text + '!'\n"
        "def keep(result: HostResult) -> str | None:\n"
        "    return result.error\n"
        "x: str = Phrase(Option('force'))\n"
    )
    # Only the snippet and the two modules it reads are checked: following
    # their imports would check the whole package and its dependencies (the
    # package's __init__ names them for type checkers), ten times the time.
    modules = [str(PACKAGE / "errors.py"), str(PACKAGE / "results.py")]
    skip = ["--follow-imports=skip", str(snippet), *modules]
    out, _, code = mypy_api.run(["--strict", "--no-incremental", *skip])
    assert code == 1, out
    assert [line.split(":")[1] for line in out.splitlines() if ": error:" in line] == [
        "4",
        "6",
        "8",
        "9",
    ], out


# Fields typed `Text` (str | Phrase): an f-string formatting one keeps only the
# API's words, which mypy does not see. So each is formatted through `say(x,
# style)` (or `{x!s}`: the API's words, said on purpose), but for the fields
# of these names that are plain str where they are formatted (and why).
TEXT_FIELDS = {"error", "reason", "summary", "rolled_back", "detail"}
STR_THERE: dict[str, set[str]] = {
    "errors.py": {"self.reason"},  # Refusal.reason: a str (its ways out are data)
    "limits/gpus.py": {"self.reason"},  # Unsatisfiable.reason: a str
    "limits/slurm_gpus.py": {"picked.reason"},  # Unsatisfiable.reason: a str
    "containers/causes.py": {"facts.error"},  # the diagnosis' own error: a str
    "containers/locks.py": {"a.error"},  # a lock answer's error: a str
    "containers/probe.py": {"state.error"},  # HostState.error: a str
    "examples/test_with_cluster.py": {"r.error"},  # an example's API caller: the API's words
}


def test_no_f_string_formats_a_text_field_without_saying_in_whose_words() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FormattedValue):
                continue
            value = node.value
            said = node.conversion == ord("s")  # `{x!s}`: the API's words, on purpose
            named = isinstance(value, ast.Attribute) and value.attr in TEXT_FIELDS and not said
            if named and ast.unparse(value) not in STR_THERE.get(rel, set()):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(value)}")
    assert not found, f"f-strings dropping a Phrase's CLI words: {found}"
