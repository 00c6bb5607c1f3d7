"""Fan-out benchmark: ours against parallel-ssh's ParallelSSHClient, same run, same hosts.

    python bench/fanout.py --hosts 240,1000 --rounds 3
    python bench/fanout.py --hosts 240,1000,5000 --rounds 1 --reuse-rounds 0 --forks default,fleet

Serves N loopback endpoints (127.0.x.y, 16 `ListenAddress` per sshd, see
bench/loopback.py), then, for each client in its own process, times `true`
on all of them: with fresh connections (connect + run), and on the reused
ones (the median of several more runs over the open connections). Reported
per fleet size:

- fresh and reused wall time inside each client, and ours / theirs;
- the fresh fan-out as a whole process: the wall time of a process that
  starts, imports, connects, runs `true` once and exits (what a user of a
  one-shot command waits for), and ours / theirs;
- each process's peak resident memory (ru_maxrss from wait4), and per host;
- each process's CPU time (user + system, getrusage), per host;
- how many hosts were ok (a run where some fail is reported, not dropped);
- the load average when each figure was taken (the machine may be shared).

`--forks default,fleet` runs each client with its own default parallelism
(ours: concurrency.hosts 256; parallel-ssh: pool_size 100) and with it at the
fleet size (what `--forks N` / parallel-ssh's `pool_size=N` ask for).

Timings on a shared 2-core machine are noisy: compare the ratios, which are
taken within one run, and use the median of several rounds (who goes first
alternates per round). `--smoke` runs a few hosts once (for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HERE = Path(__file__).resolve()


# ---- the two clients, each run as `fanout.py --worker ours|theirs` ------------------


def worker_ours(
    cluster_file: Path, reuse_rounds: int, forks: int | None, workers: str = "auto"
) -> dict[str, Any]:
    """Our transport: run_on_hosts on an SSHPool, or on a WorkerRunner where
    `Cluster.open` would plan worker processes, as `cvs exec --host-os` uses
    them (`workers`: concurrency.workers, or auto: unset)."""
    import anyio
    import yaml

    from orchestrator.cli import collector
    from orchestrator.config import ClusterConfig
    from orchestrator.ssh.fanout import run_on_hosts
    from orchestrator.ssh.transport import SSHPool
    from orchestrator.ssh.workers.parent import planned_workers
    from orchestrator.ssh.workers.runner import WorkerRunner

    collector.tune()  # as the `cvs` process does once its command's modules are in
    doc = yaml.safe_load(cluster_file.read_text())
    if forks is not None:
        doc["concurrency"] = {**doc.get("concurrency", {}), "hosts": forks}
    if workers != "auto":
        doc["concurrency"] = {**doc.get("concurrency", {}), "workers": int(workers)}
    cfg = ClusterConfig.model_validate(doc)
    hosts = [h.name for h in cfg.hosts]
    count = planned_workers(cfg, len(hosts))

    def figures(runner: SSHPool | WorkerRunner) -> dict[str, int]:
        """Handshakes, admission and (workers only) CPU, of this process's pool
        or of the worker processes' pools."""
        if isinstance(runner, WorkerRunner):
            return runner.stats()
        return {
            "connects": runner.connects,
            "peak_in_flight": runner.admission.peak_in_flight,
            "window_decreases": runner.admission.window.decreases,
        }

    async def run() -> dict[str, Any]:
        runner = WorkerRunner(cfg, workers=count) if count > 1 else SSHPool(cfg)
        # The fresh fan-out includes starting the worker processes, if any.
        t0, c0 = time.perf_counter(), time.process_time()
        async with runner:
            first = await run_on_hosts(runner, hosts, "true")
            fresh, fanout_cpu = time.perf_counter() - t0, time.process_time() - c0
            # Worker processes: their CPU so far, start-up included.
            fanout_cpu += figures(runner).get("cpu_ms", 0) / 1000
            reused, bad = [], [r for r in first.values() if not r.ok]
            for _ in range(reuse_rounds):
                t1 = time.perf_counter()
                again = await run_on_hosts(runner, hosts, "true")
                reused.append(time.perf_counter() - t1)
                bad += [r for r in again.values() if not r.ok]
            spread = figures(runner)
            return {
                "fresh": fresh,
                "fanout_cpu": fanout_cpu,
                "reused": statistics.median(reused) if reused else None,
                "failed": len(bad),
                "example": str(bad[0]) if bad else None,
                "handshakes": spread["connects"],
                "peak_in_flight": spread["peak_in_flight"],
                "window_decreases": spread["window_decreases"],
                "workers": spread.get("workers", 1),
                "workers_maxrss_kib": spread.get("maxrss_kib", 0),
                "ok": len(hosts) - len([r for r in first.values() if not r.ok]),
            }

    return anyio.run(run)


