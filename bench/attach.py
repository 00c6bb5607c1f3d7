"""Attach benchmark: what a persistent `up` with nothing to do, then `exec hostname`, costs.

    python bench/attach.py --sandbox-hosts 2 16          # throwaway sandbox(es) (root)
    python bench/attach.py --sandbox-hosts 4 --runtime podman   # podman hosts (rootful)
    python bench/attach.py --sandbox-hosts 4 --runtime podman --rootless
    python bench/attach.py --cluster cluster.yaml         # an existing cluster

Brings the persistent containers up first (cold start or attach, whatever the
hosts need), then, over fresh connections as a new `cvs` process would, runs
`Cluster.open` + `up` + `exec hostname` in-process, several times, and reports:

- wall time (median, and min..max) of open + `up` + `exec hostname`, timed
  once the machine is quiet again after the set-up (how busy it was is shown);
- CPU per host: this machine's CPU time over each timed run (from /proc/stat),
  median, divided by the hosts. In a sandbox every host runs here, so that is
  the whole cost (sshd, docker, runc, shells and us); with `--cluster` it is
  only what this machine spent;
- SSH round trips per host of the `up`: SSH channels opened (a channel carries
  one remote command; the locked probe is one held channel) and of the exec;
- the first `up` of each size (a cold start from nothing: pull-free, the
  image is on the hosts), once, before the attach runs;
- docker CLI processes per host of the `up` and of the exec, counted for real
  (docker sandbox only): every host's sshd puts a `docker` wrapper first on PATH
  that logs each invocation before running the real docker CLI; the wrapper
  is in place for one more run, not timed (a shell script per docker call
  would add its own cost to the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.api import Cluster
from orchestrator.config import ClusterConfig, load_cluster

RUNS = 5
# How long a run waits for the machine to quiet down before timing (--settle).
SETTLE_S = 60.0
WRAPPER = """#!/bin/sh
# cvs bench: log every docker CLI process, then run the real one.
[ -n "$CVS_DOCKER_LOG" ] && printf '%s\\n' "$1" >> "$CVS_DOCKER_LOG"
exec @DOCKER@ "$@"
"""
# The docker CLI the sandbox's login user runs without the wrapper: the first
# on sshd's default PATH.
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin"
REAL_DOCKER = shutil.which("docker", path=LOGIN_PATH) or "/usr/bin/docker"


@contextmanager
def counting_channels(cluster: ClusterConfig) -> Iterator[Counter[str]]:
    """SSH channels opened per host while the block runs (run/exec/process all count)."""
    by_peer = {(h.address, h.port): h.name for h in cluster.hosts}
    by_address = {h.address: h.name for h in cluster.hosts}
    counts: Counter[str] = Counter()
    original = asyncssh.SSHClientConnection.create_session

    async def counting(self: asyncssh.SSHClientConnection, *args: Any, **kwargs: Any) -> Any:
        peer = self.get_extra_info("peername") or ("?", 0)
        host = by_peer.get((peer[0], peer[1])) or by_address.get(peer[0], "?")
        counts[host] += 1
        return await original(self, *args, **kwargs)

    asyncssh.SSHClientConnection.create_session = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        asyncssh.SSHClientConnection.create_session = original  # type: ignore[method-assign]


class DockerCalls:
    """Per-host logs the sandbox hosts' docker wrapper appends to (None: not counting).

    The logging wrapper is a shell script, a process of its own per docker
    call: timed runs go without it (`plain`: the same docker CLI, linked),
    and one more run with it (`counting`) counts the processes.
    """

    def __init__(self, logs: dict[str, Path] | None, wrapper: Path | None = None) -> None:
        self.logs = logs
        self.wrapper = wrapper

    @contextmanager
    def counting(self) -> Iterator[None]:
        if self.wrapper is None:
            yield
            return
        self.install(WRAPPER)
        try:
            yield
        finally:
            self.install(None)

    def install(self, script: str | None) -> None:
        """The wrapper (`script`), or a plain link to the docker CLI it runs."""
        assert self.wrapper is not None
        staged = self.wrapper.with_name(".docker.new")
        staged.unlink(missing_ok=True)
        if script is None:
            staged.symlink_to(REAL_DOCKER)
        else:
            staged.write_text(script.replace("@DOCKER@", REAL_DOCKER))
            staged.chmod(0o755)
        staged.replace(self.wrapper)

    def lines(self) -> dict[str, list[str]] | None:
        if self.logs is None:
            return None
        return {h: p.read_text().split() if p.exists() else [] for h, p in self.logs.items()}

    def since(
        self, before: dict[str, list[str]] | None, now: dict[str, list[str]] | None = None
    ) -> dict[str, list[str]] | None:
        now = now if now is not None else self.lines()
        if now is None or before is None:
            return None
        return {h: now[h][len(before[h]) :] for h in now}


def runtime_label(cluster: ClusterConfig) -> str:
    c = cluster.container
    if c is None:
        return "docker"
    return f"{c.runtime} (rootless)" if c.rootless else c.runtime


def persistent(cluster: ClusterConfig, hosts: int | None = None) -> ClusterConfig:
    if cluster.container is None:
        raise SystemExit("the cluster file has no container block")
    container = cluster.container.model_copy(update={"lifetime": "persistent"})
    update: dict[str, Any] = {"container": container}
    if hosts is not None:
        chosen = cluster.hosts[:hosts]
        update |= {"hosts": chosen, "head": chosen[0].name}
    return cluster.model_copy(update=update)


async def up_once(cluster: ClusterConfig) -> Any:
    async with Cluster.open(cluster) as c:
        return await c.up()


async def down_once(cluster: ClusterConfig) -> Any:
    async with Cluster.open(cluster) as c:
        return await c.down(force=True)


async def attach_and_exec(
    cluster: ClusterConfig, counts: Counter[str], docker: DockerCalls
) -> tuple[Any, Any, dict[str, int], dict[str, list[str]] | None]:
    async with Cluster.open(cluster) as c:
        report = await c.up()
        up_trips = dict(counts)
        after_up = docker.lines()
        results = await c.exec("hostname")
    return report, results, up_trips, after_up


def cpu_ticks() -> tuple[int, int]:
    """This machine's CPU ticks since boot, (busy, total), all processes (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def busy_fraction(seconds: float = 1.0) -> float:
    """How busy this machine's CPUs were over `seconds` (0..1)."""
    busy0, total0 = cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = cpu_ticks()
    return (busy1 - busy0) / max(1, total1 - total0)


