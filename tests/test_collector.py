"""The CLI tunes the garbage collector for its own process only."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.cli import collector


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


def test_a_caller_passing_argv_keeps_its_own_collector_settings(
    tunes: list[str], tmp_path: Path
) -> None:
    assert cli.main(["runs", "--dir", str(tmp_path)]) == 0

    assert tunes == []


def test_tune_freezes_the_heap_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        collector.tune()

        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
