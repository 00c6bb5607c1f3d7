"""Issue 30, finding 4: a reader that closes cvs's stdout (`cvs status |
head -1`) gets no traceback from any command that writes there: one line on
stderr says the output was cut.

The hosts here refuse connections at once (a closed port on 127.0.0.1): each
command writes what it writes for them, to a pipe whose reader is already
gone.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
import traceback
from pathlib import Path

import pytest
import yaml
from clitools import CVS, cvs_in_process

CLUSTER = {
    "name": "closed",
    "hosts": [{"name": "h1", "address": "127.0.0.1", "port": 1}],
    "ssh": {"connect_timeout": 5},
    "container": {"image": "img:1", "name": "closed", "lifetime": "persistent"},
}


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    doc = {**CLUSTER, "state_dir": str(tmp_path / "state")}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "suite.yaml").write_text(
        yaml.safe_dump({"name": "s", "steps": [{"name": "one", "run": "true"}]})
    )
    (tmp_path / "src.txt").write_text("payload\n")
    return path


# Each command that writes to stdout (docs/cli-output.md).
COMMANDS = [
    ["validate", "--no-check-files"],
    ["plan"],
    ["up"],
    ["down", "--force"],
    ["status"],
    ["exec", "--", "true"],
    ["cp", "{dir}/src.txt", "/tmp/x"],
    ["run", "{dir}/suite.yaml", "--run-dir", "{dir}/run"],
    ["runs"],
    ["completion", "bash"],
]


def closed_stdout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`cvs ARGS` whose stdout reader has gone before it writes a byte."""
    proc = subprocess.Popen(
        [*CVS, *args],
        cwd=cwd,
        env={**os.environ, "CI": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    code = proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, code, "", err)


class _GoneReader(io.TextIOBase):
    """A stdout whose reader has gone: every write fails as a closed pipe's does."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def in_process(*argv: str, cwd: Path) -> tuple[int, str, str]:
    """(exit code, what reached stdout, stderr) of `cvs ARGV` run by `main` here,
    stdout's reader gone; a traceback, as the interpreter prints it, exit 1."""
    from orchestrator.cli import main

    err = io.StringIO()
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(_GoneReader()), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved)
    return code, "", err.getvalue()


@pytest.mark.parametrize("json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:1]))
def test_a_closed_stdout_gives_no_traceback(
    cluster: Path, command: list[str], json: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "1")
    words = [w.replace("{dir}", str(cluster.parent)) for w in command]
    flags = ["--json"] if json and words[0] != "completion" else []
    argv = [*flags, "-c", str(cluster), *words]
    _, _, err = in_process(*argv, cwd=cluster.parent)
    assert "Traceback" not in err, err
    if "stdout closed by its reader" not in err:
        # Nothing said: then the command had nothing for stdout.
        assert cvs_in_process(*argv, cwd=cluster.parent).stdout == ""


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_a_closed_pipe_as_a_process_gets_one_line_and_no_exception_at_exit(
    cluster: Path,
) -> None:
    """The real thing once: `cvs --json status | head -0`, the interpreter's
    exit included (what Python still holds for the pipe must not print
    `Exception ignored`)."""
    proc = closed_stdout("--json", "status", "-c", str(cluster), cwd=cluster.parent)
    assert proc.stderr.count("cvs: stdout closed by its reader") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 130, proc.stderr
