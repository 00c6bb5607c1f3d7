"""Fan-out benchmark: ours against parallel-ssh's ParallelSSHClient, same run, same hosts.

    python bench/fanout.py --hosts 240,1000 --rounds 3

Serves N loopback endpoints (127.0.x.y, 16 `ListenAddress` per sshd, see
bench/loopback.py), then, for each client in its own process, times `true`
on all of them: with fresh connections (connect + run), and on the reused
ones (the median of several more runs over the open connections). Reported
per fleet size:

- fresh and reused wall time inside each client, and ours / theirs;
- the fresh fan-out as a whole process: the wall time of a process that
  starts, imports, connects, runs `true` once and exits (what a user of a
  one-shot command waits for), and ours / theirs;
- each process's peak resident memory (ru_maxrss from wait4), and per host.

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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HERE = Path(__file__).resolve()


# ---- the two clients, each run as `fanout.py --worker ours|theirs` ------------------


def worker_ours(cluster_file: Path, reuse_rounds: int) -> dict[str, Any]:
    """Our transport: SSHPool + run_on_hosts, as `cvs exec --host-os` uses them."""
    import anyio
    import yaml

    from orchestrator.config import ClusterConfig
    from orchestrator.ssh.fanout import run_on_hosts
    from orchestrator.ssh.transport import SSHPool

    cfg = ClusterConfig.model_validate(yaml.safe_load(cluster_file.read_text()))
    hosts = [h.name for h in cfg.hosts]

    async def run() -> dict[str, Any]:
        async with SSHPool(cfg) as pool:
            t0 = time.perf_counter()
            first = await run_on_hosts(pool, hosts, "true")
            fresh = time.perf_counter() - t0
            reused, bad = [], [r for r in first.values() if not r.ok]
            for _ in range(reuse_rounds):
                t1 = time.perf_counter()
                again = await run_on_hosts(pool, hosts, "true")
                reused.append(time.perf_counter() - t1)
                bad += [r for r in again.values() if not r.ok]
            return {
                "fresh": fresh,
                "reused": statistics.median(reused) if reused else None,
                "failed": len(bad),
                "example": str(bad[0]) if bad else None,
                "handshakes": pool.connects,
            }

    return anyio.run(run)


def worker_theirs(cluster_file: Path, reuse_rounds: int) -> dict[str, Any]:
    """parallel-ssh's ParallelSSHClient (ssh2-python, gevent): the transport of the
    tool cvs replaces."""
    import yaml
    from pssh.clients import ParallelSSHClient

    doc = yaml.safe_load(cluster_file.read_text())
    addresses = [h["address"] for h in doc["hosts"]]
    ssh = doc["ssh"]
    t0 = time.perf_counter()
    client = ParallelSSHClient(
        addresses,
        user=ssh["user"],
        port=ssh["port"],
        pkey=ssh["identity_files"][0],
        pool_size=len(addresses),
        num_retries=3,
    )
    output = client.run_command("true", stop_on_errors=False)
    client.join(output)
    fresh = time.perf_counter() - t0
    codes = [o.exit_code for o in output]
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
        "reused": statistics.median(reused) if reused else None,
        "failed": len(bad),
        "example": str(bad[0]) if bad else None,
    }


# ---- the driver -------------------------------------------------------------------------


def run_worker(which: str, cluster_file: Path, reuse_rounds: int) -> dict[str, Any]:
    """One client as a whole process: its own figures (with its peak RSS, from
    getrusage in the worker), plus the process's wall time seen from here."""
    argv = [sys.executable, str(HERE), "--worker", which, "--cluster", str(cluster_file)]
    argv += ["--reuse-rounds", str(reuse_rounds)]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{which}: exit {proc.returncode}: {err.strip()[-2000:]}")
    doc = json.loads(out.strip().splitlines()[-1])
    doc["wall"] = wall
    return doc


def measure(which: str, cluster_file: Path, reuse_rounds: int) -> dict[str, Any]:
    """Two processes: one that only connects, runs `true` once and exits (its wall
    time is the fresh fan-out as a whole process: interpreter start, imports,
    connect, run, exit), then one that also runs on the reused connections."""
    alone = run_worker(which, cluster_file, 0)
    doc = run_worker(which, cluster_file, reuse_rounds)
    for d in (alone, doc):
        if d["failed"]:
            raise SystemExit(f"{which}: {d['failed']} hosts not ok, e.g. {d['example']}")
    doc["wall"] = alone["wall"]
    doc["maxrss_kib"] = max(alone["maxrss_kib"], doc["maxrss_kib"])
    return doc


