"""What worker processes cost a small cluster: `Cluster.open` + `up` (attach)
and a step (`exec true` in the containers, through their sshd and through
`docker exec`), with `concurrency.workers` 1 (one process) against 2.

    python bench/worker_steps.py                 # a throwaway 2-host docker sandbox (root)
    python bench/worker_steps.py --rounds 5 --steps 100

Brings persistent containers up once, then per round, per workers setting,
per path: a fresh `Cluster.open`, `up` (an attach), `--steps` steps, close;
prints the attach's wall time, the mean step and the whole. On 2 cores
the default never starts workers (ssh/workers/parent.py); this shows what forcing
them costs where they cannot pay: the workers' start, and a frame each way
per command.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import yaml

from orchestrator.api import Cluster
from orchestrator.config import ClusterConfig
from orchestrator.sandbox import sandbox_down, sandbox_up


def _config(doc: dict[str, Any], workers: int) -> ClusterConfig:
    return ClusterConfig.model_validate({**doc, "concurrency": {"workers": workers}})


async def _one(doc: dict[str, Any], workers: int, user: str | None, steps: int) -> str:
    start = time.perf_counter()
    async with Cluster.open(_config(doc, workers)) as cluster:
        opened = time.perf_counter()
        await cluster.up()
        attached = time.perf_counter()
        for _ in range(steps):
            results = await cluster.exec("true", user=user)
            assert all(r.ok for r in results.values()), results
        stepped = time.perf_counter()
    whole = time.perf_counter() - start
    path = "sshd  " if user is None else "docker"
    return (
        f"workers {workers} {path}: attach {attached - opened:.2f} s, "
        f"step {(stepped - attached) / steps * 1000:.1f} ms, whole {whole:.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cvs-worker-steps-") as tmp:
        directory = Path(tmp)
        sb = sandbox_up(directory / "sb", hosts=2)
        try:
            doc = yaml.safe_load(sb.cluster_file.read_text())
            doc["container"] = {**doc["container"], "name": "cvs-worker-steps"}
            doc["container"]["lifetime"] = "persistent"
            doc["state_dir"] = str(directory / "state")

            async def run() -> None:
                async with Cluster.open(_config(doc, 1)) as cluster:
                    await cluster.up()
                for round_ in range(args.rounds):
                    for workers in (1, 2):
                        for user in (None, "nobody"):  # nobody: docker exec
                            line = await _one(doc, workers, user, args.steps)
                            print(f"round {round_}: {line}", flush=True)
                async with Cluster.open(_config(doc, 1)) as cluster:
                    await cluster.down(force=True)

            anyio.run(run)
        finally:
            sandbox_down(directory / "sb")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
