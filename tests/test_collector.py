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