def worker_theirs(cluster_file: Path, reuse_rounds: int, forks: int | None) -> dict[str, Any]:
    """parallel-ssh's ParallelSSHClient (ssh2-python, gevent): the transport of the
    tool cvs replaces."""
    import yaml
    from pssh.clients import ParallelSSHClient

    doc = yaml.safe_load(cluster_file.read_text())
    addresses = [h["address"] for h in doc["hosts"]]
    ssh = doc["ssh"]
    t0, c0 = time.perf_counter(), time.process_time()
    client = ParallelSSHClient(
        addresses,
        user=ssh["user"],
        port=ssh["port"],
        pkey=ssh["identity_files"][0],
        pool_size=forks or 100,  # parallel-ssh's default pool_size is 100
        num_retries=3,
    )
    output = client.run_command("true", stop_on_errors=False)
    client.join(output)
    fresh, fanout_cpu = time.perf_counter() - t0, time.process_time() - c0
    codes = [o.exit_code for o in output]
    ok = sum(1 for c in codes if c == 0)
    reused = []
    for _ in range(reuse_rounds):
        t1 = time.perf_counter()
        again = client.run_command("true", stop_on_errors=False)
        client.join(again)
        reused.append(time.perf_counter() - t1)
        codes += [o.exit_code for o in again]
    bad = [c for c in codes if c != 0]
    return {
        "fresh": fresh,
        "fanout_cpu": fanout_cpu,
        "reused": statistics.median(reused) if reused else None,
        "failed": len(bad),
        "example": str(bad[0]) if bad else None,
        "ok": ok,
    }


# ---- the driver -------------------------------------------------------------------------


def run_worker(
    which: str, cluster_file: Path, reuse_rounds: int, forks: int | None, workers: str = "auto"
) -> dict[str, Any]:
    """One client as a whole process: its own figures (with its peak RSS and CPU,
    from getrusage in the worker), plus the process's wall time seen from here."""
    argv = [sys.executable, str(HERE), "--worker", which, "--cluster", str(cluster_file)]
    argv += ["--reuse-rounds", str(reuse_rounds)]
    if forks is not None:
        argv += ["--worker-forks", str(forks)]
    if which == "ours":
        argv += ["--worker-workers", workers]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{which}: exit {proc.returncode}: {err.strip()[-2000:]}")
    doc = json.loads(out.strip().splitlines()[-1])
    doc["wall"] = wall
    return doc


