"""The live view's summary at fleet size: what one redraw of 5000 hosts costs.

    python bench/live_view.py --hosts 5000 --rounds 20

The live thread redraws LIVE_HZ times a second, so `progress_lines` over the
whole fleet must stay a small part of a tenth of a second. The state is the
one tests/test_live_view.py draws (4000 ok, 600 unreachable with one error,
300 failed with 300 different errors, 100 running); this prints the median
and the worst of the rounds, in milliseconds, and the CPU time. The target:
well under 100 ms for 5000 hosts on one core (measured here, not asserted in
the fast tests: a shared 2-core machine's load decides wall time there).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def fleet(count: int) -> object:
    from rich.console import Console

    from orchestrator.events import CommandFinished, CommandStarted, ConnectFailed
    from orchestrator.render.live import RichSink
    from orchestrator.results import HostResult

    def terminal() -> Console:
        return Console(file=io.StringIO(), force_terminal=True, width=120)

    sink = RichSink(terminal(), err_console=terminal())
    hosts = [f"gpu{n:05d}" for n in range(1, count + 1)]
    ok, unreachable, failed = int(count * 0.8), int(count * 0.12), int(count * 0.06)
    for h in hosts:
        sink.emit(CommandStarted(host=h, command="true"))
    for h in hosts[:ok]:
        sink.emit(CommandFinished(host=h, result=HostResult(h, "ok")))
    for h in hosts[ok : ok + unreachable]:
        sink.emit(ConnectFailed(host=h, status="unreachable", error="connection refused"))
    for n, h in enumerate(hosts[ok + unreachable : ok + unreachable + failed]):
        sink.emit(
            CommandFinished(host=h, result=HostResult(h, "failed", exit_code=1, error=f"e{n}"))
        )
    return sink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from orchestrator.render.live import progress_lines

    sink = fleet(args.hosts)
    walls, cpus = [], []
    for _ in range(args.rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        progress_lines(sink.hosts, now=time.monotonic())  # type: ignore[attr-defined]
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    sink.close()  # type: ignore[attr-defined]
    print(
        f"{args.hosts} hosts: progress_lines median {statistics.median(walls) * 1000:.1f} ms, "
        f"worst {max(walls) * 1000:.1f} ms, CPU median {statistics.median(cpus) * 1000:.1f} ms "
        f"({args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()
