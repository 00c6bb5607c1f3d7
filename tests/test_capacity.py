"""Capacity up front: requests beyond a host's RAM are refused, cpus clamped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import remote
from orchestrator.containers.probe import _capacity_facts
from orchestrator.limits.capacity import fit_to_host
from orchestrator.limits.resources import EffectiveResources
from orchestrator.remote.frames import parse_sections

GI = 1024**3


@pytest.mark.parametrize(
    ("eff", "cpus", "memory", "want_cpus", "warns", "refuses"),
    [
        (EffectiveResources(cpus=4, memory_bytes=8 * GI), 8, 16 * GI, 4, False, False),
        (EffectiveResources(cpus=16), 8, 16 * GI, 8, True, False),
        (EffectiveResources(memory_bytes=32 * GI), 8, 16 * GI, None, False, True),
        (EffectiveResources(cpus=16, memory_bytes=32 * GI), 8, 16 * GI, 8, True, True),
        (EffectiveResources(cpus=16, memory_bytes=32 * GI), None, None, 16, False, False),
        (EffectiveResources(), 8, 16 * GI, None, False, False),
    ],
)
def test_fit_to_host(
    eff: EffectiveResources,
    cpus: int | None,
    memory: int | None,
    want_cpus: float | None,
    warns: bool,
    refuses: bool,
) -> None:
    fit = fit_to_host("gpu7", eff, cpus, memory)
    assert fit.resources.cpus == want_cpus
    assert (fit.warning is not None) == warns
    assert (fit.refusal is not None) == refuses
    for text in (fit.warning, fit.refusal):
        assert text is None or text.startswith("gpu7: ")


@given(st.floats(min_value=0.01, max_value=4096), st.integers(min_value=1, max_value=1024))
def test_clamped_cpus_never_exceed_the_host(request: float, count: int) -> None:
    fit = fit_to_host("h", EffectiveResources(cpus=request), count, None)
    assert fit.resources.cpus == min(request, count)
    assert (fit.warning is not None) == (request > count)


def test_probe_capacity_frame_parses() -> None:
    sections, done = parse_sections("@@cvs:capacity 96 1584906520\n@@cvs:done\n")
    assert done
    assert _capacity_facts(sections) == {"cpu_count": 96, "memory_total": 1584906520 * 1024}


@pytest.mark.parametrize("garbage", ["- -", "0 -", "", "96", "lots 12 kB"])
def test_unreadable_capacity_is_unknown(garbage: str) -> None:
    sections, _ = parse_sections(f"@@cvs:capacity {garbage}\n@@cvs:done\n")
    assert _capacity_facts(sections) == {}


def capacity(online: Path, then: str = "") -> list[str]:
    """The probe's capacity reader (remote/capacity.sh) on this online-CPU list."""
    script = remote.source("capacity") + 'cvs_capacity "$1" /proc/meminfo\n' + then
    return ["sh", "-c", script, "capacity", str(online)]


@pytest.mark.parametrize(
    ("online", "expected"),
    [("0", 1), ("0-1", 2), ("0-3,8-11", 8), ("0,2,4", 3)],
)
def test_probe_counts_online_cpus_with_builtins(online: str, expected: int, tmp_path: Path) -> None:
    (tmp_path / "online").write_text(online + "\n")
    out = subprocess.run(capacity(tmp_path / "online"), capture_output=True, text=True, check=True)
    sections, _ = parse_sections(out.stdout)
    assert _capacity_facts(sections)["cpu_count"] == expected


@pytest.mark.parametrize("online", ["1-2-3", "-", "08", "0-08", "a", "", "0-9999999", "$(id)"])
def test_malformed_online_cpus_fall_back_to_nproc_and_never_end_the_probe(
    online: str, tmp_path: Path
) -> None:
    (tmp_path / "online").write_text(online + "\n")
    out = subprocess.run(
        capacity(tmp_path / "online", then="echo after"), capture_output=True, text=True
    )
    assert out.stdout.endswith("after\n"), out
    sections, _ = parse_sections(out.stdout)
    assert _capacity_facts(sections)["cpu_count"] == len(os.sched_getaffinity(0))
