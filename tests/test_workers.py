"""Worker processes for the fan-out (ssh/workers/): when they are used, and
that through them a fan-out behaves as in one process (the same results and
events), a worker that dies loses only its hosts (named), and cancelling
(Ctrl-C) ends every worker's remote processes.

The fleet is a farm of real OpenSSH servers on loopback (bench/loopback.py,
root); the decisions are pure and tested without it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from clitools import CVS

from orchestrator import remote
from orchestrator.config import ClusterConfig, cluster_warnings, load_cluster
from orchestrator.config.documents import ConfigError
from orchestrator.events import CollectingSink, CommandStarted, Event, Message
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import run_on_hosts
from orchestrator.ssh.seam import HeldRequest
from orchestrator.ssh.transport import SSHPool
from orchestrator.ssh.workers import parent
from orchestrator.ssh.workers.parent import WORKERS_FROM, planned_workers, shards, worker_count
from orchestrator.ssh.workers.runner import WorkerRunner

REPO = Path(__file__).resolve().parents[1]
HOSTS = 8

# -- when: pure -----------------------------------------------------------------


def test_a_fleet_below_the_threshold_runs_in_one_process() -> None:
    assert worker_count(WORKERS_FROM - 1, None, 16) == 1


def test_a_large_fleet_uses_every_core() -> None:
    assert worker_count(5000, None, 16) == 16


def test_a_fleet_smaller_than_the_cores_uses_no_workers() -> None:
    assert worker_count(12, None, 16) == 1
    assert worker_count(WORKERS_FROM, None, WORKERS_FROM) == 1


def test_by_default_two_or_three_cores_use_one_process_at_any_size() -> None:
    # Measured on 2 cores: workers gained nothing at 1000 hosts (docs/performance.md).
    assert worker_count(100_000, None, 2) == 1
    assert worker_count(100_000, None, 3) == 1
    assert worker_count(100_000, None, 4) == 4


def test_one_core_means_one_process_whatever_is_asked() -> None:
    assert worker_count(5000, 8, 1) == 1


def test_workers_one_is_one_process_at_any_size() -> None:
    assert worker_count(100_000, 1, 16) == 1


def test_workers_above_the_cores_are_clamped_to_the_cores() -> None:
    assert worker_count(5000, 64, 16) == 16


def test_workers_set_apply_below_the_threshold_but_never_above_the_hosts() -> None:
    assert worker_count(40, 4, 16) == 4
    assert worker_count(3, 8, 16) == 3


def test_a_shared_jump_keeps_the_fan_out_in_one_process() -> None:
    assert worker_count(5000, None, 16, jump=True) == 1


def test_hosts_sharing_an_sshd_stay_in_one_worker_and_shards_balance() -> None:
    groups = {"10.0.0.1": ["a1", "a2", "a3"], "10.0.0.2": ["b"], "10.0.0.3": ["c"]}
    groups |= {f"10.0.1.{i}": [f"d{i}"] for i in range(5)}
    plan = shards(groups, 3)
    assert sum(len(s) for s in plan) == 10
    assert any({"a1", "a2", "a3"} <= set(s) for s in plan)
    assert max(len(s) for s in plan) - min(len(s) for s in plan) <= 1


# -- validate -----------------------------------------------------------------------


def cluster_doc(**concurrency: Any) -> dict[str, Any]:
    return {
        "name": "w",
        "hosts": [{"name": "n1"}, {"name": "n2"}],
        "ssh": {"user": "u"},
        "concurrency": concurrency,
    }


def test_validate_refuses_zero_workers_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster_doc(workers=0)))
    with pytest.raises(ConfigError) as err:
        load_cluster(path, check_files=False)
    assert "concurrency.workers" in str(err.value)


def test_validate_warns_that_workers_above_the_cores_are_clamped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("orchestrator.config.views.usable_cores", lambda: 2)
    cluster = ClusterConfig.model_validate(cluster_doc(workers=8))
    assert any(
        "concurrency.workers is 8, more than this machine's 2 cores" in w
        for w in cluster_warnings(cluster)
    )


# -- through real sshds ---------------------------------------------------------------

_root = pytest.mark.skipif(os.geteuid() != 0, reason="the loopback farm starts sshd (root)")


def needs_root(test: Callable[..., None]) -> Callable[..., None]:
    """A test on the loopback farm's real sshds (root): an integration test,
    run with the sandbox's (`-m sandbox`), not in the fast subset."""
    return pytest.mark.sandbox(_root(test))


@pytest.fixture(scope="module")
def farm_file() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the loopback farm starts sshd (root)")
    sys.path.insert(0, str(REPO))
    from bench.loopback import loopback_farm

    with loopback_farm(HOSTS) as farm:
        yield farm.cluster_yaml()


