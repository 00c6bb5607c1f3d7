"""`cvs exec`'s stdin, its bytes, and what it leaves behind (issue 42, items
5, 6 and 9), on the sandbox, docker and podman hosts:

- stdin goes to every selected host, the same bytes to each; `-n` closes it;
- `-N` on one host passes stdout as it is, byte for byte (sha256); several
  hosts' output that is not text is marked and counted, never changed;
- a command whose connection to the container's sshd is lost is ended in
  the container through the host, and cvs says so; a cvs killed with
  SIGKILL leaves no command running past its lock's lease;
- containers cvs makes run an init as PID 1, which reaps orphans; `status`
  notes a container made without one.

A 2-host sandbox per runtime, persistent containers with their sshd (so
commands go through it), a state directory and a container name of this
module's own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from clitools import CVS, explain, json_lines
from labtools import Lab
from labtools import docker as runtime_cli
from sandboxtools import sandbox_pids_holding, wait_until

from orchestrator.api import Cluster
from orchestrator.containers.locks import LEASE_SECONDS
from orchestrator.results import HostResult
from orchestrator.sandbox import sandbox_down, sandbox_up

pytestmark = pytest.mark.sandbox

HOSTS = ["node1", "node2"]


def _up(path: Path) -> None:
    async def main() -> None:
        async with Cluster.open(path) as cluster:
            await cluster.up()

    anyio.run(main)


@pytest.fixture(scope="module", params=["docker", "podman"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A sandbox of the runtime and our persistent container (its sshd on) in it."""
    runtime = str(request.param)
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root")
    if runtime == "podman" and shutil.which("podman") is None:
        pytest.skip("podman hosts need podman")
    directory = tmp_path_factory.mktemp(f"streams-{runtime}")
    try:
        sb = sandbox_up(directory / "sb", hosts=len(HOSTS), runtime=runtime)
        lab = Lab(sb, directory, prefix="cvs-io")
        _up(lab.shared_file)
        yield lab
    finally:
        sandbox_down(directory / "sb")


def cvs_bytes(lab: Lab, *args: str, input: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """`cvs -c FILE args…` with `input` on its stdin, output as bytes."""
    return subprocess.run(
        [*CVS, "-c", str(lab.shared_file), *args],
        input=input,
        capture_output=True,
        env={**os.environ, "CI": "1"},
        timeout=240,
        check=False,
    )


def text_of(proc: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode()
    )


def in_container(lab: Lab, host: str, script: str) -> str:
    """`script` in the container through the runtime's own CLI (not cvs)."""
    return runtime_cli(lab.sb, host, "exec", "-u", "0", lab.name, "sh", "-c", script)


def gone(lab: Lab, needle: bytes, timeout: float) -> bool:
    return wait_until(lambda: not sandbox_pids_holding(lab.sb, needle), timeout=timeout)


# --- stdin (item 9) -------------------------------------------------------------


def test_stdin_reaches_the_command_on_every_host(lab: Lab) -> None:
    proc = cvs_bytes(lab, "exec", "--", "cat", input=b"hi\n")
    assert proc.returncode == 0, explain(text_of(proc))
    assert sorted(proc.stdout.decode().splitlines()) == [f"{h} | hi" for h in HOSTS]


def test_stdin_reaches_the_command_through_the_runtime_exec_too(lab: Lab) -> None:
    read, write = os.pipe()
    out: dict[str, dict[str, HostResult]] = {}

    async def main() -> None:
        async with Cluster.open(lab.shared_file) as cluster:
            cluster.ssh_exec.enabled = False  # `docker exec -i` / `podman exec -i`
            out["results"] = await cluster.exec("cat; echo end", stdin=read)

    os.write(write, b"one\ntwo\n")
    os.close(write)
    try:
        anyio.run(main)
    finally:
        os.close(read)
    assert {h: (r.status, r.stdout) for h, r in out["results"].items()} == dict.fromkeys(
        HOSTS, ("ok", "one\ntwo\nend")
    )


def test_a_stdin_that_never_ends_does_not_keep_cvs_once_the_commands_end(lab: Lab) -> None:
    proc = subprocess.Popen(
        [*CVS, "-c", str(lab.shared_file), "exec", "--", "echo ran"],
        stdin=subprocess.PIPE,  # open, never written, never closed
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CI": "1"},
    )
    try:
        code = proc.wait(timeout=120)  # a few lines of output: the pipes do not fill
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stdin is not None
        proc.stdin.close()
    assert code == 0, err
    assert sorted(out.splitlines()) == [f"{h} | ran" for h in HOSTS]


def test_dash_n_closes_the_commands_stdin(lab: Lab) -> None:
    proc = cvs_bytes(lab, "exec", "-n", "--", "cat; echo end", input=b"hi\n")
    assert proc.returncode == 0, explain(text_of(proc))
    assert sorted(proc.stdout.decode().splitlines()) == [f"{h} | end" for h in HOSTS]


# --- bytes as they are (item 5) ---------------------------------------------------


def test_dash_n_capital_passes_a_binary_file_byte_for_byte(lab: Lab) -> None:
    in_container(lab, "node1", "head -c 3000000 /dev/urandom > /tmp/blob")
    want = in_container(lab, "node1", "sha256sum /tmp/blob").split()[0]
    proc = cvs_bytes(lab, "exec", "-N", "--hosts", "node1", "--", "cat /tmp/blob")
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout) == 3000000
    assert hashlib.sha256(proc.stdout).hexdigest() == want


