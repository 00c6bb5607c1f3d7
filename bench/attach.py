"""Attach benchmark: SSH round trips per host of a persistent `up` with nothing to do.

    python bench/attach.py --cluster cluster.yaml       # an existing cluster
    python bench/attach.py --sandbox-hosts 3             # builds a throwaway sandbox (root)

Brings the persistent containers up first (cold start or attach, whatever the
hosts need), then runs a second `up` over fresh connections, as a new `cvs`
process would, and counts the SSH channels it opens per host. A channel
carries one remote command, so it is one round trip; the locked probe is one
(a held channel), and an attach with sshd already running and the container
provisioned needs nothing else. Prints per-host counts and the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.api import Cluster
from orchestrator.config import ClusterConfig, load_cluster


@contextmanager
def counting_channels(cluster: ClusterConfig) -> Iterator[Counter[str]]:
    """SSH channels opened per host while the block runs (run/exec/process all count)."""
    by_peer = {(h.address, h.port): h.name for h in cluster.hosts}
    by_address = {h.address: h.name for h in cluster.hosts}
    counts: Counter[str] = Counter()
    original = asyncssh.SSHClientConnection.create_session

    async def counting(self: asyncssh.SSHClientConnection, *args: Any, **kwargs: Any) -> Any:
        peer = self.get_extra_info("peername") or ("?", 0)
        host = by_peer.get((peer[0], peer[1])) or by_address.get(peer[0], "?")
        counts[host] += 1
        return await original(self, *args, **kwargs)

    asyncssh.SSHClientConnection.create_session = counting  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        asyncssh.SSHClientConnection.create_session = original  # type: ignore[method-assign]


def persistent(cluster: ClusterConfig) -> ClusterConfig:
    if cluster.container is None:
        raise SystemExit("the cluster file has no container block")
    container = cluster.container.model_copy(update={"lifetime": "persistent"})
    return cluster.model_copy(update={"container": container})


async def up_once(cluster: ClusterConfig) -> Any:
    async with Cluster.open(cluster) as c:
        return await c.up()


def measure(cluster: ClusterConfig) -> dict[str, Any]:
    warm = anyio.run(up_once, cluster)
    if not warm.ok:
        raise SystemExit(f"the first `up` failed: {warm.to_dict()}")
    with counting_channels(cluster) as counts:
        start = time.perf_counter()
        report = anyio.run(up_once, cluster)
        seconds = time.perf_counter() - start
    hosts = [h.name for h in cluster.hosts]
    return {
        "hosts": len(hosts),
        "round_trips": {h: counts.get(h, 0) for h in hosts},
        "actions": {h: o.action.kind for h, o in report.outcomes.items()},
        "seconds": round(seconds, 3),
        "ok": report.ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", type=Path, help="cluster file (its lifetime is forced)")
    where.add_argument("--sandbox-hosts", type=int, help="build a sandbox with N hosts")
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = parser.parse_args()

    if args.cluster is not None:
        result = measure(persistent(load_cluster(args.cluster)))
    else:
        from orchestrator.sandbox import sandbox_down, sandbox_up

        with tempfile.TemporaryDirectory(prefix="cvs-bench-attach-") as tmp:
            directory = Path(tmp) / "sb"
            try:
                box = sandbox_up(directory, args.sandbox_hosts)
                result = measure(persistent(load_cluster(box.cluster_file)))
            finally:
                sandbox_down(directory)

    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        trips = result["round_trips"]
        for host, n in trips.items():
            sys.stdout.write(f"{host}  {result['actions'].get(host, '?'):<8} {n} round trip(s)\n")
        values = list(trips.values())
        sys.stdout.write(
            f"attach up: {len(values)} hosts, round trips per host max {max(values)} "
            f"mean {sum(values) / len(values):.2f}, {result['seconds']:.2f} s\n"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
