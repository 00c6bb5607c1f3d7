"""Running the real `cvs` CLI from tests, and reading its `--json` output.

One way to run it (`cvs`) and one way to read the summary (`last_json`), so a
newcomer learns them once. A test module that wants a different default (a
cluster file first, a longer timeout) wraps these in a line or two; none
spawns the CLI itself. Not a test module: tests import it, it imports no test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The CLI as this interpreter runs it: the venv's python tests the worktree.
CVS = [sys.executable, "-m", "orchestrator"]


def cvs(
    *args: str,
    cluster: Path | str | None = None,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    ci: bool = True,
    base_env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`cvs [-c cluster] args...`, captured as text; never raises on a nonzero exit.

    The environment is `base_env` (default: this process's) with `CI=1` (plain
    output, no TTY habits) unless `ci=False`, then `env` on top.
    """
    argv = [*CVS]
    if cluster is not None:
        argv += ["-c", str(cluster)]
    argv += args
    full_env = {**(os.environ if base_env is None else base_env)}
    if ci:
        full_env["CI"] = "1"
    full_env.update(env or {})
    return subprocess.run(
        argv,
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def cvs_in_process(
    *args: str,
    cluster: Path | str | None = None,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    ci: bool = True,
    base_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`cvs(...)` by calling the CLI's `main` in this process: the same argv,
    environment, working directory, output and exit code (a traceback, as
    the interpreter would print it, exit 1), without starting an interpreter
    and importing cvs again (a third of a second each).

    For what the CLI decides before it contacts anything (usage errors, exit
    2, nothing written): how `python -m orchestrator` starts, exits and
    reacts to signals is tested with `cvs`, in a process of its own.
    """
    import contextlib
    import io
    import traceback

    from orchestrator.cli import main

    del timeout  # `cvs`'s signature: nothing run this way waits on a host

    argv = [*(["-c", str(cluster)] if cluster is not None else []), *args]
    full_env = {**(os.environ if base_env is None else base_env)}
    if ci:
        full_env["CI"] = "1"
    full_env.update(env or {})
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.clear()
        os.environ.update(full_env)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess([*CVS, *argv], code, out.getvalue(), err.getvalue())


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    """What a failed assertion on a CLI run shows: exit code and both streams."""
    return f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def json_docs(stdout: str) -> list[dict[str, Any]]:
    """Every JSON line of `--json` output, in order (events, then the result)."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def last_json(proc_or_text: subprocess.CompletedProcess[str] | str) -> dict[str, Any]:
    """The result document of `cvs ... --json`: the last line that is not an event.

    cli.schema.json: zero or more events (they carry `event`), then exactly one
    result (it carries `exit_code`, never `event`).
    """
    text = proc_or_text if isinstance(proc_or_text, str) else proc_or_text.stdout
    found = [d for d in json_docs(text) if "exit_code" in d and "event" not in d]
    shown = text if isinstance(proc_or_text, str) else explain(proc_or_text)
    assert found, f"no JSON summary in the output:\n{shown}"
    return found[-1]


def cvs_on(cluster: Path | str, *args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """`cvs -c cluster args...`: for modules whose every call names its cluster file first."""
    return cvs(*args, cluster=cluster, **options)


def json_lines(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(events, result) from `--json` output; the result is the last line."""
    docs = json_docs(stdout)
    result = last_json(stdout)
    assert docs[-1] == result, f"the last JSON line is not the result:\n{stdout}"
    return docs[:-1], result
