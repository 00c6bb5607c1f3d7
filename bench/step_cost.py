"""Step cost: one command in every container, through the containers' own sshd
and through `docker exec`, in the same run (issue 34).

    python bench/step_cost.py --sandbox-hosts 16 --sizes 2 16      # root: a throwaway sandbox
    python bench/step_cost.py --cluster cluster.yaml --sizes 2     # an existing cluster
    python bench/step_cost.py ... --suite-hosts 3 --suite-steps 100

Persistent containers are brought up first (the sandbox's image runs an sshd;
the cluster's state directory is the bench's own), the machine is left to
settle, then for each size and each path (`sshd`: containers/sshexec.py,
`exec`: `docker exec`, the path with `container.sshd.exec: false`):

- step: in one invocation that has attached (`Cluster.open` + `up`, so the
  shared lock is held, as a suite run holds it), `exec("true")` on every host
  of the size, `--steps` times after 3 unmeasured ones: the median and
  min..max wall time of one step, this machine's CPU per step and host (all
  processes: in a sandbox every host is on this machine, so that is the
  whole cost, but also whatever else runs here), and our own process's CPU
  per step;
- step, `bare`: the floor of a session per step on the same connections
  (`true` on a channel of each container's connection, nothing else: no
  environment, no ssh_run.sh or run.sh, no pidfile): what the containers'
  sshd, the login shell and `true` cost whoever the client is;
- attach: a new invocation's `Cluster.open` + `up` (attach) + `exec
  hostname`, `--runs` times: the median wall time, as bench/attach.py;
- suite (`--suite-hosts N`): `cvs run` of a suite of `--suite-steps` steps
  (`true`) on N hosts, end to end as a user runs it (a new process each
  time, `--runs` times): the median wall time.

`--json` prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.attach import SETTLE_S, cpu_seconds, settle
from orchestrator.api import Cluster
from orchestrator.config import load_cluster
from orchestrator.ssh.transport import SSHPool

PATHS = ("sshd", "exec")
# A step's paths: ours through the sshd, through `docker exec`, and the floor
# of a session per step on the same connections (_bare_sessions).
STEP_PATHS = (*PATHS, "bare")
REPO = Path(__file__).resolve().parent.parent


def variant_file(
    source: Path, directory: Path, hosts: int, path: str, *, for_cvs: bool = False
) -> Path:
    """The cluster file on its first `hosts` hosts, persistent, commands
    through `path` (its container name and state directory as they are: an
    existing cluster's containers are attached to, with their keys).

    `for_cvs`: the containers also suit CVS main's `setup_sshd()`, which copies
    `/host_ssh/*` and starts its own `sshd -p2224`: a directory is mounted
    there (one file no sshd reads) and cvs's sshd listens on 2225. The same
    for every variant, so all of them attach to the same containers."""
    doc = yaml.safe_load(source.read_text())
    doc["hosts"] = doc["hosts"][:hosts]
    doc.pop("head", None)
    if doc.get("state_dir"):
        doc["state_dir"] = str((source.parent / str(doc["state_dir"])).resolve())
    sshd = {**(doc["container"].get("sshd") or {}), "exec": path == "sshd"}
    doc["container"] = {**doc["container"], "lifetime": "persistent", "sshd": sshd}
    if for_cvs:
        host_ssh = directory / "host_ssh"
        host_ssh.mkdir(mode=0o755, exist_ok=True)
        (host_ssh / "cvs-bench-note").write_text("copied by CVS's setup_sshd\n")
        sshd["port"] = 2225
        volumes = [*(doc["container"].get("volumes") or []), f"{host_ssh}:/host_ssh:ro"]
        doc["container"]["volumes"] = volumes
    out = directory / f"cluster-{hosts}-{path}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


async def _bare_sessions(cluster: Cluster) -> Callable[[], Awaitable[bool]]:
    """A step of bare sessions: `true` on a channel of each container's
    connection, and nothing else (no environment, no ssh_run.sh or run.sh, no
    pidfile): what the sshd, the login shell and `true` cost whoever the
    client is, the floor of a session per step."""
    from orchestrator.containers.route import Sshd

    ssh_exec, conns = cluster.ssh_exec, []
    for host in cluster.hosts:
        way = await ssh_exec.route(host, cluster.runtimes[host], "root")
        containers = cluster.pool.containers if isinstance(cluster.pool, SSHPool) else None
        if not isinstance(way, Sshd) or containers is None:
            raise SystemExit(f"{host}: no sshd to run a bare session on ({way})")
        conns.append(await containers.connection(ssh_exec.endpoint(host, way)))

    async def step() -> bool:
        done = await asyncio.gather(
            *(c.run("true", stdin=asyncssh.DEVNULL, check=False) for c in conns)
        )
        return all(r.exit_status == 0 for r in done)

    return step


async def _steps(cluster_file: Path, steps: int, bare: bool = False) -> dict[str, Any]:
    async with Cluster.open(cluster_file) as cluster:
        await cluster.up()
        for _ in range(3):
            await cluster.exec("true")

        async def ours() -> bool:
            return all(r.ok for r in (await cluster.exec("true")).values())

        step = await _bare_sessions(cluster) if bare else ours
        walls: list[float] = []
        cpu0, own0 = cpu_seconds(), time.process_time()
        for _ in range(steps):
            start = time.perf_counter()
            ok = await step()
            walls.append(time.perf_counter() - start)
            if not ok:
                raise SystemExit("a step failed")
        cpu, own = cpu_seconds() - cpu0, time.process_time() - own0
        counters = cluster.ssh_exec.counters
        return {
            "walls": walls,
            "cpu": cpu,
            "own": own,
            "connects": counters.connects,
            "channels": counters.channels,
            "fell_back": dict(cluster.ssh_exec.off),
        }


def measure_steps(cluster_file: Path, hosts: int, path: str, steps: int) -> dict[str, Any]:
    got = anyio.run(_steps, cluster_file, steps, path == "bare")
    walls = got["walls"]
    return {
        "what": "step",
        "path": path,
        "hosts": hosts,
        "steps": steps,
        "ms": round(statistics.median(walls) * 1000, 2),
        "ms_min": round(min(walls) * 1000, 2),
        "ms_max": round(max(walls) * 1000, 2),
        "machine_cpu_ms_per_step_host": round(got["cpu"] * 1000 / steps / hosts, 2),
        "own_cpu_ms_per_step": round(got["own"] * 1000 / steps, 2),
        "container_connects": got["connects"],
        "container_channels": got["channels"],
        "fell_back": got["fell_back"],
    }


async def _attach(cluster_file: Path) -> bool:
    async with Cluster.open(cluster_file) as cluster:
        report = await cluster.up()
        results = await cluster.exec("hostname")
        return report.ok and all(r.ok for r in results.values())


def measure_attach(cluster_file: Path, hosts: int, path: str, runs: int) -> dict[str, Any]:
    walls, cpu = [], []
    for _ in range(runs):
        cpu0, start = cpu_seconds(), time.perf_counter()
        if not anyio.run(_attach, cluster_file):
            raise SystemExit("an attach failed")
        walls.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - cpu0)
    return {
        "what": "attach",
        "path": path,
        "hosts": hosts,
        "runs": runs,
        "s": round(statistics.median(walls), 3),
        "s_min": round(min(walls), 3),
        "s_max": round(max(walls), 3),
        "machine_cpu_ms_per_host": round(statistics.median(cpu) * 1000 / hosts),
    }


def cvs_cluster_json(cluster_file: Path, directory: Path) -> Path:
    """A CVS main cluster file for the same hosts and the same running
    container (CVS attaches to it by name)."""
    doc = yaml.safe_load(cluster_file.read_text())
    ssh = doc.get("ssh") or {}
    addresses = [h.get("address") or h["name"] for h in doc["hosts"]]
    cvs = {
        "orchestrator": "container",
        "username": ssh.get("user") or os.environ.get("USER", "root"),
        "priv_key_file": (ssh.get("identity_files") or ["~/.ssh/id_ed25519"])[0],
        "node_dict": {a: {"bmc_ip": "NA", "vpc_ip": a} for a in addresses},
        "container": {
            "image": doc["container"]["image"],
            "name": doc["container"]["name"],
            "lifetime": "persistent",
            "runtime": {"name": "docker", "args": {}},
        },
    }
    path = directory / f"cvs-{len(addresses)}.json"
    path.write_text(json.dumps(cvs, indent=1))
    return path


def measure_cvs(
    cluster_file: Path, hosts: int, python: Path, steps: int, runs: int
) -> dict[str, Any]:
    """CVS main's own exec and attach (bench/cvs_main_exec.py, in CVS's venv)."""
    cvs_json = cvs_cluster_json(cluster_file, cluster_file.parent)
    child = REPO / "bench" / "cvs_main_exec.py"
    proc = subprocess.run(
        [str(python), str(child), str(cvs_json), str(steps), str(runs), "--suite-attach"],
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    if proc.returncode != 0:
        raise SystemExit(f"CVS main failed: {proc.stderr[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"what": "cvs", "path": "cvs-main", "hosts": hosts, **got}


def suite_file(directory: Path, steps: int) -> Path:
    doc = {
        "name": "step_cost",
        "description": f"{steps} steps of `true`",
        "steps": [{"name": f"s{i}", "run": "true", "timeout": 60} for i in range(steps)],
    }
    path = directory / "step_cost.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def measure_suite(
    cluster_file: Path, hosts: int, path: str, suite: Path, runs: int, steps: int
) -> dict[str, Any]:
    walls = []
    argv = [sys.executable, "-m", "orchestrator", "run", str(suite), "-c", str(cluster_file)]
    env = {**os.environ, "CI": "true", "CVS_RUNS_DIR": str(cluster_file.parent / "runs")}
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=cluster_file.parent
        )
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"the suite failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {
        "what": "suite",
        "path": path,
        "hosts": hosts,
        "steps": steps,
        "runs": runs,
        "s": round(statistics.median(walls), 2),
        "s_min": round(min(walls), 2),
        "s_max": round(max(walls), 2),
    }


@contextmanager
def sandbox(hosts: int) -> Iterator[Path]:
    from orchestrator.sandbox import sandbox_down, sandbox_up

    with tempfile.TemporaryDirectory(prefix="cvs-bench-step-") as tmp:
        directory = Path(tmp) / "sb"
        try:
            yield sandbox_up(directory, hosts).cluster_file
        finally:
            sandbox_down(directory)


def text(r: dict[str, Any]) -> str:
    if r["what"] == "step":
        return (
            f"step    {r['hosts']:>2} hosts {r['path']:>4}: exec true {r['ms']:.1f} ms median "
            f"({r['ms_min']:.1f}..{r['ms_max']:.1f}, {r['steps']} steps); machine CPU "
            f"{r['machine_cpu_ms_per_step_host']:.1f} ms per step and host, ours "
            f"{r['own_cpu_ms_per_step']:.1f} ms per step; container connections "
            f"{r['container_connects']}, channels {r['container_channels']}"
            + (f"; fell back: {r['fell_back']}" if r["fell_back"] else "")
            + "\n"
        )
    if r["what"] == "attach":
        return (
            f"attach  {r['hosts']:>2} hosts {r['path']:>4}: open + up + exec hostname "
            f"{r['s']:.3f} s median ({r['s_min']:.3f}..{r['s_max']:.3f}, {r['runs']} runs); "
            f"machine CPU {r['machine_cpu_ms_per_host']} ms per host\n"
        )
    if r["what"] == "cvs":
        return (
            f"cvs     {r['hosts']:>2} hosts main: orch.exec true {r['exec_ms']:.1f} ms median "
            f"(min {r['exec_ms_min']:.1f}, {r['steps']} steps); attach (setup_containers + "
            f"exec hostname) {r['attach_s']:.3f} s median (min {r['attach_s_min']:.3f}, "
            f"{r['runs']} runs); a suite's attach (setup_containers + setup_sshd + exec "
            f"hostname) {r.get('suite_attach_s', float('nan')):.3f} s median "
            f"(min {r.get('suite_attach_s_min', float('nan')):.3f})\n"
        )
    return (
        f"suite   {r['hosts']:>2} hosts {r['path']:>4}: cvs run, {r['steps']} steps, "
        f"{r['s']:.2f} s median ({r['s_min']:.2f}..{r['s_max']:.2f}, {r['runs']} runs)\n"
    )


def run_all(source: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="cvs-bench-step-work-", dir="/tmp"))
    # Gone on every way out (an error, Ctrl-C), not only after the last figure.
    try:
        work.chmod(0o755)
        return _run_all_in(work, source, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_all_in(work: Path, source: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    named = source
    for_cvs = bool(args.cvs_python)

    def variant(source: Path, directory: Path, hosts: int, path: str) -> Path:
        return variant_file(source, directory, hosts, path, for_cvs=for_cvs)

    widest = max([*args.sizes, args.suite_hosts or 0])
    first = variant(named, work, widest, "sshd")
    anyio.run(_attach, first)  # cold start (or attach) everywhere once
    results: list[dict[str, Any]] = []
    busy = settle(timeout=args.settle)
    sys.stderr.write(f"step_cost: machine {busy:.0%} busy before the runs\n")
    for n in args.sizes:
        for path in STEP_PATHS:
            cluster = variant(named, work, n, "sshd" if path == "bare" else path)
            results.append(measure_steps(cluster, n, path, args.steps))
    for n in args.attach_sizes:
        for path in PATHS:
            results.append(measure_attach(variant(named, work, n, path), n, path, args.runs))
    if args.cvs_python:
        n = min(args.sizes)
        cluster = variant(named, work, n, "sshd")
        results.append(measure_cvs(cluster, n, args.cvs_python, args.steps, args.runs))
    if args.suite_hosts:
        suite = suite_file(work, args.suite_steps)
        for path in PATHS:
            cluster = variant(named, work, args.suite_hosts, path)
            results.append(
                measure_suite(cluster, args.suite_hosts, path, suite, args.runs, args.suite_steps)
            )
    if args.sandbox_hosts:
        anyio.run(_down, first)
    return results


async def _down(cluster_file: Path) -> None:
    async with Cluster.open(cluster_file) as cluster:
        await cluster.down(force=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", type=Path, help="cluster file (its lifetime is forced)")
    where.add_argument("--sandbox-hosts", type=int, help="build a throwaway sandbox of N hosts")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2], help="hosts per step run")
    parser.add_argument("--attach-sizes", type=int, nargs="*", default=[2])
    parser.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
    parser.add_argument("--runs", type=int, default=5, help="attach and suite runs (default 5)")
    parser.add_argument("--suite-hosts", type=int, default=0, help="hosts of the suite run")
    parser.add_argument("--suite-steps", type=int, default=100)
    parser.add_argument(
        "--cvs-python",
        type=Path,
        help="the Python of a venv with the real CVS main installed: time its exec and attach",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"seconds to wait for a quiet machine before timing (default {SETTLE_S:g}; "
        "0: a smoke run, which times nothing it reports on)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per measurement")
    args = parser.parse_args()
    if args.cluster is not None:
        load_cluster(args.cluster)  # a bad file: its one-line error now
        results = run_all(args.cluster, args)
    else:
        with sandbox(args.sandbox_hosts) as cluster_file:
            results = run_all(cluster_file, args)
    for r in results:
        sys.stdout.write(json.dumps(r) + "\n" if args.json else text(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
