"""Every command through worker processes (ssh/workers/runner.py), on the
docker sandbox: with `concurrency.workers: 2` (this machine has 2 cores, so
the default would be one process) `up`, `status`, in-container `exec`
(through the containers' sshd and through `docker exec`), `cp` both ways,
`cvs run` and `down` give the same results, events and exit codes as one process; the
shared lock is held on every host while a command runs; a worker killed in
the middle of `up` or `exec` loses only its host, named, and that host's
lock holder ends with the worker's connection; Ctrl-C ends everything.

One 2-host sandbox for the module (each host in a worker of its own), torn
down in the fixture's finalizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from clitools import CVS, cvs_on, explain, json_docs
from labtools import Lab
from sandboxtools import sandbox_pids_holding, wait_until

from orchestrator.api import Cluster
from orchestrator.containers.copy import Payload
from orchestrator.containers.locks import LEASE_SECONDS
from orchestrator.events import CommandStarted, Event
from orchestrator.sandbox import Sandbox, sandbox_down, sandbox_up
from orchestrator.ssh.workers.runner import WorkerRunner

pytestmark = pytest.mark.sandbox

HOSTS = ["node1", "node2"]


def cvs_with(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    """`cvs -c FILE args` with the lab's cluster file (its number of workers)."""
    return cvs_on(lab.shared_file, *args, cwd=lab.directory, timeout=300)


@pytest.fixture(scope="module")
def labs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Lab]]:
    """One sandbox; per number of workers (1, 2) a persistent container of its
    own, its cluster file asking for that many workers (one directory)."""
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root")
    directory = tmp_path_factory.mktemp("workers")
    tag = uuid.uuid4().hex[:6]
    try:
        sb = sandbox_up(directory / "sb", hosts=len(HOSTS))
        yield {
            w: Lab(
                sb,
                directory,
                name=f"cvs-w{w}-{tag}",
                top={"concurrency": {"workers": w}},
                state=f"state-{w}",
            )
            for w in (1, 2)
        }
    finally:
        sandbox_down(directory / "sb")


@pytest.fixture
def lab(labs: dict[int, Lab]) -> Lab:
    """The container whose cluster file asks for two workers."""
    return labs[2]


@pytest.fixture
def down_after(labs: dict[int, Lab]) -> Iterator[None]:
    """Each test leaves no container behind (the next one starts cold)."""
    yield
    for lab in labs.values():
        cvs_with(lab, "down", "--force")


# -- the same as one process ------------------------------------------------------


def _event_key(doc: dict[str, Any], name: str) -> str:
    kind = doc["event"]
    if kind == "Message":
        return repr((kind, doc.get("host"), re.sub(r"\d+", "N", doc["text"].replace(name, "C"))))
    key: tuple[Any, ...] = (kind, doc.get("host"), doc.get("label") or doc.get("step"))
    key += (doc.get("status"),)
    if kind == "CommandFinished":
        key += (doc["result"]["status"], doc["result"]["exit_code"])
    return repr(key)


_TIMING = re.compile(r'"(duration|started|finished|ts|run_dir|id)": [^,}]+')


def _sequence(lab: Lab, workers: int) -> dict[str, Any]:
    """up (cold), up (attach), status, exec through the sshd and through
    docker exec, cp to the containers and back, a small suite, down: exit
    code, events (by kind, host, label, status), and the result document,
    timings and names set aside."""
    suite = lab.directory / "small.yaml"
    steps = [
        {"name": "hello", "run": "echo hello; id -un"},
        {"name": "fails-on-node2", "hosts": "node2", "run": "exit 7"},
    ]
    suite.write_text(yaml.safe_dump({"name": "small", "steps": steps}))
    payload = lab.directory / "payload"
    if not payload.exists():
        payload.mkdir()
        (payload / "a.bin").write_bytes(os.urandom(300_000))
        (payload / "b.txt").write_text("b\n")
    name = lab.name
    commands = {
        "up-cold": ["up"],
        "up-attach": ["up"],
        "status": ["status"],
        "exec-sshd": ["exec", "--", "sh", "-c", "echo out $(id -un); echo err >&2; exit 3"],
        "exec-docker": ["exec", "-u", "nobody", "--", "sh", "-c", "echo out $(id -un)"],
        "cp-to": ["cp", str(payload), "/tmp/payload"],
        "cp-from": ["cp", "--from-host", "/tmp/payload/a.bin", str(lab.directory / "back-W")],
        "run": ["run", str(suite), "--run-dir", str(lab.directory / f"run-{workers}")],
        "down": ["down", "--force"],
    }
    seen: dict[str, Any] = {}
    for what, (command, *rest) in commands.items():
        rest = [r.replace("back-W", f"back-{workers}") for r in rest]
        proc = cvs_with(lab, command, "--json", *rest)
        docs = json_docs(proc.stdout)
        result = [d for d in docs if "event" not in d]
        text = json.dumps(result, sort_keys=True).replace(name, "C")
        text = text.replace(str(lab.shared_file), "FILE").replace(f"run-{workers}", "RUN")
        text = text.replace(f"back-{workers}", "BACK")
        seen[what] = {
            "rc": proc.returncode,
            "events": sorted(_event_key(d, name) for d in docs if "event" in d),
            "result": _TIMING.sub(r'"\1": T', text),
        }
    return seen


