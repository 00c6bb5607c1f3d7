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
  `exec("hostname")`, median of RUNS: the least CVS's attach costs;
- `suite_attach_s` (with `--suite-attach`): what CVS's suites do before their
  first test, as its `orch` fixtures do: a new orchestrator,
  `setup_containers()`, `setup_sshd()` (six commands, its fixed 2 s sleep, a
  `pgrep` and a listener check), then `exec("hostname")`, median of RUNS.
  `setup_sshd()` copies `/host_ssh/*` (which CVS mounts when it starts the
  container itself: bench/step_cost.py mounts a directory there) and starts
  `sshd -p2224`, so cvs's own sshd is moved to another port for the bench.
  A second `sshd -p2224` in a running container fails (the port is taken),
  so before each run, untimed, CVS's sshd from the run before is stopped:
  each run starts it as a suite run on a fresh container does.
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
    suite_attach = "--suite-attach" in sys.argv[4:]
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
    suite: list[float] = []
    for _ in range(runs if suite_attach else 0):
        # Untimed: CVS's sshd of the run before (the bracket keeps pkill off its own shell).
        attached().exec("pkill -f '/usr/sbin/ssh[d] -p2224'; true", print_console=False)  # type: ignore[attr-defined]
        start = time.perf_counter()
        orch = attached()
        if not orch.setup_sshd():  # type: ignore[attr-defined]
            raise SystemExit("CVS: setup_sshd failed")
        out = orch.exec("hostname", print_console=False)  # type: ignore[attr-defined]
        suite.append(time.perf_counter() - start)
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
                **(
                    {
                        "suite_attach_s": round(statistics.median(suite), 3),
                        "suite_attach_s_min": round(min(suite), 3),
                    }
                    if suite
                    else {}
                ),
                "steps": steps,
                "runs": runs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
