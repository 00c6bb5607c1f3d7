"""What the coordinator's own CPU pays per host: a handshake, a command on the
open connection, and keeping an idle connection alive (keepalives).

    python bench/coordinator_cost.py --hosts 1000 --idle 20

Serves N loopback endpoints (bench/loopback.py), then, in this one process
(the coordinator), measures its CPU time (`time.process_time`: user + system
of this process only, not the sshds'):

- connect: every host's handshake (key exchange, host key check, public-key
  login), through the pool's admission window;
- command: `true` on every host over the open connections (a channel, exec,
  exit status);
- waiting: `sleep IDLE` on every host, so that every connection has a
  command to wait for and sends keepalives (`ssh.keepalive`, default 5 s;
  idle connections send none): the cost of noticing a silent host, less the
  cost of one command measured above.

From the connect figure follows how many handshakes per second one
coordinator process (one core: asyncio runs on one thread) can serve when
the network and the sshds are not the limit. The load average is printed with
each figure: on a shared machine the wall times are noisy, the CPU times much
less so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(cluster_file: Path, idle: float, keepalive: float) -> dict[str, Any]:
    import anyio
    import yaml

    from orchestrator.config import ClusterConfig
    from orchestrator.ssh.fanout import fan_out, run_on_hosts
    from orchestrator.ssh.transport import SSHPool

    doc = yaml.safe_load(cluster_file.read_text())
    doc["ssh"]["keepalive"] = keepalive
    doc["concurrency"] = {**doc.get("concurrency", {}), "hosts": len(doc["hosts"])}
    cfg = ClusterConfig.model_validate(doc)
    hosts = [h.name for h in cfg.hosts]

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"hosts": len(hosts), "keepalive": keepalive}
        async with SSHPool(cfg) as pool:
            out["load_before"] = loadavg()
            t0, c0 = time.perf_counter(), time.process_time()
            failures = await fan_out(hosts, pool.connect)
            out["connect_wall"] = time.perf_counter() - t0
            out["connect_cpu"] = time.process_time() - c0
            out["connect_failed"] = sum(1 for f in failures.values() if f is not None)
            out["peak_in_flight"] = pool.admission.peak_in_flight
            out["window_decreases"] = pool.admission.window.decreases
            t0, c0 = time.perf_counter(), time.process_time()
            results = await run_on_hosts(pool, hosts, "true")
            out["command_wall"] = time.perf_counter() - t0
            out["command_cpu"] = time.process_time() - c0
            out["command_failed"] = sum(1 for r in results.values() if not r.ok)
            c0 = time.process_time()
            waited = await run_on_hosts(pool, hosts, f"sleep {idle:g}")
            out["idle_cpu"] = max(0.0, time.process_time() - c0 - out["command_cpu"])
            out["idle_seconds"] = idle
            out["idle_failed"] = sum(1 for r in waited.values() if not r.ok)
            out["load_after"] = loadavg()
        return out

    return anyio.run(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--keepalive", type=float, default=5.0)
    args = parser.parse_args()
    from bench.loopback import loopback_farm

    with loopback_farm(args.hosts) as farm:
        m = measure(farm.cluster_yaml(), args.idle, args.keepalive)
    n = m["hosts"]
    per_handshake = m["connect_cpu"] / n
    print(json.dumps(m))
    print(
        f"{n} hosts (load {m['load_before']:.1f} -> {m['load_after']:.1f}): "
        f"handshake {per_handshake * 1000:.2f} ms CPU/host "
        f"(-> {1 / per_handshake:.0f} handshakes/s per coordinator core), "
        f"{m['connect_wall']:.1f}s wall, {m['connect_failed']} failed, "
        f"window peak {m['peak_in_flight']}; "
        f"command {m['command_cpu'] / n * 1000:.2f} ms CPU/host; "
        f"waiting on a command with keepalive {m['keepalive']:g}s: "
        f"{m['idle_cpu'] / m['idle_seconds'] * 100:.1f}% of a core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