def fleet(hosts: int, rounds: int, reuse_rounds: int) -> dict[str, Any]:
    import yaml

    from bench.loopback import loopback_farm

    with loopback_farm(hosts) as farm:
        cluster_file = farm.cluster_yaml()
        # Ours with the default handshake cap (10 per sshd address): the farm's
        # sshds serve 16 addresses each and allow 200 unauthenticated
        # connections (MaxStartups). parallel-ssh starts all of them at once.
        doc = yaml.safe_load(cluster_file.read_text())
        doc["concurrency"] = {"hosts": max(256, hosts)}
        cluster_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for r in range(rounds):
            # Alternate who goes first: the machine's state drifts during a run.
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            got = {w: measure(w, cluster_file, reuse_rounds) for w in order}
            rows.append((got["ours"], got["theirs"]))
            o, t = got["ours"], got["theirs"]
            print(
                f"{hosts} hosts, round {r + 1}: "
                f"fresh {o['fresh']:.2f}s vs {t['fresh']:.2f}s ({o['fresh'] / t['fresh']:.2f}) | "
                f"reused {o['reused']:.3f}s vs {t['reused']:.3f}s "
                f"({o['reused'] / t['reused']:.2f}) | "
                f"fresh process {o['wall']:.2f}s vs {t['wall']:.2f}s "
                f"({o['wall'] / t['wall']:.2f}) | "
                f"peak RSS {o['maxrss_kib'] / 1024:.0f} vs {t['maxrss_kib'] / 1024:.0f} MiB",
                flush=True,
            )

    def med(side: int, key: str) -> float:
        return statistics.median(row[side][key] for row in rows)

    summary = {"hosts": hosts, "rounds": rounds}
    for key in ("fresh", "reused", "wall", "maxrss_kib"):
        summary[key] = {"ours": med(0, key), "theirs": med(1, key)}
        summary[key]["ratio"] = summary[key]["ours"] / summary[key]["theirs"]
    for side in ("ours", "theirs"):
        summary["maxrss_kib"][f"{side}_per_host"] = summary["maxrss_kib"][side] / hosts
    return summary


def report(s: dict[str, Any]) -> str:
    m = s["maxrss_kib"]
    return "\n".join(
        [
            f"| {s['hosts']} hosts, `true`, median of {s['rounds']} | ours | parallel-ssh "
            "| ours / theirs |",
            "|---|---|---|---|",
            *(
                f"| {label} | {s[k]['ours']:.{p}f} s | {s[k]['theirs']:.{p}f} s "
                f"| **{s[k]['ratio']:.2f}** |"
                for label, k, p in (
                    ("fresh connections (connect + run)", "fresh", 2),
                    ("reused connections (median of runs)", "reused", 3),
                    ("fresh, as a whole process (start to exit)", "wall", 2),
                )
            ),
            f"| peak RSS | {m['ours'] / 1024:.0f} MiB | {m['theirs'] / 1024:.0f} MiB "
            f"| **{m['ratio']:.2f}** |",
            f"| peak RSS per host | {m['ours_per_host']:.0f} KiB | {m['theirs_per_host']:.0f} KiB "
            "| |",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="240,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reuse-rounds", type=int, default=5, help="runs on the open connections per round"
    )
    parser.add_argument("--smoke", action="store_true", help="4 hosts, one round")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.add_argument("--worker", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    parser.add_argument("--cluster", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work = worker_ours if args.worker == "ours" else worker_theirs
        doc = work(args.cluster, args.reuse_rounds)
        import resource

        doc["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(doc))
        return 0
    sizes = [4] if args.smoke else [int(n) for n in args.hosts.split(",")]
    rounds = 1 if args.smoke else args.rounds
    reuse = 2 if args.smoke else args.reuse_rounds
    summaries = [fleet(n, rounds, reuse) for n in sizes]
    print(f"\nmachine: {os.cpu_count()} cores, {_os_name()}")
    for s in summaries:
        print("\n" + report(s))
    if args.json:
        print(json.dumps(summaries))
    return 0


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
