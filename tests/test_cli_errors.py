"""Expected conditions reach the user as one line and the right exit code, never a
traceback (issue 10.2): bad or unreadable identity files, a missing cluster file,
OS errors and errors wrapped in a task group's ExceptionGroup.

The cases that need a live host (SSH agent absent, dockerd socket gone) are in
tests/test_heal.py against the sandbox.
"""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import anyio
import pytest
from clitools import cvs_in_process, last_json

from orchestrator.cli import _first_expected, _report, main
from orchestrator.errors import CvsError, ExitCode, PolicyRefused, UsageError
from orchestrator.ssh.fanout import fan_out


def cvs_with_file(
    tmp_path: Path, cluster: str | None, *args: str
) -> subprocess.CompletedProcess[str]:
    """`cvs -c tmp_path/cluster.yaml args...`, the file written first unless
    `cluster` is None (in this process: these fail before any host is contacted)."""
    path = tmp_path / "cluster.yaml"
    if cluster is not None:
        path.write_text(cluster)
    return cvs_in_process(*args, cluster=path)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr


def test_identity_file_that_is_not_a_key_exits_2_before_any_host(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("not a key\n")
    cluster = "hosts: [{name: a, address: 192.0.2.1}]\nssh: {identity_files: [key]}\n"
    proc = cvs_with_file(tmp_path, cluster, "exec", "--", "true")
    one_line(proc, 2, "ssh.identity_files", "key", "not a private key")


def test_unreadable_identity_file_exits_2(tmp_path: Path) -> None:
    cluster = "hosts: [{name: a, address: 192.0.2.1}]\nssh: {identity_files: [/proc/1/mem]}\n"
    proc = cvs_with_file(tmp_path, cluster, "exec", "--", "true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "/proc/1/mem" in proc.stderr


def test_missing_cluster_file_exits_2(tmp_path: Path) -> None:
    one_line(cvs_with_file(tmp_path, None, "status"), 2, "cluster.yaml")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/runs/x/events.jsonl"), 1),
        (OSError(errno.EIO, "Input/output error"), 1),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), 2),
        (PermissionError(errno.EACCES, "Permission denied", "/state"), 2),
        (UsageError("bad input"), 2),
    ],
)
def test_os_and_cvs_errors_become_one_line_and_their_code(
    error: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _report(error) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cvs: ")
    if isinstance(error, OSError) and error.filename:
        assert error.filename in err


def test_an_expected_error_inside_a_task_group_is_found() -> None:
    inner = PermissionError(errno.EACCES, "Permission denied", "/state")
    group = BaseExceptionGroup("tasks", [ExceptionGroup("inner", [inner])])
    assert _first_expected(group) is inner
    assert _first_expected(BaseExceptionGroup("tasks", [RuntimeError("bug")])) is None


def test_interrupted_inside_a_task_group_is_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    leaf = _first_expected(BaseExceptionGroup("tasks", [KeyboardInterrupt()]))
    assert leaf is not None and _report(leaf) == ExitCode.INTERRUPTED


def up_raising(monkeypatch: pytest.MonkeyPatch, errors: dict[str, CvsError]) -> None:
    """`cvs up` becomes a per-host fan-out in which each host's task raises its error:
    what reaches `cli.main` is the task group's genuine ExceptionGroup."""

    async def host(name: str) -> None:
        raise errors[name]

    def cmd_up(args: object) -> int:
        anyio.run(fan_out, list(errors), host)
        return ExitCode.OK

    monkeypatch.setattr("orchestrator.cli.cluster.cmd_up", cmd_up)


def test_refusals_from_several_hosts_tasks_print_one_refusal_list_and_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    up_raising(
        monkeypatch,
        {
            "node1": PolicyRefused(["node1: lock busy"]),
            "node2": PolicyRefused(["node2: lock busy", "node2: no flock"]),
        },
    )
    assert main(["up"]) == ExitCode.REFUSED
    assert capsys.readouterr().err.splitlines() == [
        "cvs: refused, nothing was changed:",
        "  - node1: lock busy",
        "  - node2: lock busy",
        "  - node2: no flock",
    ]


def test_refusals_from_several_hosts_tasks_are_one_json_result_with_every_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    up_raising(
        monkeypatch,
        {"node1": PolicyRefused(["node1: lock busy"]), "node2": PolicyRefused(["node2: no flock"])},
    )
    assert main(["up", "--json"]) == ExitCode.REFUSED
    result = last_json(capsys.readouterr().out)
    assert (result["ok"], result["exit_code"]) == (False, ExitCode.REFUSED)
    assert result["refused"] == ["node1: lock busy", "node2: no flock"]


def test_different_errors_from_several_hosts_tasks_are_each_reported_and_the_worst_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    up_raising(
        monkeypatch,
        {
            "node1": CvsError("node1: docker run failed"),
            "node2": UsageError("node2: bad image reference"),
        },
    )
    assert main(["up"]) == ExitCode.USAGE
    assert capsys.readouterr().err.splitlines() == [
        "cvs: node1: docker run failed",
        "cvs: node2: bad image reference",
    ]


@pytest.mark.parametrize(
    ("argv", "option", "fixed"),
    [
        (["-c", "f", "--hosts", "node1", "up"], "--hosts", "cvs -c f up --hosts node1"),
        (["-c", "f", "-x=node2", "-v", "status"], "-x", "cvs -c f -v status -x=node2"),
        (["--force", "-c", "f", "down"], "--force", "cvs -c f down --force"),
    ],
)
def test_an_option_of_the_command_written_before_it_says_where_it_goes(
    argv: list[str], option: str, fixed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == ExitCode.USAGE and "invalid choice" not in err
    command = next(w for w in argv if w in ("up", "status", "down"))
    assert f"{option} is an option of `cvs {command}`: write it after the command ({fixed})" in err


def test_a_misplaced_option_under_json_names_its_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--json", "-c", "f", "--hosts", "node1", "plan"])
    doc = json.loads(capsys.readouterr().out)
    assert (doc["command"], doc["exit_code"]) == ("plan", 2)