def cpu_seconds() -> float:
    """CPU time this machine has spent, all processes: in a sandbox every host
    is on this machine, so a delta is what the attach cost everywhere (sshd,
    docker, runc, the shells, and us)."""
    return cpu_ticks()[0] / os.sysconf("SC_CLK_TCK")


def settle(limit: float = 0.15, timeout: float = 60.0) -> float:
    """Wait until the machine is quiet (a fresh sandbox's dockerds keep
    starting things for a while): what is timed is the attach, not that."""
    deadline = time.monotonic() + timeout
    busy = busy_fraction()
    while busy > limit and time.monotonic() < deadline:
        busy = busy_fraction()
    return busy


def measure(
    cluster: ClusterConfig, docker: DockerCalls, runs: int = RUNS, quiet_s: float = SETTLE_S
) -> dict[str, Any]:
    first = time.perf_counter()
    warm = anyio.run(up_once, cluster)
    first_up = time.perf_counter() - first
    if not warm.ok:
        raise SystemExit(f"the first `up` failed: {warm.to_dict()}")
    busy = settle(timeout=quiet_s)
    hosts = [h.name for h in cluster.hosts]
    seconds: list[float] = []
    cpu: list[float] = []
    for _ in range(runs):
        with counting_channels(cluster) as counts:
            cpu_start, start = cpu_seconds(), time.perf_counter()
            report, results, up_trips, _ = anyio.run(attach_and_exec, cluster, counts, docker)
            seconds.append(time.perf_counter() - start)
            cpu.append(cpu_seconds() - cpu_start)
    # One more run, not timed, through the logging docker wrapper.
    with docker.counting():
        before = docker.lines()
        with counting_channels(cluster) as counted:
            report, results, _, after_up = anyio.run(attach_and_exec, cluster, counted, docker)
        up_calls = docker.since(before, after_up)
        exec_calls = docker.since(after_up)
    ok = report.ok and all(r.ok for r in results.values())
    return {
        "hosts": len(hosts),
        "runtime": runtime_label(cluster),
        # The first `up`: a cold start when nothing was there (one run, not a median).
        "first_up_seconds": round(first_up, 3),
        "first_up_actions": sorted({o.action.kind for o in warm.outcomes.values()}),
        "seconds": round(statistics.median(seconds), 3),
        "seconds_min": round(min(seconds), 3),
        "seconds_max": round(max(seconds), 3),
        "runs": runs,
        # This machine's CPU per host, median over the runs (a sandbox: all of it).
        "cpu_ms_per_host": round(statistics.median(cpu) * 1000 / len(hosts)),
        "busy_before": round(busy, 2),
        "round_trips": {h: up_trips.get(h, 0) for h in hosts},
        "exec_round_trips": {h: counts.get(h, 0) - up_trips.get(h, 0) for h in hosts},
        # The last run's docker CLI processes per host, by subcommand.
        "docker_up": None if up_calls is None else {h: up_calls[h] for h in hosts},
        "docker_exec": None if exec_calls is None else {h: exec_calls[h] for h in hosts},
        "actions": {h: o.action.kind for h, o in report.outcomes.items()},
        "hostnames": {h: r.stdout.strip() for h, r in results.items()},
        "ok": ok,
    }


