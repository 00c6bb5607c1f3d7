"""`cvs --json status`: how many bytes its JSON lines take, per fleet size.

    python bench/json_size.py --hosts 3,100,1000

Runs the real command (`orchestrator.cli.main`, the `status` handler, the
JSON sink, the result line) on scripted hosts (orchestrator/testing.py)
instead of SSH: each host answers the real probe program with what
remote/probe.sh prints for a host whose image is there and container absent
(tests/scripted.py), and the runner emits the events `SSHPool.run` emits
around each command (Connecting, Connected, CommandStarted, CommandFinished); outside a job
each host also answers status's look for containers of Slurm jobs (none).
What is measured is what cvs writes, which does not depend on the network.
Prints one line per size: total bytes, bytes of events and of the result
line, and bytes per host. The sandbox figure (3 real hosts) is
tests/test_json_lines.py's bound.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def _runner_class() -> Any:
    from orchestrator.events import CommandFinished, Connected, Connecting, EventSink, started
    from orchestrator.results import HostResult
    from orchestrator.testing import ScriptedHosts

    class EventedHosts(ScriptedHosts):
        """Scripted hosts that announce each command as SSHPool.run does."""

        sink: EventSink

        async def run(self, host: str, command: Any, **kw: Any) -> HostResult:
            import shlex

            text = command if isinstance(command, str) else shlex.join(command)
            self.sink.emit(Connecting(host=host, address=f"{host}:22"))
            self.sink.emit(Connected(host=host, seconds=0.05))
            self.sink.emit(started(host, text, kw.get("label")))
            result = await super().run(host, command, **kw)
            self.sink.emit(CommandFinished(host=host, result=result, label=kw.get("label")))
            return result

    return EventedHosts


def measure(count: int, workdir: Path) -> dict[str, Any]:
    import yaml
    from scripted import probe_output

    import orchestrator.api as api
    from orchestrator.cli import main

    names = [f"node{n:04d}" for n in range(1, count + 1)]
    cluster = workdir / f"cluster-{count}.yaml"
    doc = {
        "name": "jsonsize",
        "hosts": names,
        "ssh": {"user": "root", "host_key_policy": "off"},
        "container": {"image": "img:1", "name": "ctr", "lifetime": "per_run"},
        "state_dir": str(workdir / "state"),
    }
    cluster.write_text(yaml.safe_dump(doc))
    hosts = _runner_class()({h: probe_output() for h in names})
    hosts.answer("probe", lambda host, text: (0, probe_output(), ""))
    # Outside a job, status also lists each host's containers of Slurm jobs
    # (containers/jobleft.py): none here.
    hosts.answer("job containers", lambda host, text: (0, "", ""))

    @contextlib.asynccontextmanager
    async def scripted(config: Any, sink: Any) -> AsyncIterator[Any]:
        hosts.sink = sink
        yield hosts

    out = io.StringIO()
    saved_runner, saved_out, saved_err = api._runner, sys.stdout, sys.stderr
    api._runner = scripted  # type: ignore[assignment]
    sys.stdout, sys.stderr = out, io.StringIO()
    try:
        code = main(["-c", str(cluster), "--json", "status"])
    finally:
        api._runner = saved_runner  # type: ignore[assignment]
        sys.stdout, sys.stderr = saved_out, saved_err
    lines = out.getvalue().splitlines(keepends=True)
    docs = [json.loads(line) for line in lines]
    results = [d for d in docs if "event" not in d]
    assert len(results) == 1 and "event" not in docs[-1], "one result line, the last"
    total = sum(len(line.encode()) for line in lines)
    result_bytes = len(lines[-1].encode())
    return {
        "hosts": count,
        "exit_code": code,
        "bytes": total,
        "event_bytes": total - result_bytes,
        "result_bytes": result_bytes,
        "bytes_per_host": round(total / count),
        "events": len(docs) - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="3,100,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--json", action="store_true", help="one JSON object per size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cvs-json-size-") as tmp:
        for count in (int(n) for n in args.hosts.split(",")):
            row = measure(count, Path(tmp))
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{row['hosts']:>5} hosts: {row['bytes']:>9} bytes "
                    f"(events {row['event_bytes']}, result {row['result_bytes']}), "
                    f"{row['bytes_per_host']} per host, exit {row['exit_code']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