def loadavg() -> float:
    """The 1-minute load average: how busy the (shared) machine was."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(
    which: str,
    cluster_file: Path,
    reuse_rounds: int,
    forks: int | None = None,
    sshd_cpu: Callable[[], float] | None = None,
    workers: str = "auto",
) -> dict[str, Any]:
    """Two processes: one that only connects, runs `true` once and exits (its wall
    time is the fresh fan-out as a whole process: interpreter start, imports,
    connect, run, exit), then, with `reuse_rounds`, one that also runs on the
    reused connections. A host that failed is counted (`ok`), not fatal: a
    collapse is a result."""
    load = loadavg()
    farm_before = sshd_cpu() if sshd_cpu else None
    alone = run_worker(which, cluster_file, 0, forks, workers)
    alone["load"] = load
    if sshd_cpu and farm_before is not None:
        time.sleep(0.5)  # the listeners reap the last connections' sshds
        alone["sshd_cpu"] = sshd_cpu() - farm_before
        # What the machine could do at best: all the CPU the fan-out cost
        # (the farm's sshds and the client), spread over every core.
        alone["floor"] = (alone["sshd_cpu"] + alone["fanout_cpu"]) / (os.cpu_count() or 1)
    if not reuse_rounds:
        return alone
    doc = run_worker(which, cluster_file, reuse_rounds, forks, workers)
    for key in ("wall", "cpu", "fanout_cpu", "ok", "load", "sshd_cpu", "floor", "example"):
        if key in alone:
            doc[key] = alone[key]
    doc["maxrss_kib"] = max(alone["maxrss_kib"], doc["maxrss_kib"])
    return doc


def fleet(
    hosts: int,
    rounds: int,
    reuse_rounds: int,
    modes: list[str],
    warm_up: bool = True,
    settings: tuple[str, ...] | list[str] = ("auto",),
) -> list[dict[str, Any]]:
    from bench.loopback import loopback_farm

    summaries = []
    with loopback_farm(hosts) as farm:
        # The farm's sshds serve 16 addresses each and allow 200 unauthenticated
        # connections (MaxStartups); our per-sshd cap is per address here.
        cluster_file = farm.cluster_yaml()
        if warm_up:
            # The farm's first fan-out after it starts may cost its sshds more
            # (in two bench runs at 5000 hosts the first measured run cost
            # 16.2-16.3 ms of sshd CPU per host, the second 12.9-13.7). A real
            # cluster's sshds are long-running: no measured run is the farm's first.
            done = run_worker("ours", cluster_file, 0, None)
            print(f"{hosts} hosts, warm-up (not measured): {done['ok']} ok", flush=True)
        for mode in modes:
            # `default`: each client's own default parallelism; `fleet`: the
            # fleet size, as `--forks N` asks (parallel-ssh: pool_size=N).
            forks = hosts if mode == "fleet" else None
            rows: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {w: [] for w in settings}
            for r in range(rounds):
                # Alternate who goes first: the machine's state drifts during a run.
                order = ["theirs", *settings] if r % 2 else [*settings, "theirs"]
                got = {
                    w: measure(
                        "theirs" if w == "theirs" else "ours",
                        cluster_file,
                        reuse_rounds,
                        forks,
                        farm.sshd_cpu,
                        "auto" if w == "theirs" else w,
                    )
                    for w in order
                }
                for w in settings:
                    rows[w].append((got[w], got["theirs"]))
                    print_round(hosts, mode, w, r, got[w], got["theirs"])
            for w in settings:
                summaries.append(summarize(hosts, mode, rows[w], w))
    return summaries


def print_round(
    hosts: int, mode: str, workers: str, r: int, o: dict[str, Any], t: dict[str, Any]
) -> None:
    print(
        f"{hosts} hosts, forks {mode}, workers {workers} ({o.get('workers', 1)}), "
        f"round {r + 1}: ok {o['ok']} vs {t['ok']} | "
        f"fresh {o['fresh']:.2f}s vs {t['fresh']:.2f}s "
        f"({o['fresh'] / t['fresh']:.2f}) | "
        f"process {o['wall']:.2f}s vs {t['wall']:.2f}s "
        f"({o['wall'] / t['wall']:.2f}) | "
        f"CPU {o['cpu']:.1f}s vs {t['cpu']:.1f}s "
        f"(fan-out {o['fanout_cpu']:.1f}s vs {t['fanout_cpu']:.1f}s) | "
        f"peak RSS {o['maxrss_kib'] / 1024:.0f} vs "
        f"{t['maxrss_kib'] / 1024:.0f} MiB | "
        f"load {o['load']:.1f}/{t['load']:.1f} | "
        f"our window: peak {o['peak_in_flight']}, "
        f"{o['window_decreases']} decreases | "
        f"farm CPU per host {1000 * o['sshd_cpu'] / hosts:.1f} vs "
        f"{1000 * t['sshd_cpu'] / hosts:.1f} ms | "
        f"fresh / machine floor {o['fresh'] / o['floor']:.2f} vs "
        f"{t['fresh'] / t['floor']:.2f}",
        flush=True,
    )
    # A host that failed is a result: say how (one example per client).
    for who, doc in (("ours", o), ("parallel-ssh", t)):
        if doc.get("example"):
            print(f"  {who}, one of the failed hosts: {doc['example'][:300]}", flush=True)


def summarize(
    hosts: int,
    mode: str,
    rows: list[tuple[dict[str, Any], dict[str, Any]]],
    workers: str = "auto",
) -> dict[str, Any]:
    def med(side: int, key: str) -> float | None:
        values = [row[side][key] for row in rows if row[side].get(key) is not None]
        return statistics.median(values) if values else None

    summary: dict[str, Any] = {
        "hosts": hosts,
        "forks": mode,
        "workers": workers,
        "rounds": len(rows),
    }
    for key in (
        "fresh",
        "reused",
        "wall",
        "maxrss_kib",
        "cpu",
        "fanout_cpu",
        "ok",
        "load",
        "sshd_cpu",
        "floor",
    ):
        ours, theirs = med(0, key), med(1, key)
        summary[key] = {"ours": ours, "theirs": theirs}
        if ours is not None and theirs:
            summary[key]["ratio"] = ours / theirs
    for side in ("ours", "theirs"):
        summary["maxrss_kib"][f"{side}_per_host"] = summary["maxrss_kib"][side] / hosts
        summary["cpu"][f"{side}_per_host_ms"] = summary["cpu"][side] / hosts * 1000
        summary["fanout_cpu"][f"{side}_per_host_ms"] = summary["fanout_cpu"][side] / hosts * 1000
        summary["sshd_cpu"][f"{side}_per_host_ms"] = summary["sshd_cpu"][side] / hosts * 1000
        summary["floor"][f"{side}_fresh_over_floor"] = (
            summary["fresh"][side] / summary["floor"][side]
        )
    return summary


def report(s: dict[str, Any]) -> str:
    m, c, f = s["maxrss_kib"], s["cpu"], s["fanout_cpu"]
    d, fl = s["sshd_cpu"], s["floor"]
    rows = [
        (label, k, p)
        for label, k, p in (
            ("fresh connections (connect + run)", "fresh", 2),
            ("reused connections (median of runs)", "reused", 3),
            ("fresh, as a whole process (start to exit)", "wall", 2),
        )
        if s[k]["ours"] is not None
    ]
    return "\n".join(
        [
            f"| {s['hosts']} hosts, `true`, forks {s['forks']}, workers {s['workers']}, "
            f"median of {s['rounds']} "
            "| ours | parallel-ssh | ours / theirs |",
            "|---|---|---|---|",
            f"| hosts ok | {s['ok']['ours']:.0f} | {s['ok']['theirs']:.0f} | |",
            *(
                f"| {label} | {s[k]['ours']:.{p}f} s | {s[k]['theirs']:.{p}f} s "
                f"| **{s[k]['ratio']:.2f}** |"
                for label, k, p in rows
            ),
            f"| CPU per host, the fan-out alone | {f['ours_per_host_ms']:.2f} ms "
            f"| {f['theirs_per_host_ms']:.2f} ms | **{f['ratio']:.2f}** |",
            f"| CPU per host, whole process (user + system) | {c['ours_per_host_ms']:.2f} ms "
            f"| {c['theirs_per_host_ms']:.2f} ms | **{c['ratio']:.2f}** |",
            f"| the farm's sshd CPU per host | {d['ours_per_host_ms']:.1f} ms "
            f"| {d['theirs_per_host_ms']:.1f} ms | |",
            f"| machine floor: (sshd + client CPU) / {os.cpu_count()} cores "
            f"| {fl['ours']:.2f} s | {fl['theirs']:.2f} s | |",
            f"| fresh fan-out / machine floor | {fl['ours_fresh_over_floor']:.2f} "
            f"| {fl['theirs_fresh_over_floor']:.2f} | |",
            f"| peak RSS | {m['ours'] / 1024:.0f} MiB | {m['theirs'] / 1024:.0f} MiB "
            f"| **{m['ratio']:.2f}** |",
            f"| peak RSS per host | {m['ours_per_host']:.0f} KiB | {m['theirs_per_host']:.0f} KiB "
            "| |",
            f"| load average (1 min) at start | {s['load']['ours']:.1f} "
            f"| {s['load']['theirs']:.1f} | |",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="240,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reuse-rounds", type=int, default=5, help="runs on the open connections per round"
    )
    parser.add_argument(
        "--forks",
        default="fleet",
        help="parallelism, comma-separated: default (each client's own), fleet (the fleet size)",
    )
    parser.add_argument("--smoke", action="store_true", help="4 hosts, one round")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.add_argument("--worker", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-forks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-workers", default="auto", help=argparse.SUPPRESS)
    parser.add_argument(
        "--workers",
        default="auto",
        help="our concurrency.workers, comma-separated (auto: unset; 1: one process), "
        "each measured against the same parallel-ssh run",
    )
    parser.add_argument("--cluster", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker == "ours":
            doc = worker_ours(
                args.cluster, args.reuse_rounds, args.worker_forks, args.worker_workers
            )
        else:
            doc = worker_theirs(args.cluster, args.reuse_rounds, args.worker_forks)
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        # Worker processes count too: their peak RSS summed (each reported its
        # own), their CPU from the children's usage (reaped when the pool closed).
        doc["maxrss_kib"] = usage.ru_maxrss + doc.pop("workers_maxrss_kib", 0)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        doc["cpu"] = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime
        print(json.dumps(doc))
        return 0
    modes = [m.strip() for m in args.forks.split(",")]
    if not set(modes) <= {"default", "fleet"}:
        parser.error(f"--forks {args.forks}: each must be default or fleet")
    sizes = [4] if args.smoke else [int(n) for n in args.hosts.split(",")]
    rounds = 1 if args.smoke else args.rounds
    reuse = 2 if args.smoke else args.reuse_rounds
    settings = [w.strip() for w in args.workers.split(",")]
    summaries = [s for n in sizes for s in fleet(n, rounds, reuse, modes, not args.smoke, settings)]
    print(f"\nmachine: {os.cpu_count()} cores, {_os_name()}, {_cpu_model()}")
    for s in summaries:
        print("\n" + report(s))
    if args.json:
        print(json.dumps(summaries))
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return sys.platform


if __name__ == "__main__":
    raise SystemExit(main())
