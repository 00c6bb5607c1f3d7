"""CVS main's own `orch.exec` and attach, timed: run with the Python of a venv
that has the real CVS installed (/work/shared/peers, see its README), by
bench/step_cost.py's `--cvs-python`.

    VENV/bin/python bench/cvs_main_exec.py CLUSTER_JSON STEPS RUNS

CLUSTER_JSON is a CVS cluster file (`orchestrator: container`, lifetime
persistent) naming the container that runs on every host (cvs's, started by
the bench), so CVS attaches to it. Prints one JSON line:

- `exec_ms`: `orch.exec("true")` on every host, median of STEPS after 3
  unmeasured ones, on one orchestrator (its connections reused);
- `attach_s`: a new orchestrator (`OrchestratorFactory.create_orchestrator`),
  `setup_containers()` (persistent: CVS's probe, then attach) and
  `exec("hostname")`, median of RUNS.

Left out, because the sandbox cannot run it: CVS's fixture also calls
`setup_sshd()` before a suite, which copies the `~/.ssh` CVS mounts when *it*
starts the container (with GPU and InfiniBand devices and `memlock=-1`,
which a sandbox host refuses), and sleeps 2 s. So `attach_s` is the least
CVS's attach costs.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time

from cvs.core.orchestrators.factory import OrchestratorConfig, OrchestratorFactory


def main() -> int:
    cluster_json, steps, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    log = logging.getLogger("cvs-bench")
    logging.basicConfig(level=logging.ERROR)

    def attached() -> object:
        cfg = OrchestratorConfig.from_configs(cluster_json)
        orch = OrchestratorFactory.create_orchestrator(log, cfg)
        if not orch.setup_containers():  # type: ignore[attr-defined]
            raise SystemExit("CVS: setup_containers failed")
        return orch

    attach: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        out = attached().exec("hostname", print_console=False)  # type: ignore[attr-defined]
        attach.append(time.perf_counter() - start)
        if len(out) == 0:
            raise SystemExit("CVS: exec hostname gave nothing")
    orch = attached()
    for _ in range(3):
        orch.exec("true", print_console=False)  # type: ignore[attr-defined]
    walls: list[float] = []
    for _ in range(steps):
        start = time.perf_counter()
        orch.exec("true", print_console=False)  # type: ignore[attr-defined]
        walls.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "exec_ms": round(statistics.median(walls) * 1000, 2),
                "exec_ms_min": round(min(walls) * 1000, 2),
                "attach_s": round(statistics.median(attach), 3),
                "attach_s_min": round(min(attach), 3),
                "steps": steps,
                "runs": runs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
