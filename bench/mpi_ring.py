"""Open MPI ring between two sandbox hosts: through cvs's containers vs bare namespaces.

    python bench/mpi_ring.py                    # docker hosts (root)
    python bench/mpi_ring.py --runtime podman   # rootful podman hosts
    python bench/mpi_ring.py --json

A throwaway 2-host `--mpi` sandbox. The same job, `python3 -m mpi4py.bench
ringtest` with one rank per host, runs two ways:

- containers: `mpirun` in the head's container (started by `cvs exec`), the
  peer's orted launched over the in-container sshd with the hostfile, ssh
  config and Open MPI settings cvs wrote (no extra option);
- namespaces: `mpirun` on this machine inside node1's network namespace, the
  peer's orted started in node2's namespace by bench/mpi_netns_agent.sh as
  Open MPI's launcher agent (no ssh, no container), with the same
  `btl_tcp_if_include` / `oob_tcp_if_include` (eth0, each namespace's link
  to the sandbox bridge). Needs openmpi-bin and python3-mpi4py on this
  machine (.ci/bootstrap installs them).

Both go over the same veth pair and bridge: the figures show what the
container set-up adds to the data path (the containers share the hosts'
network: `network: host`). Per size, the median of `--repeat` runs
(the two ways take turns) of a fixed number of loops after 5 warm-up
loops; a loop is one message per rank around
the ring, so one hop takes time / (loops * 2). Latency: 1-byte messages,
the time of one hop. Bandwidth: bytes / time of one hop.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.sandbox import Sandbox, sandbox_down, sandbox_up

HERE = Path(__file__).resolve().parent
AGENT = HERE / "mpi_netns_agent.sh"
CVS = [sys.executable, "-m", "orchestrator"]
HOST_PYTHON = "/usr/bin/python3"  # Debian's, where python3-mpi4py is
# (label, message bytes, loops): latency with 1 byte, bandwidth with 1 and 16 MiB.
SIZES = [("latency", 1, 500), ("bandwidth", 1 << 20, 50), ("bandwidth", 16 << 20, 10)]
_TIME_RE = re.compile(r"time for (\d+) loops = (\S+) seconds \((\d+) processes, (\d+) bytes\)")


def ringtest_args(size: int, loops: int) -> list[str]:
    return ["-m", "mpi4py.bench", "ringtest", "-n", str(size), "-l", str(loops), "-s", "5"]


def parse_time(output: str) -> float:
    m = _TIME_RE.search(output)
    if m is None:
        raise RuntimeError(f"no ringtest timing in the output:\n{output[-2000:]}")
    return float(m.group(2))


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:6]}… exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def in_containers(cluster: Path) -> Callable[[int, int], float]:
    def one(size: int, loops: int) -> float:
        job = ["mpirun", "-np", "2", "--hostfile", "/etc/cvs/hostfile", "python3"]
        command = " ".join([*job, *ringtest_args(size, loops)])
        out = run([*CVS, "exec", "-c", str(cluster), "--hosts", "node1", "--", command])
        return parse_time(out)

    return one


def in_namespaces(sb: Sandbox, directory: Path) -> Callable[[int, int], float]:
    first, second = sb.nodes[0], sb.nodes[1]
    hostfile = directory / "hostfile"
    hostfile.write_text(f"{first.address} slots=1\n{second.address} slots=1\n")
    pairs = " ".join(f"{h.address}={h.netns}" for h in (first, second))
    env = {**os.environ, "CVS_BENCH_NETNS": pairs}

    def one(size: int, loops: int) -> float:
        argv = [
            "nsenter", f"--net=/var/run/netns/{first.netns}",
            "mpirun", "--allow-run-as-root", "-np", "2", "--hostfile", str(hostfile),
            "--mca", "plm_rsh_agent", str(AGENT),
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            HOST_PYTHON, *ringtest_args(size, loops),
        ]  # fmt: skip
        return parse_time(run(argv, env=env))

    return one


def measure(
    jobs: dict[str, Callable[[int, int], float]], repeat: int
) -> dict[str, list[dict[str, Any]]]:
    """Per size, the ways take turns (one run of each, `repeat` times): a
    busy machine slows both alike instead of whichever ran while it was."""
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in jobs}
    for label, size, loops in SIZES:
        times: dict[str, list[float]] = {way: [] for way in jobs}
        for _ in range(repeat):
            for way, job in jobs.items():
                times[way].append(job(size, loops))
        for way, runs in times.items():
            hop = statistics.median(runs) / (loops * 2)
            rows[way].append(
                {
                    "what": label,
                    "bytes": size,
                    "loops": loops,
                    "hop_us": round(hop * 1e6, 1),
                    "mb_per_s": round(size / hop / 1e6, 1),
                    "runs_s": [round(t, 4) for t in runs],
                }
            )
    return rows


def persistent_cluster(sb: Sandbox) -> Path:
    doc = yaml.safe_load(sb.cluster_file.read_text())
    doc["container"].update({"name": "cvs-bench-mpi", "lifetime": "persistent"})
    path = sb.directory / "bench-mpi.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=["docker", "podman"], default="docker")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("mpi_ring: needs root (a sandbox)")
    if shutil.which("mpirun") is None or not Path(HOST_PYTHON).exists():
        sys.exit("mpi_ring: needs openmpi-bin and python3-mpi4py on this machine (.ci/bootstrap)")
    directory = Path(tempfile.mkdtemp(prefix="cvs-bench-mpi-"))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sb = sandbox_up(directory / "sb", 2, runtime=args.runtime, mpi=True)
    cluster = persistent_cluster(sb)
    try:
        run([*CVS, "up", "-c", str(cluster)])
        load_before = os.getloadavg()
        jobs = {"containers": in_containers(cluster), "namespaces": in_namespaces(sb, directory)}
        rows = measure(jobs, args.repeat)
        report = {
            "started": started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs",
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "runtime": args.runtime,
            **rows,
        }
    finally:
        subprocess.run([*CVS, "down", "-c", str(cluster), "--force"], capture_output=True)
        sandbox_down(sb.directory)
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['machine']}; {args.runtime} hosts; {started} .. {report['finished']}; "
        f"load {report['load_before']} .. {report['load_after']}"
    )
    print(f"{'':12} {'size':>9} {'containers':>22} {'namespaces':>22}")
    for c, n in zip(report["containers"], report["namespaces"], strict=True):
        size = f"{c['bytes']}B"
        if c["what"] == "latency":
            cells = [f"{c['hop_us']} µs/hop", f"{n['hop_us']} µs/hop"]
        else:
            cells = [f"{c['mb_per_s']} MB/s", f"{n['mb_per_s']} MB/s"]
        print(f"{c['what']:12} {size:>9} {cells[0]:>22} {cells[1]:>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
