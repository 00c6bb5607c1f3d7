"""CLI start-up benchmark: whole-process wall time of `cvs --help` and friends.

    python bench/cli_startup.py            # median of 10 runs each
    python bench/cli_startup.py --runs 20 --json

Each command runs as a fresh process (`python -m orchestrator ...`, what the
`cvs` entry point runs), next to `python -c pass`, the floor no CLI start can
go under. Prints the median, min and max per command in milliseconds, and
exits 1 when a median is over the budget (150 ms by default). On a shared
2-core machine timings are noisy: look at the medians.
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

ROOT = Path(__file__).resolve().parent.parent

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
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results: dict[str, dict[str, float]] = {}
    for label, cmd in COMMANDS.items():
        time_once(cmd, env)  # warm the page cache and the bytecode cache
        samples = [time_once(cmd, env) for _ in range(args.runs)]
        results[label] = {
            "median_ms": round(statistics.median(samples), 1),
            "min_ms": round(min(samples), 1),
            "max_ms": round(max(samples), 1),
        }
    over = [
        label
        for label, r in results.items()
        if label.startswith("cvs") and r["median_ms"] > args.budget_ms
    ]
    if args.json:
        doc = {"runs": args.runs, "budget_ms": args.budget_ms, "results": results, "over": over}
        print(json.dumps(doc))
    else:
        print(f"{'command':<16} {'median':>8} {'min':>8} {'max':>8}   ({args.runs} runs, ms)")
        for label, r in results.items():
            print(f"{label:<16} {r['median_ms']:>8} {r['min_ms']:>8} {r['max_ms']:>8}")
        verdict = f"over the {args.budget_ms:g} ms budget: {', '.join(over)}" if over else "ok"
        print(f"budget {args.budget_ms:g} ms: {verdict}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
