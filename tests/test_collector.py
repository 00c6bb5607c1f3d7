"""The CLI tunes the garbage collector for its own process only."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.cli import collector

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tunes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(collector, "tune", lambda: calls.append("tune"))
    return calls


def test_the_cvs_entry_point_tunes_the_collector_of_its_process(
    tunes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["cvs", "runs", "--dir", str(tmp_path)])

    assert cli.main() == 0

    assert tunes == ["tune"]


def test_the_entry_point_collects_nothing_before_tune_and_leaves_the_collector_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enabled_at_tune: list[bool] = []
    monkeypatch.setattr(collector, "tune", lambda: enabled_at_tune.append(gc.isenabled()))
    monkeypatch.setattr(sys, "argv", ["cvs", "runs", "--dir", str(tmp_path)])

    assert cli.main() == 0

    assert enabled_at_tune == [False]  # start-up ran without the collector
    assert gc.isenabled()  # and main turned it back on, tune or not


def test_a_caller_passing_argv_keeps_its_own_collector_settings(
    tunes: list[str], tmp_path: Path
) -> None:
    assert cli.main(["runs", "--dir", str(tmp_path)]) == 0

    assert tunes == []


def test_tune_freezes_the_heap_raises_the_young_threshold_and_turns_the_collector_on() -> None:
    before = gc.get_threshold()
    try:
        collector.start()
        assert not gc.isenabled()
        collector.tune()

        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_import_for_imports_what_a_handler_names_and_nothing_for_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cvs_named_by_a_handler.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cvs_named_by_a_handler", raising=False)

    @collector.imports_first("cvs_named_by_a_handler")
    def handler() -> int:
        return 0

    collector.import_for(lambda: 0)  # names nothing: imports nothing, no error
    assert "cvs_named_by_a_handler" not in sys.modules
    collector.import_for(handler)
    assert "cvs_named_by_a_handler" in sys.modules
    assert handler() == 0  # the mark changes nothing else


# `cvs exec` in a fresh interpreter (the test process has imported everything
# already): what was imported when the entry point tuned the collector.
AT_TUNE = """
import json, sys
from orchestrator.cli import collector, main
seen = []
real = collector.tune
def tune():
    seen.append(sorted(m for m in ("asyncssh", "orchestrator.api") if m in sys.modules))
    real()
collector.tune = tune
sys.argv = ["cvs", "exec", "-c", sys.argv[1], "--host-os", "true"]
code = main()
print(json.dumps({"code": code, "seen": seen}))
"""


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cvs_exec_imports_asyncssh_and_the_api_before_the_collector_is_tuned(
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: the host refuses, no sshd needed
    cluster = tmp_path / "refused.yaml"
    cluster.write_text(
        "name: refused\nhosts:\n- name: n1\n  address: 127.0.0.1\n"
        f"ssh:\n  port: {port}\n  use_ssh_config: false\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", AT_TUNE, str(cluster)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    doc = json.loads(proc.stdout.strip().splitlines()[-1])

    assert doc["code"] == 3, proc.stderr[-2000:]  # unreachable: the whole path ran
    assert doc["seen"] == [["asyncssh", "orchestrator.api"]]
