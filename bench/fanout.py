"""Fan-out benchmark: ours against parallel-ssh's ParallelSSHClient, same run, same hosts.

    python bench/fanout.py --hosts 240 --rounds 3

Serves N loopback endpoints (127.0.1.x, 16 per sshd), then times `true` on
all of them: with fresh connections (connect + run) and on reused ones (run
again over the open connections). Prints both wall times and ours/theirs.
Timings on a shared 2-core machine are noisy: compare the ratios, which are
taken within one run, and use the median of several rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback import loopback_farm
from orchestrator.config import ClusterConfig
from orchestrator.fanout import run_on_hosts
from orchestrator.transport import SSHPool


def ours(cfg: ClusterConfig) -> tuple[float, float, int]:
    hosts = [h.name for h in cfg.hosts]

    async def main() -> tuple[float, float, int]:
        async with SSHPool(cfg) as pool:
            t0 = time.perf_counter()
            first = await run_on_hosts(pool, hosts, "true")
            t1 = time.perf_counter()
            again = await run_on_hosts(pool, hosts, "true")
            t2 = time.perf_counter()
            bad = [r for r in [*first.values(), *again.values()] if not r.ok]
            if bad:
                raise SystemExit(f"ours: {len(bad)} failures, e.g. {bad[0]}")
            return t1 - t0, t2 - t1, pool.connects

    return anyio.run(main)


def theirs(addresses: list[str], user: str, port: int, key: Path) -> tuple[float, float]:
    from pssh.clients import ParallelSSHClient

    t0 = time.perf_counter()
    client = ParallelSSHClient(
        addresses, user=user, port=port, pkey=str(key), pool_size=len(addresses), num_retries=3
    )
    output = client.run_command("true")
    client.join(output)
    t1 = time.perf_counter()
    output2 = client.run_command("true")
    client.join(output2)
    t2 = time.perf_counter()
    codes = [o.exit_code for o in [*output, *output2]]
    if any(c != 0 for c in codes):
        raise SystemExit(f"parallel-ssh: non-zero exit codes {codes[:10]}")
    return t1 - t0, t2 - t1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with loopback_farm(args.hosts) as farm:
        import yaml

        cfg = ClusterConfig.model_validate(yaml.safe_load(farm.cluster_yaml().read_text()))
        rows = []
        for r in range(args.rounds):
            o_fresh, o_reused, connects = ours(cfg)
            t_fresh, t_reused = theirs(farm.addresses, farm.user, farm.port, farm.key_file)
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
