"""Property tests' depth: full counts in CI, a fifth in the fast subset (tests/properties.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import properties
import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def restore_profile() -> Iterator[None]:
    before = settings.get_current_profile_name()
    yield
    settings.load_profile(before)


def test_ci_runs_the_suite_under_the_ci_profile() -> None:
    assert "HYPOTHESIS_PROFILE=ci python3 -m pytest" in (REPO / ".ci" / "test").read_text()


def test_the_ci_profile_keeps_each_tests_own_count_and_hypothesis_default(
    restore_profile: None,
) -> None:
    properties.load_profile(properties.CI)
    assert [properties.examples(n) for n in (60, 400)] == [60, 400]
    assert settings().max_examples == 100


def test_the_dev_profile_tries_a_fifth_and_at_least_ten(restore_profile: None) -> None:
    properties.load_profile(properties.DEV)
    assert [properties.examples(n) for n in (30, 60, 400)] == [10, 12, 80]
    assert settings().max_examples == 20
