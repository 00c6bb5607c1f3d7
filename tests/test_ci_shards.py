"""How .ci/shard.py deals the sandbox test files out to the shards that run side
by side in CI: every file exactly once, whole, balanced by measured time."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

SHARD_PY = Path(__file__).resolve().parent.parent / ".ci" / "shard.py"


def shard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_shard", SHARD_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_goes_to_exactly_one_shard() -> None:
    counts = Counter({f"tests/test_{i}.py": i + 1 for i in range(9)})
    dealt = shard_module().deal(counts, {}, 2)

    assert sorted(f for shard in dealt for f in shard) == sorted(counts)


def test_a_long_file_gets_a_shard_to_itself_against_many_short_ones() -> None:
    counts = Counter({"tests/test_long.py": 1, **{f"tests/test_s{i}.py": 1 for i in range(4)}})
    times = {
        "tests/test_long.py": (400.0, 1),
        **{f"tests/test_s{i}.py": (100.0, 1) for i in range(4)},
    }
    dealt = shard_module().deal(counts, times, 2)

    assert ["tests/test_long.py"] in dealt


def test_a_file_never_measured_counts_as_its_tests_times_the_median_per_test() -> None:
    counts = Counter({"tests/test_new.py": 10, "tests/test_a.py": 1, "tests/test_b.py": 1})
    # 5 s per test measured; the new file's ten tests: 50 s, more than the two others.
    times = {"tests/test_a.py": (5.0, 1), "tests/test_b.py": (5.0, 1)}
    dealt = shard_module().deal(counts, times, 2)

    assert ["tests/test_new.py"] in dealt


def test_junit_times_sum_setup_call_and_teardown_per_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = tmp_path / "1.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="2.5"/>'
        '<testcase classname="tests.test_a.TestThing" name="t2" time="1.5"/>'
        '<testcase classname="tests.test_b" name="t3" time="7"/>'
        "</testsuite></testsuites>"
    )
    shard_module().junit_times([str(xml)])
    out = capsys.readouterr().out.splitlines()

    assert out[1:] == ["tests/test_b.py 7 1", "tests/test_a.py 4 2"]


def test_the_slurm_modules_sharing_the_time_limited_jobs_run_in_one_shard_one_after_the_other() -> (
    None
):
    jobs, slurm = "tests/test_slurm_jobs_sandbox.py", "tests/test_slurm_sandbox.py"
    counts = Counter({jobs: 13, slurm: 21, **{f"tests/test_{i}.py": 10 for i in range(6)}})
    times = {jobs: (276.0, 13), slurm: (250.0, 21)} | {
        f"tests/test_{i}.py": (300.0 - i, 10) for i in range(6)
    }
    dealt = shard_module().deal(counts, times, 2)

    [shard] = [s for s in dealt if jobs in s]
    assert shard.index(slurm) == shard.index(jobs) + 1