@contextmanager
def counted_sandbox(
    hosts: int, runtime: str = "docker", rootless: bool = False
) -> Iterator[tuple[ClusterConfig, DockerCalls]]:
    """A throwaway sandbox whose hosts log every docker CLI process they spawn
    (podman hosts: not counted; their sshd's environment is per login user).
    `rootless`: the login user's own podman on each host (images loaded there)."""
    from orchestrator.sandbox import sandbox_down, sandbox_up

    with tempfile.TemporaryDirectory(prefix="cvs-bench-attach-") as tmp:
        directory = Path(tmp) / "sb"
        if runtime == "podman":
            try:
                box = sandbox_up(directory, hosts, runtime="podman", rootless=rootless)
                yield load_cluster(box.cluster_file), DockerCalls(None)
            finally:
                sandbox_down(directory)
            return
        # Outside the 0700 temp dir: the sandbox's login user runs the wrapper.
        wrap = Path(tempfile.mkdtemp(prefix="cvs-bench-docker-", dir="/tmp"))
        try:
            wrap.chmod(0o755)
            calls = DockerCalls({}, wrap / "docker")
            calls.install(None)  # timed runs: the plain CLI; counted runs swap the wrapper in
            box = sandbox_up(directory, hosts)
            logs: dict[str, Path] = {}
            for h in box.nodes:
                log = wrap / f"{h.name}.log"
                log.touch()
                log.chmod(0o666)
                logs[h.name] = log
                env = f"DOCKER_HOST={h.docker_host} CVS_DOCKER_LOG={log} PATH={wrap}:{LOGIN_PATH}"
                box.set_sshd_option(h, "SetEnv", env)
            calls.logs = logs
            yield load_cluster(box.cluster_file), calls
        finally:
            sandbox_down(directory)
            shutil.rmtree(wrap, ignore_errors=True)


def report_text(result: dict[str, Any]) -> str:
    trips = list(result["round_trips"].values())
    docker = "not counted (not a sandbox)"
    if result["docker_up"] is not None:
        up = max(len(v) for v in result["docker_up"].values())
        ex = max(len(v) for v in result["docker_exec"].values())
        example = next(iter(result["docker_up"].values()))
        docker = f"per host max {up} in up ({' + '.join(example)}), {ex} in exec"
    return (
        f"{result['hosts']:>3} {result['runtime']} hosts: first up "
        f"({'/'.join(result['first_up_actions'])}) {result['first_up_seconds']:.3f} s; "
        f"attach up + exec hostname {result['seconds']:.3f} s "
        f"(median of {result['runs']}, {result['seconds_min']:.3f}..{result['seconds_max']:.3f}; "
        f"CPUs {result['busy_before']:.0%} busy before; "
        f"{result['cpu_ms_per_host']} ms of this machine's CPU per host); "
        f"up round trips per host max {max(trips)}; "
        f"exec {max(result['exec_round_trips'].values())}; "
        f"docker processes {docker}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", type=Path, help="cluster file (its lifetime is forced)")
    where.add_argument(
        "--sandbox-hosts", type=int, nargs="+", help="build one sandbox, measure these host counts"
    )
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs per size (default {RUNS})")
    parser.add_argument(
        "--runtime",
        choices=("docker", "podman"),
        default="docker",
        help="the sandbox hosts' runtime (with --sandbox-hosts)",
    )
    parser.add_argument(
        "--rootless",
        action="store_true",
        help="with --runtime podman: the login user's own rootless podman on each host",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"seconds to wait for a quiet machine before timing (default {SETTLE_S:g}; "
        "0: a smoke run, which times nothing it reports on)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per size on stdout")
    args = parser.parse_args()
    if args.rootless and (args.runtime != "podman" or args.cluster is not None):
        parser.error("--rootless builds rootless podman sandbox hosts: add --runtime podman")

    results: list[dict[str, Any]] = []
    if args.cluster is not None:
        results.append(
            measure(
                persistent(load_cluster(args.cluster)), DockerCalls(None), args.runs, args.settle
            )
        )
    else:
        with counted_sandbox(max(args.sandbox_hosts), args.runtime, args.rootless) as (
            cluster,
            docker,
        ):
            for n in args.sandbox_hosts:
                sized = persistent(cluster, n)
                try:
                    results.append(measure(sized, docker, args.runs, args.settle))
                finally:
                    anyio.run(down_once, sized)  # the next size starts from nothing

    for result in results:
        sys.stdout.write(json.dumps(result) + "\n" if args.json else report_text(result))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