def config(path: Path, workers_: int) -> ClusterConfig:
    doc = yaml.safe_load(path.read_text())
    doc["concurrency"]["workers"] = workers_
    return ClusterConfig.model_validate(doc)


def runner_for(cfg: ClusterConfig, sink: CollectingSink | None = None) -> SSHPool | WorkerRunner:
    """What `Cluster.open` would reach the hosts with."""
    count = planned_workers(cfg, len(cfg.hosts))
    return WorkerRunner(cfg, sink, workers=count) if count > 1 else SSHPool(cfg, sink)


def fan_out(
    cfg: ClusterConfig, command: str, during: Callable[[Any], Any] | None = None
) -> tuple[dict[str, HostResult], list[Event], Any]:
    sink = CollectingSink()
    hosts = [h.name for h in cfg.hosts]
    pool = runner_for(cfg, sink)

    async def main() -> dict[str, HostResult]:
        async with pool:
            if during is None:
                return await run_on_hosts(pool, hosts, command, timeout=30)
            results: dict[str, HostResult] = {}

            async def run() -> None:
                results.update(await run_on_hosts(pool, hosts, command, timeout=30))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await during(pool)
            return results

    return anyio.run(main), sink.events, pool


def remote_pids(marker: str) -> list[str]:
    """The farm user's processes whose command line is `marker` (not the shells running it)."""
    argv = ["pgrep", "-u", "cvsbench", "-f", f"^{marker}$"]
    out = subprocess.run(argv, capture_output=True, text=True)
    return out.stdout.split()


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def per_host(events: list[Event]) -> list[tuple[str, str]]:
    return sorted((e.kind, getattr(e, "host", "")) for e in events if e.kind != "Message")


@needs_root
def test_through_workers_results_and_events_are_those_of_one_process(farm_file: Path) -> None:
    command = 'echo "out $(id -un)"; echo err >&2; exit 3'
    alone, alone_events, _ = fan_out(config(farm_file, 1), command)
    spread, spread_events, pool = fan_out(config(farm_file, 2), command)

    assert len(pool.fleet.workers) == 2
    assert list(spread) == list(alone)  # host order
    for host, result in spread.items():
        mine = alone[host]
        assert (result.status, result.exit_code, result.stdout, result.stderr) == (
            mine.status,
            mine.exit_code,
            mine.stdout,
            mine.stderr,
        )
    assert (spread["lo1"].exit_code, spread["lo1"].stdout) == (3, "out cvsbench")
    assert per_host(spread_events) == per_host(alone_events)


@needs_root
def test_a_worker_that_dies_loses_its_hosts_by_name_and_the_others_finish(
    farm_file: Path,
) -> None:
    marker = f"sleep 2.{uuid.uuid4().int % 10**6}"

    async def kill_worker_one(pool: WorkerRunner) -> None:
        while not remote_pids(marker) or len(remote_pids(marker)) < HOSTS:
            await anyio.sleep(0.05)
        fleet = pool.fleet
        os.kill(fleet.workers[0].process.pid, signal.SIGKILL)

    results, _, pool = fan_out(config(farm_file, 2), f"{marker}; echo done", kill_worker_one)

    fleet = pool.fleet
    lost = {h for h, w in fleet.assigned.items() if w is fleet.workers[0]}
    assert lost and len(lost) < HOSTS
    for host, result in results.items():
        if host in lost:
            assert result.status == "unreachable"
            assert "lost: the worker process 1 (pid " in (result.error or "")
            assert "was killed by SIGKILL" in (result.error or "")
        else:
            assert (result.status, result.stdout) == ("ok", "done"), result


@needs_root
def test_cancelling_a_fan_out_ends_every_workers_remote_processes(farm_file: Path) -> None:
    marker = f"sleep 61.{uuid.uuid4().int % 10**6}"
    cfg = config(farm_file, 2)
    hosts = [h.name for h in cfg.hosts]

    async def main() -> None:
        async with WorkerRunner(cfg, workers=2) as pool:
            with anyio.move_on_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_on_hosts, pool, hosts, marker)
                    while len(remote_pids(marker)) < HOSTS:
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
            assert len(pool.fleet.workers) == 2

    started = time.monotonic()
    anyio.run(main)
    assert time.monotonic() - started < 25
    assert wait_until(lambda: not remote_pids(marker), 5), remote_pids(marker)


