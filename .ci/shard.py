"""Split the sandbox half of the suite into shards that run side by side.

    python3 .ci/shard.py SHARDS DIR        DIR/1 .. DIR/SHARDS: one test file per line
    python3 .ci/shard.py --times JUNIT...  seconds per test file (sandbox-seconds.tsv)

Most of the sandbox half's wall time is waiting (real daemons coming up,
Slurm's one-minute limit, bounds waited out), not CPU, so two shards on this
2-core machine take little more than half the time of one. Each shard is a
whole pytest run over whole files (a module's sandbox is built once, in one
shard). Files are dealt out longest first to the shard with the least time so
far (the times: .ci/sandbox-seconds.tsv, measured; a file not in it counts as
its number of sandbox tests times the median seconds per test there).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TIMES = Path(__file__).with_name("sandbox-seconds.tsv")
# Files that share a session fixture whose state ages run in one shard, one
# after the other: the time-limited Slurm jobs (tests/conftest.py) end while
# the first module runs, and the second reads their end from `scontrol`,
# which forgets a job MinJobAge (300 s) after it ended.
TOGETHER = [("tests/test_slurm_jobs_sandbox.py", "tests/test_slurm_sandbox.py")]


def sandbox_files() -> Counter[str]:
    """Test file -> its number of sandbox tests, as pytest collects them."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "sandbox",
         "-p", "no:cacheprovider"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode not in (0, 5):
        sys.exit(f"shard: pytest could not collect the suite:\n{out.stdout}{out.stderr}")
    return Counter(line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line)


def known_times() -> dict[str, tuple[float, int]]:
    """File -> (seconds, tests) as last measured."""
    times: dict[str, tuple[float, int]] = {}
    if TIMES.is_file():
        for line in TIMES.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and not line.startswith("#"):
                times[parts[0]] = (float(parts[1]), int(parts[2]))
    return times


def deal(counts: Counter[str], times: dict[str, tuple[float, int]], shards: int) -> list[list[str]]:
    per_test = [s / n for s, n in times.values() if n] or [5.0]
    median = statistics.median(per_test)
    cost = {f: times[f][0] if f in times else n * median for f, n in counts.items()}
    # A unit: one file, or files that must run together, in their order.
    units = [tuple(f for f in group if f in cost) for group in TOGETHER]
    units = [u for u in units if u]
    grouped = {f for u in units for f in u}
    units += [(f,) for f in cost if f not in grouped]
    loads = [0.0] * shards
    dealt: list[list[str]] = [[] for _ in range(shards)]
    for unit in sorted(units, key=lambda u: (-sum(cost[f] for f in u), u)):
        least = loads.index(min(loads))
        dealt[least].extend(unit)
        loads[least] += sum(cost[f] for f in unit)
    return dealt


def junit_times(paths: list[str]) -> None:
    seconds: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            # classname: tests.test_foo, or tests.test_foo.TestClass
            name = "/".join(case.get("classname", "").split(".")[:2]) + ".py"
            seconds[name] += float(case.get("time", "0"))
            tests[name] += 1
    print("# test file, seconds (setup, call and teardown), sandbox tests: .ci/shard.py --times")
    for name in sorted(seconds, key=lambda f: -seconds[f]):
        print(f"{name} {seconds[name]:.0f} {tests[name]}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--times":
        junit_times(sys.argv[2:])
        return
    shards, directory = int(sys.argv[1]), Path(sys.argv[2])
    for index, files in enumerate(deal(sandbox_files(), known_times(), shards), start=1):
        (directory / str(index)).write_text("".join(f"{f}\n" for f in files))


if __name__ == "__main__":
    main()
