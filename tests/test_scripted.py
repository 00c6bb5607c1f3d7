"""The scripted hosts (orchestrator/testing.py) cannot lie: a command nobody
scripted fails the test, a timeout is honoured, a remote program's argv is
read by its arguments' names, and the fake is a HostRunner (mypy holds it
to the protocol; here the lifecycle runs on it)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from scripted import probe_output

from orchestrator import remote
from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers.lifecycle import Lifecycle
from orchestrator.containers.locks import lock_command
from orchestrator.containers.outcome import UpReport
from orchestrator.events import NullSink
from orchestrator.testing import (
    HANG,
    PROGRAM_ARGS,
    Delay,
    ScriptedHosts,
    Unscripted,
    remote_program,
)


def test_a_command_nobody_scripted_fails_instead_of_passing_for_a_success() -> None:
    hosts = ScriptedHosts({})
    hosts.answer("run", lambda host, text: (0, "ok\n", "") if "--name ctr" in text else None)
    with pytest.raises(Unscripted, match="no answer scripted for label 'run'"):
        anyio.run(lambda: hosts.run("h1", ["docker", "run", "--name", "other"], label="run"))
    with pytest.raises(Unscripted, match="'pull'"):
        anyio.run(lambda: hosts.run("h1", ["docker", "pull", "img"], label="pull"))


def test_an_answer_slower_than_the_timeout_comes_back_as_a_timeout_when_it_passes() -> None:
    hosts = ScriptedHosts({})
    hosts.answer("slow", lambda host, text: Delay(60))
    started = time.monotonic()
    result = anyio.run(lambda: hosts.run("h1", "sleep 60", timeout=0.2, label="slow"))
    waited = time.monotonic() - started
    assert result.status == "timeout" and "0.2s" in (result.error or "")
    assert 0.2 <= waited < 30


def test_a_hang_without_a_timeout_is_an_error_every_remote_operation_is_bounded() -> None:
    hosts = ScriptedHosts({})
    hosts.answer("wait", lambda host, text: HANG)
    with pytest.raises(Unscripted, match="never ends and has no timeout"):
        anyio.run(lambda: hosts.run("h1", "cat", label="wait"))


def test_the_lock_is_read_by_its_arguments_names_as_lock_sh_names_them() -> None:
    text = (Path(remote.__file__).parent / "lock.sh").read_text()
    usage = re.search(r"#\s+lock\.sh ([^\[\n]+)", text)
    assert usage is not None
    assert len(usage.group(1).split()) == len(PROGRAM_ARGS["lock"])
    probe = ["sh", "-c", "PROBE", "cvs-probe", "a", "b"]
    command = lock_command("/run/lock", "exclusive", wait=5, description="me", probe=probe)
    program = remote_program(command)
    assert program is not None and program.name == "lock"
    assert program.args == {
        "lockdir": "/run/lock",
        "mode": "x",
        "wait": "5",
        "description": "me",
        "lease": program.args["lease"],
    }
    assert program.rest == ("PROBE", "a", "b")


def test_a_docker_call_that_hangs_fails_its_host_within_runtime_timeout() -> None:
    hosts = ScriptedHosts({h: probe_output() for h in ("h1", "h2")})
    hosts.answer("run", lambda host, text: (0, "c" * 64 + "\n", ""))
    hosts.answer("verify", lambda host, text: HANG if host == "h2" else (0, "true\n", ""))
    hosts.succeed("setup")
    cfg = ContainerConfig(
        image="img:1",
        name="ctr",
        lifetime="persistent",
        sshd={"enabled": False},
        runtime_timeout=0.3,
    )
    cluster = ClusterConfig(
        name="t", hosts=[HostSpec(name="h1"), HostSpec(name="h2")], container=cfg
    )
    lc = Lifecycle(cluster, hosts, NullSink())

    async def main() -> UpReport:
        try:
            return await lc.up()
        finally:
            await lc.locks.release()

    report = anyio.run(main)
    assert report.outcomes["h1"].ok
    failed: Any = report.outcomes["h2"]
    assert failed.state == "failed" and "container.runtime_timeout" in str(failed.error)
    assert ("h2", "verify", 0.3) in hosts.timeouts
