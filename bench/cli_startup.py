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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
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


def time_once(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--budget-ms", type=float, default=150.0, help="fail above this median")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--exec", action="store_true", help="also `cvs exec` on one host (root)")
    parser.add_argument("--exec-budget-ms", type=float, default=350.0)
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = dict(COMMANDS)
    budgets = {label: args.budget_ms for label in commands}
    with contextlib.ExitStack() as stack:
        if args.exec:
            from bench.loopback import loopback_farm

            farm = stack.enter_context(loopback_farm(1))
            cluster = str(farm.cluster_yaml())
            label = "cvs exec, 1 host"
            commands[label] = ["-m", "orchestrator", "exec", "-c", cluster, "--host-os", "true"]
            budgets[label] = args.exec_budget_ms
        results = measure(commands, env, args.runs)
    over = [
        label
        for label, r in results.items()
        if label.startswith("cvs") and r["median_ms"] > budgets[label]
    ]
    if args.json:
        doc = {"runs": args.runs, "budgets_ms": budgets, "results": results, "over": over}
        print(json.dumps(doc))
    else:
        print(f"{'command':<18} {'median':>8} {'min':>8} {'max':>8}   ({args.runs} runs, ms)")
        for label, r in results.items():
            print(f"{label:<18} {r['median_ms']:>8} {r['min_ms']:>8} {r['max_ms']:>8}")
        verdict = f"over budget: {', '.join(over)}" if over else "ok"
        print(f"budgets {args.budget_ms:g} ms (exec {args.exec_budget_ms:g} ms): {verdict}")
        print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end")
    return 1 if over else 0


def measure(
    commands: dict[str, list[str]], env: dict[str, str], runs: int
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for label, cmd in commands.items():
        time_once(cmd, env)  # warm the page cache and the bytecode cache
        samples = [time_once(cmd, env) for _ in range(runs)]
        results[label] = {
            "median_ms": round(statistics.median(samples), 1),
            "min_ms": round(min(samples), 1),
            "max_ms": round(max(samples), 1),
        }
    return results


if __name__ == "__main__":
    sys.exit(main())
