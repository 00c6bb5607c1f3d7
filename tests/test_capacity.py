"""Capacity up front: requests beyond a host's RAM are refused, cpus clamped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.containers.probe import _capacity_facts, parse_sections
from orchestrator.limits.capacity import fit_to_host
from orchestrator.limits.resources import EffectiveResources

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


def test_probe_capacity_section_parses() -> None:
    import base64

    body = base64.b64encode(b"cpus 96\nMemTotal:       1584906520 kB\n").decode()
    text = f"@@cvs:section capacity 0 b64\n{body}\n@@cvs:stderr\n\n@@cvs:end capacity\n@@cvs:done\n"
    sections, done = parse_sections(text)
    assert done
    assert _capacity_facts(sections) == {"cpu_count": 96, "memory_total": 1584906520 * 1024}


@pytest.mark.parametrize("garbage", ["cpus\nMemTotal: lots", "cpus 0\n", ""])
def test_unreadable_capacity_is_unknown(garbage: str) -> None:
    import base64

    body = base64.b64encode(garbage.encode()).decode()
    text = f"@@cvs:section capacity 0 b64\n{body}\n@@cvs:stderr\n\n@@cvs:end capacity\n@@cvs:done\n"
    sections, _ = parse_sections(text)
    assert _capacity_facts(sections) == {}
