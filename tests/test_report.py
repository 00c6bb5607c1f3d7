"""report.html: rendered from a run's outcome (pure), and opened in a real headless browser."""

from __future__ import annotations

from pathlib import Path

import markupsafe
import pytest
from browser import browser_skip_reason, open_page
from outcomes import HOSTILE, failing_outcome, host

from orchestrator.suites.records import RunRecorder, StepHostOutcome, StepOutcome
from orchestrator.suites.report import render_report, timeline, write_report


def test_host_output_is_escaped_never_markup() -> None:
    page = render_report(failing_outcome())
    assert "<script>" not in page and "<img src=http" not in page
    assert str(markupsafe.escape(HOSTILE)) in page


def test_page_has_no_external_references() -> None:
    page = render_report(failing_outcome())
    assert "http://" not in page.replace("http://example.invalid", "")
    assert "https://" not in page
    assert "default-src 'none'" in page


def test_failing_cell_links_to_its_output_and_full_log() -> None:
    page = render_report(failing_outcome())
    assert 'data-step="check" data-host="node2" data-status="failed"' in page
    assert 'href="#out-check-node2"' in page
    assert 'href="logs/check/node2.log"' in page


def test_identity_names_the_image_and_one_id_for_all_hosts() -> None:
    page = render_report(failing_outcome())
    assert "rocm/cvs:7.0" in page
    assert page.count("sha256:" + "a" * 64) == 1
    assert "node[1-2]" in page


def test_timeline_is_up_then_each_step_that_ran_then_down() -> None:
    bars = timeline(failing_outcome())
    assert [b.label for b in bars] == ["up", "install", "check", "down"]
    assert bars[0].seconds == pytest.approx(2.0)
    assert bars[-1].start == pytest.approx(4.5)
    assert all(0 <= b.left <= 100 and b.left + b.width <= 100.5 for b in bars)


def test_every_run_dir_gets_a_report(tmp_path: Path) -> None:
    recorder = RunRecorder.create(tmp_path / "run")
    recorder.finish(failing_outcome(), report=write_report)
    assert recorder.report_path.is_file()
    assert "test_x" in recorder.report_path.read_text()


browser = pytest.mark.skipif(browser_skip_reason() is not None, reason=str(browser_skip_reason()))


@browser
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_report_opens_in_chromium_and_shows_the_failing_cell(tmp_path: Path) -> None:
    recorder = RunRecorder.create(tmp_path / "run")
    recorder.finish(failing_outcome(), report=write_report)
    with open_page(recorder.report_path) as visit:
        page = visit.page
        cell = page.locator('td[data-step="check"][data-host="node2"]')
        assert cell.is_visible()
        assert "failed" in cell.inner_text()
        color = cell.evaluate("e => getComputedStyle(e).backgroundColor")
        assert color == "rgb(255, 235, 233)"  # the failure colour
        # The failing host's output is expanded, the hostile line shown as text.
        details = page.locator("details#out-check-node2")
        assert details.get_attribute("open") is not None
        assert HOSTILE in details.inner_text()
        assert page.locator("#verdict").inner_text().startswith("failed")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert visit.console_errors == [] and visit.page_errors == []
    assert visit.requests == [recorder.report_path.resolve().as_uri()]


def test_a_wide_fleet_gets_one_row_per_host(tmp_path: Path) -> None:
    hosts = [f"gpu{i:03d}" for i in range(1, 41)]
    step = StepOutcome(
        name="rccl",
        hosts=hosts,
        started=1.0,
        duration=2.0,
        results={
            h: host(h, "failed" if h == "gpu017" else "ok", code=1 if h == "gpu017" else 0)
            for h in hosts
        },
    )
    page = render_report(failing_outcome(steps=[step], image_ids={}))
    assert "Hosts \N{MULTIPLICATION SIGN} steps" in page
    assert "rccl: failed on gpu017" in page
    assert page.count('<tr><th class="mono">gpu') == 40
    assert 'data-step="rccl" data-host="gpu017" data-status="failed"' in page
    assert "gpu[001-040] (40)" in page


def test_a_refused_run_reports_why_and_that_nothing_ran() -> None:
    steps = [
        StepOutcome(
            name="check",
            hosts=["node1"],
            results={"node1": StepHostOutcome(host="node1", status="skipped", reason="refused")},
        )
    ]
    outcome = failing_outcome(
        steps=steps, refused=True, error="refused: node2 has no container", image_ids={}
    )
    page = render_report(outcome)
    assert "refused (exit 4)" in page
    assert "refused: node2 has no container" in page
    assert [(b.label, b.status) for b in timeline(outcome)] == [("up", "failed")]