def test_binary_stdin_comes_back_byte_for_byte(lab: Lab) -> None:
    data = os.urandom(2_000_000)
    proc = cvs_bytes(lab, "exec", "-N", "--hosts", "node2", "--", "cat", input=data)
    assert proc.returncode == 0, proc.stderr.decode()
    assert hashlib.sha256(proc.stdout).hexdigest() == hashlib.sha256(data).hexdigest()


def test_bytes_that_are_not_text_on_several_hosts_are_marked_and_counted(lab: Lab) -> None:
    plain = text_of(cvs_bytes(lab, "exec", "-n", "--", r"printf 'a\377b\n'"))
    assert plain.returncode == 0, explain(plain)
    assert sorted(plain.stdout.splitlines()) == [f"{h} | a\\xffb" for h in HOSTS]
    assert all(
        f"{h}: 1 byte of stdout not UTF-8 text, shown as \\xNN escapes" in plain.stderr
        for h in HOSTS
    ), plain.stderr
    as_json = text_of(cvs_bytes(lab, "exec", "-n", "--json", "--", r"printf 'a\377b\n'"))
    _, summary = json_lines(as_json.stdout)
    counted = {h: r["not_text"] for h, r in summary["hosts"].items()}
    assert counted == {h: {"stdout": 1, "stderr": 0} for h in HOSTS}
    assert {r["stdout"] for r in summary["hosts"].values()} == {"a\\xffb"}


# --- no orphans, no zombies (item 6) ------------------------------------------------


def test_a_container_made_by_cvs_runs_an_init_that_reaps_orphans(lab: Lab) -> None:
    for host in HOSTS:
        init = runtime_cli(lab.sb, host, "inspect", "-f", "{{.HostConfig.Init}}", lab.name)
        assert init == "true", f"{host}: HostConfig.Init {init}"
    # An orphan: its parent shell exits at once, it exits a moment later.
    proc = cvs_bytes(lab, "exec", "-n", "--", "sh -c 'sleep 0.5 &'; sleep 2; echo done")
    assert proc.returncode == 0, explain(text_of(proc))
    time.sleep(1)
    for host in HOSTS:
        states = in_container(lab, host, "cat /proc/[0-9]*/stat 2>/dev/null | cut -d' ' -f2,3")
        assert " Z" not in states, f"{host}: zombies left: {states}"


def test_status_notes_a_container_made_without_an_init(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.containers import pipeline

    made = pipeline.run_argv

    def without_init(*args: Any, **kwargs: Any) -> list[str]:
        return [a for a in made(*args, **kwargs) if a != "--init"]

    monkeypatch.setattr(pipeline, "run_argv", without_init)
    old = Lab(lab.sb, lab.directory / "old", prefix="cvs-old", base={"sshd": {"port": 2471}})
    old.directory.mkdir()
    path = old.shared_file
    _up(path)
    monkeypatch.undo()
    try:
        status = text_of(cvs_bytes(lab, "-c", str(path), "status"))
        assert status.returncode == 0, explain(status)
        for host in HOSTS:
            assert f"{host}: note: its container was made without an init" in status.stderr
        mine = text_of(cvs_bytes(lab, "status"))
        assert "without an init" not in mine.stderr, explain(mine)
    finally:
        cvs_bytes(lab, "-c", str(path), "down", "--force")


def test_a_command_whose_sshd_dies_is_ended_through_the_host_and_said(lab: Lab) -> None:
    out: dict[str, dict[str, HostResult]] = {}

    async def kill_sshd_once_running() -> None:
        while len(sandbox_pids_holding(lab.sb, b"sleep\x004646")) < len(HOSTS):
            await anyio.sleep(0.05)
        for host in HOSTS:
            await anyio.to_thread.run_sync(
                lambda h=host: in_container(
                    lab,
                    h,
                    "for p in /proc/[0-9]*; do read -r c < $p/comm 2>/dev/null || continue; "
                    '[ "$c" = sshd ] && kill -9 "${p#/proc/}"; done; true',
                )
            )

    async def main() -> None:
        async with Cluster.open(lab.shared_file) as cluster, anyio.create_task_group() as tg:
            tg.start_soon(kill_sshd_once_running)
            with anyio.fail_after(120):
                out["results"] = await cluster.exec("sleep 4646; echo never")

    try:
        anyio.run(main)
        # Ended at once, not when it would have finished (77 min from now).
        assert gone(lab, b"sleep\x004646", timeout=10)
    finally:
        _up(lab.shared_file)  # its sshd again
    for r in out["results"].values():
        assert r.status == "failed" and r.exit_code is None, r
        assert "sshd closed the connection while the command ran" in str(r.error), r.error
        assert "its processes in the container were ended through the host" in str(r.error)


def test_a_cvs_killed_with_sigkill_leaves_no_command_past_its_lease(lab: Lab) -> None:
    proc = subprocess.Popen(
        [*CVS, "-c", str(lab.shared_file), "exec", "-n", "--", "sleep 4747"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CI": "1"},
    )
    try:
        assert wait_until(
            lambda: len(sandbox_pids_holding(lab.sb, b"sleep\x004747")) == len(HOSTS), timeout=120
        ), "the command never ran"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        # The lock's lease is the bound; here the connection's end tells the
        # holder at once (the kernel closes the dead process's socket).
        assert gone(lab, b"sleep\x004747", timeout=LEASE_SECONDS + 10)
        print(f"commands gone {time.monotonic() - killed:.1f}s after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
