"""`cvs exec -e/-w/-u` and suite steps' `workdir`/`user`: validated at the edge."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import cvs_in_process
from pydantic import ValidationError

from orchestrator.containers.exec import container_command
from orchestrator.suites.model import Step


def test_exec_options_reach_docker_exec_and_the_kill_runs_as_root() -> None:
    script, kill, stdin = container_command(
        "box", "pwd", env={"A": "1"}, user="cvsuser", workdir="/work dir", token="t"
    )
    assert "exec -i -u cvsuser -w '/work dir' box" in script
    assert "A=1" not in script and stdin is not None and "export A=1" in stdin  # env over stdin
    assert "exec -u 0 box" in kill


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"user": "-u root"}, "invalid container user"),
        ({"user": "a b"}, "invalid container user"),
        ({"workdir": "relative"}, "invalid working directory"),
        ({"workdir": "/a\nb"}, "invalid working directory"),
    ],
)
def test_bad_exec_user_or_workdir_is_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        container_command("box", "true", **kwargs)  # type: ignore[arg-type]


def test_step_takes_workdir_and_user() -> None:
    step = Step(name="s", run="make", workdir="/src", user="1000:1000")
    assert (step.workdir, step.user) == ("/src", "1000:1000")


@pytest.mark.parametrize(
    "fields",
    [{"workdir": "src"}, {"user": "x;y"}, {"on": "host", "workdir": "/src"}],
)
def test_bad_step_workdir_or_user_is_refused(fields: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Step(name="s", run="make", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-e", "NOVALUE"], "expected VAR=VALUE"),
        (["-e", "1X=2"], "expected VAR=VALUE"),
        (["--host-os", "-u", "root"], "apply inside the container"),
    ],
)
def test_bad_exec_flags_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    path = tmp_path / "c.yaml"
    # 192.0.2.1 never answers: the error must come before any connection.
    path.write_text("hosts: [{name: h, address: 192.0.2.1}]\ncontainer: {image: x}\n")
    proc = cvs_in_process("exec", *args, "--", "true", cluster=path, ci=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
