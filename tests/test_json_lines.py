"""`--json` is JSON lines on stdout for every command and option, with exactly
one result line, and events name the programs cvs sends instead of carrying
their text (issue 42, item 10). The commands run for real on the sandbox."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from suitetools import cluster_variant, cvs

from orchestrator import remote
from orchestrator.containers.probe import probe_argv
from orchestrator.events import CommandFinished, JsonLinesSink, started
from orchestrator.results import HostResult
from orchestrator.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[1]


def json_lines(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every line of stdout is a JSON object; exactly one is a result, the last."""
    docs = [json.loads(line) for line in stdout.splitlines()]
    assert docs and all(isinstance(d, dict) for d in docs)
    results = [d for d in docs if "event" not in d]
    assert len(results) == 1 and "event" not in docs[-1], [sorted(r) for r in results]
    return docs[:-1], docs[-1]


# --- fast: the naming and the sink, no hosts ------------------------------------


def test_a_sent_program_is_named_by_name_and_sha256_not_copied() -> None:
    argv = probe_argv(None, "ctr", sshd_port=2224, marker_path="/var/lib/cvs/p")
    event = started("node1", shlex.join(argv), "probe")
    sha = {n: hashlib.sha256(remote.program(n).encode()).hexdigest() for n in ("probe", "check")}
    assert [(p.name, p.sha256) for p in event.programs] == [
        ("probe", sha["probe"]),
        ("check", sha["check"]),
    ]
    assert "\n" not in event.command and len(event.command) < 400
    assert event.command.startswith(f"sh -c <program probe sha256:{sha['probe'][:12]}> cvs-probe")


def test_a_short_command_is_shown_as_it_is() -> None:
    event = started("node1", "docker rm -f ctr", "remove")
    assert (event.command, event.programs) == ("docker rm -f ctr", ())


def test_without_output_a_finished_command_carries_no_stdout() -> None:
    out = io.StringIO()
    sink = JsonLinesSink(out, output=False)
    sink.emit(CommandFinished(host="node1", result=HostResult("node1", "ok", 0, "x" * 5000)))
    doc = json.loads(out.getvalue())
    assert doc["result"]["stdout"] == "" and doc["stdout_left_out"] == 5000


def test_json_status_bytes_grow_linearly_and_small_with_hosts() -> None:
    spec = importlib.util.spec_from_file_location("json_size", REPO / "bench" / "json_size.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        small, large = (bench.measure(n, Path(tmp)) for n in (3, 60))
    assert small["exit_code"] == large["exit_code"] == 0
    # Per host, not per fleet: 60 hosts cost 20 times 3 hosts, give or take.
    assert large["bytes_per_host"] < 2 * small["bytes_per_host"]
    assert large["bytes_per_host"] < 3000, large


# --- the sandbox: every command, every -o -----------------------------------------


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A per_run variant with its containers up for the module (status then
    probes running containers, whose inspect output is the longest)."""
    path = cluster_variant(sandbox, tmp_path_factory.mktemp("jsonl"), "cvs-t-jsonl", "per_run")
    up = cvs("up", "-c", str(path), cwd=path.parent, timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        yield path
    finally:
        down = cvs("down", "-c", str(path), cwd=path.parent, timeout=300)
        assert down.returncode == 0, down.stderr


COMMANDS: list[tuple[list[str], str, int]] = [
    (["validate"], "validate", 0),
    (["plan"], "plan", 0),
    (["status"], "status", 0),
    (["status", "-o", "table"], "status", 0),
    (["status", "-o", "wide"], "status", 0),
    (["status", "-o", "json"], "status", 0),
    (["status", "-o", "yaml"], "status", 0),
    (["exec", "--", "echo", "hi"], "exec", 0),
    (["exec", "--group", "--", "echo", "hi"], "exec", 0),
    (["exec", "--host-os", "--", "false"], "exec", 1),
    (["run", "--list"], "run", 0),
    (["runs"], "runs", 0),
    (["runs", "show", "latest"], "runs", 2),
    (["completion", "bash"], "completion", 0),
    (["shell", "node1"], "shell", 2),
    (["status", "--no-such-flag"], "status", 2),
]


@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("args", "command", "code"), COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS]
)
def test_every_command_and_option_prints_json_lines_and_one_result(
    cluster: Path, args: list[str], command: str, code: int
) -> None:
    proc = cvs("-c", str(cluster), "--json", *args, cwd=cluster.parent)
    assert proc.returncode == code, proc.stderr
    _, result = json_lines(proc.stdout)
    assert (result["command"], result["exit_code"]) == (command, code)


@pytest.mark.sandbox
def test_json_cp_prints_json_lines_and_one_result(cluster: Path) -> None:
    dest = "/tmp/cvs-t-jsonl-cp.yaml"
    proc = cvs("-c", str(cluster), "--json", "cp", str(cluster), dest, cwd=cluster.parent)
    assert proc.returncode == 0, proc.stderr
    _, result = json_lines(proc.stdout)
    assert result["command"] == "cp" and all(h["ok"] for h in result["hosts"].values())


@pytest.mark.sandbox
def test_json_status_on_three_hosts_is_at_most_8_kb(cluster: Path) -> None:
    proc = cvs("-c", str(cluster), "--json", "status", "--hosts", "node[1-3]", cwd=cluster.parent)
    assert proc.returncode == 0, proc.stderr
    events, result = json_lines(proc.stdout)
    assert sorted(result["hosts"]) == ["node1", "node2", "node3"]
    assert {h["state"] for h in result["hosts"].values()} == {"running"}
    assert len(proc.stdout.encode()) <= 8 * 1024, len(proc.stdout.encode())
    print(f"cvs --json status, 3 hosts: {len(proc.stdout.encode())} bytes")
    # Per host, outside a job: the probe, and the look for containers of
    # ended jobs (Slurm, issue 42 item 1); each names its program.
    starts = [e for e in events if e["event"] == "CommandStarted"]
    for name in ("probe", "job_containers"):
        sha = hashlib.sha256(remote.program(name).encode()).hexdigest()
        named = [e for e in starts if {"name": name, "sha256": sha} in e["programs"]]
        assert sorted(e["host"] for e in named) == ["node1", "node2", "node3"], name
    assert len(starts) == 6, [e["label"] for e in starts]