def test_every_command_through_two_workers_gives_what_one_process_gives(
    labs: dict[int, Lab], down_after: None
) -> None:
    alone = _sequence(labs[1], 1)
    spread = _sequence(labs[2], 2)
    lab = labs[2]

    codes = {k: v["rc"] for k, v in spread.items()}
    assert codes == {
        "up-cold": 0,
        "up-attach": 0,
        "status": 0,
        "exec-sshd": 1,
        "exec-docker": 0,
        "cp-to": 0,
        "cp-from": 0,
        "run": 1,
        "down": 0,
    }, spread
    assert '"stdout": "out root"' in spread["exec-sshd"]["result"]
    assert '"stdout": "out nobody"' in spread["exec-docker"]["result"]
    for host in HOSTS:
        back = lab.directory / "back-2" / host / "a.bin"
        assert back.read_bytes() == (lab.directory / "payload" / "a.bin").read_bytes()
    for what in alone:
        assert spread[what] == alone[what], what


# -- through the API: the sshd path, the lock, a worker killed --------------------


def _processes(sb: Sandbox, needle: bytes) -> list[int]:
    return sandbox_pids_holding(sb, needle)


async def _when_running(lab: Lab, needle: bytes, then: Callable[[], Any]) -> None:
    with anyio.fail_after(60):
        while len(_processes(lab.sb, needle)) < len(HOSTS):
            await anyio.sleep(0.05)
    then()


def test_through_workers_the_lock_is_held_and_each_container_keeps_one_connection(
    lab: Lab, down_after: None
) -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Cluster.open(lab.shared_file) as cluster:
            assert isinstance(cluster.pool, WorkerRunner)
            assert len(cluster.pool.fleet.workers) == 2
            assert cluster.pool.fleet.assigned["node1"] is not cluster.pool.fleet.assigned["node2"]
            await cluster.up()
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    _when_running,
                    lab,
                    b"sleep\x002.4242",
                    lambda: seen.update(held=lab.holders(HOSTS)),
                )
                first = await cluster.exec("sleep 2.4242; echo slept")
            seen["first"] = {h: (r.status, r.stdout) for h, r in first.items()}
            for _ in range(3):
                assert all(r.ok for r in (await cluster.exec("true")).values())
            counters = cluster.ssh_exec.counters
            seen["connects"], seen["channels"] = counters.connects, counters.channels
        seen["after"] = lab.holders(HOSTS)

    anyio.run(main)
    assert seen["first"] == {h: ("ok", "slept") for h in HOSTS}
    assert seen["held"] == [1, 1]  # the shared lock, on each host, while it ran
    assert seen["connects"] == len(HOSTS)  # one connection per container ...
    assert seen["channels"] == 4 * len(HOSTS)  # ... carrying every command
    assert seen["after"] == [0, 0]  # released when the Cluster closed


def test_through_workers_a_copy_goes_through_the_containers_sshd_and_arrives_whole(
    lab: Lab, down_after: None, tmp_path: Path
) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(300_000))
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Cluster.open(lab.shared_file) as cluster:
            assert isinstance(cluster.pool, WorkerRunner)
            await cluster.up()
            assert all(r.ok for r in (await cluster.exec("true")).values())
            counters = cluster.ssh_exec.counters
            before = counters.channels
            copied = await cluster.copy_to(Payload.from_path(payload), "/tmp/payload.bin")
            seen["copied"] = {h: r.status for h, r in copied.items()}
            counters = cluster.ssh_exec.counters
            seen["channels"] = counters.channels - before
            sums = await cluster.exec("sha256sum /tmp/payload.bin")
            seen["sums"] = {h: r.stdout.split()[0] for h, r in sums.items()}

    anyio.run(main)
    assert seen["copied"] == {h: "ok" for h in HOSTS}
    assert seen["channels"] == len(HOSTS)  # one channel of each container's sshd
    digest = hashlib.sha256(payload.read_bytes()).hexdigest()
    assert seen["sums"] == {h: digest for h in HOSTS}


def _kill_worker_of(cluster: Cluster, host: str) -> int:
    runner = cluster.pool
    assert isinstance(runner, WorkerRunner)
    worker = runner.fleet.assigned[host]
    os.kill(worker.process.pid, signal.SIGKILL)
    return worker.index


