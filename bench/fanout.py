"""Fan-out benchmark: ours against parallel-ssh's ParallelSSHClient, same run, same hosts.

    python bench/fanout.py --hosts 240 --rounds 3

Serves N loopback endpoints (127.0.1.x, 16 per sshd), then times `true` on
all of them: with fresh connections (connect + run), and on the reused ones
(the median of several more runs over the open connections). Prints both
wall times and ours/theirs.
Timings on a shared 2-core machine are noisy: compare the ratios, which are
taken within one run, and use the median of several rounds.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import loopback_farm
from orchestrator.config import ClusterConfig
from orchestrator.ssh.fanout import run_on_hosts
from orchestrator.ssh.transport import SSHPool


def ours(cfg: ClusterConfig, reuse_rounds: int) -> tuple[float, float, int]:
    """(fresh: connect + run, reused: median of `reuse_rounds` runs, handshakes)."""
    hosts = [h.name for h in cfg.hosts]

    async def run() -> tuple[float, float, int]:
        async with SSHPool(cfg) as pool:
            t0 = time.perf_counter()
            results = list((await run_on_hosts(pool, hosts, "true")).values())
            fresh = time.perf_counter() - t0
            reused = []
            for _ in range(reuse_rounds):
                t1 = time.perf_counter()
                again = await run_on_hosts(pool, hosts, "true")
                reused.append(time.perf_counter() - t1)
                results += again.values()
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"ours: {len(bad)} failures, e.g. {bad[0]}")
            return fresh, statistics.median(reused), pool.connects

    return anyio.run(run)


def theirs(
    addresses: list[str], user: str, port: int, key: Path, reuse_rounds: int
) -> tuple[float, float]:
    """The same with parallel-ssh's ParallelSSHClient (ssh2-python, gevent)."""
    from pssh.clients import ParallelSSHClient

    t0 = time.perf_counter()
    client = ParallelSSHClient(
        addresses, user=user, port=port, pkey=str(key), pool_size=len(addresses), num_retries=3
    )
    output = client.run_command("true")
    client.join(output)
    fresh = time.perf_counter() - t0
    codes = [o.exit_code for o in output]
    reused = []
    for _ in range(reuse_rounds):
        t1 = time.perf_counter()
        again = client.run_command("true")
        client.join(again)
        reused.append(time.perf_counter() - t1)
        codes += [o.exit_code for o in again]
    if any(c != 0 for c in codes):
        raise SystemExit(f"parallel-ssh: non-zero exit codes {codes[:10]}")
    # ParallelSSHClient has no close(): its sessions end when it is collected.
    # Without this, its 240 idle connections would weigh on the next round.
    del client, output, again
    gc.collect()
    return fresh, statistics.median(reused)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reuse-rounds", type=int, default=5, help="runs on the open connections per round"
    )
    args = parser.parse_args()
    with loopback_farm(args.hosts) as farm:
        import yaml

        cfg = ClusterConfig.model_validate(yaml.safe_load(farm.cluster_yaml().read_text()))
        rows = []
        for r in range(args.rounds):
            # Alternate who goes first: the machine's state drifts during a run.
            if r % 2 == 0:
                o_fresh, o_reused, connects = ours(cfg, args.reuse_rounds)
            t_fresh, t_reused = theirs(
                farm.addresses, farm.user, farm.port, farm.key_file, args.reuse_rounds
            )
            if r % 2 == 1:
                o_fresh, o_reused, connects = ours(cfg, args.reuse_rounds)
            rows.append((o_fresh, t_fresh, o_reused, t_reused))
            print(
                f"round {r + 1}: fresh ours {o_fresh:.2f}s theirs {t_fresh:.2f}s "
                f"ratio {o_fresh / t_fresh:.2f} | reused ours {o_reused:.3f}s "
                f"theirs {t_reused:.3f}s ratio {o_reused / t_reused:.2f} "
                f"| handshakes {connects} for {args.hosts} hosts",
                flush=True,
            )
        med = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(
            f"median over {args.rounds} rounds, {args.hosts} hosts: "
            f"fresh ours {med[0]:.2f}s theirs {med[1]:.2f}s ratio {med[0] / med[1]:.2f}; "
            f"reused ours {med[2]:.3f}s theirs {med[3]:.3f}s ratio {med[2] / med[3]:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
