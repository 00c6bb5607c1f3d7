"""CLI start-up benchmark: whole-process wall time of `cvs --help` and friends.

    python bench/cli_startup.py            # median of 10 runs each
    python bench/cli_startup.py --runs 20 --json
    python bench/cli_startup.py --exec      # and `cvs exec` on one loopback host (root)

Each command runs as a fresh process (`python -m orchestrator ...`, what the
`cvs` entry point runs), next to `python -c pass`, the floor no CLI start can
go under. Prints the median, min and max per command in milliseconds, and
exits 1 when a median is over the budget (150 ms by default). On a shared
2-core machine timings are noisy: look at the medians.

`--exec` adds `cvs exec --host-os -- true` on one host, a loopback sshd
(bench/loopback.py): the whole process of a command that connects (start,
imports, handshake, the command, exit), with its own budget (350 ms).

`--baseline DIR` times the same commands from another checkout too (e.g.
`git archive main | tar -x -C /tmp/main-tree`), run for run interleaved with
this tree's, so both see the same load. Besides wall time it reports each
process's CPU time (user + system, from the children's rusage), which varies
far less than wall time on a loaded machine, and the load average before and
after.

The children use a bytecode cache (under a temporary PYTHONPYCACHEPREFIX, so
no checkout is written to) even where the environment sets
PYTHONDONTWRITEBYTECODE: an installed cvs has its .pyc files (pip compiles at
install), and compiling every module at every start is not what a user pays.
`--no-bytecode-cache` measures that way anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "cvs --help": ["-m", "orchestrator", "--help"],
    "cvs --version": ["-m", "orchestrator", "--version"],
    "cvs up --help": ["-m", "orchestrator", "up", "--help"],
}


def time_once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, user + system CPU ms) of one whole process, run in the tree it
    times (`python -m` puts the working directory first on sys.path)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=env["PYTHONPATH"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def child_env(tree: Path, pycache: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="fail above this median")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--exec", action="store_true", help="also `cvs exec` on one host (root)")
    parser.add_argument("--exec-budget-ms", type=float, default=350.0)
    parser.add_argument(
        "--baseline", type=Path, help="another checkout to time too, interleaved run for run"
    )
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="compile every module at every start (as under PYTHONDONTWRITEBYTECODE)",
    )
    args = parser.parse_args()

    commands = dict(COMMANDS)
    budgets = {label: args.budget_ms for label in commands}
    with contextlib.ExitStack() as stack:
        pycache = None
        if not args.no_bytecode_cache:
            pycache = stack.enter_context(tempfile.TemporaryDirectory(prefix="cvs-bench-pyc-"))
        trees = {"": child_env(ROOT, pycache)}
        if args.baseline is not None:
            trees[" (baseline)"] = child_env(args.baseline.resolve(), pycache)
        if args.exec:
            from bench.loopback import loopback_farm

            farm = stack.enter_context(loopback_farm(1))
            cluster = str(farm.cluster_yaml())
            label = "cvs exec, 1 host"
            commands[label] = ["-m", "orchestrator", "exec", "-c", cluster, "--host-os", "true"]
            budgets[label] = args.exec_budget_ms
        load_before = os.getloadavg()
        results = measure(commands, trees, args.runs)
        load_after = os.getloadavg()
    over = [
        label
        for label, r in results.items()
        if label.startswith("cvs")
        and not label.endswith("(baseline)")
        and r["median_ms"] > budgets[label]
    ]
    load = {"before": list(load_before), "after": list(load_after)}
    if args.json:
        doc = {
            "runs": args.runs,
            "budgets_ms": budgets,
            "results": results,
            "over": over,
            "load": load,
            "bytecode_cache": pycache is not None,
        }
        print(json.dumps(doc))
    else:
        head = f"{'command':<29} {'median':>7} {'min':>7} {'max':>7} {'cpu':>7}"
        print(f"{head}   ({args.runs} runs, ms; cpu: median user+sys)")
        for label, r in results.items():
            print(
                f"{label:<29} {r['median_ms']:>7} {r['min_ms']:>7} {r['max_ms']:>7}"
                f" {r['cpu_median_ms']:>7}"
            )
        verdict = f"over budget: {', '.join(over)}" if over else "ok"
        print(f"budgets {args.budget_ms:g} ms (exec {args.exec_budget_ms:g} ms): {verdict}")
        loads = " -> ".join(f"{a[0]:.1f}/{a[1]:.1f}/{a[2]:.1f}" for a in (load_before, load_after))
        print(f"machine: {os.cpu_count()} cores, load average (1/5/15 min) {loads}")
    return 1 if over else 0


def measure(
    commands: dict[str, list[str]], trees: dict[str, dict[str, str]], runs: int
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for label, cmd in commands.items():
        for env in trees.values():
            time_once(cmd, env)  # warm the page cache and the bytecode cache
        samples: dict[str, list[tuple[float, float]]] = {tree: [] for tree in trees}
        for _ in range(runs):
            for tree, env in trees.items():  # interleaved: both see the same load
                samples[tree].append(time_once(cmd, env))
        for tree, got in samples.items():
            walls = [wall for wall, _ in got]
            results[label + tree] = {
                "median_ms": round(statistics.median(walls), 1),
                "min_ms": round(min(walls), 1),
                "max_ms": round(max(walls), 1),
                "cpu_median_ms": round(statistics.median(cpu for _, cpu in got), 1),
            }
    return results


if __name__ == "__main__":
    sys.exit(main())