def test_a_worker_killed_mid_exec_loses_its_host_by_name_and_that_lock_goes_with_it(
    lab: Lab, down_after: None
) -> None:
    assert cvs_with(lab, "up").returncode == 0
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Cluster.open(lab.shared_file) as cluster:
            await cluster.up()  # attach: the shared lock is held until close

            def kill() -> None:
                seen["index"] = _kill_worker_of(cluster, "node1")

            async with anyio.create_task_group() as tg:
                tg.start_soon(_when_running, lab, b"sleep\x003.4343", kill)
                results = await cluster.exec("sleep 3.4343; echo done")
            seen["results"] = results
            started = time.monotonic()
            # node1's holder ends with the worker's connection (its stdin
            # ends), and within the lease whatever happens; node2's stays.
            assert await anyio.to_thread.run_sync(
                wait_until, lambda: lab.holders(HOSTS)[0] == 0, LEASE_SECONDS + 10
            ), lab.holders(HOSTS)
            seen["released_in"] = time.monotonic() - started
            seen["node2_held"] = lab.holders(HOSTS)[1]
            again = await cluster.exec("echo again")
            seen["again"] = {h: (r.status, r.stdout, r.error) for h, r in again.items()}

    anyio.run(main)
    node1, node2 = seen["results"]["node1"], seen["results"]["node2"]
    assert node1.status == "unreachable", node1
    assert f"lost: the worker process {seen['index']} (pid " in (node1.error or ""), node1
    assert "was killed by SIGKILL" in (node1.error or ""), node1
    assert (node2.status, node2.stdout) == ("ok", "done"), node2
    assert seen["node2_held"] == 1
    assert seen["again"]["node2"][:2] == ("ok", "again")
    assert seen["again"]["node1"][0] == "unreachable"
    assert "lost: the worker process" in (seen["again"]["node1"][2] or "")
    assert lab.holders(HOSTS) == [0, 0]


class _KillAt:
    """A sink that SIGKILLs a host's worker when that host's `docker run` starts."""

    def __init__(self, host: str, label: str) -> None:
        self.host, self.label = host, label
        self.events: list[Event] = []
        self.cluster: Cluster | None = None
        self.killed: int | None = None

    def emit(self, event: Event) -> None:
        self.events.append(event)
        hit = isinstance(event, CommandStarted) and event.label == self.label
        if hit and event.host == self.host and self.killed is None and self.cluster is not None:
            self.killed = _kill_worker_of(self.cluster, self.host)

    def close(self) -> None:
        pass


def test_a_worker_killed_mid_up_loses_its_host_by_name_the_other_finishes_and_its_lock_goes(
    lab: Lab, down_after: None
) -> None:
    sink = _KillAt("node1", "run")
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with Cluster.open(lab.shared_file, sink=sink) as cluster:
            sink.cluster = cluster
            report = await cluster.up(check=False)
            seen["outcomes"] = {
                h: (o.state, str(o.error or "")) for h, o in report.outcomes.items()
            }
            seen["released"] = await anyio.to_thread.run_sync(
                wait_until, lambda: lab.holders(HOSTS)[0] == 0, LEASE_SECONDS + 10
            )

    anyio.run(main)
    assert sink.killed is not None, "node1's `docker run` never started"
    state, error = seen["outcomes"]["node1"]
    assert state != "ready" and f"lost: the worker process {sink.killed} (pid " in error, seen
    # node2 finished its pipeline: ready, or rolled back by the plan's decision
    # for a partial set, as one process decides when a host is lost.
    assert seen["outcomes"]["node2"][0] in ("ready", "rolled_back"), seen
    assert seen["released"], lab.holders(HOSTS)
    assert lab.holders(HOSTS) == [0, 0]


# -- Ctrl-C -------------------------------------------------------------------------


@pytest.mark.parametrize("user", [[], ["-u", "nobody"]], ids=["sshd", "docker-exec"])
def test_ctrl_c_on_cvs_exec_in_containers_through_workers_exits_130_and_leaves_nothing(
    lab: Lab, down_after: None, user: list[str]
) -> None:
    # The sshd lets in root and the image's user: `nobody` takes `docker exec`.
    assert cvs_with(lab, "up").returncode == 0
    proc = subprocess.Popen(
        [*CVS, "-c", str(lab.shared_file), "exec", *user, "--", "sleep 46.46"],
        env={**os.environ, "CI": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: len(_processes(lab.sb, b"sleep\x0046.46")) == 2, 60), proc.poll()
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 130, explain(subprocess.CompletedProcess([], 130, stdout, stderr))
        assert wait_until(lambda: not _processes(lab.sb, b"sleep\x0046.46"), 10)
        assert wait_until(lambda: lab.holders(HOSTS) == [0, 0], 10), lab.holders(HOSTS)
        assert not [p for p in workers if Path(f"/proc/{p}").exists()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _children(pid: int) -> list[int]:
    argv = ["pgrep", "-P", str(pid), "-f", "orchestrator.ssh.worker"]
    out = subprocess.run(argv, text=True, capture_output=True).stdout
    return [int(p) for p in out.split()]
