"""Long lines cost what short ones do: 100 MB on one line against 100 MB with newlines.

    python bench/long_lines.py --mb 100 --rounds 3

One loopback SSH endpoint (bench/loopback.py); the remote command prints MB
megabytes of `x`, either as one line without a newline or folded into
100-character lines. Our transport runs it with the sink `cvs exec` uses when
piped (plain `host | line` text, here into /dev/null) and reports wall time
and the coordinator's CPU time for each. The target: one line within 1.5x the
time of the same bytes with newlines (a line is scanned once, never re-joined
per chunk; an endless line is delivered in 64 KiB pieces).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(cluster_file: Path, command: str) -> tuple[float, float, int]:
    """(wall seconds, coordinator CPU seconds, characters received) for one run."""
    import anyio
    import yaml

    from orchestrator.config import ClusterConfig
    from orchestrator.events import PlainSink
    from orchestrator.ssh.transport import SSHPool

    cfg = ClusterConfig.model_validate(yaml.safe_load(cluster_file.read_text()))
    host = cfg.hosts[0].name

    async def run() -> tuple[float, float, int]:
        with open(os.devnull, "w") as devnull:
            sink = PlainSink(devnull)
            async with SSHPool(cfg, sink) as pool:
                await pool.connect(host)
                wall, cpu = time.perf_counter(), time.process_time()
                r = await pool.run(host, command, timeout=600)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if not r.ok:
            raise SystemExit(f"{command!r}: {r.status}: {r.error}")
        return wall, cpu, len(r.stdout) + r.stdout_dropped

    return anyio.run(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from bench.loopback import loopback_farm

    size = args.mb * 1_000_000
    produce = f"head -c {size} /dev/zero | tr '\\0' x"
    commands = {"one line": produce, "100-char lines": f"{produce} | fold -w 100"}
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
    with loopback_farm(1) as farm:
        cluster_file = farm.cluster_yaml()
        for r in range(args.rounds):
            for label, command in commands.items() if r % 2 == 0 else reversed(commands.items()):
                wall, cpu, got = measure(cluster_file, command)
                rows[label].append((wall, cpu))
                print(f"round {r + 1}: {label}: {wall:.2f}s wall, {cpu:.2f}s CPU, {got} chars")
    one = [statistics.median(x) for x in zip(*rows["one line"], strict=True)]
    many = [statistics.median(x) for x in zip(*rows["100-char lines"], strict=True)]
    print(
        f"\n{args.mb} MB, median of {args.rounds}: "
        f"one line {one[0]:.2f}s wall / {one[1]:.2f}s CPU; "
        f"100-char lines {many[0]:.2f}s wall / {many[1]:.2f}s CPU; "
        f"one line / lines: wall {one[0] / many[0]:.2f}, CPU {one[1] / many[1]:.2f} (target <= 1.5)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