@needs_root
def test_ctrl_c_on_cvs_exec_exits_130_and_ends_every_workers_remote_processes(
    farm_file: Path, tmp_path: Path
) -> None:
    doc = yaml.safe_load(farm_file.read_text())
    doc["concurrency"]["workers"] = 2
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    marker = f"sleep 62.{uuid.uuid4().int % 10**6}"
    proc = subprocess.Popen(
        [*CVS, "exec", "-c", str(path), "--host-os", marker],
        env={**os.environ, "CI": "1", "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: len(remote_pids(marker)) == HOSTS, 60), proc.poll()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 130, stderr
        assert wait_until(lambda: not remote_pids(marker), 5), remote_pids(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_root
def test_workers_above_the_cores_are_clamped_with_a_warning(
    farm_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parent, "usable_cores", lambda: 2)
    results, events, pool = fan_out(config(farm_file, 64), "true")

    assert all(r.ok for r in results.values())
    assert len(pool.fleet.workers) == 2
    warnings = [e for e in events if isinstance(e, Message) and e.level == "warning"]
    assert any("concurrency.workers is 64" in e.text for e in warnings)


PARENT = """
import sys, anyio, yaml
from orchestrator.config import ClusterConfig
from orchestrator.ssh.fanout import run_on_hosts
from orchestrator.ssh.workers.runner import WorkerRunner
doc = yaml.safe_load(open(sys.argv[1]).read())
doc["concurrency"]["workers"] = 2
cfg = ClusterConfig.model_validate(doc)
async def main():
    async with WorkerRunner(cfg, workers=2) as pool:
        await run_on_hosts(pool, [h.name for h in cfg.hosts], sys.argv[2])
anyio.run(main)
"""


@needs_root
def test_a_parent_that_goes_away_leaves_no_worker_and_no_remote_process(farm_file: Path) -> None:
    marker = f"sleep 63.{uuid.uuid4().int % 10**6}"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(farm_file), marker],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert wait_until(lambda: len(remote_pids(marker)) == HOSTS, 60), parent.poll()
        children = subprocess.run(
            ["pgrep", "-f", "orchestrator.ssh.worker"], capture_output=True, text=True
        ).stdout.split()
        mine = [p for p in children if Path(f"/proc/{p}/stat").exists() and _ppid(p) == parent.pid]
        assert len(mine) == 2
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not remote_pids(marker), 15), remote_pids(marker)
        assert wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in mine), 15)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _ppid(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


# -- every command through the workers (ssh/workers/runner.py) ---------------------

HELD = "while read l; do echo got $l; done; echo bye >&2; exit 5"


async def _held_transcript(runner: Any) -> list[Any]:
    seen: list[Any] = []
    async with runner.held_process("lo2", HeldRequest(HELD)) as p:
        p.stdin.write("a\n")
        seen.append(await p.stdout.readline())
        p.stdin.write("b\n")
        await p.stdin.drain()
        seen.append(await p.stdout.readline())
        p.stdin.write_eof()
        seen += [await p.stdout.read(), await p.stderr.read()]
        seen.append((await p.wait()).exit_status)
    async with runner.held_process("lo3", HeldRequest("cat", encoding=None)) as p:
        p.stdin.write(b"x" * 300_000)
        await p.stdin.drain()
        p.stdin.write_eof()
        chunks = []
        while chunk := await p.stdout.read(65536):
            chunks.append(chunk)
        seen += [len(b"".join(chunks)), (await p.wait()).exit_status]
    return seen


@needs_root
def test_a_held_process_in_a_worker_reads_writes_and_ends_as_in_one_process(
    farm_file: Path,
) -> None:

    async def main() -> tuple[list[Any], list[Any]]:
        async with SSHPool(config(farm_file, 1)) as pool:
            alone = await _held_transcript(pool)
        async with WorkerRunner(config(farm_file, 2), workers=2) as runner:
            spread = await _held_transcript(runner)
        return alone, spread

    alone, spread = anyio.run(main)
    assert alone == ["got a\n", "got b\n", "", "bye\n", 5, 300_000, 0]
    assert spread == alone


@needs_root
def test_a_worker_that_dies_ends_its_held_processes_and_names_itself_to_later_calls(
    farm_file: Path,
) -> None:
    from orchestrator.errors import ConnectError

    sink = CollectingSink()
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with WorkerRunner(config(farm_file, 2), sink, workers=2) as runner:
            victim = runner.fleet.assigned["lo1"]
            other = next(h for h, w in runner.fleet.assigned.items() if w is not victim)
            async with runner.held_process("lo1", HeldRequest("cat")) as p:
                p.stdin.write("one\n")
                assert await p.stdout.readline() == "one\n"
                os.kill(victim.process.pid, signal.SIGKILL)
                seen["eof"] = await p.stdout.readline()
                seen["why"] = await p.stderr.read()
                seen["status"] = (await p.wait()).exit_status
                with pytest.raises(BrokenPipeError):
                    p.stdin.write("two\n")
            with pytest.raises(ConnectError) as refused:
                async with runner.held_process("lo1", HeldRequest("cat")):
                    pass
            seen["refused"] = refused.value.message
            seen["run"] = await runner.run("lo1", "true", label="probe")
            seen["other"] = await runner.run(other, "echo alive")

    anyio.run(main)
    assert seen["eof"] == ""
    assert "lost: the worker process 1 (pid " in seen["why"]
    assert "was killed by SIGKILL" in seen["why"]
    assert seen["status"] is None
    assert "lost: the worker process 1" in seen["refused"]
    assert seen["run"].status == "unreachable"
    assert "lost: the worker process 1" in (seen["run"].error or "")
    assert (seen["other"].status, seen["other"].stdout) == ("ok", "alive")
    finished = [e for e in sink.events if e.kind == "CommandFinished" and e.label == "probe"]
    assert [e.host for e in finished] == ["lo1"]  # type: ignore[attr-defined]


@needs_root
def test_cluster_open_runs_through_workers_only_when_they_are_planned(
    farm_file: Path, tmp_path: Path
) -> None:
    from orchestrator.api import Cluster

    source = tmp_path / "payload"
    source.write_bytes(os.urandom(200_000))
    dest = f"/tmp/cvs-workers-{uuid.uuid4().hex[:8]}"
    doc = yaml.safe_load(farm_file.read_text())
    doc["concurrency"].pop("workers", None)
    default = ClusterConfig.model_validate(doc)

    async def main() -> dict[str, Any]:
        async with Cluster.open(default) as cluster:
            alone = type(cluster.pool).__name__
        async with Cluster.open(config(farm_file, 2)) as cluster:
            assert isinstance(cluster.pool, WorkerRunner)
            from orchestrator.containers.copy import Payload

            sent = await cluster.copy_to(
                Payload.from_path(source), dest, hosts=["lo1"], host_os=True
            )
            back = await cluster.copy_from(dest, tmp_path / "back", host_os=True)
            ran = await cluster.exec("echo hi", host_os=True)
        return {"alone": alone, "sent": sent, "back": back, "ran": ran}

    try:
        seen = anyio.run(main)
    finally:
        subprocess.run(["rm", "-f", dest], check=False)
    assert seen["alone"] == "SSHPool"  # 2 cores, 8 hosts: one process, as before
    assert seen["sent"]["lo1"].ok, seen["sent"]
    assert all(r.ok for r in seen["back"].values()), seen["back"]
    for host in seen["back"]:
        assert (tmp_path / "back" / host / Path(dest).name).read_bytes() == source.read_bytes()
    assert {r.stdout for r in seen["ran"].values()} == {"hi"}


@needs_root
def test_a_held_process_that_ends_in_a_worker_shows_its_exit_status_as_in_one_process(
    farm_file: Path,
) -> None:
    # The lease renewer reads `exit_status` to tell that a lock holder ended.

    async def statuses(runner: Any) -> list[int | None]:
        seen = []
        async with (
            runner.held_process("lo1", HeldRequest("cat")) as alive,
            runner.held_process("lo2", HeldRequest("exit 3")) as ended,
        ):
            with anyio.move_on_after(10):
                while ended.exit_status is None:
                    await anyio.sleep(0.05)
            seen += [alive.exit_status, ended.exit_status]
        return seen

    async def main() -> tuple[list[int | None], list[int | None]]:
        async with SSHPool(config(farm_file, 1)) as pool:
            alone = await statuses(pool)
        async with WorkerRunner(config(farm_file, 2), workers=2) as runner:
            return alone, await statuses(runner)

    alone, spread = anyio.run(main)
    assert alone == spread == [None, 3]


@needs_root
def test_through_workers_a_program_passed_as_an_argument_is_named(farm_file: Path) -> None:
    # Programs are named where they are built, in this process; a worker
    # builds its CommandStarted without those names, and a program that is
    # an argument has no `cvs-NAME` after it to fall back on (it was `?`).
    text = remote.program("check")
    sha = hashlib.sha256(text.encode()).hexdigest()
    _, events, pool = fan_out(config(farm_file, 2), shlex.join(["true", text]))
    assert len(pool.fleet.workers) == 2
    starts = [e for e in events if isinstance(e, CommandStarted)]
    assert len(starts) == HOSTS
    assert {(p.name, p.sha256) for e in starts for p in e.programs} == {("check", sha)}
    assert all(f"<program check sha256:{sha[:12]}>" in e.command for e in starts)
