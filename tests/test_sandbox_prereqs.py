"""`cvs sandbox up` checks the machine first: root, commands, writable paths (issue 10.2).

Nothing here builds a sandbox: every case is refused before anything changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from clitools import cvs as run_cvs

from orchestrator.sandbox import prereqs


def test_missing_commands_are_listed_with_one_apt_command(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    problems = prereqs.check(tmp_path / "sb", [], path_env=str(empty), is_root=lambda: True)
    assert problems and not problems.not_root
    for command in ("debootstrap", "ip", "nsenter", "sudo", "ssh-keygen"):
        assert command in problems.missing or command in problems.off_path
    message = problems.message()
    if problems.missing:
        assert problems.install_command().startswith("apt-get install -y ")
        assert message.count("apt-get install") == 1


def test_a_command_only_in_sbin_is_reported_as_off_path_not_missing(tmp_path: Path) -> None:
    problems = prereqs.check(tmp_path, [], path_env=str(tmp_path), is_root=lambda: True)
    for command in problems.off_path:
        assert command not in problems.missing
        assert command not in problems.install_command().split()


def test_not_root_is_reported(tmp_path: Path) -> None:
    problems = prereqs.check(tmp_path, [], is_root=lambda: False)
    assert problems.not_root and "run it with sudo" in problems.message()


def test_a_path_under_a_regular_file_is_unwritable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "cache"
    problems = prereqs.check(tmp_path, [target], is_root=lambda: True)
    assert str(target) in problems.unwritable
    assert "not a directory" in problems.unwritable[str(target)]


def test_all_present_and_writable_is_no_problem(tmp_path: Path) -> None:
    path = os.environ.get("PATH", "") + ":" + prereqs.SBIN_DIRS
    problems = prereqs.check(tmp_path / "new", [tmp_path], path_env=path, is_root=lambda: True)
    assert not problems.unwritable and not problems.not_root


def test_sandbox_up_without_the_tools_exits_2_listing_them_and_changes_nothing(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    directory = tmp_path / "sb"
    proc = run_cvs(
        "sandbox", "up", "--dir", str(directory), env={"PATH": str(empty)}, ci=False, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nothing was changed" in proc.stderr
    assert "debootstrap" in proc.stderr and "nsenter (util-linux)" in proc.stderr
    assert proc.stderr.count("apt-get install -y ") == 1
    assert not directory.exists()
