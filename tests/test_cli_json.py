"""`--json`: one shape for every subcommand, errors included, validated against
orchestrator/schemas/cli.schema.json (real CLI processes, real sandbox)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from clitools import cvs_in_process
from suitetools import cluster_variant, cvs, write_suite

from orchestrator.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "orchestrator" / "schemas" / "cli.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def checked_lines(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every line valid; events first, exactly one result, last."""
    docs = [json.loads(line) for line in stdout.splitlines()]
    assert docs, "no JSON on stdout"
    for doc in docs:
        VALIDATOR.validate(doc)
    *events, result = docs
    assert all("event" in e for e in events) and "event" not in result
    return events, result


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cluster_variant(sandbox, tmp_path_factory.mktemp("json"), "cvs-t-json", "per_run")


@pytest.mark.parametrize(
    ("args", "command", "code"),
    [
        (["validate"], "validate", 0),
        (["exec", "--host-os", "--", "echo", "hi"], "exec", 0),
        (["exec", "--host-os", "--", "false"], "exec", 1),
        (["plan"], "plan", 0),
        (["status"], "status", 0),
        (["run", "--list"], "run", 0),
        (["run", "no-such-suite"], "run", 2),
        (["runs", "--dir", "no-runs-here"], "runs", 0),
        (["exec", "--no-such-flag"], "exec", 2),
    ],
)
def test_subcommand_json_output_follows_the_schema(
    cluster: Path, args: list[str], command: str, code: int
) -> None:
    proc = cvs(*args[:1], "-c", str(cluster), "--json", *args[1:], cwd=cluster.parent)
    assert proc.returncode == code, proc.stderr
    _, result = checked_lines(proc.stdout)
    assert result["command"] == command and result["exit_code"] == code
    assert (result["error"] is None) == (code == 0)


def test_cp_json_follows_the_schema(cluster: Path) -> None:
    dest = Path(f"/tmp/cvs-t-json-cp-{os.getpid()}.yaml")  # the hosts share this machine's /tmp
    try:
        proc = cvs(
            "cp", "-c", str(cluster), "--json", "--host-os", "--hosts", "node1",
            str(cluster), str(dest), cwd=cluster.parent,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        _, result = checked_lines(proc.stdout)
        assert result["command"] == "cp" and list(result["hosts"]) == ["node1"]
    finally:
        dest.unlink(missing_ok=True)


def test_a_missing_cluster_file_is_a_json_error_line(tmp_path: Path) -> None:
    proc = cvs_in_process("status", "-c", str(tmp_path / "absent.yaml"), "--json", cwd=tmp_path)
    assert proc.returncode == 2
    _, result = checked_lines(proc.stdout)
    assert result["ok"] is False and "absent.yaml" in result["error"]


def test_status_hosts_are_keyed_by_host_like_every_other_subcommand(cluster: Path) -> None:
    proc = cvs("status", "-c", str(cluster), "--json", cwd=cluster.parent)
    _, result = checked_lines(proc.stdout)
    assert list(result["hosts"]) == ["node1", "node2", "node3", "node4"]
    assert all(row["host"] == host for host, row in result["hosts"].items())


def test_up_exec_run_down_json_follow_the_schema(cluster: Path) -> None:
    write_suite(cluster.parent, "hello", [{"name": "hello", "run": "echo hello"}])
    try:
        up = cvs("up", "-c", str(cluster), "--json", cwd=cluster.parent, timeout=300)
        assert up.returncode == 0, up.stderr
        assert checked_lines(up.stdout)[1]["command"] == "up"
        ex = cvs("exec", "-c", str(cluster), "--json", "--", "echo", "in", cwd=cluster.parent)
        events, result = checked_lines(ex.stdout)
        assert {e["line"] for e in events if e["event"] == "OutputLine"} == {"in"}
        assert all(r["stdout"] == "in" for r in result["hosts"].values())
    finally:
        down = cvs("down", "-c", str(cluster), "--json", cwd=cluster.parent, timeout=300)
    assert down.returncode == 0, down.stderr
    assert checked_lines(down.stdout)[1]["command"] == "down"
    run = cvs(
        "run", "-c", str(cluster), str(cluster.parent / "hello.yaml"), "--json",
        "--run-dir", str(cluster.parent / "run"), cwd=cluster.parent, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    _, result = checked_lines(run.stdout)
    assert result["command"] == "run" and result["steps"][0]["status"] == "ok"
